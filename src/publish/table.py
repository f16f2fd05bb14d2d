"""Table step: runs.csv -> the published table (results/progression.csv and .md) and metrics.json.

`python -m src.publish.table results/runs.csv --ceilings results/ceilings.json --out-dir results`

- progression.csv, the contract other tools read: one row per kernel and size, baselines
  included, columns CONTRACT_COLUMNS. `status` is ok or the failure; a failed row has empty
  gflops and percentages (rel_err stays when verification measured one).
- progression.md: the kernel x size table that fits a terminal (per size GFLOP/s and % of
  cuBLAS in the kernel's precision, and each kernel's math: FFMA, 3xTF32 or TF32), headed by the
  GPU and the date of the run, then the failed jobs' errors; progression_wide.md: the same with
  the paired cuBLAS figures, 95% intervals and the stronger cuBLAS.
- metrics.json, for `dvc metrics show/diff`: job counts, the measured ceilings, and per size the
  best hand-written kernel of each math (FFMA: best_*, with % of the measured FFMA ceiling;
  3xTF32: best_3xtf32_*; TF32: best_tf32_*) and the cuBLAS FP32 / TF32 GFLOP/s.

A kernel swept over tile parameters gets one row per parameter set, labelled as in the sweep
summary (`04_blocktile_1d bm=128`). Several jobs of one label and size are that row's replicates
(independent runs, numbered by `replicate`; src/records/replicates.py combines them: the median
run's figures, the spread across runs, a verdict only where every run agrees); two jobs with the
same number are an error, so stale or repeated records must not mix in silently.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pandas as pd

from src.paths import existing_file
from src.publish.staged import staged
from src.records.collect import read_runs, records_from_runs
from src.records.record import Record
from src.records import math_units
from src.records.replicates import Row, combine
from src.records.summary import SHORT_TABLE_NOTE, row_labels, size_key, summary_table

CONTRACT_COLUMNS = ["kernel", "precision", "math", "m", "n", "k", "gflops", "pct_of_cublas_fp32",
                    "pct_of_cublas_tf32", "rel_err", "status", "gpu", "baseline_gflops",
                    "pct_ci_low", "pct_ci_high", "verdict", "best_cublas", "cublaslt_gflops",
                    "pct_of_best_cublas", "pct_best_ci_low", "pct_best_ci_high", "verdict_best",
                    # the spread across independent runs (src/records/replicates.py) and the timer
                    "replicates", "machines", "pct_min", "pct_max", "pct_range_low",
                    "pct_range_high", "gflops_min", "gflops_max", "timer_resolution_ns"]
# After the contract's columns when any row has them (runs with peers): best_*'s strongest peer in
# the same rounds, and a Triton peer's compile + autotune
PEER_COLUMNS = ["peer_name", "peer_gflops", "pct_of_peer", "pct_peer_ci_low", "pct_peer_ci_high",
                "verdict_peer", "peer_compile_s"]
BASELINE_BACKEND = "cublas"
WIDE_FILE = "progression_wide.md"
PROSE_WIDTH = 100


def _round(value, digits: int):
    return None if value is None else round(float(value), digits)


def published_rows(records: list[Record]) -> list[tuple[str, Row]]:
    """(label, row) per kernel (label) and size: the records' replicates combined."""
    return combine(records, row_labels(records))


def progression_frame(records: list[Record]) -> pd.DataFrame:
    """One row per kernel (label) and size, in table order: CONTRACT_COLUMNS, then `backend`,
    `alpha`, `beta` and `size` for the steps that need them (plots). A row's figures are its
    median runs' (replicates.py: GFLOP/s, % of cuBLAS and % of the stronger cuBLAS each its own);
    `verdict` / `verdict_best` hold for every run."""
    rows = []
    for label, row in published_rows(records):
        r, b = row.record, row.against_best
        pct, best = row.pct, row.best
        rows.append({
            "kernel": label, "precision": r.precision, "math": math_units.of_record(r),
            "m": r.m, "n": r.n, "k": r.k,
            "gflops": _round(row.gflops, 1) if r.ok else None,
            "pct_of_cublas_fp32": _round(r.pct_of_cublas_fp32, 2) if r.ok else None,
            "pct_of_cublas_tf32": _round(r.pct_of_cublas_tf32, 2) if r.ok else None,
            "rel_err": None if r.rel_err is None else float(f"{r.rel_err:.3e}"),
            "status": r.status, "gpu": r.gpu,
            # the paired comparison: the baseline timed interleaved in the same job (pct = gflops /
            # baseline_gflops exactly in a row of one run; else each figure its own median run's),
            # the 95% interval of pct and the verdict (tie unless every run's interval excludes
            # 100 on the same side)
            "baseline_gflops": _round(r.baseline_gflops, 1) if r.ok else None,
            "pct_ci_low": _round(r.pct_ci_low, 2) if r.ok else None,
            "pct_ci_high": _round(r.pct_ci_high, 2) if r.ok else None,
            "verdict": (pct.verdict if pct else r.verdict) if r.ok else None,
            # against the stronger of cuBLAS's default and cuBLASLt autotuned for the shape
            # (bench.best_cublas), paired in the same rounds: the median run of that %
            "best_cublas": b.best_cublas if r.ok else None,
            "cublaslt_gflops": _round(b.cublaslt_gflops, 1) if r.ok else None,
            "pct_of_best_cublas": _round(b.pct_of_best_cublas, 2) if r.ok else None,
            "pct_best_ci_low": _round(b.pct_best_ci_low, 2) if r.ok else None,
            "pct_best_ci_high": _round(b.pct_best_ci_high, 2) if r.ok else None,
            "verdict_best": (best.verdict if best else b.verdict_best) if r.ok else None,
            "replicates": row.replicates, "machines": row.machines if r.ok else None,
            "pct_min": _round(pct.low, 2) if pct else None,
            "pct_max": _round(pct.high, 2) if pct else None,
            "pct_range_low": _round(pct.ci_low, 2) if pct else None,
            "pct_range_high": _round(pct.ci_high, 2) if pct else None,
            "gflops_min": _round(min(x.gflops for x in row.runs), 1) if r.ok else None,
            "gflops_max": _round(max(x.gflops for x in row.runs), 1) if r.ok else None,
            "timer_resolution_ns": r.timer_resolution_ns if r.ok else None,
            "peer_name": r.peer_name if r.ok else None,
            "peer_gflops": _round(r.peer_gflops, 1) if r.ok else None,
            "pct_of_peer": _round(r.pct_of_peer, 2) if r.ok else None,
            "pct_peer_ci_low": _round(r.pct_peer_ci_low, 2) if r.ok else None,
            "pct_peer_ci_high": _round(r.pct_peer_ci_high, 2) if r.ok else None,
            "verdict_peer": r.verdict_peer if r.ok else None,
            "peer_compile_s": _round(r.peer_compile_s, 2) if r.ok else None,
            "backend": r.backend, "alpha": r.alpha, "beta": r.beta, "size": r.size_label,
        })
    frame = pd.DataFrame(rows, columns=CONTRACT_COLUMNS + PEER_COLUMNS
                         + ["backend", "alpha", "beta", "size"])
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["backend"] == BASELINE_BACKEND,
                                                    rows[i]["kernel"], size_key(rows[i]["size"])))
    return frame.iloc[order].reset_index(drop=True)


def published_columns(frame: pd.DataFrame) -> list[str]:
    """CONTRACT_COLUMNS, then PEER_COLUMNS when any row has a peer figure."""
    return CONTRACT_COLUMNS + (PEER_COLUMNS if frame[PEER_COLUMNS].notna().any().any() else [])


def size_order(frame: pd.DataFrame) -> list[str]:
    return sorted(frame["size"].unique(), key=size_key)


def _uniform(runs: pd.DataFrame, column: str):
    values = runs[column].dropna().unique() if column in runs else []
    return values[0] if len(values) == 1 else None


def _protocol(runs: pd.DataFrame) -> str:
    b = {key: _uniform(runs, f"bench.{key}") for key in
         ("warmup", "min_samples", "max_samples", "target_rel_iqr", "max_seconds", "flush_l2")}
    if any(value is None for value in b.values()):
        return "Protocol: not the same for every job (see runs.csv, bench.* columns)"
    flush = "L2 flushed before every sample" if str(b["flush_l2"]).lower() == "true" else "L2 not flushed"
    warmup_ms = _uniform(runs, "bench.warmup_ms")  # absent from runs before the timed warm-up
    timed = f" and at least {float(warmup_ms):g} ms" if warmup_ms is not None and float(warmup_ms) > 0 else ""
    return (f"Protocol: {int(b['warmup'])} warm-up launches{timed}, median of at least "
            f"{int(b['min_samples'])} samples (up to {int(b['max_samples'])}, until IQR/median "
            f"<= {100 * float(b['target_rel_iqr']):g}% or {float(b['max_seconds']):g} s), {flush}")


def _ceilings_line(ceilings: dict | None) -> str | None:
    if not ceilings:
        return None
    how = ("measured on this GPU" if ceilings.get("measured")
           else "NOT measured on a GPU: a stand-in, see the ceilings file's provenance")
    return (f"Ceilings ({how}): FP32 FFMA {ceilings['ffma_gflops']:,.0f} GFLOP/s, "
            f"device memory {ceilings['dram_gbs']:,.0f} GB/s.")


def markdown(records: list[Record], runs: pd.DataFrame, ceilings: dict | None,
             wide: bool = False) -> str:
    """progression.md (a table that fits a terminal), or with `wide` progression_wide.md (the
    paired intervals and the stronger cuBLAS, two cells a size)."""
    gpus = sorted({r.gpu for r in records if r.gpu})
    stamps = sorted(str(t) for t in runs["timestamp"].dropna()) if "timestamp" in runs else []
    date = stamps[-1][:10] if stamps else "date unknown"
    failed = [r for r in records if not r.ok]
    lines = [f"# SGEMM progression on {', '.join(gpus) or 'unknown GPU'}, {date}", ""]
    versions = [f"{name} {value}" for name, column in
                (("CUDA driver API", "device.driver"), ("runtime", "device.cuda_runtime"),
                 ("CuPy", "device.cupy"))
                if (value := _uniform(runs, column)) is not None]
    lines.append(", ".join(versions) + (". " if versions else "") + _protocol(runs) + ".")
    lines.append(f"{len(records)} jobs: {len(records) - len(failed)} ok, {len(failed)} failed. "
                 "GFLOP/s = 2·M·N·K / median time; % cuBLAS: against cuBLAS in the kernel's precision "
                 "(FP32 for the FFMA and 3xTF32 kernels, TF32 for the TF32 ones), timed interleaved "
                 "with the kernel in the same job (A B A B ..., the L2 flushed before each launch): the cell names that cuBLAS "
                 "GFLOP/s, so % is exactly the ratio of one run's kernel and cuBLAS figures (in a "
                 "replicated row, the run whose % is the median; its GFLOP/s cell is the run whose "
                 "GFLOP/s is the median), with its 95% bootstrap interval over the paired samples; "
                 "faster / slower only when the interval excludes 100%, else a tie. The cuBLAS rows "
                 "are cuBLAS's own jobs.")
    if (line := _ceilings_line(ceilings)) is not None:
        lines.append(line)
    rows = published_rows(records)
    lines.append(_replicates_line(rows))
    if (line := _short_kernels_line(rows)) is not None:
        lines.append(line)
    lines = [textwrap.fill(line, PROSE_WIDTH) for line in lines]  # prose readable in a terminal
    shown = [row.record for _, row in rows]
    by_cell = {(label, row.record.size_label): row for label, row in rows}
    if wide:
        lines += ["", summary_table(shown, wide=True, rows=by_cell).to_markdown(disable_numparse=True)]
        lines += _against_best(rows)
        lines += _against_peers(rows)
        return "\n".join(lines) + "\n"
    lines += ["", summary_table(shown, rows=by_cell).to_markdown(disable_numparse=True), "",
              textwrap.fill(f"{SHORT_TABLE_NOTE} Replicated rows show each figure's median run; the paired "
                            f"cuBLAS figures, 95% intervals, the runs' range, verdicts and the "
                            f"stronger cuBLAS: {WIDE_FILE}.", PROSE_WIDTH)]
    lines += _against_peers(rows)
    if failed:
        lines += ["", "Failed jobs (no figure anywhere):", ""]
        for label, r in zip(row_labels(records), records):
            if not r.ok:
                first = (r.error or "").splitlines()[0] if r.error else ""
                run = f" (run {r.replicate})" if (r.replicate or 1) > 1 else ""
                lines.append(f"- `{label}` at {r.size_label}{run}: **{r.status}**: {first}")
    return "\n".join(lines) + "\n"


def _replicates_line(rows: list[tuple[str, Row]]) -> str:
    """Which rows were measured in more than one independent run, and how a verdict is reached."""
    repeated = [f"{label} at {row.record.size_label}" for label, row in rows if row.replicates > 1]
    machines = max((row.machines for _, row in rows if row.replicates > 1), default=1)
    fewest = min((row.machines for _, row in rows), default=1)
    if repeated and len(repeated) == len(rows):  # name the rows only when some are not replicated
        runs = sorted({row.replicates for _, row in rows})
        which = (f"Every row was measured in independent runs ({runs[0]}–{runs[-1]} runs: separate "
                 f"processes, fresh inputs; on "
                 f"{fewest if fewest == machines else f'{fewest}–{machines}'} cards). "
                 if runs[0] != runs[-1] or fewest != machines else
                 f"Every row was measured in {runs[0]} independent runs (separate processes, fresh "
                 f"inputs; on {machines} card(s)). ")
    else:
        which = (f"{len(repeated)} rows were measured in independent runs (separate processes, "
                 f"fresh inputs; on up to {machines} machine(s)): {', '.join(repeated)}. "
                 if repeated else "Every row is one run: no row was replicated. ")
    return (which + "A replicated row shows each figure's median run (GFLOP/s, % of cuBLAS with its "
            "run's cuBLAS figure, % of the stronger cuBLAS), the runs' range of % and "
            "the union of their intervals; it is faster / slower only when every run's interval "
            "is on that side of 100%, else a tie. A row of one run says \"(1 run)\".")


SHORT_KERNEL_MS = 0.05  # under 50 us the timer's ticks and launch gaps are a visible share


def _short_kernels_line(rows: list[tuple[str, Row]]) -> str | None:
    """The timer's resolution where it matters: rows whose kernel takes under 50 us."""
    short = [(label, row.record) for label, row in rows if row.record.ok
             and row.record.time_ms_median is not None and row.record.time_ms_median < SHORT_KERNEL_MS
             and row.record.timer_resolution_ns]
    if not short:
        return None
    cells = ", ".join(f"{label} at {r.size_label} ({1e3 * r.time_ms_median:.1f} us, "
                      f"{r.timer_resolution_ns:g} ns = {100 * r.timer_resolution_ns * 1e-6 / r.time_ms_median:.2f}%)"
                      for label, r in short)
    return (f"Short kernels (under {1e3 * SHORT_KERNEL_MS:g} us), with the timer's resolution: "
            f"{cells}. Each interval is widened by resolution / median of the kernel and of its "
            f"baseline.")


def _against_best(rows: list[tuple[str, Row]]) -> list[str]:
    """The hand-written kernels against the stronger cuBLAS per shape (the default heuristic or
    cuBLASLt autotuned for it, whichever was faster in the same rounds), when the run had it."""
    mine = [(label, row) for label, row in rows
            if row.record.ok and row.record.backend != BASELINE_BACKEND
            and row.record.pct_of_best_cublas is not None]
    if not mine:
        return []
    sizes = sorted({row.record.size_label for _, row in mine}, key=size_key)
    cells: dict[str, dict[str, str]] = {}
    for label, row in mine:
        r, best = row.against_best, row.best
        which = "cuBLASLt autotuned" if "cublaslt" in (r.best_cublas or "") else "cuBLAS default"
        if best is not None and row.replicates > 1:
            text = (f"{r.pct_of_best_cublas:.1f}%, {row.replicates} runs {best.low:.1f}–"
                    f"{best.high:.1f}% [{best.ci_low:.1f}, {best.ci_high:.1f}] {best.verdict}")
        else:
            text = (f"{r.pct_of_best_cublas:.1f}% [{r.pct_best_ci_low:.1f}, {r.pct_best_ci_high:.1f}] "
                    f"{r.verdict_best} (1 run)")
        cells.setdefault(label, {})[r.size_label] = f"{text} ({which})"
    lines = ["", "Against the stronger cuBLAS at each size, in the kernel's precision: cuBLAS's "
             "default heuristic or cuBLASLt with its algorithms autotuned for the shape "
             "(nvmath-python), whichever was faster in the same interleaved rounds; % with its 95% "
             "interval and verdict (over every run of a replicated row).", "",
             "| kernel | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
    for label, row in cells.items():
        lines.append(f"| {label} | " + " | ".join(row.get(size, "") for size in sizes) + " |")
    return lines


def _against_peers(rows: list[tuple[str, Row]]) -> list[str]:
    """The dispatching kernels against the strongest peer timed beside them (their configs'
    `peers`: Triton), and why any listed peer was not compared."""
    mine = [(label, row.record) for label, row in rows
            if row.record.ok and row.record.pct_of_peer is not None]
    skipped = sorted({line for _, row in rows for line in (row.record.peers_skipped or [])})
    if not mine and not skipped:
        return []
    lines = ["", "Against the strongest peer a user would pick instead, in the kernel's accuracy "
             "(best_fp32: FP32-accurate peers, best_tf32: TF32), timed in the same interleaved "
             "rounds; % with its 95% interval, `slower` where the peer wins."]
    if mine:
        sizes = sorted({r.size_label for _, r in mine}, key=size_key)
        cells: dict[str, dict[str, str]] = {}
        for label, r in mine:
            cells.setdefault(label, {})[r.size_label] = (
                f"{r.pct_of_peer:.1f}% of {r.peer_gflops:,.0f} [{r.pct_peer_ci_low:.1f}, "
                f"{r.pct_peer_ci_high:.1f}] {r.verdict_peer} ({r.peer_name})")
        lines += ["", "| kernel | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
        for label, row in cells.items():
            lines.append(f"| {label} | " + " | ".join(row.get(size, "") for size in sizes) + " |")
    if skipped:
        lines += ["", "Peers not compared:", ""] + [f"- {line}" for line in skipped]
    return lines


def metrics(frame: pd.DataFrame, ceilings: dict | None) -> dict:
    ok = frame[frame.status == "ok"]
    out: dict = {"jobs": {"total": len(frame), "ok": len(ok), "failed": len(frame) - len(ok)}}
    if ceilings:
        out["ceilings"] = {"ffma_gflops": round(ceilings["ffma_gflops"], 1),
                           "dram_gbs": round(ceilings["dram_gbs"], 1)}
    for size in size_order(frame):
        here = ok[ok["size"] == size]
        group: dict = {}
        # the best hand-written kernel per math, against cuBLAS in its precision: FFMA (keys
        # best_*, also against the measured FFMA ceiling), 3xTF32 (best_3xtf32_*: FP32-accurate
        # on the tensor cores, against cuBLAS FP32) and TF32 (best_tf32_*)
        for math, precision, prefix in (("ffma", "fp32", "best_"), ("3xtf32", "fp32", "best_3xtf32_"),
                                        ("tf32", "tf32", "best_tf32_")):
            mine = here[(here.backend != BASELINE_BACKEND) & (here.math == math)]
            if not len(mine):
                continue
            best = mine.loc[mine.gflops.idxmax()]
            group[f"{prefix}kernel"] = best.kernel
            group[f"{prefix}gflops"] = best.gflops
            if pd.notna(best[f"pct_of_cublas_{precision}"]):
                group[f"{prefix}pct_of_cublas_{precision}"] = best[f"pct_of_cublas_{precision}"]
            for column in ("baseline_gflops", "pct_ci_low", "pct_ci_high", "verdict"):
                if pd.notna(best[column]):
                    group[f"{prefix}{column}"] = best[column]
            if best.replicates > 1:  # the spread across independent runs
                for column in ("replicates", "pct_min", "pct_max"):
                    group[f"{prefix}{column}"] = best[column]
            if math == "ffma" and ceilings:
                group["best_pct_of_ffma_peak"] = round(100 * best.gflops / ceilings["ffma_gflops"], 2)
        for baseline in ("cublas_fp32", "cublas_tf32"):
            row = here[here.kernel == baseline]
            if len(row):
                group[f"{baseline}_gflops"] = float(row.gflops.iloc[0])
        if group:
            out[f"size_{size}"] = {k: (v.item() if hasattr(v, "item") else v) for k, v in group.items()}
    return out


def load_ceilings(path: Path, records: list[Record]) -> dict:
    """ceilings.json, checked to be of the GPU the jobs ran on (when both name one)."""
    ceilings = json.loads(path.read_text())
    gpus = {r.gpu for r in records if r.gpu}
    if ceilings.get("gpu") and gpus and gpus != {ceilings["gpu"]}:
        raise ValueError(f"{path} is for {ceilings['gpu']!r} but the jobs ran on "
                         f"{', '.join(sorted(gpus))}: ceilings and runs must come from one GPU")
    return ceilings


def write_table(runs_path: Path, out_dir: Path, ceilings_path: Path | None = None) -> pd.DataFrame:
    runs = read_runs(runs_path)
    if runs.empty:
        raise ValueError(f"{runs_path} has no jobs")
    records = records_from_runs(runs)
    ceilings = load_ceilings(ceilings_path, records) if ceilings_path else None
    frame = progression_frame(records)
    with staged(out_dir) as new:  # every file replaces the published one, or none does
        frame[published_columns(frame)].to_csv(new("progression.csv"), index=False)
        new("progression.md").write_text(markdown(records, runs, ceilings))
        new(WIDE_FILE).write_text(markdown(records, runs, ceilings, wide=True))
        new("metrics.json").write_text(json.dumps(metrics(frame, ceilings), indent=2) + "\n")
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m src.publish.table",
        description="runs.csv -> progression.csv, progression.md and metrics.json")
    parser.add_argument("runs", type=existing_file(
        "the progression table is made from a runs CSV, e.g. results/<gpu>/runs.csv, which the bench "
        "stage collects"), help="runs.csv written by src.records.collect")
    parser.add_argument("--ceilings", type=existing_file(
        "--ceilings names the ceilings.json that python -m src.job.ceilings writes for the GPU; leave "
        "it out for no ceilings"), help="ceilings.json written by src.job.ceilings")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        frame = write_table(args.runs, args.out_dir, args.ceilings)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = int((frame.status != "ok").sum())
    print(f"{len(frame)} rows ({failed} failed) -> {args.out_dir}/progression.csv, "
          f"progression.md, {WIDE_FILE}, metrics.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
