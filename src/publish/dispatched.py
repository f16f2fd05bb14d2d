"""Which published rows ran the dispatch of today: a dispatching kernel's row (best_fp32,
best_tf32) records its choice (`dispatched_to`, `params`), and a re-fit of conf/tuned/<gpu>.yaml
may move that choice since. The suite and held-out reports count and list the rows measured
through an earlier dispatch (the held-out report meets a goal by today's rows only).

`python -m src.publish.dispatched RUNS_CSV --gpu GPU`: the rows to measure again, as sweeps
('KERNEL MxNxK,...': `python -m src.run -m kernel=KERNEL shape=...`)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from src.records.collect import read_runs


def dispatched_today(runs: pd.DataFrame, gpu_spec: str) -> dict[tuple, str | None]:
    """{(kernel, m, n, k): None where today's dispatch runs what the row measured, else what it
    runs now} for each ok row of a dispatching kernel that records its choice (`dispatched_to`,
    `params`): src.job.dispatch.choose at the row's problem with the device limits of
    `gpu_spec`'s datasheet, as the runner chooses, and the runner's default autotune
    (src.job.autotune): a row autotuned then is today's where autotune still measures at its
    shape the same launches from the same rule's choice (`autotune.planned`: the evidence's
    candidates and dispatch.autotune_variants) and today's margin, over the row's recorded brief
    timings, takes the launch that ran; a row of the rules
    alone, where autotune still finds the shape covered well and the rule's choice builds the same
    launch (the same params, or others that build it there). {} for a spec without a datasheet."""
    from src.job import autotune, dispatch, kept_evidence, training
    from src.job import gpu as gpu_mod
    from src.job.config import kernel_config
    from src.job.problem import Problem

    if gpu_spec not in gpu_mod.known_specs() or runs.empty:
        return {}
    limits = gpu_mod.limits_from_spec(gpu_spec)
    settings = autotune.default_settings()
    evidence = Path(settings.evidence) if settings.evidence else training.evidence_path(gpu_spec)
    rows = kept_evidence.rows(evidence) if settings.enabled and evidence.is_file() else None
    configs: dict[str, dict] = {}
    out = {}
    for r in runs[runs.status == "ok"].itertuples(index=False):
        chosen, params = getattr(r, "dispatched_to", None), getattr(r, "params", None)
        if not isinstance(chosen, str) or not isinstance(params, str):
            continue  # not a dispatching kernel's row, or one from before they recorded it
        if r.kernel not in configs:
            configs[r.kernel] = kernel_config(r.kernel)
        if not dispatch.is_dispatcher(configs[r.kernel]):
            continue
        problem = Problem(int(r.m), int(r.n), int(r.k), float(r.alpha), float(r.beta))
        now = dispatch.choose(configs[r.kernel], gpu_spec, problem, limits)
        shape = (problem.m, problem.n, problem.k)
        # the evidence's table, as the runner's autotune reads it (None: candidates from the rules)
        table = None if rows is None else kept_evidence.table(evidence, str(r.kernel))
        autotunes_now = settings.enabled and not autotune.coverage(
            now, str(r.kernel), shape, rows, settings.max_distance, str(evidence), margin=settings.margin,
            table=table).well
        autotuned = getattr(r, "autotuned", None) in (autotune.MEASURED, autotune.REUSED,
                                                      autotune.ALL_FAILED)
        rule = (now.kernel, now.params)
        ran = (chosen, json.loads(params))
        if autotuned:  # the same candidates as today's, and today's margin takes what ran
            lines = getattr(r, "autotune_candidates", None)
            rule_then, taken_now = autotune.recorded(lines, settings.margin) or (None, None)
            same = rule_then is not None and (
                _same_launch(rule_then, rule, problem, str(r.precision), limits)
                and _same_launch(ran, taken_now, problem, str(r.precision), limits)
                and _launches(lines, problem, str(r.precision), limits) == [launch for _, launch in (
                    autotune.planned(now, configs[r.kernel], gpu_spec, problem, rows, settings, limits,
                                     table))])
        else:
            same = _same_launch(ran, rule, problem, str(r.precision), limits)
        runs_now = f"{now.kernel} {json.dumps(now.params, sort_keys=True)}"
        out[(r.kernel, *shape)] = None if same and autotunes_now == autotuned else (
            f"autotune from {runs_now}" if autotunes_now else runs_now)
    return out


def _launches(lines, problem, precision: str, limits) -> list:
    """The launches an autotuned record's candidate lines name, in order, each once (a line that
    builds nothing at `problem` left out, as autotune leaves it out before measuring)."""
    from src.job import autotune, dispatch
    from src.job.training import Candidate

    out = []
    for kernel, params, *_ in autotune.recorded_candidates(lines) or []:
        launch = dispatch.launch(Candidate(kernel, json.dumps(params, sort_keys=True)), precision, problem, limits)
        if launch is not None and launch not in out:
            out.append(launch)
    return out


def _same_launch(was: tuple[str, dict], now: tuple[str, dict], problem, precision: str, limits) -> bool:
    """Whether two (kernel, params) choices are one: the same params, or others of the same kernel
    that build the same launch at `problem` (the tuner's twins)."""
    from src.job import dispatch
    from src.job.training import Candidate

    was, now = (Candidate(kernel, json.dumps(params, sort_keys=True)) for kernel, params in (was, now))
    return was == now or was.kernel == now.kernel and (
        dispatch.launch(was, precision, problem, limits) == dispatch.launch(now, precision, problem, limits))


def stale_sweeps(runs_csv: Path, gpu_spec: str) -> list[str]:
    """'KERNEL MxNxK,MxNxK,...' per dispatching kernel (in name order): the rows today's dispatch
    no longer runs as measured, to measure again (`python -m src.run -m kernel=KERNEL shape=...`)."""
    moved: dict[str, list[str]] = {}
    for (kernel, m, n, k), now in sorted(dispatched_today(read_runs(runs_csv), gpu_spec).items()):
        if now:
            moved.setdefault(kernel, []).append(f"{m}x{n}x{k}")
    return [f"{kernel} {','.join(shapes)}" for kernel, shapes in moved.items()]


def refusal(runs_csv: Path, gpu_spec: str) -> str | None:
    """Why the rows of `runs_csv` cannot be checked against `gpu_spec`'s dispatch (no such file,
    or a spec without a datasheet, whose dispatch the runner cannot rebuild), or None."""
    from src.job import gpu as gpu_mod

    if not runs_csv.is_file():
        return (f"{runs_csv} is not a file (rule: the rows checked against today's dispatch are a "
                f"runs CSV, e.g. results/<gpu>/heldout_runs.csv or suite_runs.csv).")
    if gpu_spec not in gpu_mod.known_specs():
        return (f"--gpu {gpu_spec} names no GPU datasheet (conf/gpu/{gpu_spec}.yaml) (rule: the "
                f"dispatch is rebuilt with that GPU's limits; known: {', '.join(sorted(gpu_mod.known_specs()))}).")
    return None


def print_stale(runs_csv: Path, gpu_spec: str) -> int:
    """Print `stale_sweeps` (the command's output), or the refusal on stderr; the exit status."""
    refused = refusal(runs_csv, gpu_spec)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    print("\n".join(stale_sweeps(runs_csv, gpu_spec)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="a runs CSV (src.records.collect): suite or held-out")
    parser.add_argument("--gpu", required=True, help="the GPU spec whose conf/tuned/<gpu>.yaml dispatches")
    args = parser.parse_args(argv)
    return print_stale(args.runs, args.gpu)


if __name__ == "__main__":
    sys.exit(main())
