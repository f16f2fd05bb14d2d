"""The CUTLASS peer (conf/kernel/cutlass_3xtf32.yaml) on CPU: its config composes into a spec at
the FP32 tolerance and is one of best_fp32's peers; without the nvidia-cutlass wheel or nvcc it is
skipped_missing_peer naming what to install; with both, nvcc builds its shared library for sm_90
into the cache once (atomically, its build time kept), the library loads without a GPU and
exports its entries, its tile rule picks what the source documents, and an operand CUTLASS
refuses is LaunchFailed with CUTLASS's status."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import shutil
import subprocess
import sys
import threading
import time
import types

import pytest
from omegaconf import OmegaConf

from src.errors import CompileFailed, LaunchFailed, PeerMissing
from src.job import cutlass_build
from src.job.compile import compile_kernel
from src.job.problem import Problem
from src.job.spec import build_spec
from tests.test_peers import H100

ENTRIES = ("cutlass_3xtf32_gemm", "cutlass_3xtf32_choose", "cutlass_3xtf32_sms",
           "cutlass_3xtf32_config_name", "cutlass_3xtf32_status_string")


def _tools_present() -> bool:
    try:
        cutlass_build.require_tools()
        return True
    except PeerMissing:
        return False


needs_tools = pytest.mark.skipif(not _tools_present(),
                                 reason="needs nvcc and the nvidia-cutlass wheel (.[peers])")


def _spec():
    return build_spec({"name": "cutlass_3xtf32", "backend": "cutlass", "precision": "fp32"},
                      Problem(64, 64, 64, 1.0, 0.0), H100)


def test_the_config_composes_into_a_cutlass_peer_at_the_fp32_tolerance(compose):
    cfg = compose("kernel=cutlass_3xtf32", "size=4096")
    kcfg = OmegaConf.to_container(cfg.kernel, resolve=True)
    assert (kcfg["backend"], kcfg["peer"], kcfg["math"]) == ("cutlass", True, "3xtf32")
    spec = build_spec(kcfg, Problem(4096, 4096, 4096, 1.0, 0.0), H100)
    assert (spec.backend, spec.precision, spec.source) == ("cutlass", "fp32", None)
    assert "OpMultiplyAddFastF32" in spec.entry
    assert cfg.bench.tolerance[spec.precision] == 1e-5


def test_best_fp32_times_the_cutlass_peer_and_no_longer_lists_it_as_not_built(compose):
    fp32 = compose("kernel=best_fp32").kernel
    assert "cutlass_3xtf32" in fp32.peers
    assert "cutlass_3xtf32" not in {p.name for p in fp32.peers_not_built}


def test_without_the_wheel_the_peer_is_skipped_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cutlass_library", None)  # import fails as if not installed
    with pytest.raises(PeerMissing) as raised:
        compile_kernel(_spec())
    assert raised.value.status == "skipped_missing_peer"
    message = str(raised.value)
    assert "cutlass_3xtf32" in message and "nvidia-cutlass" in message and ".[peers]" in message


def test_without_nvcc_the_peer_is_skipped_naming_the_toolkit(monkeypatch):
    monkeypatch.setattr(cutlass_build, "nvcc_path", lambda: None)
    monkeypatch.setattr(cutlass_build, "include_dir", lambda name="": "/headers")
    with pytest.raises(PeerMissing, match="nvcc .*is not on PATH") as raised:
        compile_kernel(_spec())
    assert raised.value.status == "skipped_missing_peer"


def test_the_peers_extra_installs_the_wheel():
    import tomllib

    from src.paths import CONF_DIR

    project = tomllib.loads((CONF_DIR.parent / "pyproject.toml").read_text())["project"]
    peers = project["optional-dependencies"]["peers"]
    assert any(requirement.startswith("nvidia-cutlass") for requirement in peers)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not _tools_present():
        pytest.skip("needs nvcc and the nvidia-cutlass wheel (.[peers])")
    return cutlass_build.build_library("sm_90", tmp_path_factory.mktemp("cache"))


@needs_tools
def test_nvcc_builds_the_library_for_sm_90_into_the_cache_once(built, tmp_path):
    library = cutlass_build.Path(built.path)
    assert library.parent.name == "peers" and library.suffix == ".so"
    assert built.compile_seconds > 0
    meta = json.loads(library.with_suffix(".json").read_text())
    assert meta["compile_seconds"] == built.compile_seconds and meta["described"]["arch"] == "sm_90"
    names = sorted(p.name for p in library.parent.iterdir())
    assert names == sorted([library.name, library.with_suffix(".json").name,
                            library.with_suffix(".lock").name])  # no temp file left
    # the second call finds it: same file, untouched, with the build's seconds, reused
    stamp = library.stat().st_mtime_ns
    again = cutlass_build.build_library("sm_90", library.parent.parent)
    assert not built.reused and again == dataclasses.replace(built, reused=True)
    assert library.stat().st_mtime_ns == stamp
    # its machine code is sm_90's
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        listing = subprocess.run([cuobjdump, "--list-elf", str(library)], capture_output=True,
                                 text=True).stdout
        assert "sm_90" in listing


@needs_tools
def test_the_library_loads_without_a_gpu_and_exports_its_entries(built):
    from src.job.cutlass_gemm import load

    library = load(built.path)
    for entry in ENTRIES:
        assert isinstance(getattr(library, entry), ctypes._CFuncPtr)
    nm = shutil.which("nm")
    if nm:
        symbols = subprocess.run([nm, "-D", "--defined-only", built.path], capture_output=True,
                                 text=True).stdout
        assert all(f" T {entry}\n" in symbols for entry in ENTRIES)
    assert library.cutlass_3xtf32_status_string(0) == b"Success"


@needs_tools
def test_the_tile_rule_is_the_one_the_source_documents(built):
    """The large tile when ceil(M/128) * ceil(N/128) >= SMs; alignment 4 when K and N are
    multiples of 4 and the pointers 16-byte aligned."""
    from src.job.cutlass_gemm import load

    library = load(built.path)

    def chosen(m, n, k, sms=132, pointers_aligned=1):
        choice = library.cutlass_3xtf32_choose(m, n, k, sms, pointers_aligned)
        return library.cutlass_3xtf32_config_name(choice).decode()

    assert chosen(4096, 4096, 4096) == "128x128x16 warp 32x64x16 stages 4 align 4"
    assert chosen(4096, 4095, 4096) == "128x128x16 warp 32x64x16 stages 4 align 1"
    assert chosen(4096, 4096, 4098) == "128x128x16 warp 32x64x16 stages 4 align 1"
    # an operand off a 16-byte boundary (CUTLASS's can_implement checks only 4 bytes)
    assert chosen(4096, 4096, 4096, pointers_aligned=0).endswith("stages 4 align 1")
    assert chosen(1024, 1024, 1024) == "64x64x16 warp 32x32x16 stages 3 align 4"  # 64 tiles
    assert chosen(1000, 997, 333) == "64x64x16 warp 32x32x16 stages 3 align 1"
    assert chosen(1536, 1408, 64).startswith("128x128x16")  # 12 * 11 = 132 tiles: exactly full
    assert chosen(1536, 1407, 64, sms=133).startswith("64x64x16")


class _Array:
    """What the launcher reads of a CuPy array: shape, dtype, contiguity and device pointer."""

    def __init__(self, shape, contiguous=True, ptr=256):
        import numpy as np

        self.shape, self.dtype = shape, np.float32
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.data = types.SimpleNamespace(ptr=ptr)


@needs_tools
def test_a_cutlass_error_is_a_failed_launch_with_cutlass_s_status(built, monkeypatch, tmp_path):
    """No GPU: CUTLASS's launch fails and returns its status, which the launcher names. (On a
    machine with a GPU the same call would launch on these fake pointers: skipped there.)"""
    from tests import fake_cupy
    from src.job import cutlass_gemm

    if cutlass_gemm.load(built.path).cutlass_3xtf32_sms() > 0:
        pytest.skip("a GPU is visible: the failure path is checked where none is")
    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(cutlass_gemm, "build_library", lambda *args: built)
    spec = build_spec({"name": "cutlass_3xtf32", "backend": "cutlass", "precision": "fp32",
                       "arch": "sm_90"}, Problem(64, 64, 64, 1.0, 0.0), H100)
    gemm = cutlass_gemm.CutlassGemm(spec, tmp_path)
    with pytest.raises(LaunchFailed, match=r"cutlass::Status \d+ \(Error Internal\) with "
                                           r"128x128x16 .* align 4"):
        gemm.launch(_Array((256, 256)), _Array((256, 256)), _Array((256, 256)), 1.0, 0.0)
    assert gemm.tuning is None  # nothing ran: no tile is recorded
    with pytest.raises(LaunchFailed, match="C-contiguous"):
        gemm.launch(_Array((256, 256), contiguous=False), _Array((256, 256)), _Array((256, 256)),
                    1.0, 0.0)


@needs_tools
def test_a_source_nvcc_rejects_is_a_compile_failure_with_its_message(monkeypatch, tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" int cutlass_3xtf32_gemm() { return undeclared_name; }\n')
    monkeypatch.setattr(cutlass_build, "SOURCE", broken)
    with pytest.raises(CompileFailed, match="undeclared_name"):
        cutlass_build.build_library("sm_90", tmp_path / "cache")
    left = [p.name for p in (tmp_path / "cache" / "peers").iterdir()]
    assert [name for name in left if not name.endswith(".lock")] == []  # nothing half-written


def test_best_fp32_builds_its_peers_into_the_job_s_cache_dir(monkeypatch, tmp_path):
    """The CUTLASS library lands in the job's cache_dir (conf: cache_dir), not a default one."""
    from src.job import baselines as baselines_mod
    from src.job import measure as measure_mod
    from src.job.baselines import Baselines
    from src.job.measure import Baseline
    from src.job.prepare import prepare_kernel
    from src.paths import CONF_DIR
    from src.records.record import new_record
    from tests import fake_cupy
    from tests.test_measure_cpu import Gemm
    from tests.test_peers import _bench, _where

    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(measure_mod, "compile_kernel", lambda spec, cache_dir=None: Gemm())
    built = []
    monkeypatch.setattr(baselines_mod, "compile_kernel",
                        lambda spec, cache_dir: built.append((spec.name, cache_dir)) or Gemm())
    baselines = Baselines()
    monkeypatch.setattr(baselines, "paired", lambda name, job: Baseline(name, Gemm(), 1e-5))
    kcfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "best_fp32.yaml"))
    prepared = prepare_kernel(kcfg, Problem(64, 48, 32, 1.0, 0.0), _where(), _bench())
    record = new_record("best_fp32", "fp32", "dispatch", vars(prepared.problem))
    measure_mod.measure(prepared, baselines, record, cache_dir=str(tmp_path))
    assert ("cutlass_3xtf32", str(tmp_path)) in built
    assert {cache for _, cache in built} == {str(tmp_path)}
    assert record.status == "ok" and record.peer_name in {name for name, _ in built}


@needs_tools
def test_the_job_cache_key_changes_with_the_peer_s_source(monkeypatch, tmp_path):
    """A resumed job is not served a measurement of an older CUTLASS source, nvcc or arch."""
    from src.job import cache

    spec = build_spec({"name": "cutlass_3xtf32", "backend": "cutlass", "precision": "fp32",
                       "arch": "sm_90"}, Problem(64, 64, 64, 1.0, 0.0), H100)
    before = cache._compiler(spec)
    assert before["arch"] == "sm_90" and before["nvcc"] and before["cutlass"]
    edited = tmp_path / "edited.cu"
    edited.write_text(cutlass_build.SOURCE.read_text() + "// edited\n")
    monkeypatch.setattr(cutlass_build, "SOURCE", edited)
    assert cache._compiler(spec)["source_sha256"] != before["source_sha256"]


def test_two_builders_at_once_run_nvcc_once_and_the_second_loads_the_first_s_library(monkeypatch, tmp_path):
    """Two workers (another GPU's slot) ask for the library together: one builds it while the
    other waits at the lock, then finds it built (reused, with the builder's seconds)."""
    asked, builds = [], []

    def described(arch, name="cutlass_3xtf32"):
        asked.append(name)
        return {"arch": arch, "source_sha256": "stand-in"}

    def build(what, key, library, meta):  # nvcc's stand-in: slow until the second has asked
        builds.append(library)
        deadline = time.monotonic() + 30
        while len(asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the second is past its first look at the cache by now
        meta.write_text(json.dumps({"compile_seconds": 12.5}))
        library.write_bytes(b"library")
        return cutlass_build.Library(str(library.resolve()), 12.5, key)

    monkeypatch.setattr(cutlass_build, "described", described)
    monkeypatch.setattr(cutlass_build, "_build", build)
    got = {}

    def builder(i):
        got[i] = cutlass_build.build_library("sm_90", tmp_path)

    threads = [threading.Thread(target=builder, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
        while not asked:  # the first is in before the second starts
            time.sleep(0.01)
    for thread in threads:
        thread.join(timeout=60)
    assert len(builds) == 1 and len(got) == 2
    # whichever takes the lock first builds (asking first does not decide it); the other reuses
    built, waited = sorted(got.values(), key=lambda library: library.reused)
    assert (built.reused, waited.reused) == (False, True)
    assert built.path == waited.path and waited.compile_seconds == 12.5
