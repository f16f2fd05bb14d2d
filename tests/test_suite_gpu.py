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


@pytest.mark.parametrize("kernel", ["best_fp32", "best_tf32"])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_suite_shape_verified_with_alpha_beta(compose, kernel, shape):
    prepared = prepare(compose(f"kernel={kernel}", f"shape={shape}", "alpha=0.5", "beta=3.0"))
    record = new_record(kernel, prepared.spec.precision, "nvrtc", vars(prepared.problem))
    rel_err = verify_only(prepared, record)
    assert rel_err <= record.tolerance, (prepared.dispatched.rule, rel_err)
    assert prepared.dispatched is not None and prepared.spec.name == prepared.dispatched.kernel
