#!/usr/bin/env bash
# Acceptance run for the tuning sweeper (issue 6) on the GPU box, for kernel 10 at SIZE (4096):
#   1. the full grid, on an empty measurement cache, with write-back to conf/tuned/<gpu>.yaml;
#   2. the same grid again (every candidate a cache hit): time and best compared;
#   3. TPE with a fifth of the grid's measured candidates, measuring afresh (resume=false).
# Prints a table last; summaries and the written tuned file go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
size=${SIZE:-4096}
out=${OUT:-/tmp/tune_acceptance}; mkdir -p "$out"
cache=${CACHE:-/tmp/tune_cache}; rm -rf "$cache" multirun/tune_grid multirun/tune_again multirun/tune_tpe
common=(+tune=10_warptiling size=$size cache_dir=$cache)
run() {  # name, extra args...
  local name=$1; shift
  local start=$(date +%s.%N)
  python -m src.run -m "${common[@]}" "$@" hydra.sweep.dir=multirun/$name > "$out/$name.log" 2>&1
  echo "$name $(python3 -c "import time; print(round(time.time() - $start, 1))")" >> "$out/walls.txt"
  cp multirun/$name/tune_summary.json "$out/$name.json" 2>/dev/null
}
: > "$out/walls.txt"
run tune_grid tune.write_back=true
cp conf/tuned/*.yaml "$out/" 2>/dev/null
run tune_again
grid_measured=$(python3 -c "import json; print(json.load(open('$out/tune_grid.json'))[0]['measured'])")
run tune_tpe tune.strategy=tpe tune.trials=$((grid_measured / 5)) resume=false
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
walls = dict(line.split() for line in (out / "walls.txt").read_text().splitlines())
rows = {}
print("| run | strategy | considered | pruned | measured | from cache | ok | failed compile | failed verification | wall s | best GFLOP/s | best params |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in ("tune_grid", "tune_again", "tune_tpe"):
    path = out / f"{name}.json"
    if not path.is_file():
        print(f"| {name} | (no summary) |"); continue
    d = json.loads(path.read_text())[0]
    rows[name] = d
    best = d["best"] or {}
    p = best.get("params", {})
    print(f"| {name} | {d['strategy']} | {d['candidates_considered']} | {d['pruned']} | {d['measured']} | "
          f"{d['from_cache']} | {d['ok']} | {d['failed_compile']} | {d['failed_verification']} | "
          f"{walls.get(name)} | {best.get('gflops', 0):,.1f} | "
          + " ".join(f"{k}={v}" for k, v in p.items()) + " |")
g, a, t = rows.get("tune_grid"), rows.get("tune_again"), rows.get("tune_tpe")
if g and a:
    speed = float(walls["tune_grid"]) / float(walls["tune_again"])
    print(f"grid: {walls['tune_grid']} s (goal < 600); re-run {speed:.1f}x faster (goal >= 10), "
          f"same best: {g['best']['params'] == a['best']['params'] and g['best']['gflops'] == a['best']['gflops']}")
if g and t:
    ratio = t["best"]["gflops"] / g["best"]["gflops"]
    print(f"tpe: best {t['best']['gflops']:,.1f} = {100 * ratio:.1f}% of the grid's best with "
          f"{t['measured']} of {g['measured']} evaluations ({100 * t['measured'] / g['measured']:.0f}%); "
          f"goal >= 98% with <= 25%")
PY
