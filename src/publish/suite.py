"""Suite step: the shape suite's runs (conf/suite/, kernel=best_fp32 and best_tf32) -> results/suite/.

`python -m src.publish.suite results/suite/runs.csv --out-dir results/suite`

Per GPU spec (h100_sxm, h200, ...), from the records of that GPU:
- <gpu>.csv: one row per dispatching kernel and shape: the suite it belongs to, the chapter the
  dispatch chose and the rule that chose it, GFLOP/s, the ratio to cuBLAS's default (paired, with
  its 95% interval and verdict) and to the stronger of cuBLAS default and autotuned cuBLASLt.
- <gpu>.md: the same as a table per precision, sorted by ratio, headed by the summary (shapes
  per math, and the measurement sessions the rows come from).
- <gpu>.png: the ratio per shape, sorted, log scale, 1.0 marked, one panel per precision,
  each point coloured by its math (FFMA, 3xTF32 or TF32).
- <gpu>_wide.md: the tables with both ratios' 95% intervals and which cuBLAS was stronger.
and metrics.json (dvc.yaml: results/suite_metrics.json): per GPU and precision, the geometric mean and minimum of both ratios over the
shapes that ran, the number of shapes and of failed ones. A failed job has no ratio anywhere: it
is counted as failed, and a goal over "every shape" is not met while any failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from src.paths import CONF_DIR
from src.records import math_units
from src.records.collect import read_runs

DISPATCHERS = {"best_fp32": "fp32", "best_tf32": "tf32"}
COLUMNS = ["suite", "shape", "m", "n", "k", "alpha", "beta", "kernel", "chosen", "math", "rule",
           "status",
           "gflops", "baseline", "baseline_gflops", "ratio", "ratio_ci_low", "ratio_ci_high",
           "verdict", "cublaslt_gflops", "best_cublas", "ratio_best", "ratio_best_ci_low",
           "ratio_best_ci_high", "verdict_best", "rel_err", "error"]


def suites(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """Shape "MxNxK" -> the suite that lists it (conf/suite/*.yaml, hydra.sweeper.params.shape).
    The hand-written suites only: the generated shape sets (training, heldout; their files say
    `generated_from`) are not the published suite."""
    found = {}
    for path in sorted((conf_dir / "suite").glob("*.yaml")):
        data = OmegaConf.load(path)
        if "generated_from" in data:
            continue
        shapes = data.hydra.sweeper.params.shape
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
            "math": _text(getattr(r, "math", None))
            or math_units.of_chapter(_text(getattr(r, "dispatched_to", None))),
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
        # which math the dispatch ran (best_fp32: FFMA or 3xTF32, both FP32-accurate)
        entry["by_math"] = {}
        for kind in math_units.ORDER if "math" in rows else ():  # not `math`: the module's name
            mine = rows[rows["math"] == kind]
            if len(mine):
                measured = mine[mine.status == "ok"].ratio.dropna()
                entry["by_math"][kind] = {
                    "shapes": int(len(mine)),
                    "geomean_vs_default": round(geomean(measured), 4) if len(measured) else None}
        out[precision] = entry
    return out


def sessions(timestamps, gap_hours: float = 1.0) -> list[tuple[str, str, int]]:
    """The measurement sessions behind a table: job timestamps split where more than `gap_hours`
    pass between two jobs; (first, last, jobs) each."""
    stamps = sorted(pd.to_datetime(pd.Series(list(timestamps)).dropna(), utc=True))
    found: list[list] = []
    for stamp in stamps:
        if found and (stamp - found[-1][1]).total_seconds() <= gap_hours * 3600:
            found[-1][1], found[-1][2] = stamp, found[-1][2] + 1
        else:
            found.append([stamp, stamp, 1])
    return [(a.strftime("%Y-%m-%d %H:%M"), b.strftime("%H:%M"), n) for a, b, n in found]


def _maths(counts: dict) -> str:
    return ", ".join(f"{math_units.label(m)} {c['shapes']}" for m, c in counts.items())


def markdown(frame: pd.DataFrame, gpu_spec: str, gpus: list[str], timestamps=()) -> str:
    lines = [f"# Shape suite on {', '.join(gpus) or gpu_spec} ({gpu_spec})", ""]
    stats = summary(frame)
    lines += ["| precision | kernel | shapes (math) | failed | geomean / min vs cuBLAS | "
              "geomean / min vs best cuBLAS |", "| --- | --- | --- | --- | --- | --- |"]
    for precision, s in stats.items():
        d, b = s.get("vs_default", {}), s.get("vs_best", {})
        lines.append(f"| {precision} | {s['kernel']} | {s['shapes']} ({_maths(s['by_math'])}) | "
                     f"{s['failed']} | {d.get('geomean', '')} / {d.get('min', '')} "
                     f"({d.get('min_shape', '')}) | {b.get('geomean', '')} / {b.get('min', '')} "
                     f"({b.get('min_shape', '')}) |")
    notes = ["The math column says what each shape ran on: FFMA (FP32 on the SIMT cores), 3xTF32 "
             "(FP32-accurate: three TF32 products on the tensor cores, verified at the FP32 "
             "tolerance and paired with cuBLAS FP32, which runs FFMA) or TF32 (tensor cores, TF32 "
             "accuracy). best_fp32's figures are FFMA's only where its math says FFMA.",
             "Ratios are kernel speed / baseline speed, paired in the same job, with 95% "
             "intervals; `best cuBLAS` is the stronger of cuBLAS's default and autotuned "
             "cuBLASLt at that shape. faster / slower only when the interval excludes 1.0."]
    runs = sessions(timestamps)
    if len(runs) > 1:
        notes.append(f"The rows come from {len(runs)} measurement sessions (jobs more than an "
                     "hour apart start a new one; a row re-measured later replaced the earlier "
                     "one, by kernel and shape): " + "; ".join(
                         f"{a}-{b} UTC ({n} jobs)" for a, b, n in runs) + ".")
    lines += [""] + [textwrap.fill(note, 100) + "\n" for note in notes]
    for kernel in DISPATCHERS:
        rows = frame[frame.kernel == kernel].sort_values("ratio", na_position="first")
        if rows.empty:
            continue
        lines += [f"## {kernel}", "", "| suite | shape | chosen | math | GFLOP/s | vs cuBLAS | "
                  "vs best cuBLAS |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows.itertuples(index=False):
            math = math_units.label(r.math) if isinstance(r.math, str) else ""
            if r.status != "ok":
                lines.append(f"| {r.suite} | {r.shape} | {r.chosen or ''} | {math} | {r.status} | | |")
                continue
            best = "" if pd.isna(r.ratio_best) else f"{r.ratio_best:.3f} {r.verdict_best}"
            lines.append(f"| {r.suite} | {r.shape} | {r.chosen} | {math} | {r.gflops:,.1f} | "
                         f"{r.ratio:.3f} {r.verdict} | {best} |")
        lines.append("")
    lines.append(f"Intervals and which cuBLAS was stronger: {gpu_spec}_wide.md and {gpu_spec}.csv.")
    return "\n".join(lines) + "\n"


def markdown_wide(frame: pd.DataFrame, gpu_spec: str) -> str:
    """Every shape with both ratios' 95% intervals and which cuBLAS was the stronger."""
    lines = [f"# Shape suite on {gpu_spec}: intervals", ""]
    for kernel in DISPATCHERS:
        rows = frame[frame.kernel == kernel].sort_values("ratio", na_position="first")
        if rows.empty:
            continue
        lines += [f"## {kernel}", "", "| suite | shape | chosen | math | GFLOP/s | vs cuBLAS | "
                  "vs best cuBLAS (which) |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows.itertuples(index=False):
            math = math_units.label(r.math) if isinstance(r.math, str) else ""
            if r.status != "ok":
                lines.append(f"| {r.suite} | {r.shape} | {r.chosen or ''} | {math} | {r.status} | | |")
                continue
            best = "" if pd.isna(r.ratio_best) else (
                f"{r.ratio_best:.3f} [{r.ratio_best_ci_low:.3f}, {r.ratio_best_ci_high:.3f}] "
                f"{r.verdict_best} ({r.best_cublas})")
            lines.append(f"| {r.suite} | {r.shape} | {r.chosen} | {math} | {r.gflops:,.1f} | "
                         f"{r.ratio:.3f} [{r.ratio_ci_low:.3f}, {r.ratio_ci_high:.3f}] "
                         f"{r.verdict} | {best} |")
        lines.append("")
    return "\n".join(lines)


MATH_COLOURS = {"ffma": "#1f77b4", "3xtf32": "#2ca02c", "tf32": "#ff7f0e"}
RATIO_TICKS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)


def figure(frame: pd.DataFrame, gpu_spec: str):
    """One panel per dispatching kernel: its ratio to cuBLAS per shape, sorted, on a log axis
    labelled at readable steps; each point coloured by the math the shape ran on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    kernels = [k for k in DISPATCHERS if (frame.kernel == k).any()]
    fig, axes = plt.subplots(1, max(len(kernels), 1), figsize=(7 * max(len(kernels), 1), 6),
                             squeeze=False)
    for ax, kernel in zip(axes[0], kernels):
        rows = frame[(frame.kernel == kernel) & (frame.status == "ok")].sort_values("ratio")
        x = list(range(len(rows)))
        colours = [MATH_COLOURS.get(m, "0.4") for m in rows["math"]]
        ax.scatter(x, rows.ratio, s=22, c=colours, zorder=3)
        if rows.ratio_best.notna().any():
            ax.scatter(x, rows.ratio_best, s=22, c=colours, marker="x", zorder=3)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_yscale("log")
        values = pd.concat([rows.ratio, rows.ratio_best]).dropna()
        low, high = (float(values.min()), float(values.max())) if len(values) else (0.9, 1.1)
        ax.set_ylim(min(low, 0.95) / 1.05, max(high, 1.05) * 1.05)
        ax.yaxis.set_major_locator(FixedLocator([t for t in RATIO_TICKS
                                                 if low / 1.2 <= t <= high * 1.2]))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(lambda value, _: f"{value:g}x")
        ax.set_xticks(x)
        ax.set_xticklabels(rows["shape"], rotation=90, fontsize=6)
        ax.set_xlabel("shape (M x N x K), sorted by the ratio to cuBLAS's default")
        ax.set_ylabel("speed / cuBLAS speed (log scale; 1x = cuBLAS)")
        maths = [m for m in math_units.ORDER if (rows["math"] == m).any()]
        ax.set_title(f"{kernel} on {gpu_spec}: {len(rows)} shapes ("
                     + ", ".join(f"{math_units.label(m)} {(rows['math'] == m).sum()}" for m in maths)
                     + ")")
        ax.grid(True, which="major", axis="y", alpha=0.3)
        handles = [Line2D([], [], linestyle="", marker="o", color=MATH_COLOURS[m],
                          label=f"{math_units.label(m)}: {math_units.MEANING[m]}") for m in maths]
        handles += [Line2D([], [], linestyle="", marker="o", color="0.3", label="vs cuBLAS default"),
                    Line2D([], [], linestyle="", marker="x", color="0.3", label="vs best cuBLAS")]
        ax.legend(handles=handles, fontsize=8, loc="upper left")
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
        stamps = runs[runs.gpu_spec == gpu_spec].timestamp \
            if {"gpu_spec", "timestamp"} <= set(runs.columns) else []
        (out_dir / f"{gpu_spec}.md").write_text(markdown(rows, gpu_spec, gpus, stamps))
        (out_dir / f"{gpu_spec}_wide.md").write_text(markdown_wide(rows, gpu_spec))
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
