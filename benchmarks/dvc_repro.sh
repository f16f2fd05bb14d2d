#!/usr/bin/env bash
# `dvc repro` in a fresh clone on the GPU box, then again (must report everything up to date).
# The GPU box's copy of the tree has no .git: snapshot it into a throwaway repository first.
# Writes results/ and dvc.lock to $OUT/dvc_results.tgz. Usage: bash benchmarks/dvc_repro.sh [-f]
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
src=$PWD
if [ ! -d .git ]; then
  git init -q && printf ".whl/\n.gl/\n" >> .git/info/exclude && git add -A && git -c user.email=lab@localhost -c user.name=lab commit -qm snapshot
fi
rm -rf /tmp/fresh && git clone -q "$src" /tmp/fresh && cd /tmp/fresh || exit 1
command -v python >/dev/null || { mkdir -p /tmp/bin; ln -sf "$(command -v python3)" /tmp/bin/python; export PATH=/tmp/bin:$PATH; }
export PYTHONUNBUFFERED=1
start=$(date +%s)
python3 -m dvc repro "$@" 2>&1 | tail -12
echo "dvc repro took $(( $(date +%s) - start )) s"
python3 -m dvc repro 2>&1 | tail -3
python3 -m dvc status
tar czf "$out/dvc_results.tgz" results dvc.lock
cat results/progression.md
