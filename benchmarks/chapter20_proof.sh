#!/usr/bin/env bash
# Acceptance run for chapter 20 (wgmma + TMA) on the GPU box: its GPU tests (sizes that are not
# multiples of its tile, alpha/beta, one or two wgmma groups in flight), its SASS (HGMMA, TMA, no
# LDL/STL), and its variants timed against cuBLAS TF32 in one process (benchmarks/variants.py).
# The published figures come from `dvc repro` (benchmarks/dvc_repro.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -m gpu -k "wgmma or 20_wgmma" tests/test_gpu.py 2>&1 | tail -3
python3 benchmarks/sass_report.py h100_sxm 20_wgmma_tf32
python3 benchmarks/variants.py 20_wgmma_tf32 --sizes 4096,8192 --shape 1000,1032,1000,0.5,3.0 \
    --vary in_flight=2,1 --vary map.a.element=tf32,f32 2>&1 | sed -n '/ on /,$p'
