"""`sgemm-lab explain MxNxK [--gpu SPEC] [--precision fp32|tf32]`: which dispatch rule of
conf/tuned/<gpu>.yaml chooses what for a shape (kernel, parameters, the rule's `why`), and the
measured alternatives at the training shapes nearest to it in log-shape space (those the nearest
model weighed, where it chose), from the evidence file the tuned file names (default
results/tuning/<gpu>.csv; or a plain note that there is none). Reads files only: no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from src.job.training import distance, nearest, score

DISPATCHERS = {"fp32": "best_fp32", "tf32": "best_tf32"}
STAND_IN = "a100"  # whose limits an unknown GPU is explained with (sm_80: cp.async, TF32)


def report(shape: tuple[int, int, int], gpu_spec: str, precision: str, rows: list[dict] | None,
           evidence_name: str, top: int = 5) -> str:
    from src.job import dispatch, tuned
    from src.job.config import kernel_config
    from src.job.gpu import known_specs, limits_from_spec
    from src.job.problem import Problem

    dispatcher = DISPATCHERS[precision]
    problem = Problem(*shape, 0.5, 3.0)
    known = gpu_spec in known_specs()
    limits = limits_from_spec(gpu_spec if known else STAND_IN)  # as the runner's: the device's
    choice = dispatch.choose(kernel_config(dispatcher), gpu_spec, problem, limits)
    under = tuned.lookup(choice.kernel, gpu_spec, problem, explicit=set(choice.params))
    params = {**(kernel_config(choice.kernel).get("params") or {}), **under.params, **choice.params}
    lines = [f"{dispatcher} at {'x'.join(map(str, shape))} on {gpu_spec}:",
             f"  runs {choice.kernel} {json.dumps(params, sort_keys=True)}",
             f"  chosen by {choice.rule}"]
    if under.source and under.params:
        lines.append(f"  parameters not set by the rule from {under.source}")
    if not known:
        lines.append(f"  no GPU spec {gpu_spec} (conf/gpu/): what builds is checked against {STAND_IN}'s "
                     f"limits, the least the lab's kernels need; on the device its own limits decide")
    lines += _autotune(choice, dispatcher, problem, gpu_spec, limits, rows, evidence_name)
    borrowed = tuned.dispatch_borrowed_from(gpu_spec)
    if borrowed is not None and choice.when is not None:  # a rule chose, not the default
        lines.append(f"  the rules are {borrowed}'s, taken by conf/tuned/{gpu_spec}.yaml, not fitted to "
                     f"measurements on {gpu_spec}: `sgemm-lab tune` there fits its own")
    if rows is None:
        lines.append(f"no evidence file {evidence_name}: no measured alternatives to show "
                     f"(`sgemm-lab tune` on {gpu_spec} writes it)")
        return "\n".join(lines) + "\n"
    def is_choice(row: dict) -> bool:  # the row's candidate is what the rule runs
        return row["kernel"] == choice.kernel and all(
            params.get(k) == v for k, v in json.loads(row["params"]).items())

    # the neighbours the model summed over (its count, distance and reserved sides); else the 3 nearest
    by_model = choice.when == dispatch.NEAREST
    shown = dispatch.neighbours(gpu_spec, dispatcher, problem) if by_model else nearest(rows, dispatcher, shape, 3)
    side = dispatch.small_side_of(gpu_spec, dispatcher) if by_model else 0.0
    if by_model:
        lines += _weighing(*dispatch.weighing(gpu_spec, dispatcher, problem, precision, limits, top))
    for near in shown:
        mine = [r for r in rows if r["dispatcher"] == dispatcher and (r["m"], r["n"], r["k"]) == near]
        ok = [r for r in mine if r["status"] == "ok"]
        launches = _launches(ok)
        lines.append(f"measured at {'x'.join(map(str, near))} (log2 distance "
                     f"{distance(near, shape, side):.2f}; {len(ok)} ok as {len(launches)} distinct "
                     f"launches, {len(mine) - len(ok)} failed) from {evidence_name}:")
        for rank, group in enumerate(launches, start=1):
            chosen = any(is_choice(r) for r in group)
            if rank <= top or chosen:  # the choice gets its line wherever it ranks
                lines.append(_launch_line(rank, group, chosen))
    if not nearest(rows, dispatcher, shape):
        lines.append(f"{evidence_name} has no {dispatcher} rows")
    return "\n".join(lines) + "\n"


def _autotune(choice, dispatcher: str, problem, gpu_spec: str, limits: dict | None,
              rows: list[dict] | None, evidence_name: str) -> list[str]:
    """What the run-time autotune does here under conf/dispatch/default.yaml: nothing (off, or
    the shape is covered well), or measure its candidates once, briefly: the first few that build
    here, each launch once (with the GPU's limits, or the stand-in's for a GPU without a spec)."""
    from src.job import autotune
    from src.job.config import kernel_config

    settings = autotune.default_settings()
    shape = (problem.m, problem.n, problem.k)
    if not settings.enabled:
        return ["  autotune: off (dispatch.autotune): the rule's choice runs"]
    covered = autotune.coverage(choice, dispatcher, shape, rows, settings.max_distance, evidence_name,
                                margin=settings.margin)
    if covered.well:
        return [f"  autotune: measures nothing here: {covered.why}"]
    listed = [f"    {c.kernel} {json.dumps(c.params, sort_keys=True)} ({c.source})" for c, _ in
              autotune.planned(choice, kernel_config(dispatcher), gpu_spec, problem, rows, settings, limits)]
    return [f"  autotune: measures these {len(listed)} here, briefly, the first time a job meets the "
            f"shape ({covered.why}); a challenger runs only if more than {settings.margin:.0%} faster "
            f"than the rule's choice, and the winner is kept:", *listed]


def _weighing(launches: list[tuple], near: list[tuple[int, int, int]]) -> list[str]:
    """The nearest model's first launches here, each with its score and its ratio at each
    neighbour as measured -> as weighed (scaled by the wave fill here against there)."""
    lines = [f"the nearest model's first {len(launches)} launches here (score: the neighbours' "
             f"mean; at {', '.join('x'.join(map(str, s)) for s in near)}: measured -> as weighed):"]
    for rank, (candidate, score, twins, at) in enumerate(launches, start=1):
        also = f" (+{twins} that build it here)" if twins else ""
        lines.append(f"  {rank}. {score:.3f}x {candidate.kernel} {candidate.params}{also}: " + ", ".join(
            "-" if got is None else f"{got:.3f}" if abs(scaled - got) < 5e-4 else f"{got:.3f} -> {scaled:.3f}"
            for got, scaled in at))
    return lines


def _launches(ok: list[dict]) -> list[list[dict]]:
    """A shape's ok rows as distinct launches, best first: each measured row with the candidates
    that build the same kernel and launch there (`same_as` naming it) after it."""
    groups: dict[tuple, list[dict]] = {}
    for r in sorted(ok, key=lambda r: bool(r.get("same_as"))):  # measured rows first
        groups.setdefault((r["kernel"], r.get("same_as") or r["params"]), []).append(r)
    return sorted(groups.values(), key=lambda g: -(score(g[0]) or 0.0))


def _launch_line(rank: int, group: list[dict], chosen: bool) -> str:
    r = group[0]
    interval = ("" if r["ratio_best_ci_low"] is None else
                f" [{r['ratio_best_ci_low']:.3f}, {r['ratio_best_ci_high']:.3f}]")
    others = len(group) - 1
    also = (f" (+{others} candidate{'s' if others > 1 else ''} that build{'' if others > 1 else 's'} "
            f"this same launch here)" if others else "")
    mark = "  <- the rule's choice" if chosen else ""
    return (f"  {rank}. {score(r) or 0.0:.3f}x{interval} {r['gflops']:,.0f} GFLOP/s "
            f"{r['kernel']} {r['params']}{also}{mark}")


def main(argv: list[str]) -> int:
    from src.errors import LabError, NoGPU
    from src.job import dispatch
    from src.job.shapes import parse
    from src.job.training import evidence_path, read
    from src.tune.command import detected_spec

    parser = argparse.ArgumentParser(prog="sgemm-lab explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", help="MxNxK, e.g. 2500x3500x900")
    parser.add_argument("--gpu", help="the GPU spec (default: the detected device's)")
    parser.add_argument("--precision", choices=sorted(DISPATCHERS), default="fp32")
    parser.add_argument("--csv", type=Path, default=None, help="the evidence file")
    args = parser.parse_args(argv)
    dims = parse(args.shape)
    if dims is None:
        parser.error(f"shape must be MxNxK, three positive integers joined by x (got {args.shape!r})")
    try:
        try:
            gpu_spec = args.gpu or detected_spec()
        except NoGPU as exc:  # explain reads files only: a machine without a GPU names the spec
            raise NoGPU(f"{exc} `sgemm-lab explain` reads files only: name the GPU spec with --gpu "
                        f"(a conf/gpu/ file, e.g. --gpu h100_sxm).") from exc
        # the evidence the tuned file's model was fitted from, which may not be the default file
        path = args.csv or dispatch.evidence_file(gpu_spec) or evidence_path(gpu_spec)
        rows = read(path) if path.is_file() else None
        print(report(dims, gpu_spec, args.precision, rows, str(path)), end="")
    except LabError as exc:
        print(f"error [{exc.status}]: {exc}", file=sys.stderr)
        return 1
    return 0

