"""Time variants of one chapter against cuBLAS in one process, through the runner's own steps
(src/job: prepare -> compile -> verify -> time, and its Baselines) and protocol (conf/bench/): a
quick way to compare tile shapes or tensor-map settings on the GPU box before writing the winner
into a config. Every variant is verified first; one that fails prints its error and is not timed.

  python -m benchmarks.variants 20_wgmma_tf32 --sizes 4096,8192 \\
      --vary bm=128,256 --vary stages=3,4 --vary map.a.element=f32,tf32

`--vary key=v1,v2` crosses values: `key` is a parameter (kernel.params.<key>) or
`map.<matrix>.<field>` for a launch.tensor_maps entry. A tuned chapter starts from the detected
GPU's tuned values for each size (conf/tuned/), as in a run; `--tuned-for` borrows another GPU's.
`--shape m,n,k[,alpha,beta]` adds a verified-only problem (repeatable); `--alpha`/`--beta` set the
timed problems' scalars (beta != 0 times the epilogue's reads of C too). Prints a table last.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
from dataclasses import replace

from omegaconf import OmegaConf

from src.errors import LabError
from src.job.baselines import Baselines
from src.job.config import compose
from src.job.gpu import known_specs, resolve_spec
from src.job.measure import verify_and_time, verify_only
from src.job.prepare import prepare_kernel, target
from src.job.problem import Problem
from src.job.protocol import BenchProtocol
from src.records.record import new_record


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def with_maps(kernel_cfg: dict, choice: dict) -> dict:
    """`map.<matrix>.<field>` choices applied to the config's launch.tensor_maps entries."""
    cfg = copy.deepcopy(kernel_cfg)
    for key, value in choice.items():
        if key.startswith("map."):
            _, matrix, field = key.split(".")
            entry = next(tm for tm in cfg["launch"]["tensor_maps"] if tm["matrix"] == matrix)
            entry[field] = value
    return cfg


def parse_problems(sizes: str, shapes: list[str], alpha: float = 1.0,
                   beta: float = 0.0) -> tuple[list[Problem], list[Problem]]:
    timed = [Problem(*(3 * [int(s)] if "x" not in s else map(int, s.split("x"))), alpha, beta)
             for s in sizes.split(",")]
    checked = []
    for shape in shapes:
        v = [float(x) for x in shape.split(",")]
        checked.append(Problem(int(v[0]), int(v[1]), int(v[2]), v[3] if len(v) > 3 else 1.0,
                               v[4] if len(v) > 4 else 0.0))
    return timed, checked


def run_variant(kernel_cfg, choice, problem, timed, where, bench, baselines) -> tuple[str, str]:
    params = {k: v for k, v in choice.items() if not k.startswith("map.")}
    prepared = prepare_kernel(with_maps(kernel_cfg, choice), problem, where, bench,
                              overrides=params)
    record = new_record(prepared.spec.name, prepared.spec.precision, prepared.spec.backend,
                        vars(problem))
    if not timed:
        verify_only(prepared, record)
        return "ok", (f"verified  rel_err {record.rel_err:.2e}  regs {record.registers}  "
                      f"local {record.local_bytes} B")
    gflops = verify_and_time(prepared, record)
    baseline = "cublas_tf32" if prepared.spec.precision == "tf32" else "cublas_fp32"
    ref = baselines.gflops(baseline, problem, bench, where)
    pct = f"{100 * gflops / ref:.1f}% of {baseline} ({ref:,.0f})" if ref else "(no baseline)"
    return "ok", (f"{gflops:,.0f} GFLOP/s {pct}  rel_err {record.rel_err:.2e}  "
                  f"regs {record.registers}  local {record.local_bytes} B")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel")
    parser.add_argument("--sizes", default="4096", help="timed sizes: 4096 or MxNxK, comma-separated")
    parser.add_argument("--vary", action="append", default=[])
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--alpha", type=float, default=1.0, help="the timed problems' alpha")
    parser.add_argument("--beta", type=float, default=0.0, help="the timed problems' beta")
    parser.add_argument("--bench", default="default")
    parser.add_argument("--tuned-for", default="auto",
                        help="GPU spec whose tuned values apply (default: the detected GPU's)")
    args = parser.parse_args()

    cfg = compose(f"kernel={args.kernel}", f"bench={args.bench}")
    kernel_cfg = OmegaConf.to_container(cfg.kernel, resolve=True)
    bench = BenchProtocol.from_config(OmegaConf.to_container(cfg.bench, resolve=True))
    where = target(cfg.gpu)
    device = where.device
    if device is None:
        print("no GPU: variants are timed on the GPU box", file=sys.stderr)
        return 1
    if args.tuned_for != "auto":  # borrow the tuned file, keep the detected device's limits
        where = replace(where, gpu_spec=resolve_spec(known_specs()[args.tuned_for], device))
    print(f"device: {device.name} (cc {device.compute_capability}, driver {device.driver})")

    axes = [(k, [_value(v) for v in vs.split(",")])
            for k, vs in (item.split("=", 1) for item in args.vary)]
    choices = [dict(zip([k for k, _ in axes], combo))
               for combo in itertools.product(*[vs for _, vs in axes])] or [{}]
    timed, checked = parse_problems(args.sizes, args.shape, args.alpha, args.beta)
    baselines = Baselines()
    rows = []
    for choice in choices:
        label = " ".join(f"{k}={v}" for k, v in choice.items()) or "configured"
        for problem, is_timed in [(p, False) for p in checked] + [(p, True) for p in timed]:
            try:
                status, text = run_variant(kernel_cfg, choice, problem, is_timed, where, bench,
                                           baselines)
            except LabError as exc:
                status, text = "FAILED", str(exc).splitlines()[0][:160]
            rows.append((label, problem.label, status, text))
            print(rows[-1], flush=True)

    print(f"\n{args.kernel} on {device.name}")
    for label, shape, status, text in rows:
        print(f"{label:<40} {shape:<18} {status:<7} {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
