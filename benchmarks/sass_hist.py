"""Opcode histogram of one kernel's SASS (sm_90) at given parameters: how much of the code is FFMA,
and what else is there. Usage: python benchmarks/sass_hist.py KERNEL [param=value ...] [m,n,k]"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from omegaconf import OmegaConf  # noqa: E402

from src.job.nvcc import compile_offline  # noqa: E402
from src.job.gpu import limits_from_spec  # noqa: E402
from src.job.problem import Problem  # noqa: E402
from src.job.spec import build_spec  # noqa: E402
from src.tune.tuned import apply as apply_tuned  # noqa: E402

name, *rest = sys.argv[1:]
size = [4096, 4096, 4096]
overrides = {}
for item in rest:
    if "=" in item:
        key, value = item.split("=", 1)
        overrides[key] = int(value)
    else:
        size = [int(x) for x in item.split(",")]
problem = Problem(*size, 1.0, 0.0)
cfg = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parent.parent / "conf" / "kernel" / f"{name}.yaml"))
apply_tuned(cfg, "h100_sxm", problem)
cfg["params"].update(overrides)
spec = build_spec(cfg, problem, limits_from_spec("h100_sxm"))
with tempfile.TemporaryDirectory() as tmp:
    cubin = Path(tmp) / "k.cubin"
    report = compile_offline(spec, "sm_90", cubin=cubin)
    sass = subprocess.run(["cuobjdump", "--dump-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
ops = collections.Counter(m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass))
total = sum(ops.values())
print(f"{spec.entry}: {report['registers']} regs, {report['spill_store_bytes']} B spilled, {total} instructions")
print("  " + ", ".join(f"{op} {n} ({100 * n / total:.0f}%)" for op, n in ops.most_common(14)))
