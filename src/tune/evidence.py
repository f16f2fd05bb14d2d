"""Tuning evidence: the tuning sweeps' records -> results/tuning/<gpu>.csv, one row per training
shape x candidate measured (status, GFLOP/s, ratio to the stronger cuBLAS with its 95% interval),
and back. A candidate that builds the same kernel and launch as a measured one at that shape
(src/tune/space.py, SAME_KERNEL) gets that one's figures with `same_as` naming it, so every
candidate of the sweep has a row where it builds. The file holds the measured rows only: each
names the candidates that build its launch in `same_launch`, by the params they change
(src/job/training.twin_change), and training.read gives each its row back; 70% of a tune's rows
are such twins, so the file is about a third of what one row each took. `stage` says which stage of the
plan measured a row (1: the screen, every candidate; 2: the survivors at the other shapes; 3: a
second screen's survivors at the added draws; src/tune/plan.py). The fit (src/tune/fit.py) and `sgemm-lab explain` read the file; nothing else
is needed to re-fit.

`source_sha256` is the SHA-256 of the exact source NVRTC built (the kernel file with its headers
pasted in, src/job/compile.expand_source): a partial re-tune (`sgemm-lab tune --kernels ...`)
keeps another candidate's rows only while that candidate's source is still the one they measured
(`kept_rows`). `carried_from`, where set, is the source that measured the row, carried over to
`source_sha256` because the candidate builds the same machine code and launch from both
(src/tune/carry.py).
"""

from __future__ import annotations

import csv
import hashlib
import json
from functools import lru_cache
from pathlib import Path

from src.errors import ConfigError
from src.job.training import row_order, twin_change
from src.records.collect import PROTOCOL_RULE, protocol_shortfalls, record_row
from src.records.record import Record, load_records
from src.tune.space import params_key

COLUMNS = ["gpu_spec", "dispatcher", "precision", "shape", "m", "n", "k", "aligned", "kernel",
           "params", "status", "gflops", "ratio_best", "ratio_best_ci_low", "ratio_best_ci_high",
           "best_cublas", "ratio", "baseline", "same_launch", "from_cache", "timestamp", "error", "stage",
           "source_sha256", "carried_from"]


def _ratio(pct) -> float | None:
    return None if pct is None else round(float(pct) / 100, 4)


def row(record: Record, gpu_spec: str, dispatcher: str, precision: str, stage: int = 1) -> dict:
    ok = record.ok
    return {
        "gpu_spec": gpu_spec, "dispatcher": dispatcher, "precision": precision,
        "shape": f"{record.m}x{record.n}x{record.k}", "m": record.m, "n": record.n, "k": record.k,
        "aligned": int(record.n % 4 == 0 and record.k % 4 == 0), "kernel": record.kernel,
        "params": json.dumps(record.params, sort_keys=True), "status": record.status,
        "gflops": round(record.gflops, 1) if ok and record.gflops is not None else None,
        "ratio_best": _ratio(record.pct_of_best_cublas) if ok else None,
        "ratio_best_ci_low": _ratio(record.pct_best_ci_low) if ok else None,
        "ratio_best_ci_high": _ratio(record.pct_best_ci_high) if ok else None,
        "best_cublas": record.best_cublas if ok else None,
        "ratio": _ratio(record.pct_of_cublas) if ok else None,
        "baseline": record.baseline, "same_as": None, "from_cache": int(bool(record.from_cache)),
        "timestamp": record.timestamp,
        "error": None if ok else (record.error or "").splitlines()[0][:200] if record.error else None,
        "stage": stage, "source_sha256": record.source_sha256, "carried_from": None,
    }


def sweep_rows(sweep, sweep_dir: Path, gpu_spec: str, settings: dict,
               kept: list[dict] = ()) -> list[dict]:
    """The rows of one planned sweep (src/tune/plan.Sweep): its records, and a row for each
    candidate that is the same kernel as a measured one at a shape, or as one of the `kept` rows
    (the evidence it was planned around, `sgemm-lab tune --missing`) that is not itself held: the
    first of a launch too, where the plan held it for a kept twin."""
    from src.job.gpu import limits_from_spec
    from src.job.problem import Problem
    from src.tune import plan
    from src.tune import space as tune

    records = load_records(sweep_dir / sweep.name) if (sweep_dir / sweep.name).is_dir() else []
    shortfalls = protocol_shortfalls([record_row(r, "") for r in records])
    if shortfalls:  # a ratio to a weaker baseline, or another clock's, would mislead the fit
        raise ConfigError(f"sweep {sweep.name}: " + "; ".join(shortfalls) + f" ({PROTOCOL_RULE}). "
                          f"Its rows are not written into the evidence; send cupti-python and "
                          f"nvmath-python with the run (pyproject's `cuda13` extra) and tune again.")
    measured = {}
    rows = []
    for record in records:
        r = row(record, gpu_spec, sweep.dispatcher, sweep.precision, sweep.stage)
        measured[(r["shape"], r["params"])] = r
        rows.append(r)
    known = {(r["shape"], r["params"]): r for r in kept
             if (r["dispatcher"], r["kernel"]) == (sweep.dispatcher, sweep.kernel)}
    cfg = plan.candidate_config(sweep.kernel, sweep.precision)
    limits = limits_from_spec(gpu_spec)
    pruner = tune.Pruner(cfg, sweep.candidate_list(), limits)
    for shape in sweep.covered:
        outline = pruner.at(Problem(*shape.dims, settings["alpha"], settings["beta"]))
        for launch in pruner.launches(outline).values():
            members = [json.dumps(json.loads(p), sort_keys=True) for p in launch]
            # the launch's figures: the first's measurement, else any kept row of the launch (the
            # plan held the launch for it and measured nothing)
            source = measured.get((shape.label, members[0])) or next(
                (known[(shape.label, p)] for p in members if (shape.label, p) in known), None)
            if source is None:
                continue
            for p in members:
                if (shape.label, p) not in known and (shape.label, p) not in measured:
                    # a kept source may itself be a twin (the earlier run's grid kept another
                    # first): name the row that holds the figures
                    rows.append({**source, "params": p,
                                 "same_as": source.get("same_as") or source["params"]})
    return rows


def source_sha256(kernel: str) -> str:
    """The SHA-256 of the source NVRTC builds for `kernel` today (what a record's source_sha256
    holds for a job of it)."""
    from src.job.compile import expand_source
    from src.job.config import kernel_config
    from src.paths import kernel_file

    text = expand_source(kernel_file(str(kernel_config(kernel)["source"]), kernel))
    return hashlib.sha256(text.encode()).hexdigest()


def kept_rows(rows: list[dict], remeasured: set[str]) -> list[dict]:
    """The rows of an evidence file that a partial re-tune keeps: every candidate's but those it
    measures again, each only if its source is still the one that measured it. A ConfigError
    names the candidates whose rows cannot be kept (a row without source_sha256, or a source that
    changed): measure them again too."""
    kept = [r for r in rows if r["kernel"] not in remeasured]
    today = {k: source_sha256(k) for k in {r["kernel"] for r in kept}}
    stale = sorted({r["kernel"] for r in kept if r.get("source_sha256") != today[r["kernel"]]})
    if stale:
        raise ConfigError(
            f"the evidence rows of {', '.join(stale)} were measured from another source than "
            f"today's (or do not say which: no source_sha256), so a partial re-tune cannot keep "
            f"them (rule: kept evidence must be of the kernel as it is built now); add them to "
            f"--kernels, or run the whole tune.")
    return kept


def _key(r: dict, params: str) -> tuple:
    """A candidate at a row's shape: its dispatcher, shape, kernel and `params`."""
    return (r["dispatcher"], int(r["m"]), int(r["n"]), int(r["k"]), r["kernel"], params)


def merged(earlier: list[dict], new: list[dict]) -> list[dict]:
    """A tune's evidence so far: `earlier`'s rows (the file before the run) with `new` ones in
    their place, by dispatcher, shape, kernel and params. An earlier row whose source row is
    replaced goes too (its figures were that row's), unless `new` holds it again."""
    replaced = {_key(r, r["params"]) for r in new}
    return [r for r in earlier if _key(r, r["params"]) not in replaced
            and not (r.get("same_as") and _key(r, r["same_as"]) in replaced)] + list(new)


sort_key = row_order  # the file's row order (src/job/training.row_order)


@lru_cache(maxsize=1 << 16)  # a (params, twin) pair recurs at every shape and in every write of a tune
def _change_text(source: str, twin: str) -> str:
    return json.dumps(twin_change(source, twin))


def write(rows: list[dict], path: Path) -> Path:
    """Written whole or not at all (a temporary file renamed over the old one). A same_as row
    goes into its source row's `same_launch`; one whose source row is not among `rows`, or is of
    another source_sha256, is a ConfigError naming the rule."""
    twins: dict[tuple, list[str]] = {}
    for r in rows:
        if r.get("same_as"):
            twins.setdefault(_key(r, r["same_as"]), []).append(r["params"])
    measured = [r for r in rows if not r.get("same_as")]
    sources = {_key(r, r["params"]): r.get("source_sha256") for r in measured}
    orphans = twins.keys() - sources.keys()
    apart = [r for r in rows if r.get("same_as") and _key(r, r["same_as"]) in sources
             and r.get("source_sha256") != sources[_key(r, r["same_as"])]]
    if apart:
        r = apart[0]
        raise ConfigError(
            f"{path}: {len(apart)} same_as row(s) are of another source than their source row, e.g. "
            f"{r['kernel']} {r['params']} at {r['shape']} ({r['dispatcher']}) (rule: a same_as row "
            f"builds its source row's launch from the same source; where the source changed, drop "
            f"the twin and measure it again).")
    if orphans:
        dispatcher, m, n, k, kernel, params = sorted(orphans)[0]
        raise ConfigError(
            f"{path}: {len(orphans)} same_as row(s) name a source row that is not written, e.g. "
            f"{kernel} {params} at {m}x{n}x{k} ({dispatcher}) (rule: a same_as row's figures are its "
            f"source row's, written once, in that row); keep the source rows or drop the twins.")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for r in sorted(measured, key=sort_key):
            texts = [_change_text(r["params"], twin) for twin in sorted(twins.get(_key(r, r["params"]), ()))]
            writer.writerow({**{c: r.get(c) for c in COLUMNS},  # json.dumps' own list layout
                             "same_launch": f"[{', '.join(texts)}]" if texts else None})
    tmp.replace(path)
    return path


def held_pairs(rows: list[dict]) -> dict:
    """{(dispatcher, kernel): {shape: params keys}} of evidence rows (a same_as row too: its
    candidate builds the measured one's kernel there)."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["dispatcher"], r["kernel"]), {}).setdefault(r["shape"], set()).add(
            r["params"] if isinstance(r["params"], str) else params_key(r["params"]))
    return out
