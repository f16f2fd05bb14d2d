"""Compare step: every GPU's published set (results/<gpu>/) side by side -> results/compare/.

`python -m src.publish.compare --gpus h100_sxm h200 --results results --out-dir results/compare`

The GPUs are the specs named (params.yaml: published.gpus), in that order; a GPU whose set holds
no table (never measured) or lacks a row is shown as "not measured", never dropped. Nothing is
measured here: the figures are the per-GPU tables' (results/<gpu>/progression.csv, suite.csv).
- progression.csv: one row per kernel, size and GPU: status (ok, the failure, or not measured),
  GFLOP/s, % of cuBLAS in the kernel's precision and its verdict, the GPU's name.
- progression.md: kernel x size, a line per GPU under each kernel, each cell 'GFLOP/s %';
  headline.md: the same for the headline kernels (--headline), the README's table.
- suite.csv: one row per dispatching kernel, shape and GPU: the chapter chosen, math, GFLOP/s,
  ratio to cuBLAS and to the stronger cuBLAS; suite.md: the per-GPU geometric means and minima,
  then each shape's ratio with a column per GPU.
- progression.png: per hand-written kernel at the largest size, % of cuBLAS and GFLOP/s with a
  bar per GPU; suite.png: each shape's ratio to cuBLAS with a marker per GPU. A GPU not
  measured is a legend entry that says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from src.paths import COMPARE_DIR, RESULTS_DIR
from src.publish.staged import staged
from src.publish.ratios import DISPATCHERS, RATIO_TICKS, geomean
from src.records import math_units
from src.records.summary import size_key

NOT_MEASURED = "not measured"
BASELINES = ("cublas_fp32", "cublas_tf32")
PROGRESSION_COLUMNS = ["kernel", "math", "size", "gpu_spec", "gpu", "status", "gflops",
                       "pct_of_cublas", "verdict"]
SUITE_COLUMNS = ["kernel", "suite", "shape", "gpu_spec", "gpu", "status", "chosen", "math", "gflops",
                 "ratio", "verdict", "ratio_best", "verdict_best"]
GPU_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
GPU_MARKERS = "oD^sv<>"


def _size(row) -> str:
    m, n, k = int(row.m), int(row.n), int(row.k)
    return str(m) if m == n == k else f"{m}x{n}x{k}"


def read_set(results: Path, gpu: str, name: str) -> pd.DataFrame | None:
    """results/<gpu>/<name>, or None when the GPU has no such published table."""
    path = results / gpu / name
    return pd.read_csv(path) if path.is_file() else None


def progression_frame(results: Path, gpus: list[str]) -> pd.DataFrame:
    """One row per kernel, size and GPU (PROGRESSION_COLUMNS), kernels in the first measured
    GPU's table order; a (kernel, size) a GPU has no row for is `not measured` there."""
    tables = {gpu: read_set(results, gpu, "progression.csv") for gpu in gpus}
    rows: dict[tuple[str, str, str], dict] = {}
    order: list[tuple[str, str]] = []
    for gpu, table in tables.items():
        for r in (table.itertuples(index=False) if table is not None else ()):
            key = (r.kernel, _size(r))
            if key not in order:
                order.append(key)
            pct = r.pct_of_cublas_tf32 if r.precision == "tf32" else r.pct_of_cublas_fp32
            rows[(*key, gpu)] = {"math": r.math, "gpu": r.gpu, "status": r.status,
                                 "gflops": r.gflops, "pct_of_cublas": pct, "verdict": r.verdict}
    kernels = list(dict.fromkeys(kernel for kernel, _ in order))
    out = []
    for kernel in kernels:
        sizes = sorted({size for k, size in order if k == kernel}, key=size_key)
        maths = {row["math"] for (k, _, _), row in rows.items() if k == kernel}
        for size in sizes:
            for gpu in gpus:
                row = rows.get((kernel, size, gpu))
                if row is None:
                    row = {"math": next(iter(maths)), "gpu": None, "status": NOT_MEASURED,
                           "gflops": None, "pct_of_cublas": None, "verdict": None}
                out.append({"kernel": kernel, "size": size, "gpu_spec": gpu, **row})
    return pd.DataFrame(out, columns=PROGRESSION_COLUMNS)


def suite_frame(results: Path, gpus: list[str]) -> pd.DataFrame:
    """One row per dispatching kernel, shape and GPU (SUITE_COLUMNS), `not measured` where a GPU
    has no suite table or no row for the shape."""
    tables = {gpu: read_set(results, gpu, "suite.csv") for gpu in gpus}
    names = {gpu: _gpu_names(results, gpu) for gpu in gpus}
    rows: dict[tuple[str, str, str], dict] = {}
    order: list[tuple[str, str, str]] = []
    for gpu, table in tables.items():
        for r in (table.itertuples(index=False) if table is not None else ()):
            if (r.kernel, r.suite, r.shape) not in order:
                order.append((r.kernel, r.suite, r.shape))
            rows[(r.kernel, r.shape, gpu)] = {
                "gpu": names[gpu], "status": r.status, "chosen": r.chosen, "math": r.math,
                "gflops": r.gflops, "ratio": r.ratio, "verdict": r.verdict,
                "ratio_best": r.ratio_best, "verdict_best": r.verdict_best}
    out = []
    for kernel, suite, shape in order:
        for gpu in gpus:
            row = rows.get((kernel, shape, gpu)) or {"gpu": None, "status": NOT_MEASURED}
            out.append({"kernel": kernel, "suite": suite, "shape": shape, "gpu_spec": gpu, **row})
    return pd.DataFrame(out, columns=SUITE_COLUMNS)


def _gpu_names(results: Path, gpu: str) -> str | None:
    table = read_set(results, gpu, "progression.csv")
    names = sorted(table.gpu.dropna().unique()) if table is not None else []
    return ", ".join(names) or None


def measured(frame: pd.DataFrame, gpu: str) -> bool:
    return bool((frame[frame.gpu_spec == gpu].status != NOT_MEASURED).any())


def _cell(row) -> str:
    if row.status == NOT_MEASURED:
        return NOT_MEASURED
    if row.status != "ok":
        return str(row.status)
    pct = "" if pd.isna(row.pct_of_cublas) else f" {row.pct_of_cublas:.0f}%"
    return f"{row.gflops:,.0f}{pct}"


def _gpus_line(frame: pd.DataFrame, gpus: list[str]) -> str:
    parts = []
    for gpu in gpus:
        names = sorted(frame.loc[frame.gpu_spec == gpu, "gpu"].dropna().unique())
        parts.append(f"{gpu} ({', '.join(names)})" if measured(frame, gpu) else f"{gpu} ({NOT_MEASURED})")
    return ", ".join(parts)


def progression_markdown(frame: pd.DataFrame, gpus: list[str], kernels: list[str] | None = None) -> str:
    """kernel | math | GPU | one column per size; `kernels` picks (and orders) the rows."""
    rows = frame if kernels is None else frame[frame.kernel.isin(kernels)]
    order = list(dict.fromkeys(rows.kernel)) if kernels is None else [k for k in kernels if k in set(rows.kernel)]
    sizes = sorted(rows["size"].unique(), key=size_key)
    lines = ["| kernel | math | GPU | " + " | ".join(sizes) + " |",
             "|:---|:---|:---|" + "---:|" * len(sizes)]
    for kernel in order:
        mine = rows[rows.kernel == kernel]
        math = math_units.label(mine["math"].dropna().iloc[0]) if mine["math"].notna().any() else ""
        for gpu in gpus:
            cells = {r.size: _cell(r) for r in mine[mine.gpu_spec == gpu].itertuples(index=False)}
            lines.append(f"| {kernel} | {math} | {gpu} | "
                         + " | ".join(cells.get(size, NOT_MEASURED) for size in sizes) + " |")
    return "\n".join(lines) + "\n"


def progression_document(frame: pd.DataFrame, gpus: list[str]) -> str:
    return (f"# SGEMM progression side by side: {_gpus_line(frame, gpus)}\n\n"
            "From each GPU's published table (results/<gpu>/progression.md: its protocol, dates, "
            "intervals and failures). Each cell: GFLOP/s and % of cuBLAS in the kernel's "
            "precision on that GPU, paired in the same job; \"not measured\": that GPU has no "
            "published figure for the row.\n\n" + progression_markdown(frame, gpus))


def suite_summary(frame: pd.DataFrame, gpus: list[str]) -> list[str]:
    lines = ["| precision | kernel | GPU | shapes | failed | geomean / min vs cuBLAS | "
             "geomean / min vs best cuBLAS |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for kernel, precision in DISPATCHERS.items():
        for gpu in gpus:
            rows = frame[(frame.kernel == kernel) & (frame.gpu_spec == gpu)]
            if not len(rows) or not (rows.status != NOT_MEASURED).any():
                lines.append(f"| {precision} | {kernel} | {gpu} | {NOT_MEASURED} | | | |")
                continue
            ok = rows[rows.status == "ok"]
            ran = rows[rows.status != NOT_MEASURED]

            def stat(column: str) -> str:
                values = ok[column].dropna()
                return f"{geomean(values):.4f} / {values.min():.4f}" if len(values) else ""

            lines.append(f"| {precision} | {kernel} | {gpu} | {len(ran)} | {len(ran) - len(ok)} | "
                         f"{stat('ratio')} | {stat('ratio_best')} |")
    return lines


def suite_document(frame: pd.DataFrame, gpus: list[str]) -> str:
    lines = [f"# Shape suite side by side: {_gpus_line(frame, gpus)}", "",
             "From each GPU's published suite (results/<gpu>/suite.md). Ratios are the dispatching "
             "kernel's speed over cuBLAS's in the same job (1.0 = cuBLAS), with the verdict of its "
             "95% interval; \"not measured\": that GPU has no published figure for the shape.", ""]
    lines += suite_summary(frame, gpus) + [""]
    for kernel in DISPATCHERS:
        rows = frame[frame.kernel == kernel]
        if rows.empty:
            continue
        lines += [f"## {kernel}: ratio to cuBLAS (chapter chosen)", "",
                  "| suite | shape | " + " | ".join(gpus) + " |", "| --- | --- |" + " --- |" * len(gpus)]
        for (suite, shape), per_gpu in rows.groupby(["suite", "shape"], sort=False):
            cells = []
            for gpu in gpus:
                r = per_gpu[per_gpu.gpu_spec == gpu]
                r = r.iloc[0] if len(r) else None
                if r is None or r.status == NOT_MEASURED:
                    cells.append(NOT_MEASURED)
                elif r.status != "ok":
                    cells.append(str(r.status))
                else:
                    cells.append(f"{r.ratio:.3f} {r.verdict} ({r.chosen})")
            lines.append(f"| {suite} | {shape} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def legend_handles(frame: pd.DataFrame, gpus: list[str]):
    from matplotlib.patches import Patch

    return [Patch(facecolor=GPU_COLOURS[i % len(GPU_COLOURS)] if measured(frame, gpu) else "none",
                  edgecolor=GPU_COLOURS[i % len(GPU_COLOURS)], hatch=None if measured(frame, gpu) else "//",
                  label=gpu if measured(frame, gpu) else f"{gpu}: {NOT_MEASURED}")
            for i, gpu in enumerate(gpus)]


def progression_figure(frame: pd.DataFrame, gpus: list[str], path: Path) -> None:
    """At the largest size: % of cuBLAS in each kernel's precision (hand-written kernels) and
    GFLOP/s (with the baselines), a bar per GPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    squares = [s for s in frame["size"].unique() if "x" not in s]
    size = max(squares or frame["size"].unique(), key=size_key)
    at = frame[frame["size"] == size]
    kernels = list(dict.fromkeys(at.kernel))
    fig, axes = plt.subplots(1, 2, figsize=(14, 0.32 * len(kernels) * max(len(gpus), 1) / 1.5 + 2.5),
                             sharey=True, layout="constrained")
    y = np.arange(len(kernels))
    height = 0.8 / max(len(gpus), 1)
    for i, gpu in enumerate(gpus):
        mine = at[at.gpu_spec == gpu].set_index("kernel")
        offset = y - 0.4 + height * (i + 0.5)
        pct = [mine.pct_of_cublas.get(k) if k not in BASELINES else None for k in kernels]
        gflops = [mine.gflops.get(k) for k in kernels]
        colour = GPU_COLOURS[i % len(GPU_COLOURS)]
        axes[0].barh(offset, pd.to_numeric(pd.Series(pct), errors="coerce"), height=height, color=colour)
        axes[1].barh(offset, pd.to_numeric(pd.Series(gflops), errors="coerce"), height=height, color=colour)
    axes[0].axvline(100, color="black", linestyle="--", linewidth=1)
    axes[0].set_xlabel("% of cuBLAS in the kernel's precision (same GPU, same job)")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("GFLOP/s (log scale)")
    axes[0].set_yticks(y, kernels, fontsize=8)
    axes[0].invert_yaxis()
    for ax in axes:
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"SGEMM at {size} by GPU: {_gpus_line(frame, gpus)}", fontsize=10)
    fig.legend(handles=legend_handles(frame, gpus), loc="outside lower center", ncols=len(gpus),
               frameon=False)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def suite_figure(frame: pd.DataFrame, gpus: list[str], path: Path) -> None:
    """Per dispatching kernel: each shape's ratio to cuBLAS, a marker per GPU, the shapes in the
    order of the first measured GPU's ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    kernels = [k for k in DISPATCHERS if (frame.kernel == k).any()] or list(DISPATCHERS)
    fig, axes = plt.subplots(1, len(kernels), figsize=(7 * len(kernels), 6), squeeze=False,
                             layout="constrained")
    first = next((gpu for gpu in gpus if measured(frame, gpu)), None)
    for ax, kernel in zip(axes[0], kernels):
        rows = frame[frame.kernel == kernel]
        lead = rows[(rows.gpu_spec == first)].sort_values("ratio") if first else rows
        shapes = list(dict.fromkeys(lead["shape"]))
        x = {shape: i for i, shape in enumerate(shapes)}
        for i, gpu in enumerate(gpus):
            mine = rows[(rows.gpu_spec == gpu) & (rows.status == "ok")]
            ax.scatter([x[s] for s in mine["shape"]], mine.ratio, s=22, zorder=3,
                       color=GPU_COLOURS[i % len(GPU_COLOURS)], marker=GPU_MARKERS[i % len(GPU_MARKERS)])
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(FixedLocator(RATIO_TICKS))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(lambda value, _: f"{value:g}x")
        ax.set_xticks(range(len(shapes)), shapes, rotation=90, fontsize=6)
        ax.set_xlabel(f"shape (M x N x K), sorted by {first or 'no GPU'}'s ratio")
        ax.set_ylabel("speed / cuBLAS speed (log scale; 1x = cuBLAS)")
        ax.set_title(f"{kernel} against cuBLAS, by GPU", fontsize=10)
        ax.grid(True, which="major", axis="y", alpha=0.3)
    fig.legend(handles=legend_handles(frame, gpus), loc="outside lower center", ncols=len(gpus),
               frameon=False)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def write_compare(results: Path, gpus: list[str], out_dir: Path,
                  headline: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    if not gpus or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {' '.join(gpus)}: name each GPU spec once (params.yaml: published.gpus)")
    progression, suite = progression_frame(results, gpus), suite_frame(results, gpus)
    if not any(measured(progression, gpu) for gpu in gpus):
        raise ValueError(f"no GPU of {', '.join(gpus)} has a published table under {results}/<gpu>/: "
                         "nothing to compare")
    out_dir.mkdir(parents=True, exist_ok=True)
    with staged(out_dir) as new:  # every file replaces the published one, or none does
        progression.to_csv(new("progression.csv"), index=False)
        new("progression.md").write_text(progression_document(progression, gpus))
        new("headline.md").write_text(progression_markdown(progression, gpus, headline))
        suite.to_csv(new("suite.csv"), index=False)
        new("suite.md").write_text(suite_document(suite, gpus))
        progression_figure(progression, gpus, new("progression.png"))
        suite_figure(suite, gpus, new("suite.png"))
    return progression, suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.publish.compare",
                                     description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--gpus", nargs="+", required=True, help="GPU specs, in column order")
    parser.add_argument("--headline", nargs="*", default=None,
                        help="the kernels of headline.md (default: every kernel)")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="holds results/<gpu>/")
    parser.add_argument("--out-dir", type=Path, default=COMPARE_DIR)
    args = parser.parse_args(argv)
    try:
        progression, _ = write_compare(args.results, args.gpus, args.out_dir, args.headline)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    missing = [gpu for gpu in args.gpus if not measured(progression, gpu)]
    print(f"{', '.join(args.gpus)} side by side -> {args.out_dir}"
          + (f" ({', '.join(missing)}: {NOT_MEASURED})" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
