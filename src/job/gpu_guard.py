"""Guard of a published set: a GPU's measuring stages (dvc.yaml: bench@<gpu>, suite@<gpu>) time
on that GPU only, so results/<gpu>/ never holds another GPU's figures.

`python -m src.job.gpu_guard h200` exits 0 when every visible CUDA device is the GPU that
conf/gpu/h200.yaml describes (its `match` patterns, as `gpu=auto` picks a spec), else 1 with one
paragraph saying why: no GPU here, or which device is here and which spec it is.
`python -m src.job.gpu_guard h200 --runs results/h200/.runs.csv.new` also checks a collected runs
CSV before it is moved into the set: every job that reached a GPU names that spec.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from src.errors import NoGPU
from src.records.collect import SET_RULE as RULE, runs_refusal
from src.job import gpu as gpu_mod



def visible_device_names() -> list[str]:
    """The name of every CUDA device this process sees (CUDA_VISIBLE_DEVICES applies)."""
    try:
        import cupy as cp

        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, CUDARuntimeError (no driver), ...
        raise NoGPU(gpu_mod.no_gpu_message(exc)) from exc
    if count == 0:
        raise NoGPU(gpu_mod.no_gpu_message(None, count))
    names = []
    for index in range(count):
        name = cp.cuda.runtime.getDeviceProperties(index)["name"]
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return names


def spec_of(device_name: str) -> str:
    found = gpu_mod.spec_for_device_name(device_name)
    return found.name if found is not None else "unknown (no conf/gpu/ spec matches it)"


def device_refusal(spec: str, device_names: list[str]) -> str | None:
    """Why devices named `device_names` may not measure `spec`'s published set (None: they may)."""
    others = [(name, spec_of(name)) for name in device_names if spec_of(name) != spec]
    if not others:
        return None
    seen = ", ".join(f"{name!r} (spec {found})" for name, found in others)
    return (f"refusing to measure results/{spec}/: this stage times on a {spec} GPU "
            f"(conf/gpu/{spec}.yaml) but this machine shows {seen}. Run it on a {spec} node, or "
            f"run the stage of the GPU that is here (dvc repro bench@<its spec>) ({RULE}).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.job.gpu_guard",
                                     description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("spec", help="the GPU spec whose set is measured (conf/gpu/<spec>.yaml)")
    parser.add_argument("--runs", type=Path, help="a collected runs CSV to check as well")
    args = parser.parse_args(argv)
    if args.spec not in gpu_mod.known_specs():
        print(f"error: no GPU spec {args.spec!r}: the published sets are named after conf/gpu/*.yaml "
              f"({', '.join(gpu_mod.known_specs())})", file=sys.stderr)
        return 1
    try:
        why = device_refusal(args.spec, visible_device_names())
    except NoGPU as exc:
        why = f"refusing to measure results/{args.spec}/ without a {args.spec} GPU: {exc} ({RULE})"
    if why is None and args.runs is not None:
        why = runs_refusal(args.spec, args.runs)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    print(f"{args.spec}: every visible GPU is one" + (f"; {args.runs} holds its jobs only" if args.runs else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
