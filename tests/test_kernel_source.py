"""Rules on the kernel sources themselves (issue 17): no CUDA device function over 150 lines, and
the wgmma chapters (20, 23) take their TMA and wgmma code from the shared headers, once."""

from __future__ import annotations

import re

import pytest

from src.job.compile import expand_source
from src.paths import KERNELS_DIR

MAX_DEVICE_FUNCTION_LINES = 150
_QUALIFIER = re.compile(r"\b__(device|global)__\b")


def device_functions(text: str) -> list[tuple[int, int]]:
    """(first line, line count) of every __device__ / __global__ function definition in a CUDA
    source: from its signature (and a `template <...>` line just above it) to its closing brace.
    Declarations without a body are skipped; lambdas count toward the function holding them."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        if not _QUALIFIER.search(lines[i]) or lines[i].lstrip().startswith("//"):
            i += 1
            continue
        start = i - 1 if i > 0 and lines[i - 1].lstrip().startswith("template") else i
        j = i
        while "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
            j += 1
        if "{" not in lines[j]:  # a declaration
            i = j + 1
            continue
        depth, k = 0, j
        while True:
            depth += lines[k].count("{") - lines[k].count("}")
            if depth == 0:
                break
            k += 1
        found.append((start + 1, k - start + 1))
        i = k + 1
    return found


def test_device_functions_are_counted_from_signature_to_closing_brace():
    text = ("template <int N>\n__device__ void f(int x) {\n  if (x) {\n    x = 1;\n  }\n}\n"
            "__device__ void g();\n__global__ void h() { }\n")
    assert device_functions(text) == [(1, 6), (8, 1)]


SOURCES = sorted(str(p.relative_to(KERNELS_DIR)) for p in [*KERNELS_DIR.rglob("*.cu"), *KERNELS_DIR.rglob("*.cuh")])


@pytest.mark.parametrize("source", SOURCES)
def test_no_device_function_over_150_lines(source):
    too_long = [(line, count) for line, count in device_functions((KERNELS_DIR / source).read_text())
                if count > MAX_DEVICE_FUNCTION_LINES]
    assert not too_long, (
        f"{source}: device functions over {MAX_DEVICE_FUNCTION_LINES} lines (first line, lines): "
        f"{too_long}; cut them into named __device__ __forceinline__ steps (kernels/README.md)")


@pytest.mark.parametrize("chapter", ["chapters/20_wgmma_tf32.cu", "chapters/23_wgmma_3xtf32.cu",
                                     "chapters/25_wgmma_tf32_any_shape.cu", "gemm/tf32.cu",
                                     "gemm/3xtf32.cu"])
def test_wgmma_chapters_share_the_tma_and_wgmma_headers(chapter):
    text = expand_source(KERNELS_DIR / chapter)
    for header in ("tma.cuh", "wgmma.cuh", "mbarrier.cuh", "warpgroup.cuh"):
        assert f'#line 1 "kernels/include/{header}"' in text, header
    own = (KERNELS_DIR / chapter).read_text()
    for name in ("struct alignas(64) TensorMap", "void tma_load_2d(", "unsigned to_tf32(",
                 "u64 smem_desc_k_sw128(", "void wgmma_fence("):
        assert text.count(name) == 1, name  # defined once, in the header
        assert name not in own, f"{chapter} defines {name} itself instead of including it"
