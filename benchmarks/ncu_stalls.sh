#!/usr/bin/env bash
# Where the warps of a GEMM kernel wait, instruction by instruction: Nsight Compute's full set
# (warp-state sampling per SASS instruction, shared-memory wavefronts, issue slots) for each
# kernel named, one launch each at one size, cuBLAS included (its SASS comes with it).
#   benchmarks/ncu_stalls.sh 4096 17_flagship cublas_fp32 17_flagship:lane_map=2
# Writes <tag>.details.csv (sections) and <tag>.sass.csv (per-instruction samples) under $OUT
# (or ./ncu_out), packed as ncu_stalls.tgz.
set -uo pipefail
size=$1; shift
out=${OUT:-ncu_out}/ncu_stalls
mkdir -p "$out"
ncu --version | tail -1
for item in "$@"; do
  tag=$(echo "$item" | tr ':=,' '_~.' | tr '~' '-')
  ncu --set full --import-source no -k regex:gemm -c 1 -f -o "$out/$tag" \
    python3 benchmarks/profile_kernels.py "$item" --size "$size" --launches 1 --tuned-for "${TUNED_FOR:-auto}" >"$out/$tag.log" 2>&1 \
    || { echo "$item: ncu failed"; tail -5 "$out/$tag.log"; continue; }
  ncu -i "$out/$tag.ncu-rep" --page details --csv >"$out/$tag.details.csv" 2>&1
  ncu -i "$out/$tag.ncu-rep" --page source --csv --print-source sass >"$out/$tag.sass.csv" 2>&1 \
    || ncu -i "$out/$tag.ncu-rep" --page source --csv >"$out/$tag.sass.csv" 2>&1
  echo "$item: $(wc -l <"$out/$tag.sass.csv") source lines, $(du -k "$out/$tag.ncu-rep" | cut -f1) KiB report"
  grep -E '"(Issue Slots Busy|Executed Ipc Active|Registers Per Thread|Duration|Warp Cycles Per Issued Instruction)"' \
    "$out/$tag.details.csv" | cut -d, -f13- | head -6
done
tar czf "${OUT:-ncu_out}/ncu_stalls.tgz" -C "$(dirname "$out")" ncu_stalls && rm -rf "$out"
