"""The CUDA toolchain as the offline builds call it: where nvcc is, and its flags for an
architecture. Shared by the kernels' offline builds (nvcc.py) and the CUTLASS peer's library
(cutlass_build.py), below both, so neither build imports the other's step."""

from __future__ import annotations

import shutil


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def nvcc_arch_options(arch: str) -> list[str]:
    """nvcc's flags for `arch`. An arch-specific target (sm_90a) is spelled as -gencode: nvcc
    13.0's -arch=sm_90a shorthand also runs a plain sm_90 pass, which rejects wgmma."""
    if arch.endswith("a"):
        number = arch[len("sm_"):]
        return [f"-gencode=arch=compute_{number},code={arch}"]
    return [f"-arch={arch}"]
