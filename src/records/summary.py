"""Report step: the kernel x size summary of a set of records, printed and written as CSV/Markdown.

One row per kernel, one column group per size (GFLOP/s and % of cuBLAS in the kernel's own
precision: FP32 kernels against cuBLAS FP32, TF32 kernels, marked "of TF32", against cuBLAS TF32). A failed job
shows its status in place of a figure.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from src.records import math_units
from src.records.record import Record

if TYPE_CHECKING:
    import pandas as pd

BASELINES = ("cublas_fp32", "cublas_tf32")


def size_key(label: str):
    """Sort key for size labels: squares ("1024") before MxNxK shapes, each by value."""
    dims = [int(x) for x in label.split("x")]
    return (len(dims), dims)


def summary_frame(records: list[Record]) -> pd.DataFrame:
    """Long form: one row per job, the columns other tools read."""
    import pandas as pd  # here, not at import: a job that fails at once never needs pandas

    rows = [{
        "kernel": r.kernel, "precision": r.precision, "math": math_units.of_record(r),
        "size": r.size_label,
        "m": r.m, "n": r.n, "k": r.k, "status": r.status,
        "gflops": r.gflops if r.ok else None,
        "pct_of_cublas_fp32": r.pct_of_cublas_fp32 if r.ok else None,
        "pct_of_cublas_tf32": r.pct_of_cublas_tf32 if r.ok else None,
        "pct_of_peak": r.pct_of_peak if r.ok else None,
        "rel_err": r.rel_err, "time_ms_median": r.time_ms_median if r.ok else None,
        "registers": r.registers, "gpu": r.gpu,
    } for r in records]
    return pd.DataFrame(rows)


def row_labels(records: list[Record]) -> list[str]:
    """The kernel name, plus the tile parameters that vary between this kernel's jobs at one size
    (so a tile sweep shows one row per parameter set instead of collapsing them). Parameters that
    differ only from one size to another, as tuned size classes do (conf/tuned/), keep one row."""
    varying: dict[str, list[str]] = {}
    for kernel in {r.kernel for r in records}:
        mine = [r for r in records if r.kernel == kernel]
        keys = sorted({key for r in mine for key in (r.params or {})})
        varying[kernel] = [key for key in keys if any(
            len({str((r.params or {}).get(key)) for r in mine if r.size_label == size}) > 1
            for size in {r.size_label for r in mine})]
    return [r.kernel + "".join(f" {key}={(r.params or {}).get(key)}" for key in varying[r.kernel])
            for r in records]


def _layout(records: list[Record]) -> tuple[list[str], list[str], dict]:
    """The kernel x size grid both the table and the figure show: row labels (hand-written
    kernels first, then the baselines), sizes in order, and the record of each (row, size)."""
    labels = row_labels(records)
    kernel_of = dict(zip(labels, (r.kernel for r in records)))
    rows = sorted(kernel_of, key=lambda label: (kernel_of[label] in BASELINES, label))
    sizes = sorted({r.size_label for r in records}, key=size_key)
    cell = {(label, r.size_label): r for label, r in zip(labels, records)}
    return rows, sizes, cell


def _pct_cell(r: Record) -> str:
    """% of cuBLAS in the record's own precision: a tensor-core (TF32) kernel is compared with
    cuBLAS TF32, not with the FP32 SIMT baseline it would dwarf. A paired measurement shows the
    baseline's GFLOP/s from the same rounds (so % is exactly the ratio of the two figures shown)
    and the 95% interval; 'faster' / 'slower' only when the interval excludes 100%."""
    if r.pct_ci_low is not None and r.baseline_gflops and r.backend != "cublas":
        mark = " of TF32" if r.precision == "tf32" else ""
        word = "" if r.verdict == "tie" else f" {r.verdict}"
        return (f"{r.pct_of_cublas:.1f}%{mark} of {r.baseline_gflops:,.0f} "
                f"[{r.pct_ci_low:.1f}, {r.pct_ci_high:.1f}]{word}")
    if r.precision == "tf32":
        return "" if r.pct_of_cublas_tf32 is None else f"{r.pct_of_cublas_tf32:.1f}% of TF32"
    return "" if r.pct_of_cublas_fp32 is None else f"{r.pct_of_cublas_fp32:.1f}%"


def _replicated_cells(r: Record, row) -> tuple[str, str]:
    """GFLOP/s and % cells of a published row (replicates.Row): each figure's median run (the
    % with its run's cuBLAS figure), and beside them the number of runs, their range, and a
    verdict that holds for every run."""
    runs = row.replicates
    gflops = f"{row.gflops:,.1f}"
    if runs > 1:
        low, high = min(x.gflops for x in row.runs), max(x.gflops for x in row.runs)
        gflops += f" ({runs} runs {low:,.0f}–{high:,.0f})"
    spread = row.pct
    if spread is None or r.backend == "cublas" or not r.baseline_gflops:
        return gflops, _pct_cell(r)
    mark = " of TF32" if r.precision == "tf32" else ""
    head = f"{r.pct_of_cublas:.1f}%{mark} of {r.baseline_gflops:,.0f}"
    if runs == 1:
        return gflops, f"{head} [{r.pct_ci_low:.1f}, {r.pct_ci_high:.1f}] {spread.verdict} (1 run)"
    where = f" on {row.machines} machines" if row.machines > 1 else ""
    return gflops, (f"{head}, {runs} runs{where} {spread.low:.1f}–{spread.high:.1f}% "
                    f"[{spread.ci_low:.1f}, {spread.ci_high:.1f}] {spread.verdict}")


def _short_cell(r: Record, gflops: float | None = None) -> str:
    """'GFLOP/s  %': the terminal-wide table's cell, % of cuBLAS in the kernel's precision
    (`gflops`: a replicated row's median GFLOP/s, else the record's)."""
    paired = r.pct_ci_low is not None and r.baseline_gflops and r.backend != "cublas"
    own = r.pct_of_cublas if paired else (
        r.pct_of_cublas_tf32 if r.precision == "tf32" else r.pct_of_cublas_fp32)
    return f"{r.gflops if gflops is None else gflops:,.0f}" + ("" if own is None else f" {own:.0f}%")


def summary_table(records: list[Record], wide: bool = False,
                  rows: dict | None = None) -> pd.DataFrame:
    """kernel x size, with each row's math (FFMA, 3xTF32 or TF32: 3xTF32 is FP32-accurate but
    runs on the tensor cores, so it is never shown as plain FP32). The default fits a terminal:
    one cell per size, 'GFLOP/s  % of cuBLAS in the kernel's precision' (or the failure);
    `wide`: two cells per size, the % with its paired cuBLAS figure and 95% interval. `rows`, for
    the published table: (label, size) -> replicates.Row, whose wide cells show the spread across
    runs and a verdict that holds for every run."""
    import pandas as pd

    kernels, sizes, cell = _layout(records)
    table = pd.DataFrame(index=pd.Index(kernels, name="kernel"))
    maths = {}
    for (kernel, _), r in cell.items():
        maths.setdefault(kernel, math_units.label(math_units.of_record(r)))
    table["math"] = [maths[kernel] for kernel in kernels]
    for size in sizes:
        gf, pct, short = [], [], []
        for kernel in kernels:
            r = cell.get((kernel, size))
            if r is None:
                gf.append(""), pct.append(""), short.append("")
            elif not r.ok:
                gf.append(r.status), pct.append(""), short.append(r.status)
            elif rows is not None and (kernel, size) in rows:
                g, p = _replicated_cells(r, rows[kernel, size])
                gf.append(g), pct.append(p), short.append(_short_cell(r, rows[kernel, size].gflops))
            else:
                gf.append(f"{r.gflops:,.1f}")
                pct.append(_pct_cell(r))
                short.append(_short_cell(r))
        if wide:
            table[f"{size} GFLOP/s"] = gf
            table[f"{size} % cuBLAS"] = pct
        else:
            table[size] = short
    return table


SHORT_TABLE_NOTE = ("Each cell: GFLOP/s and % of cuBLAS in the kernel's precision (FFMA and 3xTF32 "
                    "against cuBLAS FP32, TF32 against cuBLAS TF32). math: FFMA = FP32 on the SIMT "
                    "cores; 3xTF32 = FP32-accurate, three TF32 products on the tensor cores; TF32 = "
                    "TF32 accuracy on the tensor cores.")


def summary_heading(records: list[Record]) -> str:
    gpus = sorted({r.gpu for r in records if r.gpu})
    failed = sum(not r.ok for r in records)
    return (f"SGEMM on {', '.join(gpus) or 'unknown GPU'}: {len(records)} jobs, "
            f"{len(records) - failed} ok, {failed} failed")


def summary_markdown(records: list[Record], wide: bool = False) -> str:
    """The heading and the kernel x size table, as summary.md (summary_wide.md: `wide`) holds them."""
    table = summary_table(records, wide=wide).to_markdown(disable_numparse=True)
    return f"{summary_heading(records)}\n\n{table}\n\n{textwrap.fill(SHORT_TABLE_NOTE, 100)}\n"


def write_summary(records: list[Record], directory: Path) -> str:
    """Write summary.csv (long form), summary.md (the table that fits a terminal) and
    summary_wide.md (with the paired intervals); return the printable table."""
    directory.mkdir(parents=True, exist_ok=True)
    summary_frame(records).to_csv(directory / "summary.csv", index=False)
    markdown = summary_markdown(records)
    (directory / "summary.md").write_text(markdown)
    (directory / "summary_wide.md").write_text(summary_markdown(records, wide=True))
    return markdown


def gflops_figure(records: list[Record]):
    """GFLOP/s by kernel and size: one group of bars per size, one bar per row of the summary
    table (kernel, plus the tile parameters that vary), log scale; a failed job has no bar.
    A matplotlib Figure drawn on the Agg canvas (no display, no pyplot state)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows, sizes, cell = _layout(records)
    # a row with no ok job draws no bar, so it gets no colour and no legend entry either
    rows = [label for label in rows if any(
        (r := cell.get((label, size))) is not None and r.ok and r.gflops for size in sizes)]

    fig = Figure(figsize=(max(6.0, 1.1 * len(sizes) * max(len(rows), 4) / 4 + 3), 4.5),
                 layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / max(len(rows), 1)
    colors = [cmap(i % cmap.N) for name in ("tab20", "Dark2")
              for cmap in [matplotlib.colormaps[name]] for i in range(cmap.N)]
    drawn = 0
    for i, label in enumerate(rows):
        xs, heights = [], []
        for j, size in enumerate(sizes):
            r = cell.get((label, size))
            if r is not None and r.ok and r.gflops:
                xs.append(j + (i - (len(rows) - 1) / 2) * width)
                heights.append(r.gflops)
        ax.bar(xs, heights, width, label=label, color=colors[i % len(colors)])
        drawn += len(heights)
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_xlabel("size (M = N = K, or MxNxK)")
    ax.set_ylabel("GFLOP/s (median)")
    if drawn:
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no job succeeded", transform=ax.transAxes, ha="center")
    ax.set_title(summary_heading(records), fontsize="medium")
    ax.grid(axis="y", which="both", alpha=0.3)
    if rows:  # in the figure's layout, so that log_figure's plain savefig keeps all of it
        fig.legend(fontsize="small", loc="outside right upper")
    return fig
