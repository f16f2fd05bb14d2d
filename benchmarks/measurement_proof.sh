#!/usr/bin/env bash
# Issue 18 on the GPU box (from the repo root; PYTHONPATH set as for the other proofs):
#   1. the cheating kernels (tests/kernels/cheat.cu) are caught with their status and have no
#      figure anywhere; a figure above the ceiling is implausible; healthy kernels pass;
#   2. paired comparisons repeated twice (stability of % and its interval), the checks'
#      overhead per job, and a table last (benchmarks/paired_demo.py).
# The published sweep twice through `dvc repro -f` is run separately.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "== GPU tests: cheating kernels, plausibility, healthy kernels =="
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cheating.py 2>&1 | tail -15
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py \
    -k "test_kernel_verified and 1024 and (06_vectorize or 20_wgmma or cublas)" 2>&1 | tail -3
echo "== paired comparisons, overhead per job =="
timeout 240 python3 benchmarks/paired_demo.py --rounds 2 2>&1 | grep -v Warning
