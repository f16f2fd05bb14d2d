"""The old C requested into L2 before the epilogue (kernels/include/c_prefetch.cuh): gemm_tf32 and
gemm_3xtf32 build it in (PREFETCH_C, the configs' derived `c_prefetched`) at short K with a large C
only, gemm_tf32_swapped never; elsewhere they build what they built before. On a GPU the
prefetching builds are verified with alpha and beta in each layout and with K slices (a block
prefetches its own share of the tile)."""

from __future__ import annotations

import pytest

from src.job.compile import expand_source, nvrtc_ptx
from src.job.gpu import limits_from_spec
from src.job.pipeline import run_job
from src.job.problem import Problem
from src.job.spec import build_spec
from tests.test_compile import needs_nvrtc
from tests.test_gpu import QUICK, pinned_inputs
from tests.test_spec import kernel_cfg

H200 = limits_from_spec("h200")


def template_args(entry: str) -> list[int]:
    return [int(a) for a in entry.split("<", 1)[1].rstrip(">").split(",")]


@pytest.mark.parametrize("shape,prefetched", [
    ((8067, 417, 114), 1),    # short K, C of 3.4 M elements
    ((2048, 1024, 256), 1),   # the edges: K 256, C of 2^21 elements
    ((2048, 1024, 257), 0),   # K past 256
    ((2047, 1024, 100), 0),   # C one row short of 2^21 elements
    ((4096, 4096, 4096), 0),
])
@pytest.mark.parametrize("kernel,params", [("gemm_tf32", {}), ("gemm_3xtf32", {}),
                                           ("gemm_3xtf32", {"register_operand": 2})])
def test_prefetch_is_built_at_short_k_with_a_large_c_only(kernel, params, shape, prefetched):
    """The entry's next-to-last template argument is PREFETCH_C (the last stays STREAM), in the
    main launch and in a split tail's; gemm_tf32_swapped's entry has no such argument."""
    spec = build_spec(kernel_cfg(kernel, **params), Problem(*shape, 0.5, 3.0), H200)
    assert template_args(spec.entry)[-2] == prefetched, spec.entry
    tail = build_spec(kernel_cfg(kernel, **params, split_tail=1), Problem(*shape, 0.5, 3.0), H200)
    if tail.tail:
        assert template_args(tail.tail.entry)[-2] == prefetched, tail.tail.entry
    swapped = build_spec(kernel_cfg("gemm_tf32_swapped"), Problem(*shape, 0.5, 3.0), H200)
    assert len(template_args(swapped.entry)) == 7, swapped.entry


@needs_nvrtc
@pytest.mark.parametrize("kernel,params", [("gemm_tf32", {}), ("gemm_3xtf32", {"register_operand": 2})])
def test_prefetching_build_issues_l2_prefetches_and_the_other_none(kernel, params):
    """PREFETCH_C 1 compiles the prefetch loop in (`prefetch.global.L2` in NVRTC's PTX); PREFETCH_C 0
    compiles it out, so the builds the tuning evidence measured keep their code (`--carry-over`)."""
    on = build_spec(kernel_cfg(kernel, **params), Problem(8067, 417, 114, 0.5, 3.0), H200)
    off = build_spec(kernel_cfg(kernel, **params), Problem(8067, 417, 260, 0.5, 3.0), H200)
    ptx = {spec.entry: nvrtc_ptx(expand_source(spec.source), spec.entry, "9.0a") for spec in (on, off)}
    assert "prefetch.global.L2" in ptx[on.entry]
    assert "prefetch.global.L2" not in ptx[off.entry]


def verified_run(compose, kernel: str, shape: tuple, params: dict, beta: float):
    """`kernel` run by name at `shape` with `params`, alpha 0.5 and `beta` (quick protocol): the
    record, after asserting it verified (every check within the tolerance) with no local memory."""
    m, n, k = shape
    record = run_job(compose(f"kernel={kernel}", f"m={m}", f"n={n}", f"k={k}", "alpha=0.5",
                             f"beta={beta}", *[f"kernel.params.{p}={v}" for p, v in params.items()],
                             *QUICK, *pinned_inputs(shape)),
                     explicit_params=set(params))
    assert record.status == "ok", record.error
    assert max(record.rel_err, record.rel_err_timed, record.rel_err_fresh) <= record.tolerance
    assert record.local_bytes == 0
    return record


PREFETCH_CASES = [
    # (kernel, shape, params, beta, smoke)
    ("gemm_tf32", (2048, 1024, 100), {}, 3.0, False),
    ("gemm_tf32", (2048, 1024, 100), {"min_slice_k": 32}, 3.0, True),          # 2 K slices: row shares
    ("gemm_tf32", (1500, 1500, 130), {"fit": 2}, 3.0, False),                 # K % 4: the pre-pass, fitted rows
    ("gemm_tf32", (1500, 1500, 130), {"unaligned_rows": 2}, 3.0, False),      # A streamed by the producers
    ("gemm_tf32", (2048, 1024, 100), {}, 0.0, False),                         # beta 0: C never read
    ("gemm_3xtf32", (2048, 1024, 100), {}, 3.0, False),                       # role 0
    # the split tail's 28 tiles in 4 K slices each: role 0's blocks share rows, role 1's columns
    ("gemm_3xtf32", (2048, 1200, 200), {"split_tail": 1, "min_slice_k": 32}, 3.0, False),
    ("gemm_3xtf32", (2048, 1200, 200), {"register_operand": 2, "split_tail": 1, "min_slice_k": 32}, 3.0, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,shape,params,beta", [
    pytest.param(kernel, shape, params, beta,
                 id=f"{kernel}-{'x'.join(map(str, shape))}-" + "-".join(f"{p}{v}" for p, v in params.items())
                 + f"-beta{beta:g}",
                 marks=[pytest.mark.chapter(kernel)] + ([pytest.mark.smoke] if smoke else []))
    for kernel, shape, params, beta, smoke in PREFETCH_CASES])
def test_prefetching_builds_verified_alpha_beta(compose, kernel, shape, params, beta):
    record = verified_run(compose, kernel, shape, params, beta)
    assert template_args(record.entry)[-2] == 1, record.entry
    if params.get("min_slice_k") == 32:  # the K slices ran: a cluster launch or a sliced tail
        assert "_cluster<" in record.entry or params.get("split_tail") == 1, record.entry
