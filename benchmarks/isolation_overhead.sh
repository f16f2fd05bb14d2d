#!/usr/bin/env bash
# The cost of running jobs in a worker process (src/sweep/worker.py) on a healthy sweep: the same
# sweep (kernels 01-09 at 256 and 512, short protocol, no tracking) with isolation.mode=inline
# and isolation.mode=process; the difference over the job count is the overhead per job
# (it includes starting the one worker). Prints a two-row table last.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/isolation_overhead}
rm -rf "$out"
jobs=0
declare -A wall
for mode in inline process; do
  start=$(date +%s.%N)
  python -m src.run -m 'kernel=glob(0*)' size=256,512 bench=quick mlflow.enabled=false \
    isolation.mode=$mode hydra.sweep.dir="$out/$mode" > "$out.$mode.log" 2>&1
  wall[$mode]=$(python3 -c "import time; print(time.time() - $start)")
  jobs=$(ls -d "$out/$mode"/*/ | wc -l)
  ok=$(grep -l '"status": "ok"' "$out/$mode"/*/record.json | wc -l)
  echo "$mode: $jobs jobs, $ok ok"
done
python3 - "$jobs" "${wall[inline]}" "${wall[process]}" <<'PY'
import sys
jobs, inline, process = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"| isolation | jobs | wall s | s per job |\n|---|---|---|---|")
print(f"| inline | {jobs} | {inline:.1f} | {inline / jobs:.3f} |")
print(f"| process | {jobs} | {process:.1f} | {process / jobs:.3f} |")
print(f"overhead of the worker process: {(process - inline) / jobs * 1000:.0f} ms per job "
      f"({process - inline:.1f} s over {jobs} jobs, one worker start included)")
PY
