"""Memory instructions in each chapter's SASS (sm_90, at the parameters the progression runs: the
tuned ones for an H100 SXM where a chapter is tuned, at 4096): are the loads as wide as intended
(LDG.E.128 / LDS.128 / LDGSTS.E.BYPASS.128) and is there no local-memory traffic (LDL/STL)?
Needs nvcc and cuobjdump (the GPU box has both). Usage: python benchmarks/sass_report.py [gpu_spec] [chapter ...]
A chapter with a fixed target (`arch: sm_90a`) is built for it; HGMMA counts its wgmma."""

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

CONF = Path(__file__).resolve().parent.parent / "conf" / "kernel"
OPS = re.compile(r"\b((?:LDGSTS|LDG|STG|LDS|STS|LDL|STL|UTMALDG|UTMASTG)(?:\.[A-Z0-9]+)*)")

gpu = sys.argv[1] if len(sys.argv) > 1 else "h100_sxm"
only = set(sys.argv[2:])
problem = Problem(4096, 4096, 4096, 1, 0)
print(f"{'kernel':<26} {'regs':>4} {'FFMA':>5} {'HMMA':>5} {'HGMMA':>5}  memory instructions in SASS (sm_90)")
for path in sorted(CONF.glob("[0-9][0-9]_*.yaml")):
    if only and path.stem not in only:
        continue
    cfg = OmegaConf.to_container(OmegaConf.load(path))
    apply_tuned(cfg, gpu, problem)
    spec = build_spec(cfg, problem, limits_from_spec(gpu))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        report = compile_offline(spec, spec.arch or "sm_90", cubin=cubin)
        sass = subprocess.run(["cuobjdump", "--dump-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    counts = collections.Counter(OPS.findall(sass))
    ffma = len(re.findall(r"\bFFMA\b", sass))
    hmma = len(re.findall(r"\bHMMA\.", sass))
    hgmma = len(re.findall(r"\bHGMMA\.", sass))
    text = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
    print(f"{spec.name:<26} {report['registers']:>4} {ffma:>5} {hmma:>5} {hgmma:>5}  {text}")
