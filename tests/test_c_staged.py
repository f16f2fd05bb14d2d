"""The old C staged in shared memory (gemm_tf32's `c_staged` 1, PREFETCH_C 2): the producer threads
copy the block's tile of C there with 16-byte cp.async while the main loop runs and the epilogue
reads it there. It builds only where a block owns a whole tile (one K slice, no split tail) and
C's rows are 16-byte aligned (N % 4 == 0); elsewhere the launch is c_staged 0's. Its tile counts in
the shared memory the smem rule checks. On a GPU the staging builds are verified with alpha and
beta (0 reads nothing), partial tiles at both edges, fitted rows and both block widths."""

from __future__ import annotations

import pytest

from src.errors import InvalidParams
from src.job.compile import expand_source, nvrtc_ptx
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.job.spec import build_spec
from tests.test_c_prefetch import template_args, verified_run
from tests.test_compile import needs_nvrtc
from tests.test_spec import kernel_cfg

H200 = limits_from_spec("h200")
TILE = {"bm": 128, "bn": 128, "stages": 4}  # a tile whose staged C fits (the default 256-row one's does not)


@pytest.mark.parametrize("shape,params,built", [
    ((12288, 384, 96), {}, 2),                        # one tile per block, N % 4 == 0
    ((2048, 1024, 4096), {}, 2),                      # any K: the copy runs beside the main loop
    ((8067, 417, 114), {}, 1),                        # N % 4 != 0: the L2 prefetch of c_staged 0
    ((2048, 1024, 4096), {"min_slices": 2}, 0),       # K slices: a block holds a share of a tile
    ((1000, 1000, 4096), {"min_slice_k": 32}, 0),     # few tiles, sliced
])
def test_staging_is_built_only_where_a_block_owns_an_aligned_tile(shape, params, built):
    staged = build_spec(kernel_cfg("gemm_tf32", **TILE, c_staged=1, **params), Problem(*shape, 0.5, 3.0), H200)
    plain = build_spec(kernel_cfg("gemm_tf32", **TILE, **params), Problem(*shape, 0.5, 3.0), H200)
    assert template_args(staged.entry)[-2] == built, staged.entry
    if built != 2:  # the launch of c_staged 0: same entry, same shared memory
        assert (staged.entry, staged.dynamic_smem_bytes) == (plain.entry, plain.dynamic_smem_bytes)
    else:  # a 128 x 128 tile's C, rows padded by 4 floats, and its barrier
        assert staged.dynamic_smem_bytes - plain.dynamic_smem_bytes == 4 * 128 * 132 + 16


def test_staging_with_a_split_tail_stages_nothing():
    """The tiles past the last full wave run K-sliced in a tail launch: neither launch stages C."""
    problem = Problem(2048, 1200, 200, 0.5, 3.0)
    spec = build_spec(kernel_cfg("gemm_tf32", **TILE, c_staged=1, split_tail=1, min_slice_k=32), problem, H200)
    assert spec.tail is not None
    assert template_args(spec.entry)[-2] != 2 and template_args(spec.tail.entry)[-2] != 2


def test_a_staged_tile_past_shared_memory_names_the_rule():
    """256 x 128 tiles with 4 stages fill 192 KiB; their C (132 KiB) does not fit beside them."""
    with pytest.raises(InvalidParams, match=r"smem_bytes <= max_smem_per_block"):
        build_spec(kernel_cfg("gemm_tf32", bm=256, bn=128, stages=4, c_staged=1),
                   Problem(12288, 1024, 96, 0.5, 3.0), H200)


@needs_nvrtc
def test_staging_build_copies_c_with_cp_async_and_the_prefetch_build_does_not():
    staged = build_spec(kernel_cfg("gemm_tf32", **TILE, c_staged=1), Problem(12288, 384, 96, 0.5, 3.0), H200)
    prefetched = build_spec(kernel_cfg("gemm_tf32", **TILE), Problem(12288, 384, 96, 0.5, 3.0), H200)
    ptx = {s.entry: nvrtc_ptx(expand_source(s.source), s.entry, "9.0a") for s in (staged, prefetched)}
    assert "cp.async.cg.shared.global" in ptx[staged.entry]
    assert "prefetch.global.L2" not in ptx[staged.entry]
    assert "prefetch.global.L2" in ptx[prefetched.entry]


STAGED_CASES = [
    # (shape, params, beta, smoke)
    ((2048, 1024, 100), {}, 3.0, True),
    ((2048, 1024, 100), {}, 0.0, True),                     # beta 0: nothing copied, nothing read
    ((1500, 1004, 100), {}, 3.0, False),                    # partial tiles: M % 128 = 92, N % 128 = 108
    ((1500, 1004, 130), {"fit": 2}, 3.0, False),            # fitted rows, K % 4: the pre-pass
    ((1500, 1004, 130), {"unaligned_rows": 2}, 3.0, False),  # A streamed by the producers too
    ((3000, 700, 300), {"bn": 64}, 3.0, False),              # 64-column tiles (stride 68)
    ((3000, 700, 300), {"bm": 64, "bn": 64, "stages": 8}, 3.0, False),
]


@pytest.mark.gpu
@pytest.mark.chapter("gemm_tf32")
@pytest.mark.parametrize("shape,params,beta", [
    pytest.param(shape, params, beta,
                 id="x".join(map(str, shape)) + "".join(f"-{p}{v}" for p, v in params.items()) + f"-beta{beta:g}",
                 marks=[pytest.mark.smoke] if smoke else [])
    for shape, params, beta, smoke in STAGED_CASES])
def test_staging_builds_verified_alpha_beta(compose, shape, params, beta):
    record = verified_run(compose, "gemm_tf32", shape, {**TILE, "c_staged": 1, **params}, beta)
    assert template_args(record.entry)[-2] == 2, record.entry
