#!/usr/bin/env bash
# Issue-2 acceptance run on the GPU box: GPU tests, the progression sweep twice (reproducibility),
# the goal check, and the bad-input errors as a user sees them. Prints a short table last.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python3 -m pytest -q -m gpu 2>&1 | tail -3
for bad in "kernel=07_nope" "kernel=06_vectorize kernel.params.bk=6" "size=0" "kernel=05_blocktile_2d size=1000" "gpu=b200"; do
  echo "\$ python -m src.run $bad"
  python3 -m src.run $bad 2>&1 | grep -v '^\s*provider=\|^Primary\|^Set the env\|^\s*$\|^Config search path' | tail -4
  echo "exit code: ${PIPESTATUS[0]}"
done
rm -rf multirun/mixed  # a sweep directory holds one sweep
# A sweep with jobs that must fail (invalid tile parameters, unsupported size) next to good ones.
python3 -m src.run -m kernel=04_blocktile_1d,05_blocktile_2d kernel.params.bm=64,128 size=1000,1024 \
  hydra.sweep.dir=multirun/mixed > "$out/mixed.log" 2>&1
# The issue's command, exactly, twice.
python3 -m src.run -m 'kernel=glob(*)' size=1024,4096 > "$out/run1.log" 2>&1
run1=$(ls -td multirun/*/*/ | head -1)
python3 -m src.run -m 'kernel=glob(*)' size=1024,4096 > "$out/run2.log" 2>&1
run2=$(ls -td multirun/*/*/ | head -1)
python3 - "$out" "$run1" multirun/mixed <<'PY'
import json, sys
from pathlib import Path
from src.records.record import load_records
for name, sweep in (("records_progression.jsonl", sys.argv[2]), ("records_mixed.jsonl", sys.argv[3])):
    with open(Path(sys.argv[1]) / name, "w") as f:
        for r in load_records(Path(sweep)):
            f.write(json.dumps(r.to_dict(), default=str) + "\n")
PY
tail -8 "$out/mixed.log"
tail -14 "$out/run1.log"
python3 benchmarks/check_progression.py "$run1" "$run2"
python3 benchmarks/sass_report.py
