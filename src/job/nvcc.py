"""Offline builds with nvcc: the same source and instantiation NVRTC builds for a run, compiled
for a named architecture on any machine with the CUDA toolkit (no GPU needed), for ptxas's
resource report and the SASS (the CPU compile tests, benchmarks/sass.py)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from src.errors import CompileFailed
from src.job.compile import NVRTC_OPTIONS, expand_source
from src.job.spec import KernelSpec
from src.job.toolchain import nvcc_arch_options, nvcc_path  # noqa: F401  (nvcc_arch_options: this module's API too)


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "static_smem_bytes": re.compile(r"(\d+) bytes smem"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_store_bytes": re.compile(r"(\d+) bytes spill stores"),
    "spill_load_bytes": re.compile(r"(\d+) bytes spill loads"),
}


def compile_offline(spec: KernelSpec, arch: str = "sm_90", cubin: Path | None = None) -> dict:
    """Build the spec's exact source and instantiation with nvcc for `arch`; return ptxas's report.

    The template is instantiated by taking the entry's address in host code, which makes the
    device pass emit exactly the instantiation NVRTC would get from `name_expressions`.
    `cubin`, if given, keeps the binary (for cuobjdump --dump-sass).
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompileFailed("nvcc is not on PATH; offline compile checks need the CUDA toolkit.")
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "unit.cu"
        unit.write_text(expand_source(spec.source)
                        + f"\nstatic auto* const sgemm_lab_entry = &{spec.entry};\n"
                        + (f"static auto* const sgemm_lab_prepass = &{spec.prepass.entry};\n"
                           if spec.prepass else "")
                        + (f"static auto* const sgemm_lab_tail = &{spec.tail.entry};\n"
                           if spec.tail else ""))
        out = cubin if cubin is not None else Path(tmp) / "unit.cubin"
        cmd = [nvcc, *NVRTC_OPTIONS, "-ftz=true", "-cubin", *nvcc_arch_options(arch), "-Xptxas", "-v",
               "-diag-suppress", "177", "-o", str(out), str(unit)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CompileFailed(f"kernel {spec.name} ({spec.entry}) failed to compile for {arch}:\n"
                            f"{proc.stderr.strip()}")
    report: dict = {"arch": arch, "log": proc.stderr}
    entry_log = _entry_log(proc.stderr, spec.entry.split("<")[0])
    for key, pattern in _PTXAS.items():
        found = pattern.search(entry_log)
        report[key] = int(found.group(1)) if found else 0
    return report


def _entry_log(log: str, name: str) -> str:
    """ptxas's lines for the kernel `name` alone: a source with a pre-pass (or a header's) builds
    several kernels, and the report's numbers must be the entry's, not the first in the log."""
    mangled = f"{len(name)}{name}"  # as in _Z33name...: not a prefix of name_cluster's
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", log):
        found = re.search(r"Compiling entry function '([^']+)'", block)
        if found and (found.group(1) == name or mangled in found.group(1)):
            return block
    return log
