"""Suite step: one GPU's shape suite runs (conf/suite/, kernel=best_fp32 and best_tf32) -> its
published set, results/<gpu>/.

`python -m src.publish.suite results/h100_sxm/suite_runs.csv --gpu h100_sxm --out-dir results/h100_sxm`

For the GPU spec named (h100_sxm, h200, ...; its runs only):
- suite.csv: one row per dispatching kernel and shape: the suite it belongs to, the chapter the
  dispatch chose and the rule that chose it, GFLOP/s, the ratio to cuBLAS's default (paired, with
  its 95% interval and verdict) and to the stronger of cuBLAS default and autotuned cuBLASLt.
- suite.md: the same as a table per precision, sorted by ratio, headed by the summary (shapes
  per math, and the measurement sessions the rows come from).
- suite.png: the ratio per shape, sorted, log scale, 1.0 marked, one panel per precision,
  each point coloured by its math (FFMA, 3xTF32 or TF32).
- suite_wide.md: the tables with both ratios' 95% intervals and which cuBLAS was stronger.
and suite_metrics.json: keyed by the GPU spec, per precision, the geometric mean and minimum of
both ratios over the shapes that ran, the number of shapes, of failed ones and of rows measured
through an earlier dispatch than today's conf/tuned/<gpu>.yaml (src/publish/dispatched.py). A failed job has no ratio anywhere: it
is counted as failed, and a goal over "every shape" is not met while any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from src.paths import CONF_DIR, existing_file
from src.publish.dispatched import dispatched_today
from src.publish.ratios import DISPATCHERS, RATIO_TICKS, geomean
from src.publish.staged import staged
from src.records import math_units
from src.records.collect import read_runs, runs_refusal

COLUMNS = ["suite", "shape", "m", "n", "k", "alpha", "beta", "kernel", "chosen", "math", "rule",
           "status",
           "gflops", "baseline", "baseline_gflops", "ratio", "ratio_ci_low", "ratio_ci_high",
           "verdict", "cublaslt_gflops", "best_cublas", "ratio_best", "ratio_best_ci_low",
           "ratio_best_ci_high", "verdict_best", "rel_err", "error", "dispatch_now"]
# After COLUMNS when any row has them: the strongest peer timed in the same rounds (the kernel
# config's `peers`: Triton)
PEER_COLUMNS = ["peer", "peer_gflops", "ratio_peer", "ratio_peer_ci_low", "ratio_peer_ci_high",
                "verdict_peer"]


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


def suite_frame(runs: pd.DataFrame, conf_dir: Path = CONF_DIR, gpu_spec: str | None = None) -> pd.DataFrame:
    """The dispatching kernels' rows of a runs frame, as COLUMNS (ratios as factors, not %); with
    the GPU spec, `dispatch_now`: what today's conf/tuned/<gpu>.yaml runs instead where a re-fit
    moved the row's choice since it was measured (src/publish/dispatched.py; empty where it runs
    the same, or the row was not checked)."""
    named = suites(conf_dir)
    today = dispatched_today(runs, gpu_spec) if gpu_spec else {}
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
            "dispatch_now": today.get((r.kernel, int(r.m), int(r.n), int(r.k))),
            "peer": _text(get("peer_name")), "peer_gflops": _number(get("peer_gflops"), 1),
            "ratio_peer": ratio("pct_of_peer"), "ratio_peer_ci_low": ratio("pct_peer_ci_low"),
            "ratio_peer_ci_high": ratio("pct_peer_ci_high"), "verdict_peer": _text(get("verdict_peer")),
            "gpu_spec": _text(getattr(r, "gpu_spec", None)) or "unknown"})
    frame = pd.DataFrame(rows, columns=COLUMNS + PEER_COLUMNS + ["gpu_spec"])
    # a job refused before it reached the GPU (a shape its chapter does not run) records no GPU;
    # a sweep runs on one, so it is that sweep's
    specs = set(frame.gpu_spec) - {"unknown"}
    if len(specs) == 1:
        frame["gpu_spec"] = specs.pop()
    return frame.sort_values(["gpu_spec", "kernel", "suite", "m", "n", "k"], kind="stable")


def has_peers(frame: pd.DataFrame) -> bool:
    """Whether any row was compared with a peer (the peer columns are shown only then)."""
    return "ratio_peer" in frame and bool(frame.ratio_peer.notna().any())


def summary(frame: pd.DataFrame) -> dict:
    """Per dispatching kernel's precision: shapes, failed, and the geometric mean and minimum
    of the ratio to cuBLAS default (`vs_default`) and to the stronger cuBLAS (`vs_best`)."""
    out = {}
    for kernel, precision in DISPATCHERS.items():
        rows = frame[frame.kernel == kernel]
        if rows.empty:
            continue
        ok = rows[rows.status == "ok"]
        entry = {"kernel": kernel, "shapes": int(len(rows)), "failed": int(len(rows) - len(ok)),
                 "earlier_dispatch": int(rows.dispatch_now.notna().sum())}
        for key, column in (("vs_default", "ratio"), ("vs_best", "ratio_best"),
                            ("vs_peer", "ratio_peer")):
            values = ok[column].dropna() if column in ok else ok.iloc[0:0]
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
    peers = has_peers(frame)
    lines += ["| precision | kernel | shapes (math) | failed | earlier dispatch | geomean / min vs cuBLAS | "
              "geomean / min vs best cuBLAS |" + (" geomean / min vs strongest peer |" if peers else ""),
              "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if peers else "")]
    for precision, s in stats.items():
        d, b, p = s.get("vs_default", {}), s.get("vs_best", {}), s.get("vs_peer", {})
        peer = (f"{p['geomean']} / {p['min']} ({p['min_shape']})"
                + (" (below 1.0: the peer is faster)" if p["geomean"] < 1.0 else "")) if p else ""
        lines.append(f"| {precision} | {s['kernel']} | {s['shapes']} ({_maths(s['by_math'])}) | "
                     f"{s['failed']} | {s['earlier_dispatch']} | {d.get('geomean', '')} / {d.get('min', '')} "
                     f"({d.get('min_shape', '')}) | {b.get('geomean', '')} / {b.get('min', '')} "
                     f"({b.get('min_shape', '')}) |" + (f" {peer} |" if peers else ""))
    notes = ["The math column says what each shape ran on: FFMA (FP32 on the SIMT cores), 3xTF32 "
             "(FP32-accurate: three TF32 products on the tensor cores, verified at the FP32 "
             "tolerance and paired with cuBLAS FP32, which runs FFMA) or TF32 (tensor cores, TF32 "
             "accuracy). best_fp32's figures are FFMA's only where its math says FFMA.",
             "Ratios are kernel speed / baseline speed, paired in the same job, with 95% "
             "intervals; `best cuBLAS` is the stronger of cuBLAS's default and autotuned "
             "cuBLASLt at that shape. faster / slower only when the interval excludes 1.0."]
    notes.append(f"Earlier dispatch: rows whose choice conf/tuned/{gpu_spec}.yaml has moved since "
                 "they were measured (a re-fit); they are listed with what runs today below, and "
                 "`python -m src.publish.dispatched` prints them as sweeps to measure again.")
    if peers:
        notes.append("`vs peer`: against the strongest peer a user would pick instead, timed in "
                     "the same rounds (best_fp32: the FP32-accurate ones, Triton's tf32x3 and ieee "
                     "matmuls and CUTLASS's 3xTF32 GEMM; best_tf32: Triton TF32), with the "
                     "peer's name; empty where no peer "
                     "ran (the rows' peers_skipped say why). Below 1.0 the peer is faster.")
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
                  "vs best cuBLAS |" + (" vs peer |" if peers else ""),
                  "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if peers else "")]
        for r in rows.itertuples(index=False):
            math = math_units.label(r.math) if isinstance(r.math, str) else ""
            if r.status != "ok":
                lines.append(f"| {r.suite} | {r.shape} | {r.chosen or ''} | {math} | {r.status} | | |"
                             + (" |" if peers else ""))
                continue
            best = "" if pd.isna(r.ratio_best) else f"{r.ratio_best:.3f} {r.verdict_best}"
            lines.append(f"| {r.suite} | {r.shape} | {r.chosen} | {math} | {r.gflops:,.1f} | "
                         f"{r.ratio:.3f} {r.verdict} | {best} |" + (f" {_peer_cell(r)} |" if peers else ""))
        lines.append("")
    for kernel in DISPATCHERS:
        moved = frame[(frame.kernel == kernel) & frame.dispatch_now.notna()]
        if len(moved):
            lines += [f"## {kernel}: measured through an earlier dispatch", "",
                      "| suite | shape | measured | vs best cuBLAS | today's dispatch runs |",
                      "| --- | --- | --- | --- | --- |"]
            lines += [f"| {r.suite} | {r.shape} | {r.chosen} | "
                      f"{'' if pd.isna(r.ratio_best) else f'{r.ratio_best:.3f}'} | {r.dispatch_now} |"
                      for r in moved.sort_values(["m", "n", "k"]).itertuples(index=False)]
            lines.append("")
    lines.append(f"Intervals and which cuBLAS was stronger: {PREFIX}_wide.md and {PREFIX}.csv.")
    return "\n".join(lines) + "\n"


def _peer_cell(r, interval: bool = False) -> str:
    """The ratio to the strongest peer, its verdict and the peer (empty where none ran)."""
    if getattr(r, "ratio_peer", None) is None or pd.isna(r.ratio_peer):
        return ""
    span = f" [{r.ratio_peer_ci_low:.3f}, {r.ratio_peer_ci_high:.3f}]" if interval else ""
    return f"{r.ratio_peer:.3f}{span} {r.verdict_peer} ({r.peer})"


def markdown_wide(frame: pd.DataFrame, gpu_spec: str) -> str:
    """Every shape with both ratios' 95% intervals and which cuBLAS was the stronger."""
    lines = [f"# Shape suite on {gpu_spec}: intervals", ""]
    peers = has_peers(frame)
    for kernel in DISPATCHERS:
        rows = frame[frame.kernel == kernel].sort_values("ratio", na_position="first")
        if rows.empty:
            continue
        lines += [f"## {kernel}", "", "| suite | shape | chosen | math | GFLOP/s | vs cuBLAS | "
                  "vs best cuBLAS (which) |" + (" vs peer (which) |" if peers else ""),
                  "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if peers else "")]
        for r in rows.itertuples(index=False):
            math = math_units.label(r.math) if isinstance(r.math, str) else ""
            if r.status != "ok":
                lines.append(f"| {r.suite} | {r.shape} | {r.chosen or ''} | {math} | {r.status} | | |"
                             + (" |" if peers else ""))
                continue
            best = "" if pd.isna(r.ratio_best) else (
                f"{r.ratio_best:.3f} [{r.ratio_best_ci_low:.3f}, {r.ratio_best_ci_high:.3f}] "
                f"{r.verdict_best} ({r.best_cublas})")
            lines.append(f"| {r.suite} | {r.shape} | {r.chosen} | {math} | {r.gflops:,.1f} | "
                         f"{r.ratio:.3f} [{r.ratio_ci_low:.3f}, {r.ratio_ci_high:.3f}] "
                         f"{r.verdict} | {best} |"
                         + (f" {_peer_cell(r, interval=True)} |" if peers else ""))
        lines.append("")
    return "\n".join(lines)


MATH_COLOURS = {"ffma": "#1f77b4", "3xtf32": "#2ca02c", "tf32": "#ff7f0e"}


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


PREFIX = "suite"  # results/<gpu>/suite.csv, suite.md, suite_wide.md, suite.png
METRICS_FILE = "suite_metrics.json"


def publish(runs_csv: Path, out_dir: Path, gpu_spec: str) -> dict:
    """Write one GPU's suite files and its metrics (keyed by the spec) into its published set
    out_dir (results/<gpu_spec>/), all replacing the published ones together or none
    (staged.py). Rows of another GPU spec are refused: a set holds one GPU's figures only.
    Returns the metrics."""
    runs = read_runs(runs_csv)
    frame = suite_frame(runs, gpu_spec=gpu_spec)
    if frame.empty:
        raise ValueError(f"{runs_csv} has no best_fp32 / best_tf32 jobs: nothing to publish")
    refusal = runs_refusal(gpu_spec, runs_csv)  # a set holds one GPU's figures only
    if refusal:
        raise ValueError(refusal)
    mine = runs[runs.gpu_spec == gpu_spec] if "gpu_spec" in runs else runs.iloc[:0]
    gpus = sorted(mine.gpu.dropna().unique()) if "gpu" in mine else []
    stamps = mine.timestamp if "timestamp" in mine else []
    rows = frame.drop(columns="gpu_spec" if has_peers(frame) else ["gpu_spec", *PEER_COLUMNS])
    metrics = {gpu_spec: summary(rows)}
    out_dir.mkdir(parents=True, exist_ok=True)
    with staged(out_dir) as new:
        rows.to_csv(new(f"{PREFIX}.csv"), index=False)
        new(f"{PREFIX}.md").write_text(markdown(rows, gpu_spec, gpus, stamps))
        new(f"{PREFIX}_wide.md").write_text(markdown_wide(rows, gpu_spec))
        figure(rows, gpu_spec).savefig(new(f"{PREFIX}.png"), dpi=110)
        new(METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=existing_file(
        "the suite report is made from a runs CSV, e.g. results/<gpu>/suite_runs.csv, which the "
        "suite stage collects"), help="runs CSV of the suite sweeps (src.records.collect)")
    parser.add_argument("--gpu", required=True,
                        help="the GPU spec (conf/gpu/<name>.yaml) whose published set this is")
    parser.add_argument("--out-dir", type=Path, required=True, help="its set: results/<gpu>/")
    args = parser.parse_args(argv)
    try:
        metrics = publish(args.runs, args.out_dir, args.gpu)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
