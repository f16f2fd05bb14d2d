#!/usr/bin/env bash
# `dvc repro` in a fresh clone on the GPU box, then again (must report everything up to date).
# Writes results/ and dvc.lock to $OUT/dvc_results.tgz. With --check-force it then runs
# `dvc repro -f` in the same clone and compares every ok row with the first run (within 3%),
# writing the forced run to $OUT/dvc_results_forced.tgz. Usage: bash benchmarks/dvc_repro.sh [--check-force]
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
# Snapshot the working tree (whatever .git the copy has or lacks) into a throwaway repository,
# then clone that: the clone holds exactly the tracked-or-unignored files of this tree.
rm -rf /tmp/snap /tmp/fresh && mkdir -p /tmp/snap
tar --exclude=./.git --exclude=./.whl --exclude=./.gl -cf - . | tar -xf - -C /tmp/snap
(cd /tmp/snap && git init -q && git add -A && git -c user.email=lab@localhost -c user.name=lab commit -qm snapshot) || exit 1
git clone -q /tmp/snap /tmp/fresh && cd /tmp/fresh || exit 1
[ -d .dvc ] || { echo "no .dvc in the clone"; exit 1; }
command -v python >/dev/null || { mkdir -p /tmp/bin; ln -sf "$(command -v python3)" /tmp/bin/python; export PATH=/tmp/bin:$PATH; }
export PYTHONUNBUFFERED=1
start=$(date +%s)
python3 -m dvc repro 2>&1 | tail -12
echo "dvc repro took $(( $(date +%s) - start )) s"
python3 -m dvc repro 2>&1 | tail -3
python3 -m dvc status
tar czf "$out/dvc_results.tgz" results dvc.lock
cat results/progression.md
if [ "${1:-}" = "--check-force" ]; then
  rm -rf /tmp/first && cp -r results /tmp/first
  python3 -m dvc repro -f 2>&1 | tail -3
  tar czf "$out/dvc_results_forced.tgz" results dvc.lock
  # every (kernel, size) ok in both runs within 3% of GFLOP/s, and no status changed
  python3 - results/runs.csv /tmp/first/runs.csv 3 <<'EOF'
import sys
import pandas as pd
key = ["kernel", "m", "n", "k"]
new, old = (pd.read_csv(p)[key + ["status", "gflops"]] for p in sys.argv[1:3])
tolerance = float(sys.argv[3])
both = new.merge(old, on=key, suffixes=("_new", "_old"))
ok = both[(both.status_new == "ok") & (both.status_old == "ok")].copy()
ok["change_pct"] = 100.0 * (ok.gflops_new / ok.gflops_old - 1.0)
print(ok.sort_values("change_pct", key=abs, ascending=False).head(8).to_string(index=False))
worst = ok.change_pct.abs().max()
status_changed = both[both.status_new != both.status_old]
print(f"{len(ok)} jobs ok in both, {len(status_changed)} changed status; "
      f"largest |change| {worst:.2f}% (tolerance {tolerance}%)")
within = worst <= tolerance and status_changed.empty and len(ok) == len(new)
print("all ok rows reproduce within tolerance" if within else "NOT within tolerance")
sys.exit(0 if within else 1)
EOF
fi
