"""A tuning sweep's trials and best result, in the shapes its MLflow parent run keeps them: tags
with the counts and the best parameters, and a table with one row per trial."""

from __future__ import annotations

import json

from src.records.record import Record

def tuning_tags(summaries: list[dict]) -> dict[str, str]:
    """A tuning sweep's counts and best result, as tags of its run (summed over its problems;
    the best is the first problem's)."""
    tags = {f"tune_{name}": str(sum(s[name] for s in summaries))
            for name in ("pruned", "measured", "from_cache", "ok", "failed_compile",
                         "failed_verification", "failed_other")}
    if summaries:
        tags["tune_strategy"] = summaries[0]["strategy"]
        best = summaries[0].get("best")
        if best:
            tags["tune_best_gflops"] = f"{best['gflops']:.1f}"
            tags["tune_best_params"] = json.dumps(best["params"], sort_keys=True)
    return tags


def trials_frame(records: list[Record]):
    """One row per trial of a tuning sweep: its tile parameters, status, figures, whether it was
    reused from the cache, and the MLflow run that measured it (this sweep's child, or the
    earlier sweep's run for a reused measurement)."""
    import pandas as pd

    rows = []
    for r in records:
        rows.append({**{f"param.{k}": v for k, v in r.params.items()}, "status": r.status,
                     "gflops": r.gflops, "pct_of_cublas_fp32": r.pct_of_cublas_fp32,
                     "registers": r.registers, "from_cache": r.from_cache,
                     "measured_at": r.timestamp, "mlflow_run_id": r.mlflow_run_id})
    return pd.DataFrame(rows)
