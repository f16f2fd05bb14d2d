#!/usr/bin/env bash
# Acceptance run for chapter 23 (3xTF32 on wgmma + TMA) on the GPU box (H100): its GPU tests
# (any M, N, K with alpha/beta in each code path, rel_err <= 1e-5 and within 2x of cuBLAS FP32's on
# the same inputs, the tiny-A case where it is only TF32-accurate), its SASS, its timing against
# cuBLAS FP32 in one process (benchmarks/variants.py: the runner's own spec -> compile -> verify ->
# time, the pre-pass included in the time), then rel_err of 23 next to cuBLAS FP32 and TF32 on
# the same inputs for K = 1024 ... 16384 (benchmarks/accuracy_3xtf32.py), whose table is last.
# Run from the repository root: bash benchmarks/chapter23_proof.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -p no:cacheprovider -m gpu -k "3xtf32 or 23_wgmma" tests/test_gpu.py 2>&1 | tail -15
python3 benchmarks/sass_report.py h100_sxm 23_wgmma_3xtf32 2>&1 | tail -15
echo "== chapter 23 (configured) vs cuBLAS FP32, one process"
python3 benchmarks/variants.py 23_wgmma_3xtf32 --sizes 1024,2048,4096,8192 \
    --shape 4095,4097,333,0.5,3.0 --shape 17,33,5,0.5,3.0 2>&1 | sed -n '/ on /,$p'
echo "== variants at 4096 and 8192 (promotion period, accumulation, product order, 20's tile)"
python3 benchmarks/variants.py 23_wgmma_3xtf32 --sizes 4096,8192 --vary promote=1,4,16 \
    --vary order=1,2 2>&1 | sed -n '/ on /,$p'
python3 benchmarks/variants.py 23_wgmma_3xtf32 --sizes 4096,8192 --vary accumulation=1 \
    --vary bm=128,256 --vary stages=2 --vary in_flight=1 2>&1 | sed -n '/ on /,$p'
echo "== rel_err on the same inputs (M = N = 2048; uniform, a wide dynamic range, tiny A)"
python3 benchmarks/accuracy_3xtf32.py --mn 2048 --ks 1024,2048,4096,8192,16384 --inputs uniform \
    --variant configured --variant accumulation=1 --variant order=2 --variant promote=1,in_flight=1 \
    2>&1 | sed -n '/^rel_err/,$p'
python3 benchmarks/accuracy_3xtf32.py --mn 2048 --ks 1024,4096,16384 --inputs wide,tiny_a \
    --variant configured --variant accumulation=1 2>&1 | sed -n '/^rel_err/,$p'
