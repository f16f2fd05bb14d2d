"""Builds ahead of a sweep's jobs (src/sweep/prebuild.py) and their hand-out (src/sweep/pool.py),
on CPU: which jobs need which build, for which architecture and cache; a job held for a build
goes out once it is built, or when nothing else is left; a failed build releases its jobs."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from src.errors import ConfigError
from src.sweep import prebuild
from src.sweep.pool import Pool
from tests import fault_jobs
from tests.test_gpu_launcher import gpus

RULE = {"cutlass": "tests.fault_jobs.released_build"}
PEERS = {"cutlass_3xtf32": {"name": "cutlass_3xtf32", "backend": "cutlass"},
         "triton_fp32": {"name": "triton_fp32", "backend": "triton"}}


def job(kernel: dict, gpu: dict | None = None, chdir: bool = False, cache_dir: str = "cache"):
    return OmegaConf.create({"kernel": kernel, "gpu": gpu or {"name": "auto"}, "cache_dir": cache_dir,
                             "hydra": {"job": {"chdir": chdir}}})


def test_a_job_needs_the_build_of_its_kernels_backend_and_of_its_peers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    asked = []
    configs = [job({"name": "cutlass_3xtf32", "backend": "cutlass"}),
               job({"name": "best_fp32", "backend": "dispatch", "peers": ["triton_fp32", "cutlass_3xtf32"]}),
               job({"name": "best_tf32", "backend": "dispatch", "peers": ["triton_fp32", "nope"]}),
               job({"name": "01_naive", "backend": "nvrtc"}),
               job({"name": "mine", "backend": "cutlass", "arch": "sm_80"}),
               job({"name": "cutlass_3xtf32", "backend": "cutlass"}, cache_dir="/elsewhere")]
    builds, needs = prebuild.plan(configs, RULE, lambda: asked.append(1) or ["sm_90"], PEERS.__getitem__)
    main = prebuild.Build(RULE["cutlass"], "cutlass_3xtf32", "sm_90", str(tmp_path / "cache"))
    own_arch = prebuild.Build(RULE["cutlass"], "mine", "sm_80", str(tmp_path / "cache"))
    other = prebuild.Build(RULE["cutlass"], "cutlass_3xtf32", "sm_90", "/elsewhere")
    assert list(builds) == [main, own_arch, other] and asked == [1]  # NVML asked once
    assert builds[main] == PEERS["cutlass_3xtf32"]
    assert needs == [{main}, {main}, set(), set(), {own_arch}, {other}]


def test_the_architecture_is_nvmls_else_the_gpu_specs_else_nothing_is_built(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kernel = {"name": "cutlass_3xtf32", "backend": "cutlass"}
    h100 = {"name": "h100_sxm", "compute_capability": "9.0"}
    plan = lambda configs, archs: prebuild.plan(configs, RULE, lambda: archs, PEERS.__getitem__)[0]
    assert [b.arch for b in plan([job(kernel, h100)], ["sm_90", "sm_80"])] == ["sm_90", "sm_80"]
    assert [b.arch for b in plan([job(kernel, h100)], [])] == ["sm_90"]
    assert plan([job(kernel)], []) == {}  # gpu=auto and no NVML: the jobs build it as before
    assert plan([job(kernel, h100, chdir=True)], ["sm_90"]) == {}  # each job's own cache_dir
    assert prebuild.plan([job(kernel, h100)], {}, lambda: ["sm_90"])[0] == {}


@pytest.mark.parametrize("section", [["cutlass"], {"cutlass": 3}, {"cutlass": "build"}, "x"])
def test_a_bad_rule_names_the_rule(section):
    with pytest.raises(ConfigError, match=r"hydra.launcher.prebuild must map a kernel backend .*rule: "
                                          r"it names the builds done on the launching process's CPU"):
        prebuild.prebuild_rule(section)
    assert prebuild.prebuild_rule(None) == {}


@pytest.mark.parametrize("name", ["cutlass_3xtf32", "broken"])
def test_a_job_is_held_until_its_build_ends_even_a_failed_one(name):
    release, built = fault_jobs.build_released, fault_jobs.released_builds
    release.clear()
    built.clear()
    build = prebuild.Build(RULE["cutlass"], name, "sm_90", "/cache")
    builds = prebuild.Prebuilds({build: {"name": name}}, [{build}, set()])
    try:
        assert builds.held(0) and not builds.held(1) and not builds.wake.poll(0.2)
        release.set()
        assert builds.wake.poll(60)
        builds.join()
        assert not builds.held(0) and built == [(name, "sm_90", "/cache")]
        assert builds.failed == ({build: "RuntimeError: nvcc: exit 1"} if name == "broken" else {})
    finally:
        release.set()
        builds.close()


def test_the_pool_passes_held_jobs_over_and_hands_them_out_once_released(tmp_path):
    """One slot, jobs 0 and 1 held: 2 goes out first; job 0 is released when 2 ends (the wake
    connection says so), so it goes out before 3; job 1, never released, goes out last, when
    nothing else is left."""
    from multiprocessing import Pipe

    wake, writer = Pipe(duplex=False)
    held = {0, 1}
    handed = []

    def on_end(job, answer):
        if job["name"] == "job2":
            held.discard(0)
            writer.send("built")

    pool = Pool(gpus("0"), serve=fault_jobs.pool_serve)
    try:
        answers = pool.run([{"name": f"job{i}"} for i in range(4)], on_end=on_end,
                           on_start=lambda job, gpu: handed.append(job["name"]),
                           held=held.__contains__, wake=wake)
    finally:
        pool.stop()
    assert handed == ["job2", "job0", "job3", "job1"]
    assert [answer.value["name"] for answer in answers] == [f"job{i}" for i in range(4)]
