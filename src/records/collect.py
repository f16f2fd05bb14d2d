"""Collect step: a sweep's job records -> one CSV with one row per job (results/runs.csv).

`python -m src.records.collect SWEEP_DIR [SWEEP_DIR|RECORDS.jsonl ...] -o results/runs.csv`

A sweep directory's jobs come with those of its replicate runs (SWEEP_DIR/replicates/run<n>/...,
written by src.sweep.replicate). Every Record field becomes a column, in the Record's order, after `job` (the Hydra job directory,
or `<file>:<line>` for a JSONL source) and `size` (the size label). Nested fields are flattened:
`params`, `grid`, `block` and the per-sample lists as compact JSON (a kernel's tile parameters differ from another's),
`device` and `bench` spread into `device.<key>` and `bench.<key>` columns (`bench.tolerance.fp32`).
A failed job keeps its status and error and has empty figures, exactly as in its record.
`read_runs` and `records_from_runs` read the file back for the table and plots steps;
`runs_refusal` says why a runs file may not enter a GPU's published set (jobs of another GPU, or
timed otherwise than their protocol asked: `protocol_shortfalls`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import fields
from pathlib import Path

import pandas as pd

from src.errors import StorageError
from src.records import math_units
from src.records.record import RECORD_FILE, REPLICATES_DIR, Record, read_record, record_paths

_JSON_FIELDS = ("params", "grid", "block", "sample_clock_mhz", "kernel_time_ms", "baseline_time_ms",
                "throttle_reasons", "clock_range_mhz", "sustained_clock_mhz", "peers_skipped",
                "autotune_candidates")
_SPREAD_FIELDS = ("device", "bench")
_RECORD_FIELDS = list(fields(Record))
SET_RULE = "rule: results/<gpu>/ holds figures measured on that GPU only"


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}", sub, out)
    else:
        out[prefix] = value


def record_row(record: Record, job: str) -> dict:
    """One flat row: scalars as they are, nested fields as described in the module docstring."""
    row: dict = {"job": job, "size": record.size_label}
    for f in _RECORD_FIELDS:
        value = getattr(record, f.name)
        if f.name in _JSON_FIELDS:
            row[f.name] = None if value is None else json.dumps(value, separators=(",", ":"))
        elif f.name in _SPREAD_FIELDS:
            _flatten(f.name, value or {}, row)
        else:
            row[f.name] = value
    return row


def load_source(source: Path) -> list[tuple[str, Record]]:
    """(job, record) pairs from a sweep directory or a JSONL file of records."""
    if source.is_dir():
        # the sweep's own jobs, then those of its replicate runs' sweeps (src.sweep.replicate)
        nested = sorted((source / REPLICATES_DIR).glob(f"run*/*/*/{RECORD_FILE}"),
                        key=lambda p: (p.parts[-4], p.parts[-3], _job_order(p)))
        return [(str(p.parent.relative_to(source)), read_record(p))
                for p in record_paths(source) + nested]
    pairs = []
    for lineno, line in enumerate(source.read_text().splitlines(), start=1):
        if line.strip():
            try:
                pairs.append((f"{source.name}:{lineno}", Record.from_dict(json.loads(line))))
            except (ValueError, TypeError) as exc:
                raise StorageError(f"{source}, line {lineno}, is not a job record "
                                   f"({type(exc).__name__}: {exc}) (rule: one JSON record a "
                                   f"line).") from None
    return pairs


def _job_order(path: Path) -> int:
    head = path.parent.name.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # full precision: the CSV carries exactly what the record did
    return str(value)


def write_runs(pairs: list[tuple[str, Record]], path: Path) -> int:
    """Write the runs CSV; the columns are the union over all rows, in first-seen order."""
    rows = [record_row(record, job) for job, record in pairs]
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(col)) for col in columns])
    return len(rows)


def read_runs(path: Path) -> pd.DataFrame:
    """The runs CSV as a frame (strings kept as strings; empty cells are NaN)."""
    frame = pd.read_csv(path, dtype={"kernel": str, "status": str, "error": str, "params": str,
                                     "size": str, "job": str, "gpu": str, "gpu_spec": str})
    missing = {"kernel", "precision", "backend", "m", "n", "k", "status", "gflops"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path} is not a runs CSV written by src.records.collect: no column(s) "
                         f"{', '.join(sorted(missing))}")
    return frame


def runs_refusal(spec: str, runs_csv: Path) -> str | None:
    """Why the collected runs may not enter `spec`'s set: jobs that name another GPU spec, or
    jobs timed otherwise than their protocol asked (`protocol_shortfalls`)."""
    with runs_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    others = sorted({row.get("gpu_spec") or "" for row in rows} - {spec, "", "unknown"})
    if others:  # empty / unknown: refused before any GPU
        return (f"refusing to publish {runs_csv} into results/{spec}/: it holds jobs measured on "
                f"{', '.join(others)} ({SET_RULE}).")
    shortfalls = protocol_shortfalls(rows)
    if shortfalls:
        return (f"refusing to publish {runs_csv} into results/{spec}/: " + "; ".join(shortfalls)
                + f" ({PROTOCOL_RULE}). Send the project's optional CUDA packages with the run "
                f"(cupti-python, nvmath-python: pyproject's `cuda13` extra) and measure again.")
    return None


PROTOCOL_RULE = "rule: a published figure was timed by the clock and against the baselines its protocol names"


def protocol_shortfalls(rows: list[dict]) -> list[str]:
    """What the measured jobs (status ok) of collected runs lack of the protocol each names: the
    clock it asked for (`bench.timer`; CUDA events stand in when CUPTI's bindings are missing)
    and, with `bench.best_cublas`, the autotuned cuBLASLt baseline (empty when nvmath-python is
    missing or refuses): each a line naming how many jobs and the first shapes."""
    def shapes(bad):
        return ", ".join(f"{r.get('m')}x{r.get('n')}x{r.get('k')}" for r in bad[:3]) + (
            ", ..." if len(bad) > 3 else "")

    measured = [r for r in rows if r.get("status") == "ok"]
    clock = [r for r in measured if r.get("bench.timer") and r.get("timer")
             and r["timer"] != r["bench.timer"]]
    baseline = [r for r in measured if str(r.get("bench.best_cublas", "")).lower() == "true"
                and r.get("backend") != "cublas" and not r.get("cublaslt_gflops")]  # (cuBLAS's own rows compare to none)
    out = []
    if clock:
        out.append(f"{len(clock)} job(s) were timed by {clock[0]['timer']} where the protocol asks "
                   f"{clock[0]['bench.timer']} ({shapes(clock)})")
    if baseline:
        out.append(f"{len(baseline)} job(s) asked for the stronger cuBLAS (bench.best_cublas) "
                   f"but cuBLASLt autotuned did not run ({shapes(baseline)})")
    return out


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def records_from_runs(frame: pd.DataFrame) -> list[Record]:
    """The Record fields of each row, typed again, with `device` gathered from its columns
    (`bench` stays in the frame)."""
    records = []
    for row in frame.to_dict("records"):
        data = {}
        for f in _RECORD_FIELDS:
            if f.name == "device":  # which card of which machine: replicates count machines
                data["device"] = {key[len("device."):]: value for key, value in row.items()
                                  if key.startswith("device.") and not _missing(value)}
                continue
            value = row.get(f.name)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            if f.name in _JSON_FIELDS:
                value = json.loads(value)
            elif f.name in _SPREAD_FIELDS:
                continue
            elif str(f.type).startswith("int"):
                value = int(value)
            elif str(f.type).startswith("float"):
                value = float(value)
            elif str(f.type).startswith("str"):
                value = str(value)
            data[f.name] = value
        record = Record.from_dict(data)
        record.math = math_units.of_record(record)  # runs recorded before records carried it
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m src.records.collect",
        description="Flatten job records (a Hydra sweep directory, or JSONL files of records) "
                    "into one CSV with one row per job.")
    parser.add_argument("sources", nargs="+", type=Path,
                        help="sweep directories (<n>_<kernel>_<m>x<n>x<k>/record.json) or .jsonl files")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the CSV to write")
    args = parser.parse_args(argv)

    pairs: list[tuple[str, Record]] = []
    for source in args.sources:
        if not source.exists():
            parser.exit(1, f"error: {source} does not exist\n")
        try:
            found = load_source(source)
        except StorageError as exc:  # published results are never made from a partial sweep
            parser.exit(1, f"error [{exc.status}]: {exc} No CSV was written.\n")
        if not found:
            parser.exit(1, f"error: no {RECORD_FILE} under {source} (did the sweep run?)\n")
        pairs += found
    n = write_runs(pairs, args.out)
    failed = sum(not record.ok for _, record in pairs)
    print(f"{n} jobs ({n - failed} ok, {failed} failed) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
