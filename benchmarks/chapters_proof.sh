#!/usr/bin/env bash
# Acceptance run for chapters 07-17 on the GPU box: GPU tests, every chapter verified at 128 and a
# rectangular shape with alpha/beta, the flagship at shapes that are not multiples of its tiles,
# and the SASS report. (The timed progression at 1024-8192 is `dvc repro`: benchmarks/dvc_repro.sh.)
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python3 -m pytest -q -m gpu 2>&1 | tail -3
K=$(ls conf/kernel | sed -n 's/^\(\(0[7-9]\|1[0-9]\)_.*\)\.yaml$/\1/p' | paste -sd, -)
rm -rf multirun/proof_128 multirun/proof_rect multirun/proof_odd multirun/proof_odd_grid
python3 -m src.run -m kernel=$K size=128 bench=quick hydra.sweep.dir=multirun/proof_128 > "$out/proof.log" 2>&1
python3 -m src.run -m kernel=$K m=2048 n=1024 k=512 alpha=0.5 beta=3.0 bench=quick hydra.sweep.dir=multirun/proof_rect >> "$out/proof.log" 2>&1
python3 -m src.run -m kernel=17_flagship size=1000 'm=4095' 'n=4097' 'k=333' alpha=0.5 beta=3.0 bench=quick hydra.sweep.dir=multirun/proof_odd >> "$out/proof.log" 2>&1
python3 -m src.run -m kernel=17_flagship m=1000,4095 n=1000,4097 k=1000,333 alpha=0.5 beta=3.0 bench=quick hydra.sweep.dir=multirun/proof_odd_grid >> "$out/proof.log" 2>&1
grep -E "jobs, .* ok" "$out/proof.log"
grep -E "^17_flagship" "$out/proof.log" | tail -8
python3 benchmarks/sass_report.py
