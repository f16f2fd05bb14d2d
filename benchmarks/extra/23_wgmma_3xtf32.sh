#!/usr/bin/env bash
# Chapter 23's extra proof step (benchmarks/proof.sh runs it after the variants): its normwise
# error next to cuBLAS FP32's and TF32's on the same inputs, against the FP64 reference, for
# K = 1024 ... 16384 (uniform inputs, then a wide dynamic range and the tiny-A case where 3xTF32
# is only TF32-accurate), with the variants of its accumulation. Prints only the tables (or the
# tail of a failure) and exits non-zero when a run fails.
set -uo pipefail
accuracy() {
  local log rc
  log=$(mktemp)
  python3 benchmarks/accuracy_3xtf32.py "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then sed -n '/^rel_err/,$p' "$log"; else echo "accuracy_3xtf32.py $* failed:"; tail -5 "$log"; fi
  rm -f "$log"
  return $rc
}
status=0
accuracy --mn 2048 --ks 1024,2048,4096,8192,16384 --inputs uniform --variant configured \
    --variant accumulation=1 --variant order=2 --variant promote=1,in_flight=1 || status=1
accuracy --mn 2048 --ks 1024,4096,16384 --inputs wide,tiny_a --variant configured \
    --variant accumulation=1 || status=1
exit $status
