#!/usr/bin/env bash
# Acceptance run for chapter 21 (FFMA for Hopper) on the GPU box: its GPU tests (sizes that are
# not multiples of its tile, alpha/beta, split-K), its SASS (LDS.128, LDGSTS, no LDL/STL), the
# variants behind its chapter header timed against cuBLAS FP32 in one process, and Nsight
# Compute's warp-stall sampling of it and of cuBLAS. The published figures come from `dvc repro`.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -m gpu -k "ffma_hopper or 21_ffma" tests/test_gpu.py 2>&1 | tail -3
python3 benchmarks/sass_report.py h100_sxm 17_flagship 21_ffma_hopper
python3 benchmarks/variants.py 21_ffma_hopper --sizes 4096,8192 --shape 1000,1000,1000,0.5,3.0 \
    --shape 4095,4097,333,0.5,3.0 --vary fma_order=3,1 --vary loads_first=2,1 2>&1 | sed -n '/ on /,$p'
python3 benchmarks/variants.py 21_ffma_hopper --sizes 1024 --vary split_k=1,2,4 --vary bn=128,256 \
    --vary threads=128,256 2>&1 | sed -n '/ on /,$p' | grep -v FAILED
TUNED_FOR=h100_sxm bash benchmarks/ncu_stalls.sh 4096 21_ffma_hopper 17_flagship cublas_fp32 | grep -v '^ '
