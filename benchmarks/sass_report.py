"""Memory instructions in each chapter's SASS (sm_90, default parameters): are the loads as wide
as intended (LDG.E.128 / LDS.128 in 06) and is there no local-memory traffic (LDL/STL)?
Needs nvcc and cuobjdump (the GPU box has both). Usage: python benchmarks/sass_report.py"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from omegaconf import OmegaConf  # noqa: E402

from src.compile import compile_offline  # noqa: E402
from src.gpu import limits_from_spec  # noqa: E402
from src.problem import Problem  # noqa: E402
from src.spec import build_spec  # noqa: E402

CONF = Path(__file__).resolve().parent.parent / "conf" / "kernel"
OPS = re.compile(r"\b((?:LDG|STG|LDS|STS|LDL|STL)(?:\.[A-Z0-9]+)*)")

print(f"{'kernel':<18} {'regs':>4}  memory instructions in SASS (sm_90)")
for path in sorted(CONF.glob("0*.yaml")):
    spec = build_spec(OmegaConf.load(path), Problem(4096, 4096, 4096, 1, 0), limits_from_spec("h100_sxm"))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        report = compile_offline(spec, "sm_90", cubin=cubin)
        sass = subprocess.run(["cuobjdump", "--dump-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    counts = collections.Counter(OPS.findall(sass))
    text = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
    print(f"{spec.name:<18} {report['registers']:>4}  {text}")
