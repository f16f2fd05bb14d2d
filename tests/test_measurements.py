"""The measurement cache (src/job/cache.py): keys that change with everything a measurement
depends on, and a store that keeps only verified records, whole."""

from __future__ import annotations

import dataclasses

import pytest

from src.job.cache import Cache, key
from src.job.prepare import PreparedJob, Target
from src.job.problem import Problem
from src.job.protocol import BenchProtocol
from src.records.record import Record
from src.job.spec import build_spec
from tests.conftest import compose_config

LIMITS = {"max_threads_per_block": 1024, "max_smem_per_block": 227 * 1024, "sms": 132}
DEVICE = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "13.0",
          "cuda_runtime": "13.0", "nvrtc": "13.0", "cupy": "14.2.0", "sms": 132}


def key_of(spec, problem, bench, device, source, gpu_spec=None):
    """The key of a prepared job as the pipeline hands it to the cache (the device as a dict)."""
    where = Target(device=device, limits=LIMITS, gpu_spec=gpu_spec)
    return key(PreparedJob(problem, where, {}, spec, BenchProtocol.from_config(bench), None, source))


def spec_and_problem(*overrides):
    from omegaconf import OmegaConf

    cfg = compose_config("kernel=06_vectorize", "size=256", *overrides)
    problem = Problem.from_cfg(cfg)
    return build_spec(cfg.kernel, problem, LIMITS), problem, OmegaConf.to_container(cfg.bench)


def test_the_key_changes_with_everything_a_measurement_depends_on():
    from src.job.gpu import GpuSpec
    from src.job.tensor_maps import TensorMapSpec

    spec, problem, bench = spec_and_problem()
    sxm = GpuSpec("h100_sxm", 132, 67.0, 494.7, 3350.0)
    base = key_of(spec, problem, bench, DEVICE, "a" * 64, sxm).digest
    assert base == key_of(spec, problem, dict(bench), dict(DEVICE), "a" * 64, sxm).digest  # deterministic
    other_tiles, _, _ = spec_and_problem("kernel.params.bk=16")
    variants = [
        key_of(other_tiles, problem, bench, DEVICE, "a" * 64, sxm),                      # parameters
        key_of(spec, dataclasses.replace(problem, k=512), bench, DEVICE, "a" * 64, sxm),  # size
        key_of(spec, dataclasses.replace(problem, beta=1.0), bench, DEVICE, "a" * 64, sxm),
        key_of(spec, problem, {**bench, "flush_l2": False}, DEVICE, "a" * 64, sxm),     # protocol
        key_of(spec, problem, bench, {**DEVICE, "name": "NVIDIA H200"}, "a" * 64, sxm),  # GPU
        key_of(spec, problem, bench, {**DEVICE, "driver": "13.1"}, "a" * 64, sxm),      # driver
        key_of(spec, problem, bench, DEVICE, "b" * 64, sxm),                             # kernel source
        key_of(dataclasses.replace(spec, arch="sm_90a"), problem, bench, DEVICE, "a" * 64, sxm),
        key_of(dataclasses.replace(spec, tensor_maps=(TensorMapSpec("a", (32, 128), 128),)),
            problem, bench, DEVICE, "a" * 64, sxm),                                   # TMA box
        key_of(dataclasses.replace(spec, tensor_maps=(TensorMapSpec("a", (32, 128), 0),)),
            problem, bench, DEVICE, "a" * 64, sxm),                                   # swizzle
        key_of(spec, problem, bench, DEVICE, "a" * 64,                                    # datasheet
            GpuSpec("h100_pcie", 114, 51.2, 378.0, 2000.0)),
    ]
    assert len({base, *(v.digest for v in variants)}) == len(variants) + 1
    # device facts that do not change a measurement are not part of it
    assert key_of(spec, problem, bench, {**DEVICE, "pci_bus_id": "0000:01:00.0"}, "a" * 64,
               sxm).digest == base


def _prepared(kernel: str, shape=(4096, 4096, 4096)):
    """A job as the pipeline prepares it (a best_* config is dispatched to its chapter)."""
    from src.job import gpu as gpu_mod
    from src.job.config import kernel_config
    from src.job.prepare import prepare_kernel

    _, _, bench = spec_and_problem()
    where = Target(DEVICE, gpu_mod.limits_from_spec("h100_sxm"),
                   gpu_mod.spec_for_device_name(DEVICE["name"]))
    return prepare_kernel(kernel_config(kernel), Problem(*shape, 1.0, 0.0), where,
                          BenchProtocol.from_config(bench))


def test_a_dispatchers_run_has_a_key_of_its_own_and_a_direct_runs_key_is_unchanged():
    """A best_* run that chose a kernel is not a direct run of that kernel (its record names the
    dispatcher and times its peers): its key differs, by dispatcher and by peers; the direct
    run's key is the one it had before dispatcher runs were told apart (no `dispatcher` field),
    so entries cached before still serve it."""
    import dataclasses as dc

    via = _prepared("best_tf32")
    chosen = via.dispatched.kernel
    direct = _prepared(chosen)
    direct = dc.replace(direct, kernel_cfg=via.kernel_cfg, spec=via.spec, source=via.source)
    assert key(direct).described["kernel"] == key(via).described["kernel"]  # the same launch
    assert "dispatcher" not in key(direct).described
    assert key(via).described["dispatcher"] == {"name": "best_tf32", "peers": list(via.peers)}
    other_dispatcher = dc.replace(via, dispatched=dc.replace(via.dispatched, dispatcher="best_fp32"))
    other_peers = dc.replace(via, peers=())
    assert len({key(j).digest for j in (direct, via, other_dispatcher, other_peers)}) == 4
    assert key(_prepared("best_tf32")).digest == key(via).digest  # deterministic


def test_a_dispatchers_run_is_served_back_to_it(tmp_path, caplog):
    """resume=true reuses a best_* run's record (it names the dispatcher, not the chapter it
    chose), and a direct run of the same tile is not served it."""
    import dataclasses as dc

    via = _prepared("best_tf32")
    direct = dc.replace(via, dispatched=None, peers=())
    problem = via.problem
    fields = dict(precision="tf32", backend="nvrtc", m=problem.m, n=problem.n, k=problem.k,
                  alpha=problem.alpha, beta=problem.beta, entry=via.spec.entry, gflops=5.0e5,
                  rel_err=2e-4, dispatched_to=via.dispatched.kernel, gpu_spec=via.target.gpu_spec_name)
    cache = Cache(tmp_path)
    cache.put(key(via), Record(kernel="best_tf32", **fields))
    served = cache.get(key(via))
    assert served is not None and served.kernel == "best_tf32" and not caplog.text
    assert cache.get(key(direct)) is None
    cache.put(key(direct), Record(kernel=via.dispatched.kernel, **fields))
    assert cache.get(key(direct)).kernel == via.dispatched.kernel
    assert cache.get(key(via)).kernel == "best_tf32"  # neither overwrote the other
    # a best_* record stored under a direct run's key is another job's: measured again
    cache.put(key(direct), Record(kernel="best_tf32", **fields))
    assert cache.get(key(direct)) is None and "kernel differ" in caplog.text


def test_the_key_covers_nvrtcs_options(monkeypatch):
    import src.job.compile as compile_mod

    spec, problem, bench = spec_and_problem()
    before = key_of(spec, problem, bench, DEVICE, "a" * 64).digest
    monkeypatch.setattr(compile_mod, "BUILD_OPTIONS", (*compile_mod.BUILD_OPTIONS, "-G"))
    assert key_of(spec, problem, bench, DEVICE, "a" * 64).digest != before


def record(**fields) -> Record:
    return Record(kernel="06_vectorize", precision="fp32", backend="nvrtc", m=256, n=256, k=256,
                  alpha=1.0, beta=0.0, **fields)


def job_key():
    spec, problem, bench = spec_and_problem()
    return key_of(spec, problem, bench, DEVICE, "a" * 64), spec


def test_only_verified_records_are_kept_and_come_back_whole(tmp_path):
    cache = Cache(tmp_path)
    job, spec = job_key()
    good = record(gflops=1234.5, rel_err=1e-7, entry=spec.entry, timestamp="2026-11-21T00:00:00")
    assert cache.put(job, good) is not None
    other = key_of(spec, Problem(256, 256, 512, 1.0, 0.0), spec_and_problem()[2], DEVICE, "a" * 64)
    assert cache.put(other, record(status="failed_verification", error="wrong")) is None
    assert cache.get(job) == good
    assert cache.get(other) is None
    assert len(cache) == 1
    assert not list(tmp_path.rglob("*.tmp"))  # written whole, then renamed


@pytest.mark.parametrize("junk", ["", "{not json", '{"kernel": "x"}', "[1, 2]",
                                  '{"format": 2, "key": 3, "described": null, "record": 1}'])
def test_an_unreadable_entry_is_a_miss_not_an_error(tmp_path, junk, caplog):
    cache = Cache(tmp_path)
    job, spec = job_key()
    path = cache.put(job, record(gflops=1.0, entry=spec.entry))
    path.write_text(junk)
    assert cache.get(job) is None
    assert "measuring again" in caplog.text


def test_an_entry_is_served_only_to_its_own_job(tmp_path, caplog):
    """Another kernel's record copied under this key, or an entry of another job renamed to
    this key, is measured again rather than served as this job's."""
    import json

    cache = Cache(tmp_path)
    job, spec = job_key()
    path = cache.put(job, record(gflops=1.0, entry=spec.entry))
    entry = json.loads(path.read_text())
    entry["record"]["kernel"] = "01_naive"  # another kernel's figure under this key
    path.write_text(json.dumps(entry))
    assert cache.get(job) is None and "kernel differ" in caplog.text
    other = key_of(spec, Problem(256, 256, 512, 1.0, 0.0), spec_and_problem()[2], DEVICE, "a" * 64)
    moved = cache.put(other, dataclasses.replace(record(gflops=2.0, entry=spec.entry), k=512))
    path.write_text(moved.read_text())  # a whole entry of another job, under this key
    assert cache.get(job) is None and "another job" in caplog.text


def test_a_cache_that_cannot_be_written_keeps_the_measurement(tmp_path, caplog):
    """A cache directory that cannot be written (here its place is taken by a file, which
    refuses even root, unlike a read-only mode) costs the reuse, with a warning, not the job."""
    blocked = tmp_path / "cache"
    blocked.write_text("not a directory")
    job, spec = job_key()
    assert Cache(blocked).put(job, record(gflops=1.0, entry=spec.entry)) is None
    assert "could not store this result" in caplog.text and "resume=true" in caplog.text
    assert Cache(blocked).get(job) is None  # and reading it is a plain miss


@pytest.mark.parametrize("edit,served", [
    ({}, True),                                               # as measured
    ({"gflops": 999999.0}, False),                            # the figure alone edited
    ({"gflops": 999999.0, "time_ms_median": None}, False),    # and its time removed
    ({"time_ms_median": 1e-6, "gflops": "from the time"}, False),  # beyond the GPU's ceiling
    ({"gflops": float("inf"), "time_ms_median": 0.0}, False),
])
def test_a_cached_figure_passes_the_checks_a_fresh_one_does(tmp_path, edit, served, caplog):
    """An entry edited to `gflops: 999999` (its key and description intact) is measured again,
    with a warning saying why, instead of being served as ok."""
    import json

    from src.job import gpu as gpu_mod
    from src.job.measure import check_cached
    from src.job.pipeline import cached_is_plausible

    spec, problem, bench = spec_and_problem()
    h100 = gpu_mod.spec_for_device_name(DEVICE["name"])
    prepared = PreparedJob(problem, Target(device=DEVICE, limits=LIMITS, gpu_spec=h100), {}, spec,
                           BenchProtocol.from_config(bench), None, "a" * 64)
    job = key(prepared)
    time_ms = 0.5  # 67 GFLOP/s at 256^3: far below an H100's ceiling
    measured = record(gflops=problem.flops / (time_ms * 1e-3) / 1e9, time_ms_median=time_ms,
                      rel_err=1e-7, entry=spec.entry, gpu_spec=h100.name)
    cache = Cache(tmp_path)
    path = cache.put(job, measured)
    entry = json.loads(path.read_text())
    gflops = edit.get("gflops", measured.gflops)
    if gflops == "from the time":  # consistent with its time, which no H100 can reach
        gflops = problem.flops / (edit["time_ms_median"] * 1e-3) / 1e9
    entry["record"].update(edit, gflops=gflops)
    path.write_text(json.dumps(entry))
    cached = cache.get(job)
    assert cached is not None  # the key, description and names are this job's
    assert cached_is_plausible(prepared, cached) is served
    if not served:
        assert "measuring again" in caplog.text and "rule:" in caplog.text
    else:
        check_cached(prepared, cached)
