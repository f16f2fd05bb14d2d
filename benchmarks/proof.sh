#!/usr/bin/env bash
# One chapter's proof on the GPU box, in one command:
#   bash benchmarks/proof.sh CHAPTER [--vary key=v1,v2 ...]
# CHAPTER is a conf/kernel name or its number (23 or 23_wgmma_3xtf32). In order:
#   1. its GPU tests: pytest -m gpu -k CHAPTER (the every-kernel tests at its name, and the tests
#      marked @pytest.mark.chapter(CHAPTER): its edge shapes, schedules, accuracy);
#   2. its SASS for an H100 SXM at 4096 (python -m benchmarks.sass): registers, FFMA/HMMA/HGMMA, the
#      width of its loads and stores, no LDL/STL;
#   3. python -m benchmarks.variants at the published sizes 1024, 2048, 4096, 8192 against cuBLAS in one
#      process, and verified at shapes off every tile with alpha = 0.5, beta = 3 (4095x4097x333,
#      1000^3, 17x33x5);
#   4. with --vary: variants.py at VARY_SIZES (default 4096,8192) over the crossed values, as
#      variants.py crosses them (key is a kernel parameter or map.<matrix>.<field>);
# Logs go to $OUT/proof_CHAPTER (default /tmp/proof_CHAPTER). Prints a short table last; exits
# non-zero when a step failed. The published figures themselves come from `dvc repro`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1  # python -m from the root: benchmarks/ and src/ import as packages

usage() { echo "usage: bash benchmarks/proof.sh CHAPTER [--vary key=v1,v2 ...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
[[ $1 =~ ^[0-9]$ ]] && set -- "0$1" "${@:2}"  # chapter 7 is 07_...
matches=$(ls conf/kernel | sed -n "s/^\(${1}\(_[a-z0-9_]*\)\?\)\.yaml$/\1/p")
[ "$(echo "$matches" | grep -c .)" -eq 1 ] || {
  echo "proof.sh: '$1' must name exactly one chapter in conf/kernel/ (found: ${matches:-none})" >&2; exit 2; }
chapter=$matches; shift
vary=()
while [ $# -gt 0 ]; do
  case $1 in
    --vary) [ $# -ge 2 ] || usage; vary+=(--vary "$2"); shift 2 ;;
    --vary=*) vary+=(--vary "${1#--vary=}"); shift ;;
    *) echo "proof.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
out=${OUT:-/tmp}/proof_$chapter; mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)
echo "== proof of $chapter on $gpu"
failed=0
rows=()
row() { rows+=("| $1 | $2 |"); }

echo "== 1. GPU tests (-k $chapter)"
python3 -m pytest -q -p no:cacheprovider -m gpu -k "$chapter" tests/test_gpu.py >"$out/tests.log" 2>&1 || failed=1
tail -15 "$out/tests.log"
row "GPU tests -k $chapter" "$(tail -1 "$out/tests.log" | tr -d '=' | sed 's/^ *//; s/ *$//')"

echo "== 2. SASS"
python3 -m benchmarks.sass "$chapter" >"$out/sass.log" 2>"$out/sass.err" || { failed=1; tail -5 "$out/sass.err"; }
cat "$out/sass.log"
row "SASS (h100_sxm, 4096)" "$(tail -1 "$out/sass.log" | awk '$2 ~ /^[0-9]+$/ {
  printf "regs %s, FFMA %s, HMMA %s, HGMMA %s;", $2, $3, $4, $5; for (i = 6; i <= NF; i++) printf " %s", $i; next }
  { print "FAILED (see sass.log)" }')"

variants() {  # name, label, variants.py arguments...: runs it, prints its table, adds a row
  local name=$1 label=$2 ok bad; shift 2
  local log=$out/$name.log table=$out/$name.table
  python3 -m benchmarks.variants "$chapter" "$@" >"$log" 2>&1 || failed=1
  sed -n "/^$chapter on /,\$p" "$log" | tee "$table"
  if [ ! -s "$table" ]; then tail -5 "$log"; failed=1; row "$label" "no table (see $name.log)"; return; fi
  ok=$(grep -cE '[0-9x] +ok ' "$table")  # a row: label, shape, status, text
  bad=$(grep -cE '[0-9x] +FAILED ' "$table")
  [ "$bad" -eq 0 ] || failed=1
  row "$label" "$ok ok, $bad failed"
}
echo "== 3. published sizes, and shapes off the tile with alpha = 0.5, beta = 3"
variants published "variants at 1024-8192 and off-tile shapes" --sizes 1024,2048,4096,8192 --shape 4095,4097,333,0.5,3.0 \
    --shape 1000,1000,1000,0.5,3.0 --shape 17,33,5,0.5,3.0
if [ ${#vary[@]} -gt 0 ]; then
  echo "== 4. variants ${vary[*]}"
  variants vary "variants ${vary[*]}" --sizes "${VARY_SIZES:-4096,8192}" "${vary[@]}"
fi

echo
echo "== $chapter on $gpu: summary (logs in $out)"
echo "| step | result |"
echo "|---|---|"
printf '%s\n' "${rows[@]}"
sed -n '2,$p' "$out/published.table" 2>/dev/null
exit $failed
