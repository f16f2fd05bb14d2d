"""The measurement cache (src/job/cache.py): keys that change with everything a measurement
depends on, and a store that keeps only verified records, whole."""

from __future__ import annotations

import dataclasses

import pytest

from src.job.cache import Cache, key
from src.job.gpu import GpuSpec
from src.job.prepare import PreparedJob, Target
from src.job.problem import Problem
from src.records.record import Record
from src.job.spec import build_spec
from tests.conftest import compose_config

LIMITS = {"max_threads_per_block": 1024, "max_smem_per_block": 227 * 1024, "sms": 132}
DEVICE = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "13.0",
          "cuda_runtime": "13.0", "nvrtc": "13.0", "cupy": "14.2.0", "sms": 132}


def spec_and_problem(*overrides):
    from omegaconf import OmegaConf

    cfg = compose_config("kernel=06_vectorize", "size=256", *overrides)
    problem = Problem.from_cfg(cfg)
    return build_spec(cfg.kernel, problem, LIMITS), problem, OmegaConf.to_container(cfg.bench)


def job(spec, problem, bench, device, source="a") -> PreparedJob:
    """A prepared job as the pipeline hands it to the cache (the device as a plain dict)."""
    where = Target(device=device, limits=LIMITS, gpu_spec=GpuSpec("h100_sxm"))
    return PreparedJob(problem, where, {}, spec, bench, None, source)


def test_the_key_changes_with_everything_a_measurement_depends_on():
    spec, problem, bench = spec_and_problem()
    base = key(job(spec, problem, bench, DEVICE))
    assert base == key(job(spec, problem, dict(bench), dict(DEVICE)))  # deterministic
    other_tiles, _, _ = spec_and_problem("kernel.params.bk=16")
    variants = [
        key(job(other_tiles, problem, bench, DEVICE)),                          # parameters
        key(job(spec, dataclasses.replace(problem, k=512), bench, DEVICE)),    # size
        key(job(spec, dataclasses.replace(problem, beta=1.0), bench, DEVICE)),
        key(job(spec, problem, {**bench, "flush_l2": False}, DEVICE)),         # protocol
        key(job(spec, problem, bench, {**DEVICE, "name": "NVIDIA H200"})),     # GPU
        key(job(spec, problem, bench, {**DEVICE, "driver": "13.1"})),          # driver
        key(job(spec, problem, bench, DEVICE, source="b")),                    # kernel source
    ]
    assert len({base, *variants}) == len(variants) + 1
    # device facts that do not change a measurement are not part of it
    assert key(job(spec, problem, bench, {**DEVICE, "pci_bus_id": "0000:01:00.0"})) == base


def record(**fields) -> Record:
    return Record(kernel="06_vectorize", precision="fp32", backend="nvrtc", m=256, n=256, k=256,
                  alpha=1.0, beta=0.0, **fields)


def test_only_verified_records_are_kept_and_come_back_whole(tmp_path):
    cache = Cache(tmp_path)
    good = record(gflops=1234.5, rel_err=1e-7, params={"bm": 64}, timestamp="2026-11-21T00:00:00")
    assert cache.put("ab" * 32, good) is not None
    assert cache.put("cd" * 32, record(status="failed_verification", error="wrong")) is None
    assert cache.get("ab" * 32) == good
    assert cache.get("cd" * 32) is None and cache.get("ef" * 32) is None
    assert len(cache) == 1
    assert not list(tmp_path.rglob("*.tmp"))  # written whole, then renamed


@pytest.mark.parametrize("junk", ["", "{not json", '{"kernel": "x"}'])
def test_an_unreadable_entry_is_a_miss_not_an_error(tmp_path, junk):
    cache = Cache(tmp_path)
    path = cache.put("ab" * 32, record(gflops=1.0))
    path.write_text(junk)
    assert cache.get("ab" * 32) is None
