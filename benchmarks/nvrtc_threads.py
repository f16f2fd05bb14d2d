"""How much compiling on threads buys: NVRTC builds of N candidates of kernel 10 (distinct tile
parameters, each a fresh compile in an empty cache) on 1 thread and on T threads.

    python benchmarks/nvrtc_threads.py [--candidates 32] [--threads 16]

Needs NVRTC, not a GPU. Prints one line per run and the speed-up last."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from omegaconf import OmegaConf

from src.tune import space as tune
from src.job.compile import expand_source, precompile
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.job.spec import KERNELS_DIR


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    kernel = OmegaConf.to_container(OmegaConf.load(KERNELS_DIR.parent / "conf/kernel/10_warptiling.yaml"))
    space = OmegaConf.to_container(OmegaConf.load(KERNELS_DIR.parent / "conf/tune/10_warptiling.yaml"))["tune"]["space"]
    valid = tune.prune(kernel, tune.grid(space), Problem(4096, 4096, 4096, 1.0, 0.0),
                       limits_from_spec("h100_sxm")).valid[: args.candidates]
    text = expand_source(KERNELS_DIR / kernel["source"])
    jobs = [(spec.name, text, spec.entry) for _, spec in valid]
    seconds = {}
    for threads in (1, args.threads):
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            results = [f.result() for f in precompile(jobs, args.arch, cache, threads=threads)]
            seconds[threads] = time.perf_counter() - start
        per = sum(r.compile_seconds for r in results) / len(results)
        print(f"{len(jobs)} candidates on {threads:2d} thread(s): {seconds[threads]:6.1f} s wall, "
              f"{per:.2f} s per compile", flush=True)
    print(f"speed-up on {args.threads} threads: {seconds[1] / seconds[args.threads]:.1f}x")


if __name__ == "__main__":
    main()
