#!/usr/bin/env bash
# The tile-parameter sweeps behind conf/tuned/<gpu>.yaml: Hydra multiruns over kernel.params.*
# with the tuned lookup off (use_tuned=false), so each job runs exactly the parameters it names.
# Combinations that break a kernel's constraints are rejected before compiling and recorded as
# invalid_params. A short protocol ranks the candidates; the winners are re-measured with the
# default protocol by the progression run. Usage: bash benchmarks/tune_sweeps.sh [section ...]
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
Q="use_tuned=false bench.min_samples=10 bench.max_seconds=0.5"
sweep() {  # sweep NAME OVERRIDES...
  local name=$1; shift
  rm -rf "multirun/tune/$name"
  python3 -m src.run -m $Q "$@" hydra.sweep.dir="multirun/tune/$name" > "$out/tune_$name.log" 2>&1
  python3 benchmarks/best_of_sweep.py "multirun/tune/$name" --top 4
}
W64x32="kernel.params.bm=128 kernel.params.bn=128 kernel.params.wm=64 kernel.params.wn=32 kernel.params.wniter=2 kernel.params.tm=8 kernel.params.tn=4 kernel.params.threads=256"
W64x64="kernel.params.wm=64 kernel.params.wn=64 kernel.params.wniter=4 kernel.params.tm=8 kernel.params.tn=4"
for section in "${@:-09 10 11 12 17 17_1024}"; do
  case $section in
    09) sweep 09 kernel=09_autotuned size=4096 kernel.params.bm=64,128 kernel.params.bn=64,128 \
          kernel.params.bk=8,16,32 kernel.params.tm=4,8 kernel.params.tn=4,8 ;;
    10) sweep 10a kernel=10_warptiling size=4096 $W64x32 kernel.params.bk=8,16,32
        sweep 10b kernel=10_warptiling size=4096 $W64x64 kernel.params.bm=128 kernel.params.bn=128,256 \
          kernel.params.threads=128,256 kernel.params.bk=8,16 ;;
    11) sweep 11a kernel=11_double_buffer size=4096 $W64x32 kernel.params.bk=8,16
        sweep 11b kernel=11_double_buffer size=4096 $W64x64 kernel.params.bm=128 kernel.params.bn=128,256 \
          kernel.params.threads=128,256 kernel.params.bk=8,16 ;;
    12) sweep 12a kernel=12_cp_async size=4096 $W64x32 kernel.params.bk=8,16,32 kernel.params.stages=2,3,4
        sweep 12b kernel=12_cp_async size=4096 $W64x64 kernel.params.bm=128 kernel.params.bn=128,256 \
          kernel.params.threads=128,256 kernel.params.bk=8,16 kernel.params.stages=3,4 ;;
    17) sweep 17a kernel=17_flagship size=4096 $W64x32 kernel.params.bk=8,16,32 kernel.params.stages=2,3,4 \
          kernel.params.min_blocks=1,2
        sweep 17b kernel=17_flagship size=4096 $W64x64 kernel.params.bm=128,256 kernel.params.bn=128,256 \
          kernel.params.threads=128,256,512 kernel.params.bk=8,16 kernel.params.stages=3,4 ;;
    17_1024) sweep 17c kernel=17_flagship size=1024 $W64x32 kernel.params.bk=16,32 kernel.params.stages=3,4 \
          kernel.params.split_k=1,2,3,4
        sweep 17d kernel=17_flagship size=1024 kernel.params.bm=64 kernel.params.bn=128 kernel.params.wm=32 \
          kernel.params.wn=64 kernel.params.wniter=2 kernel.params.tm=8 kernel.params.tn=4 \
          kernel.params.threads=128 kernel.params.bk=16,32 kernel.params.stages=3,4 kernel.params.split_k=1,2 ;;
    # cuBLAS's own choice on the H100 (ncu: sm80_xmma_gemm ... tilesize256x128x8_stage3_warpsize4x2x1):
    # 64 x 64 warp tiles, 128 accumulators per thread, one 256-thread block per SM.
    17_big) B="kernel=17_flagship kernel.params.bm=256,128 kernel.params.bn=128,256 kernel.params.wm=64 kernel.params.wn=64 kernel.params.threads=256 kernel.params.stages=3,4 kernel.params.ka=2,4"
        sweep 17e size=4096 $B kernel.params.tm=8 kernel.params.tn=4 kernel.params.wniter=4 kernel.params.bk=8,16
        sweep 17f size=4096 $B kernel.params.tm=8 kernel.params.tn=8 kernel.params.wniter=2 kernel.params.bk=8,16
        sweep 17g size=4096 $B kernel.params.tm=16 kernel.params.tn=4 kernel.params.wniter=2 kernel.params.bk=8,16
        sweep 17h size=4096 $B kernel.params.tm=16 kernel.params.tn=8 kernel.params.wniter=1 kernel.params.bk=8,16 ;;
    10_more) sweep 10c kernel=10_warptiling size=4096 kernel.params.bm=128 kernel.params.bn=128 \
          kernel.params.threads=256 kernel.params.wm=32,64 kernel.params.wn=32,64 kernel.params.wniter=1,2,4 \
          kernel.params.tm=4,8 kernel.params.tn=4,8 kernel.params.bk=16,32 ;;
    17_stages) sweep 17j kernel=17_flagship size=4096 kernel.params.bm=128 kernel.params.bn=256 kernel.params.wm=64 \
          kernel.params.wn=64 kernel.params.wniter=2 kernel.params.tm=16 kernel.params.tn=4 kernel.params.threads=256 \
          kernel.params.ka=2 kernel.params.fma_order=3 kernel.params.bk=16,32 kernel.params.stages=3,4,6,8 \
          kernel.params.group_m=4,8,16 ;;
    17_big_1024) sweep 17i size=1024 kernel=17_flagship kernel.params.bm=256 kernel.params.bn=128 kernel.params.wm=64 \
          kernel.params.wn=64 kernel.params.threads=256 kernel.params.tm=8 kernel.params.tn=4,8 kernel.params.wniter=4,2 \
          kernel.params.bk=8,16 kernel.params.stages=3 kernel.params.ka=2 kernel.params.split_k=2,4 ;;
  esac
done
