"""Plots step: runs.csv + ceilings.json -> the published figures (PNG) and their data (CSV).

`python -m src.publish.plots results/runs.csv --ceilings results/ceilings.json --out-dir results/plots`

The rows are the table step's (src.publish.table.progression_frame: one per kernel and size) and only
rows whose status is ok are drawn: a failed job is in no figure and no data file.

- gflops_vs_size: GFLOP/s against size (log-log) for every hand-written kernel, with cuBLAS FP32
  and TF32 as reference lines; the headline kernels (the fastest hand-written kernel of each
  precision at the largest size) drawn heavier.
- pct_of_cublas: each hand-written kernel at the largest size against cuBLAS in its own
  precision (FP32 kernels against cuBLAS FP32, TF32 kernels against cuBLAS TF32).

Every kernel keeps one colour and marker, distinct from every other's, in all figures.
- roofline: the measured FP32 FFMA ceiling and device-memory bandwidth of this GPU (and the
  datasheet peaks, dashed), with every kernel at every size as a point. Arithmetic intensity is
  2·M·N·K FLOP over the compulsory DRAM traffic: A and B read once and C written once,
  4·(M·K + K·N + M·N) bytes, plus 4·M·N for reading C when beta != 0 (see `min_bytes`).

Each PNG has a CSV beside it with the plotted points, which dvc.yaml's `plots:` section draws.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from src.records import math_units  # noqa: E402
from src.paths import existing_file  # noqa: E402
from src.publish.staged import staged  # noqa: E402
from src.records.collect import read_runs, records_from_runs  # noqa: E402
from src.publish.table import BASELINE_BACKEND, load_ceilings, progression_frame, size_order  # noqa: E402

FIGURES = ("gflops_vs_size", "pct_of_cublas", "roofline")
REFERENCE_STYLE = {"cublas_fp32": dict(color="black", linestyle="--", linewidth=2.0),
                   "cublas_tf32": dict(color="0.45", linestyle="-.", linewidth=2.0)}
REFERENCE_LABEL = {"cublas_fp32": "cuBLAS FP32", "cublas_tf32": "cuBLAS TF32"}
PNG_METADATA = {"Software": None}  # no version stamp: a rerun of the same data gives the same file


def min_bytes(m: int, n: int, k: int, beta: float) -> int:
    """Compulsory DRAM traffic of C = alpha*A@B + beta*C in FP32: A, B read and C written once;
    C is also read when beta != 0 (with beta == 0 the kernels never read C)."""
    return 4 * (m * k + k * n + (2 if beta != 0 else 1) * m * n)


def intensity(m: int, n: int, k: int, beta: float) -> float:
    return 2 * m * n * k / min_bytes(m, n, k, beta)


def plotted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that may appear in a figure: status ok and a figure measured."""
    ok = frame[(frame.status == "ok") & frame.gflops.notna()].copy()
    # one number per size for the x axis: N for square problems, else the cube root of M*N*K
    ok["size_n"] = [r.m if r.m == r.n == r.k else round(float(np.cbrt(float(r.m) * r.n * r.k)), 1)
                    for r in ok.itertuples()]
    ok["intensity"] = [round(intensity(r.m, r.n, r.k, r.beta), 3) for r in ok.itertuples()]
    return ok


def _title_gpu(frame: pd.DataFrame) -> str:
    gpus = sorted(frame.gpu.dropna().unique())
    return ", ".join(gpus) or "unknown GPU"


# A panel holds at most PANEL_SIZE kernels, each in one of tab10's ten colours with its own
# marker, so every series in a panel can be told apart; the fastest kernel of each math is drawn
# heavier and named in bold.
PALETTE = tuple(plt.get_cmap("tab10").colors)
MARKERS = "ovs^D<>phP*Xd8H"
PANEL_SIZE = len(PALETTE)
MATH_COLOURS = {"ffma": "#1f77b4", "3xtf32": "#2ca02c", "tf32": "#ff7f0e"}


def series_styles(kernels: list[str], headline: list[str] = ()) -> dict[str, dict]:
    """A colour and a marker per kernel of one panel, in order: distinct colours for up to
    PANEL_SIZE kernels, and distinct (colour, marker) pairs beyond."""
    return {kernel: {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)]}
            for i, kernel in enumerate(kernels)}


def math_of(ok: pd.DataFrame) -> dict[str, str]:
    return dict(zip(ok.kernel, ok["math"].fillna("ffma")))


def series_label(kernel: str, math: str | None) -> str:
    """The kernel, with its math when that is not FFMA: `23_wgmma_3xtf32 [3xTF32]`."""
    return kernel if math in (None, "ffma") else f"{kernel} [{math_units.label(math)}]"


def panels(ok: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """The hand-written kernels split for reading: FFMA chapters in panels of at most PANEL_SIZE,
    then the tensor-core ones (3xTF32 and TF32) together."""
    maths = math_of(ok)
    ffma = [k for k in _mine(ok) if maths[k] == "ffma"]
    tensor = [k for k in _mine(ok) if maths[k] != "ffma"]
    count = -(-len(ffma) // PANEL_SIZE)
    chunks = [ffma[i * len(ffma) // count:(i + 1) * len(ffma) // count] for i in range(count)]
    out = [(f"FFMA (FP32 on the SIMT cores): {c[0].split('_')[0]} to {c[-1].split('_')[0]}", c)
           for c in chunks]
    if tensor:
        out.append(("tensor cores: 3xTF32 (FP32-accurate) and TF32", tensor))
    return out


def headline_kernels(ok: pd.DataFrame) -> list[str]:
    """The fastest hand-written kernel of each math (FFMA, 3xTF32, TF32) at the largest size it ran."""
    mine = ok[ok.backend != BASELINE_BACKEND]
    if mine.empty:
        return []
    at_largest = mine[mine.size_n == mine.size_n.max()]
    best = at_largest.sort_values("gflops").groupby(at_largest["math"].fillna("ffma")).tail(1)
    return sorted(best.kernel)


def same_precision_pct(rows: pd.DataFrame) -> pd.Series:
    """% of cuBLAS in each row's own precision."""
    return rows.pct_of_cublas_tf32.where(rows.precision == "tf32", rows.pct_of_cublas_fp32)


def _mine(ok: pd.DataFrame) -> list[str]:
    return sorted(ok.loc[ok.backend != BASELINE_BACKEND, "kernel"].unique())


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=120, bbox_inches="tight", metadata=PNG_METADATA)
    plt.close(fig)


def plot_gflops_vs_size(ok: pd.DataFrame, gpu: str, path: Path) -> pd.DataFrame:
    """One panel per group of kernels (panels()), each with cuBLAS FP32 and TF32 as references."""
    sizes = ok.drop_duplicates("size").sort_values("size_n")[["size", "size_n"]]
    x = sizes.size_n.to_numpy()
    headline = headline_kernels(ok)
    maths = math_of(ok)
    groups = panels(ok)
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 4.6 * len(groups)), squeeze=False,
                             sharex=True)

    def series(kernel: str) -> np.ndarray:
        mine = ok[ok.kernel == kernel].set_index("size").gflops
        return np.array([mine.get(s, np.nan) for s in sizes["size"]], dtype=float)  # NaN: a gap

    low = float(ok.gflops.min()) / 1.5
    high = float(ok.gflops.max()) * 1.5
    for ax, (title, kernels) in zip(axes[:, 0], groups):
        styles = series_styles(kernels)
        for kernel in kernels:
            heavy = kernel in headline
            ax.plot(x, series(kernel), **styles[kernel], markersize=9 if heavy else 5,
                    linewidth=3.0 if heavy else 1.4, zorder=4 if heavy else 2,
                    linestyle="--" if maths[kernel] == "3xtf32" else "-",
                    label=series_label(kernel, maths[kernel]))
        for kernel, style in REFERENCE_STYLE.items():
            if kernel in set(ok.kernel):
                ax.plot(x, series(kernel), marker="s", label=REFERENCE_LABEL[kernel], zorder=3, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        ax.set_xticks(x, list(sizes["size"]))
        ax.minorticks_off()
        ax.set_ylabel("GFLOP/s (log scale)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelbottom=True)
        legend = ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8)
        for text in legend.get_texts():
            if text.get_text().split(" [")[0] in headline:
                text.set_fontweight("bold")
    axes[-1, 0].set_xlabel("size (M = N = K)")
    fig.suptitle(f"SGEMM GFLOP/s against size, {gpu}\nbold: the fastest FFMA, 3xTF32 and TF32 "
                 "kernel at the largest size; dashed: 3xTF32 (FP32-accurate on tensor cores)",
                 fontsize=10)
    _save(fig, path)
    out = ok[["kernel", "math", "size", "size_n", "gflops"]]
    return out.rename(columns={"size": "size_label", "size_n": "size"})


def largest_size(ok: pd.DataFrame) -> str | None:
    mine = ok[(ok.backend != BASELINE_BACKEND) & same_precision_pct(ok).notna()]
    return None if mine.empty else mine.sort_values("size_n").iloc[-1]["size"]


def plot_pct_of_cublas(ok: pd.DataFrame, gpu: str, path: Path) -> pd.DataFrame:
    """One bar per hand-written kernel: % of cuBLAS in its own precision (a TF32 kernel against
    cuBLAS FP32 would read 700% and squash every FP32 bar)."""
    size = largest_size(ok)
    rows = ok[(ok["size"] == size) & (ok.backend != BASELINE_BACKEND)].sort_values("kernel").copy()
    rows["pct_of_cublas"] = same_precision_pct(rows)
    fig, ax = plt.subplots(figsize=(8, 0.4 * max(len(rows), 2) + 1.5), layout="constrained")
    y = np.arange(len(rows))
    for math, label in (("ffma", "FFMA kernel (FP32 on SIMT cores), % of cuBLAS FP32"),
                        ("3xtf32", "3xTF32 kernel (FP32-accurate on tensor cores), % of cuBLAS FP32"),
                        ("tf32", "TF32 kernel (tensor cores), % of cuBLAS TF32")):
        mask = (rows["math"].fillna("ffma") == math).to_numpy()
        if mask.any():
            bars = ax.barh(y[mask], rows.pct_of_cublas[mask], height=0.7,
                           color=MATH_COLOURS[math], label=label)
            ax.bar_label(bars, fmt="%.1f%%", padding=3, fontsize=8)
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(y, [series_label(k, m) for k, m in zip(rows.kernel, rows["math"])])
    ax.invert_yaxis()
    top = float(np.nan_to_num(rows.pct_of_cublas.max())) if len(rows) else 0.0
    ax.set_xlim(0, max(110.0, 1.15 * top))
    ax.set_xlabel("% of cuBLAS in the kernel's precision (same shape, protocol and process)")
    ax.set_title(f"% of cuBLAS at {size}, {gpu}" if size else f"% of cuBLAS: no data, {gpu}")
    fig.legend(loc="outside lower center", ncols=1, frameon=False)
    _save(fig, path)
    return rows[["kernel", "precision", "math", "size", "pct_of_cublas", "pct_of_cublas_fp32",
                 "pct_of_cublas_tf32"]].rename(columns={"size": "size_label"})


def plot_roofline(ok: pd.DataFrame, ceilings: dict, gpu: str, path: Path) -> pd.DataFrame:
    ffma, dram = float(ceilings["ffma_gflops"]), float(ceilings["dram_gbs"])
    sheet = ceilings.get("datasheet") or {}
    measured = bool(ceilings.get("measured"))
    hi = max([4 * float(ok.intensity.max()) if len(ok) else 1e3, 4 * ffma / dram])
    ai = np.logspace(np.log10(0.5), np.log10(hi), 400)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    what = "measured" if measured else "STAND-IN, NOT MEASURED"
    ax.plot(ai, np.minimum(ffma, dram * ai), color="crimson", linewidth=2.2,
            label=f"FFMA roof, {what}: {ffma:,.0f} GFLOP/s, memory {dram:,.0f} GB/s")
    ridge = ffma / dram
    ax.annotate(f"ridge {ridge:.1f} FLOP/B", (ridge, ffma), textcoords="offset points",
                xytext=(6, -14), fontsize=8, color="crimson")
    if sheet.get("fp32_gflops") and sheet.get("mem_bandwidth_gbs"):
        ax.plot(ai, np.minimum(sheet["fp32_gflops"], sheet["mem_bandwidth_gbs"] * ai),
                color="0.5", linestyle="--", linewidth=1.2,
                label=f"datasheet FP32 {sheet['fp32_gflops']:,.0f} GFLOP/s, "
                      f"{sheet['mem_bandwidth_gbs']:,.0f} GB/s")
    if sheet.get("tf32_gflops") and sheet.get("mem_bandwidth_gbs"):
        tf32, bandwidth = float(sheet["tf32_gflops"]), float(sheet["mem_bandwidth_gbs"])
        ax.plot(ai, np.minimum(tf32, bandwidth * ai), color=MATH_COLOURS["tf32"], linestyle=":",
                linewidth=1.6, label=f"TF32 roof: datasheet dense TF32 {tf32:,.0f} GFLOP/s")
        # 3xTF32 spends three TF32 products per FP32-accurate one (src/job/plausibility.py)
        ax.plot(ai, np.minimum(tf32 / 3, bandwidth * ai), color=MATH_COLOURS["3xtf32"],
                linestyle="--", linewidth=1.6,
                label=f"3xTF32 roof: dense TF32 / 3 = {tf32 / 3:,.0f} GFLOP/s")
    for size, x in ok.drop_duplicates("size")[["size", "intensity"]].itertuples(index=False):
        ax.axvline(x, color="0.85", linewidth=0.8, zorder=1)
        ax.annotate(str(size), (x, 0), xycoords=("data", "axes fraction"), xytext=(2, 3),
                    textcoords="offset points", fontsize=7, color="0.4")
    # one colour per math (the kernels are told apart in gflops_vs_size); the fastest of each
    # math named beside its points
    headline = headline_kernels(ok)
    mine = ok[ok.backend != BASELINE_BACKEND]
    markers = {"ffma": "o", "3xtf32": "D", "tf32": "^"}
    for math in math_units.ORDER:
        rows = mine[mine["math"].fillna("ffma") == math]
        if len(rows):
            ax.scatter(rows.intensity, rows.gflops, color=MATH_COLOURS[math], marker=markers[math],
                       s=34, zorder=3, edgecolors="white", linewidths=0.5,
                       label=f"{math_units.label(math)} kernels ({math_units.MEANING[math]})")
    for kernel in [k for k in REFERENCE_STYLE if k in set(ok.kernel)]:
        rows = ok[ok.kernel == kernel]
        ax.scatter(rows.intensity, rows.gflops, color=REFERENCE_STYLE[kernel]["color"], marker="s",
                   s=40, zorder=4, label=REFERENCE_LABEL[kernel])
    for kernel in headline:
        rows = ok[ok.kernel == kernel].sort_values("intensity")
        ax.scatter(rows.intensity, rows.gflops, facecolors="none", edgecolors="black", s=110,
                   linewidths=1.2, zorder=5)
        last = rows.iloc[-1]
        ax.annotate(kernel, (last.intensity, last.gflops), textcoords="offset points",
                    xytext=(-4, 7), ha="right", fontsize=7, fontweight="bold")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(ai[0], ai[-1])
    ax.set_xlabel("arithmetic intensity (FLOP per byte of compulsory DRAM traffic)")
    ax.set_ylabel("GFLOP/s")
    sizes = ", ".join(size_order(ok)) if len(ok) else "none"
    ax.set_title(f"Roofline, {gpu} (points: sizes {sizes})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8)
    _save(fig, path)
    return ok[["kernel", "size", "intensity", "gflops"]].rename(columns={"size": "size_label"})


def write_plots(runs_path: Path, ceilings_path: Path, out_dir: Path) -> dict[str, pd.DataFrame]:
    records = records_from_runs(read_runs(runs_path))
    frame = progression_frame(records)
    ceilings = load_ceilings(ceilings_path, records)
    ok = plotted_rows(frame)
    if ok.empty:
        statuses = frame.status.value_counts()
        raise ValueError(f"no job in {runs_path} is ok, so there is nothing to plot ("
                         + ", ".join(f"{n} {status}" for status, n in statuses.items()) + ")")
    gpu = _title_gpu(frame)
    with staged(out_dir) as new:  # every figure and its points replace the published ones, or none
        data = {
            "gflops_vs_size": plot_gflops_vs_size(ok, gpu, new("gflops_vs_size.png")),
            "pct_of_cublas": plot_pct_of_cublas(ok, gpu, new("pct_of_cublas.png")),
            "roofline": plot_roofline(ok, ceilings, gpu, new("roofline.png")),
        }
        for name, points in data.items():
            points.to_csv(new(f"{name}.csv"), index=False)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m src.publish.plots",
        description="runs.csv + ceilings.json -> gflops_vs_size, pct_of_cublas and roofline "
                    "(PNG, with the plotted points as CSV)")
    parser.add_argument("runs", type=existing_file(
        "the plots are drawn from a runs CSV, e.g. results/<gpu>/runs.csv, which the bench stage "
        "collects"), help="runs.csv written by src.records.collect")
    parser.add_argument("--ceilings", type=existing_file(
        "--ceilings names the ceilings.json that python -m src.job.ceilings writes for the GPU"),
        required=True, help="ceilings.json written by src.job.ceilings")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        data = write_plots(args.runs, args.ceilings, args.out_dir)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{', '.join(f'{name}.png ({len(points)} points)' for name, points in data.items())} "
          f"-> {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
