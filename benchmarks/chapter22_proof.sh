#!/usr/bin/env bash
# Acceptance run for chapter 22 (warp-specialized, persistent FFMA) on the GPU box: its GPU tests
# (sizes that are not multiples of its tile, alpha/beta, split-K, stream-K splits), its SASS, and
# the variants behind its chapter header timed against cuBLAS FP32 in one process. The published
# figures come from `dvc repro`.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -m gpu -k "22_ffma or stream_k" tests/test_gpu.py 2>&1 | tail -3
python3 benchmarks/sass_report.py h100_sxm 21_ffma_hopper 22_ffma_warp_specialized
python3 benchmarks/variants.py 22_ffma_warp_specialized --sizes 1024,2048,4096,8192 \
    --shape 1000,1000,1000,0.5,3.0 --shape 4095,4097,333,0.5,3.0 "$@" 2>&1 | sed -n '/ on /,$p'
python3 benchmarks/variants.py 22_ffma_warp_specialized --sizes 4096,8192,4224x4096x4096 \
    --vary schedule=1,2 "$@" 2>&1 | sed -n '/ on /,$p'
# 1024: the cluster schedule (the tuned size class) against its BK = 8 version and stream-K
python3 benchmarks/variants.py 22_ffma_warp_specialized --sizes 1024 --vary bk=8,16 "$@" 2>&1 | sed -n '/ on /,$p'
python3 benchmarks/variants.py 22_ffma_warp_specialized --sizes 1024 --vary schedule=2 --vary split_k=1 \
    --vary bn=256 --vary wn=64 --vary tm=16 --vary bk=8 "$@" 2>&1 | sed -n '/ on /,$p'
