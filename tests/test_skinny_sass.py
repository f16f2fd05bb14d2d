"""The library's skinny kernel (kernels/gemm/ffma_skinny.cu) compiles to chapter 24's machine code,
byte for byte, for every build the tuned files give it: chapter 24 is the measured kernel, and a
change of source form alone (a lambda for an inline load, a variable declared earlier) has cost
the suite row 8 x 4096 x 4096 a third of its speed on the H100 (issue 34)."""

from __future__ import annotations

import ast
import re
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.job import tuned
from src.job.compile import NVRTC_OPTIONS, expand_source
from src.job.gpu import limits_from_spec
from src.job.nvcc import nvcc_path
from src.job.problem import Problem
from src.job.spec import build_spec
from src.paths import KERNELS_DIR
from tests.conftest import CONF_DIR, ROOT

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (no CUDA toolkit)")

# Every small side's width (1 .. 32, and 3, which rounds up), both layouts, aligned and unaligned
# rows of the streamed operand, a big side that gives one-chunk K slices (512 rows: 32 slices of
# 128) and one that does not, and the suite's rows.
WIDTHS = (1, 2, 3, 8, 16, 32)
SHAPES = sorted({*((big, w, k) for w in WIDTHS for big in (512, 4096) for k in (4096, 4095)),
                 *((w, big, k) for w in WIDTHS for big in (512, 4096, 4097) for k in (4096, 333)),
                 (8, 4096, 4096), (4096, 8, 4096), (1, 4096, 4096), (4096, 1, 4096)})
TEMPLATE_ARGS = re.compile(r"<([^>]*)>")


def tuned_builds() -> set[tuple[int, ...]]:
    """The template arguments of gemm_ffma_skinny for every shape above on every tuned GPU."""
    builds = set()
    for path in sorted((CONF_DIR / "tuned").glob("*.yaml")):
        for shape in SHAPES:
            problem = Problem(*shape, 1.0, 0.0)
            cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "gemm_ffma_skinny.yaml"))
            tuned.apply(cfg, path.stem, problem)
            spec = build_spec(cfg, problem, limits_from_spec(path.stem))
            builds.add(tuple(int(x) for x in TEMPLATE_ARGS.search(spec.entry).group(1).split(",")))
    return builds


def kernel_text(source: Path, kernel: str, build: tuple[int, ...], tmp: Path) -> bytes:
    """nvcc's sm_90 machine code (the .text section) of `kernel` for one build: a unit of its own,
    as NVRTC builds one instantiation per job (in a unit of many, nvcc's code for one build can
    depend on what else the unit instantiates)."""
    name = f"{kernel}_{'_'.join(map(str, build))}"
    unit = tmp / f"{name}.cu"
    unit.write_text(expand_source(source)
                    + f"static auto* const entry = &{kernel}<{', '.join(map(str, build))}>;\n")
    cubin = tmp / f"{name}.cubin"
    proc = subprocess.run([nvcc_path(), *NVRTC_OPTIONS, "-ftz=true", "-cubin", "-arch=sm_90",
                           "-diag-suppress", "177", "-o", str(cubin), str(unit)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    [text] = [data for name, data in elf_sections(cubin.read_bytes()).items()
              if re.fullmatch(rf"\.text\._Z\d+{kernel}I(?:Li\d+E)+Ev.*", name)]
    return text


def elf_sections(elf: bytes) -> dict[str, bytes]:
    """A 64-bit little-endian ELF file's sections by name (a cubin is one)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    sections = {}
    for name_offset, kind, _flags, _addr, offset, size in headers:
        name = elf[names_at + name_offset:elf.index(b"\0", names_at + name_offset)].decode()
        sections[name] = b"" if kind == 8 else elf[offset:offset + size]  # 8: SHT_NOBITS
    return sections


def tuned_builds_fresh() -> set[tuple[int, ...]]:
    """tuned_builds() in a fresh interpreter: the tuned files as they are, never a config, limit
    or cache another test of this process has patched or filled (xdist orders tests anew)."""
    proc = subprocess.run([sys.executable, "-c", "from tests.test_skinny_sass import tuned_builds; "
                           "print(sorted(tuned_builds()))"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(ast.literal_eval(proc.stdout.strip()))


@needs_nvcc
def test_library_skinny_kernel_is_chapter_24s_machine_code():
    builds = tuned_builds_fresh()
    # the layouts, widths, load widths, the prefetching builds and one-chunk K slices all occur
    assert {b[0] for b in builds} == {0, 1} and {b[1] for b in builds} == {1, 2, 4, 8, 16, 32}
    assert {b[3] for b in builds} == {1, 4} and {b[6] for b in builds} == {0, 1}
    assert (0, 2, 8, 4, 128, 4, 0) in builds and (1, 8, 8, 4, 256, 8, 0) in builds  # 8 x 4096 x 4096
    chapter_source = KERNELS_DIR / "chapters" / "24_ffma_skinny.cu"
    library_source = KERNELS_DIR / "gemm" / "ffma_skinny.cu"
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=4) as pool:
        chapter = dict(zip(sorted(builds), pool.map(
            lambda b: kernel_text(chapter_source, "sgemm_skinny", b, Path(tmp)), sorted(builds))))
        library = dict(zip(sorted(builds), pool.map(
            lambda b: kernel_text(library_source, "gemm_ffma_skinny", b, Path(tmp)), sorted(builds))))
    differ = sorted(b for b in builds if chapter[b] != library[b])
    assert not differ, (f"{len(differ)} of {len(builds)} builds of gemm_ffma_skinny differ from "
                        f"chapter 24's machine code: {differ}")
