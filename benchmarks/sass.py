"""What the compiler made of a kernel: its SASS, built offline with nvcc for a named GPU (no GPU
needed; nvcc and cuobjdump are), from exactly what a run prepares (src/job/prepare.py: the tuned
parameters for that GPU and size, then the spec and source).

  python -m benchmarks.sass [CHAPTER ...] [--gpu h100_sxm] [--size 4096]
      one row per chapter (every chapter if none is named): registers, FFMA / HMMA / HGMMA
      counts, and the memory instructions by width (LDG.E.128, LDS.128, LDGSTS...128, TMA) and
      local-memory traffic (LDL / STL, which should be absent);
  python -m benchmarks.sass --hist KERNEL [param=value ...] [--gpu h100_sxm] [--size M,N,K]
      the opcode histogram of one kernel at those parameters: how much of the code is FFMA.

A chapter with a fixed target (`arch: sm_90a`) is built for it, the others for the GPU's own
architecture. Prints its table last.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


from src.errors import LabError
from src.job.config import kernel_config
from src.job.gpu import known_specs
from src.job.nvcc import compile_offline
from src.job.prepare import PreparedJob, datasheet_target, prepare_kernel
from src.job.problem import Problem
from src.paths import CONF_DIR

# LDSM (ldmatrix) before LDS, or it would count as a plain LDS
MEMORY_OPS = re.compile(r"\b((?:LDGSTS|LDG|STG|LDSM|LDS|STS|LDL|STL|UTMALDG|UTMASTG)(?:\.[A-Z0-9]+)*)")
# an instruction line of cuobjdump: /*0040*/  [@P0 | @!UP1]  OPCODE.MODIFIERS ...
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def chapters() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "kernel").glob("[0-9][0-9]_*.yaml"))


def problem_of(text: str) -> Problem:
    """`4096` or `M,N,K` (or MxNxK) as a problem with alpha = 1, beta = 0."""
    sizes = [int(x) for x in re.split(r"[,x]", text)]
    if len(sizes) == 1:
        sizes *= 3
    if len(sizes) != 3 or min(sizes) < 1:
        raise SystemExit(f"--size takes N or M,N,K of positive integers, not {text!r}")
    return Problem(*sizes, 1.0, 0.0)


def build_sass(prepared: PreparedJob) -> tuple[dict, str]:
    """ptxas's report and cuobjdump's SASS of the prepared kernel, for its fixed target if it has
    one, else for the target GPU's compute capability."""
    if shutil.which("cuobjdump") is None:
        raise SystemExit("cuobjdump is not on PATH: the SASS tool needs the CUDA toolkit's binary "
                         "utilities (the GPU box has them; nvcc alone does not disassemble).")
    arch = prepared.spec.arch or f"sm_{prepared.target.limits['compute_capability']}"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        report = compile_offline(prepared.spec, arch, cubin=cubin)
        sass = subprocess.run(["cuobjdump", "--dump-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    return report, sass


def prepared_for(name: str, problem: Problem, gpu: str, params: dict | None = None) -> PreparedJob:
    where = datasheet_target(known_specs()[gpu])
    return prepare_kernel(kernel_config(name), problem, where, overrides=params or None)


def instruction_counts(sass: str) -> tuple[dict, collections.Counter]:
    """The math instructions (FFMA, HMMA, HGMMA) and the memory instructions, by their full
    opcode with modifiers, in cuobjdump's SASS text."""
    ops = collections.Counter(OPCODE.findall(sass))
    math = {op: ops[op] for op in ("FFMA", "HMMA", "HGMMA")}
    return math, collections.Counter(MEMORY_OPS.findall(sass))


def memory_table(names: list[str], problem: Problem, gpu: str) -> list[str]:
    lines = [f"{'kernel':<26} {'regs':>4} {'FFMA':>5} {'HMMA':>5} {'HGMMA':>5}  memory instructions "
             f"in SASS ({gpu}, {problem.label})"]
    for name in names:
        try:
            report, sass = build_sass(prepared_for(name, problem, gpu))
        except LabError as exc:
            lines.append(f"{name:<26} FAILED: {str(exc).splitlines()[0][:100]}")
            continue
        math, memory = instruction_counts(sass)
        text = ", ".join(f"{op} x{n}" for op, n in sorted(memory.items()))
        lines.append(f"{name:<26} {report['registers']:>4} {math['FFMA']:>5} {math['HMMA']:>5} "
                     f"{math['HGMMA']:>5}  {text}")
        print(lines[-1], file=sys.stderr, flush=True)  # progress: each build takes seconds
    return lines


def histogram(name: str, params: dict, problem: Problem, gpu: str, top: int = 14) -> list[str]:
    prepared = prepared_for(name, problem, gpu, params)
    report, sass = build_sass(prepared)
    ops = collections.Counter(OPCODE.findall(sass))
    total = sum(ops.values())
    return [f"{prepared.spec.entry} ({gpu}, {problem.label}): {report['registers']} regs, "
            f"{report['spill_store_bytes']} B spilled, {total} instructions",
            "  " + ", ".join(f"{op} {n} ({100 * n / total:.0f}%)" for op, n in ops.most_common(top))]


def parse_params(items: list[str]) -> dict:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"kernel parameters are given as name=value, not {item!r}")
        params[key] = int(value) if value.lstrip("-").isdigit() else value
    return params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[3:]))
    parser.add_argument("names", nargs="*",
                        help="chapters (table) or, with --hist, KERNEL [param=value ...]")
    parser.add_argument("--hist", action="store_true", help="opcode histogram of one kernel")
    parser.add_argument("--gpu", default="h100_sxm", help="GPU spec (conf/gpu/) to build for")
    parser.add_argument("--size", default="4096", help="N or M,N,K (default 4096)")
    args = parser.parse_args(argv)
    if args.gpu not in known_specs():
        parser.error(f"--gpu must name a spec in conf/gpu/: {', '.join(known_specs())}")
    problem = problem_of(args.size)
    if args.hist:
        if not args.names:
            parser.error("--hist needs a kernel name, then its parameters as name=value")
        lines = histogram(args.names[0], parse_params(args.names[1:]), problem, args.gpu)
    else:
        unknown = sorted(set(args.names) - set(chapters()))
        if unknown:
            parser.error(f"no chapter {', '.join(unknown)} in conf/kernel/")
        lines = memory_table(args.names or chapters(), problem, args.gpu)
    print("\n".join(lines))
    return 1 if any(" FAILED: " in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
