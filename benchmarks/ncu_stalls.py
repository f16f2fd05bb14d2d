"""Where the warps of a GEMM kernel wait, instruction by instruction: Nsight Compute's full set
(warp-state sampling per SASS instruction, shared-memory wavefronts, issue slots) for each kernel
named, one launch each at one size, cuBLAS included (its SASS comes with it).

  python -m benchmarks.ncu_stalls 4096 17_flagship cublas_fp32 17_flagship:lane_map=2

A kernel is a config name, optionally with parameter overrides after a colon
(`17_flagship:bk=16,stages=4`); the GPU's tuned values apply first, as in a run (`--tuned-for`
borrows another GPU's). Writes <tag>.details.csv (sections) and <tag>.sass.csv (per-instruction
samples) under $OUT (or ./ncu_out), packed as ncu_stalls.tgz. `--launch` is the process ncu
profiles: it only launches the kernels (it was benchmarks/profile_kernels.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from src.job.compile import compile_kernel
from src.job.config import kernel_config
from src.job.gpu import known_specs
from src.job.prepare import prepare_kernel, target
from src.job.problem import Problem, make_inputs

SHOWN = ("Issue Slots Busy", "Executed Ipc Active", "Registers Per Thread", "Duration",
         "Warp Cycles Per Issued Instruction")


def overrides_of(text: str) -> dict:
    """`bk=16,stages=4` as parameters."""
    pairs = (pair.split("=", 1) for pair in filter(None, text.split(",")))
    return {key: int(value) for key, value in pairs}


def launch(items: list[str], size: int, launches: int, tuned_for: str) -> None:
    """Compile and launch each kernel on random inputs: what ncu attaches to."""
    import cupy as cp

    # a named spec is taken as given on this device: its tuned values, this device's limits
    where = target(known_specs()[tuned_for] if tuned_for != "auto" else {"name": "auto"})
    problem = Problem(size, size, size, 1.0, 0.0)
    inputs = make_inputs(problem)
    for item in items:
        name, _, overrides = item.partition(":")
        prepared = prepare_kernel(kernel_config(name), problem, where,
                                  overrides=overrides_of(overrides) or None)
        prepared.require_device()
        kernel = compile_kernel(prepared.spec)
        for _ in range(launches):
            kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta)
        cp.cuda.runtime.deviceSynchronize()
        print(f"{item}: {prepared.spec.entry or name} launched {launches}x", flush=True)


def tag_of(item: str) -> str:
    """A file name for `17_flagship:bk=16,stages=4`: 17_flagship_bk-16.stages-4."""
    return item.replace(":", "_").replace("=", "-").replace(",", ".")


def profile(item: str, size: int, tuned_for: str, out: Path) -> bool:
    """One kernel under `ncu --set full`; its details and per-instruction pages as CSV."""
    tag = out / tag_of(item)
    target_cmd = [sys.executable, "-m", "benchmarks.ncu_stalls", str(size), item, "--launch",
                  "--tuned-for", tuned_for]
    with open(f"{tag}.log", "w") as log:
        done = subprocess.run(["ncu", "--set", "full", "--import-source", "no", "-k", "regex:gemm",
                               "-c", "1", "-f", "-o", str(tag), *target_cmd],
                              stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(f"{item}: ncu failed")
        print("".join(Path(f"{tag}.log").read_text().splitlines(keepends=True)[-5:]), end="")
        return False
    report = f"{tag}.ncu-rep"

    def page(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ncu", "-i", report, *args], capture_output=True, text=True)

    details = page("--page", "details", "--csv").stdout
    Path(f"{tag}.details.csv").write_text(details)
    sass = page("--page", "source", "--csv", "--print-source", "sass")
    if sass.returncode != 0:  # an older ncu has no --print-source
        sass = page("--page", "source", "--csv")
    Path(f"{tag}.sass.csv").write_text(sass.stdout)
    print(f"{item}: {len(sass.stdout.splitlines())} source lines, "
          f"{os.path.getsize(report) // 1024} KiB report")
    shown = [line for line in details.splitlines() if any(f'"{name}"' in line for name in SHOWN)]
    for line in shown[:6]:
        print(",".join(line.split(",")[12:]))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", type=int, help="M = N = K")
    parser.add_argument("kernels", nargs="+", help="NAME or NAME:param=value,...")
    parser.add_argument("--tuned-for", default="auto", help="GPU spec whose tuned values apply")
    parser.add_argument("--launch", action="store_true",
                        help="only launch the kernels (what ncu profiles)")
    parser.add_argument("--launches", type=int, default=1, help="with --launch: launches each")
    args = parser.parse_args(argv)
    if args.launch:
        launch(args.kernels, args.size, args.launches, args.tuned_for)
        return 0
    if shutil.which("ncu") is None:
        parser.error("ncu (Nsight Compute) is not on PATH: run this on the GPU box")
    base = Path(os.environ.get("OUT", "ncu_out"))
    out = base / "ncu_stalls"
    out.mkdir(parents=True, exist_ok=True)
    print(subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip()
          .splitlines()[-1])
    ok = [profile(item, args.size, args.tuned_for, out) for item in args.kernels]
    with tarfile.open(base / "ncu_stalls.tgz", "w:gz") as tgz:
        tgz.add(out, arcname="ncu_stalls")
    shutil.rmtree(out)
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
