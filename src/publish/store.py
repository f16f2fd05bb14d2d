"""Published store step: the published runs (every GPU's results/<gpu>/runs.csv and suite_runs.csv) -> an MLflow
store that anyone can open, with or without a GPU (`sgemm-lab ui --published`).

`python -m src.publish.store [RUNS.csv ...] [-o .sgemm_cache/published/mlflow.db]`

One experiment, `sgemm-lab/published`; per CSV a parent run (a GPU's progression, its suite) and per
row a job run nested under it, logged as the job logged itself on the GPU (src/sweep/tracking/
job_run.py: params, rounded metrics, tags, the description: figures, or the error of a failed
job) and saying where it comes from (the CSV, its job, the GPU and date). Nothing is measured
here. The experiment carries the lab's saved view (the figures as columns) and, as its
description, links to the questions of docs/tracking.md.

Built on demand into a git-ignored folder rather than committed: the store's schema is that of
the MLflow installed (pyproject asks for mlflow>=3; a store made by another version is refused
until migrated), and a rebuilt store differs in every run id. The experiment's tag STAMP_TAG holds
a hash of what it was built from (the CSVs, the code that writes the runs, the store's path), so
`ensure_published` rebuilds it only when one of them changed.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path

from src.paths import ROOT, published_sets
from src.records.record import Record

EXPERIMENT = "sgemm-lab/published"
# every published GPU's progression and suite runs (a set measured without a suite has no suite_runs.csv)
DEFAULT_SOURCES = tuple(path for s in published_sets() for path in (s / "runs.csv", s / "suite_runs.csv")
                        if path.is_file())
DEFAULT_STORE = ROOT / ".sgemm_cache" / "published" / "mlflow.db"
TITLES = {"runs.csv": "progression", "suite_runs.csv": "shape suite"}  # a parent run's name, by file
STAMP_TAG = "sgemm_lab.published_from"
# the code that decides what a run holds: a change to it rebuilds the store
WRITERS = (Path(__file__), ROOT / "src" / "sweep" / "tracking" / "job_run.py",
           ROOT / "src" / "sweep" / "tracking" / "views.py")


def stamp(sources: list[Path], db: Path) -> str:
    digest = hashlib.sha256(str(db.resolve()).encode())
    for path in [*WRITERS, *sources]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def stamp_of(db: Path) -> str | None:
    """The stamp a built store carries (None: no store, or not one of these)."""
    if not db.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            row = conn.execute(
                "SELECT t.value FROM experiment_tags t JOIN experiments e "
                "ON e.experiment_id = t.experiment_id WHERE e.name = ? AND t.key = ?",
                (EXPERIMENT, STAMP_TAG)).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else row[0]


def ensure_published(db: Path = DEFAULT_STORE, sources=DEFAULT_SOURCES) -> bool:
    """The published store at `db`, built if missing or made from other inputs; True if built."""
    sources = [Path(s) for s in sources]
    if stamp_of(db) == stamp(sources, db):
        return False
    print(f"building the published MLflow store {db} from "
          f"{', '.join(rel(s) for s in sources)} (once; seconds)", file=sys.stderr)
    build(sources, db)
    return True


def rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def millis(timestamp: str | None) -> int | None:
    return None if not timestamp else int(datetime.fromisoformat(timestamp).timestamp() * 1000)


def job_params(record: Record, row: dict) -> dict[str, str]:
    """As a job logs them: what ran (kernel, shape, precision), what it resolved (entry, launch,
    tile parameters), and the timing protocol (the row's bench.* columns)."""
    from src.sweep.tracking.job_run import result_params

    params = {"kernel": record.kernel, "precision": record.precision, "m": str(record.m),
              "n": str(record.n), "k": str(record.k), "alpha": str(record.alpha),
              "beta": str(record.beta), **result_params(record, bool(record.params))}
    for key, value in row.items():
        if key.startswith("bench.") and value == value and value is not None:  # NaN: not set
            params[key] = str(value)
    return params


def provenance(record: Record, source: Path, job: str) -> str:
    where = f"{record.gpu or 'the GPU'}" + (f", {record.timestamp}" if record.timestamp else "")
    return (f"\nMeasured on {where} by job `{job}`; rebuilt from the published {rel(source)} "
            f"(`python -m src.publish.store`): nothing here was measured on this machine.\n")


def parent_note(title: str, source: Path, records: list[Record]) -> str:
    failed = [r for r in records if not r.ok]
    gpus = sorted({r.gpu for r in records if r.gpu})
    stamps = sorted(r.timestamp for r in records if r.timestamp)
    note = (f"The published {title}: {len(records)} jobs from {rel(source)}, measured on "
            f"{', '.join(gpus) or 'a GPU'}" + (f" from {stamps[0]} to {stamps[-1]}" if stamps else "")
            + f". {len(records) - len(failed)} ok, {len(failed)} failed.\n")
    for record in failed:
        note += f"\n- failed: {record.kernel} {record.size_label}: {record.status}"
    return note + "\n"


def experiment_note(experiment: str, sources: list[Path]) -> str:
    from src.sweep.tracking.views import question_links

    lines = ["The published sgemm-lab runs, rebuilt from "
             + " and ".join(f"`{rel(s)}`" for s in sources)
             + " (each run's description says which job, GPU and date it comes from). Nothing "
             "here was measured on this machine.", ""]
    for what, url in question_links("", experiment).items():
        lines.append(f"- [{what}]({url})")
    return "\n".join(lines) + "\n"


def log_source(mlflow_client, experiment: str, source: Path) -> int:
    """A parent run for the CSV `source` and a job run per row; returns how many rows."""
    from src.records.collect import read_runs, records_from_runs  # pandas: only when building
    from src.sweep.tracking.job_run import description, record_metrics, record_tags, run_name
    from src.sweep.tracking.store import FAILED, FINISHED, first_line, log_batch

    frame = read_runs(source)
    records = records_from_runs(frame)
    rows = frame.to_dict("records")
    title = TITLES.get(source.name, source.stem)
    failed = sum(not r.ok for r in records)
    gpus = sorted({r.gpu for r in records if r.gpu})
    times = sorted(t for t in (millis(r.timestamp) for r in records) if t is not None)
    parent = mlflow_client.create_run(
        experiment, start_time=times[0] if times else None,
        run_name=f"{title}: {len(records)} jobs on {', '.join(gpus) or 'a GPU'} "
                 f"({len(records) - failed} ok, {failed} failed)",
        tags={"kind": "sweep", "source": rel(source), "mlflow.source.name": "src.publish.store",
              "mlflow.note.content": parent_note(title, source, records)}).info.run_id
    log_batch(mlflow_client, parent, metrics={"jobs": float(len(records)),
                                              "jobs_ok": float(len(records) - failed),
                                              "jobs_failed": float(failed)})
    for record, row in zip(records, rows):
        job = str(row["job"])
        tags = {"kind": "job", "mlflow.parentRunId": parent, "source": f"{rel(source)}:{job}",
                "mlflow.source.name": "src.publish.store", **record_tags(record),
                "mlflow.note.content": description(record) + provenance(record, source, job)}
        if not record.ok:
            tags["error"] = first_line(record.error or record.status)
        if record.mlflow_run_id:
            tags["recorded_run_id"] = record.mlflow_run_id  # the run in the GPU machine's store
        started = millis(record.timestamp)
        run = mlflow_client.create_run(experiment, start_time=started,
                                       run_name=run_name(record.kernel, record.m, record.n, record.k),
                                       tags=tags).info.run_id
        log_batch(mlflow_client, run, params=job_params(record, row), metrics=record_metrics(record))
        mlflow_client.set_terminated(run, FINISHED if record.ok else FAILED, end_time=started)
    mlflow_client.set_terminated(parent, FINISHED, end_time=times[-1] if times else None)
    return len(records)


def build(sources: list[Path], db: Path) -> int:
    """The store at `db` from `sources`, made whole beside it and moved over it (a reader never
    sees half a store); returns how many job runs it holds."""
    from src.sweep.tracking.store import ARTIFACTS_DIR, EXPERIMENT_TAGS, client
    from src.sweep.tracking.views import view_tags

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating tables..."
    db.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own per build: MLflow keeps one engine per store URI in a process, and one
    # reused here would write into the store moved into place by the build before
    fresh = db.with_name(f".{db.name}.{os.getpid()}.{time.time_ns()}.new")
    try:
        mlflow_client = client(f"sqlite:///{fresh.resolve()}")
        experiment = mlflow_client.create_experiment(
            EXPERIMENT, artifact_location=(db.parent.resolve() / ARTIFACTS_DIR / "published").as_uri(),
            tags={**EXPERIMENT_TAGS, **view_tags()})
        jobs = sum(log_source(mlflow_client, experiment, source) for source in sources)
        mlflow_client.set_experiment_tag(experiment, "mlflow.note.content",
                                         experiment_note(experiment, sources))
        mlflow_client.set_experiment_tag(experiment, STAMP_TAG, stamp(sources, db))  # last: whole
        fresh.replace(db)
    finally:
        fresh.unlink(missing_ok=True)
        fresh.with_name(fresh.name + ".lock").unlink(missing_ok=True)
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.publish.store",
                                     description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("sources", nargs="*", type=Path, default=list(DEFAULT_SOURCES),
                        help="runs CSVs written by src.records.collect (default: every published "
                             "GPU's runs.csv and suite_runs.csv)")
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_STORE, help="the sqlite store")
    args = parser.parse_args(argv)
    try:
        jobs = build(args.sources, args.out)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {jobs} job runs from {', '.join(rel(s) for s in args.sources)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
