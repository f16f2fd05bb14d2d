"""Suite step: the shape suite's runs (conf/suite/, kernel=best_fp32 and best_tf32) -> results/suite/.

`python -m src.publish.suite results/suite/runs.csv --out-dir results/suite`

Per GPU spec (h100_sxm, h200, ...), from the records of that GPU:
- <gpu>.csv: one row per dispatching kernel and shape: the suite it belongs to, the chapter the
  dispatch chose and the rule that chose it, GFLOP/s, the ratio to cuBLAS's default (paired, with
  its 95% interval and verdict) and to the stronger of cuBLAS default and autotuned cuBLASLt.
- <gpu>.md: the same as a table per precision, sorted by ratio, headed by the summary.
- <gpu>.png: the ratio per shape, sorted, log scale, 1.0 marked, one panel per precision.
and metrics.json (dvc.yaml: results/suite_metrics.json): per GPU and precision, the geometric mean and minimum of both ratios over the
shapes that ran, the number of shapes and of failed ones. A failed job has no ratio anywhere: it
is counted as failed, and a goal over "every shape" is not met while any failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from src.paths import CONF_DIR
from src.records.collect import read_runs

DISPATCHERS = {"best_fp32": "fp32", "best_tf32": "tf32"}
COLUMNS = ["suite", "shape", "m", "n", "k", "alpha", "beta", "kernel", "chosen", "rule", "status",
           "gflops", "baseline", "baseline_gflops", "ratio", "ratio_ci_low", "ratio_ci_high",
           "verdict", "cublaslt_gflops", "best_cublas", "ratio_best", "ratio_best_ci_low",
           "ratio_best_ci_high", "verdict_best", "rel_err", "error"]


def suites(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """Shape "MxNxK" -> the suite that lists it (conf/suite/*.yaml, hydra.sweeper.params.shape)."""
    found = {}
    for path in sorted((conf_dir / "suite").glob("*.yaml")):
        shapes = OmegaConf.load(path).hydra.sweeper.params.shape
        for shape in str(shapes).split(","):
            found.setdefault(shape.strip(), path.stem)
    return found


def _text(value) -> str | None:
    return None if value is None or pd.isna(value) else str(value)


def _number(value, digits: int):
    return None if value is None or pd.isna(value) else round(float(value), digits)


def suite_frame(runs: pd.DataFrame, conf_dir: Path = CONF_DIR) -> pd.DataFrame:
    """The dispatching kernels' rows of a runs frame, as COLUMNS (ratios as factors, not %)."""
    named = suites(conf_dir)
    rows = []
    mine = runs[runs.kernel.isin(DISPATCHERS)]
    for r in mine.itertuples(index=False):
        shape = f"{int(r.m)}x{int(r.n)}x{int(r.k)}"
        ok = r.status == "ok"
        get = lambda column: getattr(r, column, None) if ok else None  # noqa: E731
        ratio = lambda column: None if get(column) is None or pd.isna(get(column)) \
            else round(float(get(column)) / 100, 4)  # noqa: E731
        rows.append({
            "suite": named.get(shape, "other"), "shape": shape, "m": int(r.m), "n": int(r.n),
            "k": int(r.k), "alpha": r.alpha, "beta": r.beta, "kernel": r.kernel,
            "chosen": _text(getattr(r, "dispatched_to", None)),
            "rule": _text(getattr(r, "dispatch_rule", None)),
            "status": r.status, "gflops": _number(get("gflops"), 1),
            "baseline": get("baseline"), "baseline_gflops": _number(get("baseline_gflops"), 1),
            "ratio": ratio("pct_of_cublas"), "ratio_ci_low": ratio("pct_ci_low"),
            "ratio_ci_high": ratio("pct_ci_high"), "verdict": get("verdict"),
            "cublaslt_gflops": _number(get("cublaslt_gflops"), 1),
            "best_cublas": get("best_cublas"), "ratio_best": ratio("pct_of_best_cublas"),
            "ratio_best_ci_low": ratio("pct_best_ci_low"),
            "ratio_best_ci_high": ratio("pct_best_ci_high"), "verdict_best": get("verdict_best"),
            "rel_err": _number(getattr(r, "rel_err", None), 10),
            "error": None if ok else getattr(r, "error", None),
            "gpu_spec": _text(getattr(r, "gpu_spec", None)) or "unknown"})
    frame = pd.DataFrame(rows, columns=COLUMNS + ["gpu_spec"])
    # a job refused before it reached the GPU (a shape its chapter does not run) records no GPU;
    # a sweep runs on one, so it is that sweep's
    specs = set(frame.gpu_spec) - {"unknown"}
    if len(specs) == 1:
        frame["gpu_spec"] = specs.pop()
    return frame.sort_values(["gpu_spec", "kernel", "suite", "m", "n", "k"], kind="stable")


def geomean(values) -> float | None:
    values = [float(v) for v in values if v is not None and not pd.isna(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(frame: pd.DataFrame) -> dict:
    """Per dispatching kernel's precision: shapes, failed, and the geometric mean and minimum
    of the ratio to cuBLAS default (`vs_default`) and to the stronger cuBLAS (`vs_best`)."""
    out = {}
    for kernel, precision in DISPATCHERS.items():
        rows = frame[frame.kernel == kernel]
        if rows.empty:
            continue
        ok = rows[rows.status == "ok"]
        entry = {"kernel": kernel, "shapes": int(len(rows)), "failed": int(len(rows) - len(ok))}
        for key, column in (("vs_default", "ratio"), ("vs_best", "ratio_best")):
            values = ok[column].dropna()
            if len(values):
                low = ok.loc[values.idxmin()]
                entry[key] = {"geomean": round(geomean(values), 4), "min": round(float(values.min()), 4),
                              "min_shape": low["shape"], "shapes_measured": int(len(values))}
        out[precision] = entry
    return out


def markdown(frame: pd.DataFrame, gpu_spec: str, gpus: list[str]) -> str:
    lines = [f"# Shape suite on {', '.join(gpus) or gpu_spec} ({gpu_spec})", ""]
    stats = summary(frame)
    lines += ["| precision | kernel | shapes | failed | geomean vs cuBLAS | min vs cuBLAS | "
              "geomean vs best cuBLAS | min vs best cuBLAS |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for precision, s in stats.items():
        d, b = s.get("vs_default", {}), s.get("vs_best", {})
        lines.append(f"| {precision} | {s['kernel']} | {s['shapes']} | {s['failed']} | "
                     f"{d.get('geomean', '')} | {d.get('min', '')} ({d.get('min_shape', '')}) | "
                     f"{b.get('geomean', '')} | {b.get('min', '')} ({b.get('min_shape', '')}) |")
    lines += ["", "Ratios are kernel speed / baseline speed, paired in the same job, with 95% "
              "intervals; `best cuBLAS` is the stronger of cuBLAS's default and autotuned "
              "cuBLASLt at that shape. faster / slower only when the interval excludes 1.0.", ""]
    for kernel in DISPATCHERS:
        rows = frame[frame.kernel == kernel].sort_values("ratio", na_position="first")
        if rows.empty:
            continue
        lines += [f"## {kernel}", "", "| suite | shape | chosen | GFLOP/s | vs cuBLAS | "
                  "vs best cuBLAS (which) |", "| --- | --- | --- | --- | --- | --- |"]
        for r in rows.itertuples(index=False):
            if r.status != "ok":
                lines.append(f"| {r.suite} | {r.shape} | {r.chosen or ''} | {r.status} | | |")
                continue
            best = "" if pd.isna(r.ratio_best) else (
                f"{r.ratio_best:.3f} [{r.ratio_best_ci_low:.3f}, {r.ratio_best_ci_high:.3f}] "
                f"{r.verdict_best} ({r.best_cublas})")
            lines.append(f"| {r.suite} | {r.shape} | {r.chosen} | {r.gflops:,.1f} | "
                         f"{r.ratio:.3f} [{r.ratio_ci_low:.3f}, {r.ratio_ci_high:.3f}] "
                         f"{r.verdict} | {best} |")
        lines.append("")
    return "\n".join(lines)


def figure(frame: pd.DataFrame, gpu_spec: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = [k for k in DISPATCHERS if (frame.kernel == k).any()]
    fig, axes = plt.subplots(1, max(len(kernels), 1), figsize=(7 * max(len(kernels), 1), 6),
                             squeeze=False)
    for ax, kernel in zip(axes[0], kernels):
        rows = frame[(frame.kernel == kernel) & (frame.status == "ok")].sort_values("ratio")
        x = range(len(rows))
        ax.scatter(x, rows.ratio, s=18, label="vs cuBLAS default", zorder=3)
        if rows.ratio_best.notna().any():
            ax.scatter(x, rows.ratio_best, s=18, marker="x", label="vs best cuBLAS", zorder=3)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels(rows["shape"], rotation=90, fontsize=6)
        ax.set_ylabel("speed ratio (log scale)")
        ax.set_title(f"{kernel} on {gpu_spec}: {len(rows)} shapes, sorted")
        ax.grid(True, which="both", axis="y", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def publish(runs_csv: Path, out_dir: Path, metrics_path: Path | None = None) -> dict:
    """Write the per-GPU files into out_dir; the metrics of every GPU published there (this
    run's and earlier ones', read back from their CSVs) to metrics_path (default
    out_dir/metrics.json). Returns the metrics."""
    frame = suite_frame(read_runs(runs_csv))
    if frame.empty:
        raise ValueError(f"{runs_csv} has no best_fp32 / best_tf32 jobs: nothing to publish")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = read_runs(runs_csv)
    metrics = {}
    for gpu_spec, rows in frame.groupby("gpu_spec"):
        gpus = sorted(runs[(runs.get("gpu_spec") == gpu_spec)].gpu.dropna().unique()) \
            if "gpu_spec" in runs else []
        rows = rows.drop(columns="gpu_spec")
        rows.to_csv(out_dir / f"{gpu_spec}.csv", index=False)
        (out_dir / f"{gpu_spec}.md").write_text(markdown(rows, gpu_spec, gpus))
        fig = figure(rows, gpu_spec)
        fig.savefig(out_dir / f"{gpu_spec}.png", dpi=110)
    for path in sorted(out_dir.glob("*.csv")):  # every GPU published so far, this one re-read too
        metrics[path.stem] = summary(pd.read_csv(path))
    target = metrics_path or out_dir / "metrics.json"
    target.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="runs CSV of the suite sweeps (src.records.collect)")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--metrics", type=Path, default=None,
                        help="where metrics.json goes (default: OUT_DIR/metrics.json)")
    args = parser.parse_args(argv)
    try:
        metrics = publish(args.runs, args.out_dir, args.metrics)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
