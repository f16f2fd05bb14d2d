"""Show the newest sweep tracked in MLflow: the parent run, and per job its kernel, M x N x K,
GFLOP/s and status, as mlflow.search_runs returns them.

Usage: python benchmarks/mlflow_report.py [--tracking-uri URI] [--experiment NAME]
The store defaults to the runner's: MLFLOW_TRACKING_URI, else sqlite mlflow.db in the current
directory (run it from the project root). Without --experiment every experiment is searched.
Exits 1 when there is no sweep. Run on the GPU box after a sweep; mlflow-skinny is enough.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from src.sweep.tracking.store import resolve_tracking_uri, sqlite_path  # noqa: E402

COLUMNS = {  # search_runs column -> printed name
    "tags.mlflow.runName": "run", "params.kernel": "kernel", "mxnxk": "m x n x k",
    "metrics.gflops": "GFLOP/s", "metrics.pct_of_cublas_fp32": "% cuBLAS FP32",
    "status": "status", "tags.status": "job status",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", help="default: as the runner (see above)")
    parser.add_argument("--experiment", help="experiment name (default: every experiment)")
    args = parser.parse_args(argv)

    uri = resolve_tracking_uri(args.tracking_uri, Path.cwd())
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        print(f"no MLflow store at {db}: run a sweep first, or pass --tracking-uri")
        return 1
    import mlflow

    mlflow.set_tracking_uri(uri)
    where = ({"experiment_names": [args.experiment]} if args.experiment
             else {"search_all_experiments": True})
    sweeps = mlflow.search_runs(filter_string="tags.kind = 'sweep'", max_results=1,
                                order_by=["attributes.start_time DESC"], **where)
    if sweeps.empty:
        print(f"no sweep in {uri}" + (f" (experiment {args.experiment})" if args.experiment else ""))
        return 1
    sweep = sweeps.iloc[0]
    jobs = mlflow.search_runs(experiment_ids=[sweep.experiment_id], max_results=50000,
                              filter_string=f"tags.`mlflow.parentRunId` = '{sweep.run_id}'")

    print(f"store:      {uri}")
    print(f"experiment: {mlflow.get_experiment(sweep.experiment_id).name}")
    print(f"sweep run:  {sweep.run_id}  ({sweep.get('tags.mlflow.runName')}, {sweep.status})")
    print(f"sweep dir:  {sweep.get('tags.sweep_dir')}")
    print(f"command:    {sweep.get('params.overrides')}")
    counts = {k: sweep.get(f"tags.{k}") for k in ("jobs", "jobs_ok", "jobs_failed", "jobs_killed")}
    print("jobs:       " + ", ".join(f"{k.removeprefix('jobs_') if k != 'jobs' else 'total'} {v}"
                                     for k, v in counts.items()))
    if jobs.empty:
        print("(no job runs)")
        return 0
    jobs["mxnxk"] = jobs["params.m"] + "x" + jobs["params.n"] + "x" + jobs["params.k"]
    jobs["num"] = jobs["tags.mlflow.runName"].str.extract(r"^(\d+)_", expand=False).astype(float)
    jobs = jobs.sort_values(["num", "tags.mlflow.runName"])
    table = jobs.reindex(columns=list(COLUMNS)).rename(columns=COLUMNS)
    print()
    print(table.to_string(index=False, na_rep="", float_format=lambda x: f"{x:,.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
