"""The library's skinny kernel (kernels/gemm/ffma_skinny.cu) compiles to chapter 24's machine code,
byte for byte, for every build the tuned files give it: chapter 24 is the measured kernel, and a
change of source form alone (a lambda for an inline load, a variable declared earlier) has cost
the suite row 8 x 4096 x 4096 a third of its speed on the H100 (issue 34). Checked through nvcc
and through the runner's own NVRTC build, the code a job launches."""

from __future__ import annotations

import ast
import copy
import re
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.job import tuned
from src.job.compile import NVRTC_OPTIONS, build_cubin, expand_source
from src.job.gpu import limits_from_spec
from src.job.nvcc import nvcc_path
from src.job.problem import Problem
from src.job.spec import build_spec
from src.paths import KERNELS_DIR
from tests.conftest import CONF_DIR, ROOT
from tests.test_compile import needs_nvrtc

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (no CUDA toolkit)")


def suite_shapes() -> set[tuple[int, int, int]]:
    """Every shape of every suite file (conf/suite/), the generated held-out and training sets too."""
    shapes = set()
    for path in sorted((CONF_DIR / "suite").glob("*.yaml")):
        for shape in str(OmegaConf.load(path).hydra.sweeper.params.shape).split(","):
            shapes.add(tuple(int(d) for d in shape.strip().split("x")))
    return shapes


# Every small side (1 .. 32: each width, the bucket edges, both layouts), big sides that give
# many, few or one K slice (256 to 4096 rows or columns, and 4097, unaligned), K of one step (64),
# of slices that round up (333, 1000), unaligned (4095) and a power of two (4096), and the suites'
# shapes with a small side. A K slice can be any multiple of the K step up to max_k_slice for
# some K; these K give the ones the tuned classes pick at the sizes the suites and dispatch run.
SMALL = range(1, 33)
BIG = (256, 512, 1024, 4096, 4097)
K = (64, 333, 1000, 4095, 4096)
SHAPES = sorted({*((big, small, k) for small in SMALL for big in BIG for k in K),
                 *((small, big, k) for small in SMALL for big in BIG for k in K),
                 *(shape for shape in suite_shapes() if min(shape[:2]) <= 32)})
TEMPLATE_ARGS = re.compile(r"<([^>]*)>")


def tuned_builds() -> set[tuple[int, ...]]:
    """The template arguments of gemm_ffma_skinny for every shape above on every tuned GPU."""
    builds = set()
    kernel = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "gemm_ffma_skinny.yaml"))
    for path in sorted((CONF_DIR / "tuned").glob("*.yaml")):
        limits = limits_from_spec(path.stem)
        for shape in SHAPES:
            problem = Problem(*shape, 1.0, 0.0)
            cfg = copy.deepcopy(kernel)
            tuned.apply(cfg, path.stem, problem)
            spec = build_spec(cfg, problem, limits)
            builds.add(tuple(int(x) for x in TEMPLATE_ARGS.search(spec.entry).group(1).split(",")))
    return builds


def nvcc_text(source: Path, kernel: str, build: tuple[int, ...], tmp: Path) -> bytes:
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
    return kernel_section(cubin.read_bytes(), kernel)


def nvrtc_text(source: Path, kernel: str, build: tuple[int, ...], tmp: Path) -> bytes:
    """The same through the runner's own build (NVRTC, its options, one instantiation per job):
    the code a job launches."""
    cubin = build_cubin(expand_source(source), f"{kernel}<{', '.join(map(str, build))}>", "sm_90",
                        tmp / "cache")
    return kernel_section(Path(cubin.path).read_bytes(), kernel)


def kernel_section(cubin: bytes, kernel: str) -> bytes:
    """The .text section of the one instantiation of `kernel` in a cubin."""
    [text] = [data for name, data in elf_sections(cubin).items()
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


# The compiler gives the same source different code now and then: NVRTC 13.5 (the runner's) built
# 1 or 2 of the builds differently in most runs of all of them, never the same build twice, and
# chapter 24's own text as often as the library's (its (0, 32, 8, 4, 512, 4, 0) two ways in two
# runs). So a build whose texts differ is built again before it counts as differing.
RETRIES = 3


def differing(text_of, builds: list[tuple[int, ...]], tmp: Path) -> list[tuple[int, ...]]:
    """The builds for which no text of the library's kernel is one of chapter 24's, each build
    compiled once and a differing one up to RETRIES more times (a fresh folder each time, so no
    build is served from a cache)."""
    chapter_source = KERNELS_DIR / "chapters" / "24_ffma_skinny.cu"
    library_source = KERNELS_DIR / "gemm" / "ffma_skinny.cu"
    seen = {b: (set(), set()) for b in builds}
    left = list(builds)
    with ThreadPoolExecutor(max_workers=4) as pool:
        for attempt in range(1 + RETRIES):
            folder = tmp / f"try{attempt}"
            folder.mkdir()
            chapter = pool.map(lambda b: text_of(chapter_source, "sgemm_skinny", b, folder), left)
            library = pool.map(lambda b: text_of(library_source, "gemm_ffma_skinny", b, folder), left)
            for b, ours, theirs in zip(left, chapter, library):
                seen[b][0].add(ours)
                seen[b][1].add(theirs)
            left = [b for b in left if not seen[b][0] & seen[b][1]]
            if not left:
                break
    return left


@pytest.fixture(scope="module")
def builds() -> list[tuple[int, ...]]:
    found = tuned_builds_fresh()
    # the layouts, widths, load widths, the prefetching builds and one-chunk K slices all occur
    assert {b[0] for b in found} == {0, 1} and {b[1] for b in found} == {1, 2, 4, 8, 16, 32}
    assert {b[3] for b in found} == {1, 4} and {b[6] for b in found} == {0, 1}
    assert (0, 2, 8, 4, 128, 4, 0) in found and (1, 8, 8, 4, 256, 8, 0) in found  # 8 x 4096 x 4096
    assert (1, 8, 8, 4, 64, 8, 0) in found  # few rows, one step of K per warp: 5 x 256 x 64 on the H100
    return sorted(found)


@needs_nvcc
def test_library_skinny_kernel_is_chapter_24s_machine_code(builds, tmp_path):
    differ = differing(nvcc_text, builds, tmp_path)
    assert not differ, (f"{len(differ)} of {len(builds)} builds of gemm_ffma_skinny differ from "
                        f"chapter 24's machine code (nvcc): {differ}")


@needs_nvrtc
def test_library_skinny_kernel_is_chapter_24s_machine_code_through_nvrtc(builds, tmp_path):
    differ = differing(nvrtc_text, builds, tmp_path)
    assert not differ, (f"{len(differ)} of {len(builds)} builds of gemm_ffma_skinny differ from "
                        f"chapter 24's machine code (NVRTC, the runner's build): {differ}")
