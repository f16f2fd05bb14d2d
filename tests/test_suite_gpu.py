"""GPU: every shape of every suite (conf/suite/) runs and verifies through both dispatching kernels
with alpha = 0.5 and beta = 3, whatever chapter the GPU's dispatch table picks for it."""

from __future__ import annotations

import pytest

from src.job.measure import verify_only
from src.job.prepare import prepare
from src.publish.suite import suites
from src.records.record import new_record

pytestmark = pytest.mark.gpu

SHAPES = sorted(suites(), key=lambda s: [int(d) for d in s.split("x")])
# The smoke tier's shapes: the first suite shape of each (dispatch rule, chapter size class) on the
# H100's table, per dispatching kernel (15 classes for 96 jobs, found by preparing every job).
SMOKE = {"best_fp32": {"1x4096x4096", "4096x1x4096", "16x8192x8192", "128x5120x13824",
                       "4096x64x4096", "4096x256x4096"},
         "best_tf32": {"1x4096x4096", "4096x1x4096", "16x8192x8192", "128x5120x13824",
                       "256x15360x5120", "511x513x8191", "512x10240x8192", "768x768x768",
                       "1000x1000x1000"}}
CASES = [pytest.param(kernel, shape, id=f"{shape}-{kernel}",
                      marks=[pytest.mark.smoke] if shape in SMOKE[kernel] else [])
         for shape in SHAPES for kernel in ("best_fp32", "best_tf32")]


@pytest.mark.parametrize("kernel,shape", CASES)
def test_every_suite_shape_verified_with_alpha_beta(compose, kernel, shape):
    prepared = prepare(compose(f"kernel={kernel}", f"shape={shape}", "alpha=0.5", "beta=3.0"))
    record = new_record(kernel, prepared.spec.precision, "nvrtc", vars(prepared.problem))
    rel_err = verify_only(prepared, record)
    assert rel_err <= record.tolerance, (prepared.dispatched.rule, rel_err)
    assert prepared.dispatched is not None and prepared.spec.name == prepared.dispatched.kernel
