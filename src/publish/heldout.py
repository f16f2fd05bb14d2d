"""Held-out step: best_fp32 / best_tf32 on the held-out shapes (conf/suite/heldout.yaml, never
used in tuning) -> results/<gpu>/heldout.csv and heldout.md: per precision the geometric mean and
minimum of the ratio to the stronger cuBLAS (cuBLAS's default where cuBLASLt was not measured),
the failed count, issue 39's goals, the worst five shapes, and the rows measured through an earlier
dispatch than today's conf/tuned/<gpu>.yaml (a re-fit moved their choice): a goal is met only by
figures of the dispatch that runs today.

`python -m src.publish.heldout RUNS_CSV --gpu GPU --out-dir results/GPU`
`python -m src.publish.heldout RUNS_CSV --gpu GPU --stale`: the rows to measure again, as sweeps
(src/publish/dispatched.py, which decides which rows ran today's dispatch)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from src.paths import existing_file
from src.publish.dispatched import print_stale
from src.publish.staged import staged
from src.publish.ratios import geomean
from src.publish.suite import suite_frame
from src.records.collect import read_runs, runs_refusal

# Issue 39's bar on shapes the dispatch never saw, against the stronger cuBLAS: (geomean, min)
GOALS = {"fp32": (1.5, 0.95), "tf32": (1.05, 0.90)}
KERNELS = {"fp32": "best_fp32", "tf32": "best_tf32"}


def heldout_frame(runs: pd.DataFrame, gpu_spec: str | None = None) -> pd.DataFrame:
    """The dispatching kernels' rows, with `value` the ratio the report uses and, with the GPU
    spec, `dispatch_now`: what today's dispatch runs instead where a re-fit moved the row's
    choice (empty where it runs the same, or the row was not checked)."""
    frame = suite_frame(runs, gpu_spec=gpu_spec).copy()
    frame["suite"] = "heldout"
    frame["value"] = frame.ratio_best.where(frame.ratio_best.notna(), frame.ratio)
    frame["against"] = ["best cuBLAS" if pd.notna(b) else "cuBLAS" for b in frame.ratio_best]
    return frame[[c for c in frame.columns if c != "dispatch_now"] + ["dispatch_now"]]  # last, as published


def summary(frame: pd.DataFrame) -> dict:
    out = {}
    for precision, kernel in KERNELS.items():
        rows = frame[frame.kernel == kernel]
        if rows.empty:
            continue
        ok = rows[(rows.status == "ok") & rows.value.notna()]
        moved = rows.dispatch_now.notna() if "dispatch_now" in rows else pd.Series(False, rows.index)
        entry = {"kernel": kernel, "shapes": int(len(rows)), "failed": int(len(rows) - len(ok)),
                 "earlier_dispatch": int(moved.sum())}
        if len(ok):
            low = ok.loc[ok.value.idxmin()]
            entry.update(geomean=round(geomean(ok.value), 4), min=round(float(low.value), 4),
                         min_shape=low["shape"])
            goal_geo, goal_min = GOALS[precision]
            entry["goal_met"] = bool(entry["failed"] == 0 and entry["earlier_dispatch"] == 0
                                     and entry["geomean"] >= goal_geo and entry["min"] >= goal_min)
            worst = ok.sort_values(["value", "shape"]).head(5)
            entry["worst"] = [{"shape": r["shape"], "chosen": r["chosen"], "ratio": round(float(r.value), 4),
                               "against": r["against"]} for _, r in worst.iterrows()]
        out[precision] = entry
    return out


def markdown(frame: pd.DataFrame, gpu_spec: str) -> str:
    stats = summary(frame)
    lines = [f"# Held-out shapes on {gpu_spec}", "",
             "Shapes drawn from conf/shapes/distribution.yaml with the held-out seed, never used in "
             "tuning (conf/suite/heldout.yaml). Ratio: speed / the stronger cuBLAS (paired). "
             f"Earlier dispatch: rows whose choice conf/tuned/{gpu_spec}.yaml has moved since they "
             "were measured, or where the run-time autotune (conf/dispatch/default.yaml) measures "
             "candidates now and did not then, or the reverse (a goal is met by today's dispatch "
             "only).", "",
             "| precision | kernel | shapes | failed | earlier dispatch | geomean | min (shape) "
             "| goal (geomean / min) | met |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for precision, s in stats.items():
        goal = GOALS[precision]
        lines.append(f"| {precision} | {s['kernel']} | {s['shapes']} | {s['failed']} | "
                     f"{s['earlier_dispatch']} | "
                     f"{s.get('geomean', '')} | {s.get('min', '')} ({s.get('min_shape', '')}) | "
                     f"{goal[0]} / {goal[1]} | {'yes' if s.get('goal_met') else 'no'} |")
    for precision, s in stats.items():
        lines += ["", f"## {s['kernel']}: the worst five", "", "| shape | chosen | ratio |",
                  "| --- | --- | --- |"]
        lines += [f"| {w['shape']} | {w['chosen']} | {w['ratio']:.3f} ({w['against']}) |"
                  for w in s.get("worst", [])]
        failed = frame[(frame.kernel == s["kernel"]) & (frame.status != "ok")]
        lines += [f"| {r['shape']} | {r['chosen'] or ''} | {r['status']} |" for _, r in failed.iterrows()]
        if s["earlier_dispatch"]:
            moved = frame[(frame.kernel == s["kernel"]) & frame.dispatch_now.notna()]
            lines += ["", f"## {s['kernel']}: measured through an earlier dispatch", "",
                      "| shape | measured | ratio | today's dispatch runs |", "| --- | --- | --- | --- |"]
            lines += [f"| {r['shape']} | {r['chosen']} | {r['value']:.3f} | {r['dispatch_now']} |"
                      for _, r in moved.sort_values(["m", "n", "k"]).iterrows()]
    return "\n".join(lines) + "\n"


PREFIX = "heldout"  # results/<gpu>/heldout.csv, heldout.md


def publish(runs_csv: Path, out_dir: Path, gpu_spec: str) -> dict:
    """Write one GPU's held-out report into its published set out_dir (results/<gpu_spec>/),
    both files replacing the published ones together or neither (staged.py). Rows of another
    GPU spec are refused: a set holds one GPU's figures only. Returns the metrics."""
    frame = heldout_frame(read_runs(runs_csv), gpu_spec)
    if frame.empty:
        raise ValueError(f"{runs_csv} has no best_fp32 / best_tf32 jobs: nothing to publish")
    refusal = runs_refusal(gpu_spec, runs_csv)  # a set holds one GPU's figures only
    if refusal:
        raise ValueError(refusal)
    rows = frame.drop(columns="gpu_spec")
    out_dir.mkdir(parents=True, exist_ok=True)
    with staged(out_dir) as new:
        rows.to_csv(new(f"{PREFIX}.csv"), index=False)
        new(f"{PREFIX}.md").write_text(markdown(rows, gpu_spec))
    return {gpu_spec: summary(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=existing_file(
        "the held-out report is made from a runs CSV, e.g. results/<gpu>/heldout_runs.csv, which the "
        "heldout stage collects"), help="runs CSV of the held-out sweep (src.records.collect)")
    parser.add_argument("--gpu", required=True,
                        help="the GPU spec (conf/gpu/<name>.yaml) whose published set this is")
    parser.add_argument("--out-dir", type=Path, help="its set: results/<gpu>/")
    parser.add_argument("--stale", action="store_true",
                        help="print the rows today's dispatch no longer runs as measured, as "
                             "'KERNEL shape,...' lines to measure again; write nothing")
    args = parser.parse_args(argv)
    if args.stale:
        return print_stale(args.runs, args.gpu)
    if args.out_dir is None:
        parser.error("--out-dir is required to publish (rule: the report goes into its GPU's set, "
                     "results/<gpu>/)")
    try:
        publish(args.runs, args.out_dir, args.gpu)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print((args.out_dir / f"{PREFIX}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
