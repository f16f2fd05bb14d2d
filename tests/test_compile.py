"""Every chapter compiles for sm_80 and sm_90 with nvcc, from the exact text NVRTC gets, with no
spills at its default parameters; compile errors carry the original file and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.job import tuned
from src.job.compile import expand_source
from src.job.nvcc import compile_offline, nvcc_path
from src.errors import CompileFailed, InvalidParams, UnsupportedSize
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.job.spec import KernelSpec, build_spec
from src.paths import KERNELS_DIR
from src.paths import CHAPTERS_DIR, INCLUDE_DIR, LIBRARY_DIR
from tests import fake_cupy
from tests.conftest import CONF_DIR, SHAPE_LIMITED, chapter_shapes

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (no CUDA toolkit)")
CHAPTERS = sorted(p.stem for p in (CONF_DIR / "kernel").glob("[0-9][0-9]_*.yaml"))
LIBRARY = sorted(p.stem for p in (CONF_DIR / "kernel").glob("gemm_*.yaml"))


def default_spec(name: str, shape: tuple[int, int, int] | None = None) -> KernelSpec:
    """The chapter at its configured parameters at 4096^3 (a shape-limited chapter: its first
    shape, or `shape`)."""
    cfg = OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml")
    shape = shape or chapter_shapes(name, sizes=(4096,))[0]
    return build_spec(cfg, Problem(*shape, 1.0, 0.0), limits_from_spec("h100_sxm"))


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_compiles_without_spills(name, arch):
    spec = default_spec(name)
    if spec.arch is not None:  # a fixed target (20: sm_90a) is built for that target only
        if arch != "sm_90":
            pytest.skip(f"{name} is built for {spec.arch} only")
        arch = spec.arch
    report = compile_offline(spec, arch)
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, report["log"]
    assert report["stack_bytes"] == 0, report["log"]
    assert 0 < report["registers"] <= 255
    smem = spec.derived.get("smem_bytes", 0)
    if spec.dynamic_smem_bytes:  # the pipeline's stages are dynamic shared memory
        # static: split-K's ticket flag, and mbarriers (two of 8 bytes per stage) where a chapter has them
        barriers = 16 * spec.params.get("stages", 0) if "mbar_init" in expand_source(spec.source) else 0
        assert spec.dynamic_smem_bytes == smem, report["log"]
        assert report["static_smem_bytes"] <= 16 + barriers, report["log"]
    else:
        assert report["static_smem_bytes"] == smem, report["log"]
    # the ptxas report is for this very instantiation
    assert spec.entry.split("<")[0] in report["log"]


def test_every_cu_file_is_a_configured_chapter_or_library_kernel():
    """kernels/chapters/ holds the chapters (conf/kernel/NN_*.yaml), kernels/gemm/ the library
    (conf/kernel/gemm_*.yaml, `library: true`), and no .cu lies anywhere else."""
    def sources(names):
        return sorted(OmegaConf.load(CONF_DIR / "kernel" / f"{n}.yaml").source for n in names)
    assert sorted(f"chapters/{p.name}" for p in CHAPTERS_DIR.glob("*.cu")) == sources(CHAPTERS)
    # a file may serve several library configs (mma_tf32.cu: gemm_mma_tf32 and its 3xTF32 build)
    assert sorted(f"gemm/{p.name}" for p in LIBRARY_DIR.glob("*.cu")) == sorted(set(sources(LIBRARY)))
    assert sorted(KERNELS_DIR.rglob("*.cu")) == sorted([*CHAPTERS_DIR.glob("*.cu"), *LIBRARY_DIR.glob("*.cu")])
    for name in LIBRARY:
        assert OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml").library is True, name
    for name in CHAPTERS:
        assert not OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml").get("library"), name


@pytest.mark.parametrize("name", CHAPTERS)
def test_each_chapter_opens_with_what_changed(name):
    text = (KERNELS_DIR / OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml").source).read_text()
    head = text.split("#include", 1)[0]
    assert head.startswith(f"// {name[:2]} "), "a chapter starts with its number and title"
    assert "Tile hierarchy" in head
    assert name == "01_naive" or "What changed" in head


def test_expand_source_inlines_the_header_with_line_marks():
    text = expand_source(CHAPTERS_DIR / "06_vectorize.cu")
    assert "#include" not in text
    assert '#line 1 "kernels/include/common.cuh"' in text
    assert "store_axpby4" in text
    # after the header, line numbers continue from the original file
    original = (CHAPTERS_DIR / "06_vectorize.cu").read_text().splitlines()
    include_line = next(i for i, l in enumerate(original, 1) if l.startswith("#include"))
    assert f'#line {include_line + 1} "kernels/chapters/06_vectorize.cu"' in text


HEADERS = sorted(p.name for p in INCLUDE_DIR.glob("*.cuh"))


@pytest.mark.parametrize("header", HEADERS)
def test_each_header_says_what_it_holds_and_is_guarded(header):
    """A header opens with what it holds and why, and carries an include guard: the runner pastes
    headers into one text, where #pragma once cannot stop a header reached twice."""
    lines = (INCLUDE_DIR / header).read_text().splitlines()
    assert lines[0].startswith(f"// {header}: "), "a header opens with `// <name>: what it holds`"
    guard = next(l for l in lines if not l.startswith("//"))
    assert guard.startswith("#ifndef SGEMM_LAB_"), header
    assert lines[lines.index(guard) + 1] == guard.replace("#ifndef", "#define"), header
    assert lines[-1].startswith("#endif"), header


def test_expand_source_pastes_nested_includes():
    """22 includes ffma_stage.cuh, which includes cp_async.cuh: both end up in the text, and
    every header 22 reaches is in it (common.cuh through several others)."""
    text = expand_source(CHAPTERS_DIR / "22_ffma_warp_specialized.cu")
    assert "#include" not in text
    for header in ("common.cuh", "tile_order.cuh", "split_k.cuh", "ffma_stage.cuh", "cp_async.cuh",
                   "ffma_thread_tile.cuh", "mbarrier.cuh", "warpgroup.cuh", "cluster.cuh"):
        assert f'#line 1 "kernels/include/{header}"' in text, header
    # a chapter that needs none of the pipeline headers gets none of them
    assert "kernels/cp_async.cuh" not in expand_source(CHAPTERS_DIR / "06_vectorize.cu")


@needs_nvcc
def test_compile_error_names_file_and_line(tmp_path, monkeypatch):
    broken = tmp_path / "99_broken.cu"
    broken.write_text('#include "common.cuh"\n\n'
                      "template <int BS>\n__global__ void sgemm_broken(float* C) {\n"
                      "  C[0] = undefined_symbol;\n}\n")
    (tmp_path / "common.cuh").write_text((INCLUDE_DIR / "common.cuh").read_text())
    monkeypatch.setattr("src.paths.KERNEL_DIRS", (KERNELS_DIR, tmp_path))  # a kernel folder here
    spec = KernelSpec(name="99_broken", backend="nvrtc", precision="fp32", source=broken,
                      entry="sgemm_broken<32>", grid=(1,), block=(32,))
    with pytest.raises(CompileFailed) as info:
        compile_offline(spec, "sm_90")
    assert "99_broken.cu(5)" in str(info.value) and "undefined_symbol" in str(info.value)


def _nvrtc_missing() -> str | None:
    try:
        from src.job.compile import nvrtc_version

        nvrtc_version()
        return None
    except Exception as exc:  # no libnvrtc: pip install nvidia-cuda-nvrtc (the [test] extra)
        return f"NVRTC not loadable ({type(exc).__name__})"


needs_nvrtc = pytest.mark.skipif(_nvrtc_missing() is not None, reason=str(_nvrtc_missing()))
H100 = limits_from_spec("h100_sxm")
P4096 = Problem(4096, 4096, 4096, 1.0, 0.0)


def _spec(name: str, conf_dir=CONF_DIR, **params) -> KernelSpec:
    cfg = OmegaConf.to_container(OmegaConf.load(conf_dir / "kernel" / f"{name}.yaml"))
    cfg["params"].update(params)
    return build_spec(cfg, Problem(4096, 4096, 4096, 1.0, 0.0), H100)


@needs_nvrtc
def test_nvrtc_builds_a_cubin_once_and_reuses_it(tmp_path):
    from src.job.compile import build_cubin

    spec = _spec("10_warptiling")
    text = expand_source(spec.source)
    first = build_cubin(text, spec.entry, "sm_90", tmp_path, spec.name)
    data = open(first.path, "rb").read()
    assert data[:4] == b"\x7fELF" and first.lowered_name.startswith("_Z")
    assert "sgemm_warptiling" in first.lowered_name and first.compile_seconds > 0
    again = build_cubin(text, spec.entry, "sm_90", tmp_path, spec.name)
    assert again == first  # from the cache: same file, same recorded compile time
    other = build_cubin(text, spec.entry, "sm_80", tmp_path, spec.name)
    assert other.path != first.path  # the architecture is part of the key


@needs_nvrtc
def test_a_copied_cubin_cache_is_served_from_its_new_place_and_checked(tmp_path):
    """Meta files name their cubin relative to themselves (a copied cache works where it
    lands) with its size and SHA-256: an emptied or swapped cubin is built again."""
    import json
    import shutil

    from src.job.compile import build_cubin

    spec = _spec("06_vectorize")
    text = expand_source(spec.source)
    first = build_cubin(text, spec.entry, "sm_90", tmp_path / "a", spec.name)
    meta = next((tmp_path / "a").rglob("*.json"))
    assert json.loads(meta.read_text())["path"] == Path(first.path).name  # no absolute path
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    moved = build_cubin(text, spec.entry, "sm_90", tmp_path / "b", spec.name)
    assert moved.compile_seconds == first.compile_seconds  # served, not rebuilt
    assert moved.path.startswith(str((tmp_path / "b").resolve())) and Path(moved.path).is_file()
    Path(moved.path).write_bytes(b"")  # an empty cubin is never served
    rebuilt = build_cubin(text, spec.entry, "sm_90", tmp_path / "b", spec.name)
    assert rebuilt.compile_seconds != first.compile_seconds
    assert Path(rebuilt.path).read_bytes()[:4] == b"\x7fELF"


@needs_nvrtc
def test_a_cubin_cache_that_cannot_be_written_still_builds(tmp_path, caplog):
    from src.job.compile import build_cubin

    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    spec = _spec("06_vectorize")
    cubin = build_cubin(expand_source(spec.source), spec.entry, "sm_90", blocked, spec.name)
    assert Path(cubin.path).read_bytes()[:4] == b"\x7fELF"
    assert "could not store the build" in caplog.text


@needs_nvrtc
def test_cached_cubin_is_a_whole_elf_file(tmp_path):
    """The cached cubin is the whole ELF image, so cuobjdump and nvdisasm can read it: its
    program-header and section-header tables lie inside the file. (CuPy's getCUBIN returns one
    byte less than NVRTC's size; the driver loads that, the disassemblers do not.)"""
    import struct

    from src.job.compile import build_cubin

    spec = _spec("21_ffma_hopper")
    cubin = build_cubin(expand_source(spec.source), spec.entry, "sm_90", tmp_path, spec.name)
    data = open(cubin.path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # 64-bit ELF
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 0x36)
    assert e_phnum > 0 and e_phoff + e_phnum * e_phentsize <= len(data)
    assert e_shoff + e_shnum * e_shentsize <= len(data)


@needs_nvrtc
def test_nvrtc_compile_error_shows_the_log_with_file_and_line(tmp_path):
    from src.job.compile import build_cubin

    spec = _spec("broken_compile", conf_dir=CONF_DIR.parent / "tests" / "conf")
    with pytest.raises(CompileFailed) as failed:
        build_cubin(expand_source(spec.source), spec.entry, "sm_90", tmp_path, spec.name)
    message = str(failed.value)
    assert "kernel broken_compile (broken_compile) failed to compile with NVRTC" in message
    assert "tests/kernels/broken_compile.cu(7): error" in message.splitlines()[0]  # the console line
    assert "tests/kernels/broken_compile.cu(7)" in message and "undeclared_value" in message
    assert not list(tmp_path.rglob("*.cubin"))  # nothing cached for a failure


@needs_nvrtc
def test_precompile_builds_candidates_on_threads(tmp_path):
    from src.job.compile import Cubin, precompile

    variants = [_spec("10_warptiling", bk=bk, tm=tm) for bk in (8, 16) for tm in (4, 8)]
    jobs = [(s.name, expand_source(s.source), s.entry) for s in variants]
    jobs.append(("broken", "this is not C++", "nothing"))
    results = [f.exception() or f.result() for f in precompile(jobs, "sm_90", tmp_path, threads=2)]
    built = results[:-1]
    assert all(isinstance(r, Cubin) for r in built) and len({r.path for r in built}) == 4
    assert isinstance(results[-1], CompileFailed)


@needs_nvrtc
@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_builds_with_nvrtc_as_the_runner_does(name, tmp_path):
    """The runner's own path (NVRTC -> cubin for sm_90, src/compile.build_cubin) for every
    chapter at its configured (tuned where it is tuned) parameters."""
    from src.job.compile import build_cubin

    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml"))
    problem = Problem(*chapter_shapes(name, sizes=(4096,))[0], 1.0, 0.0)
    tuned.apply(cfg, "h100_sxm", problem)
    spec = build_spec(cfg, problem, H100)
    cubin = build_cubin(expand_source(spec.source), spec.entry, spec.arch or "sm_90", tmp_path,
                        spec.name)
    assert open(cubin.path, "rb").read(4) == b"\x7fELF"


@needs_nvcc
def test_sm90a_chapter_has_wgmma_setmaxnreg_and_no_spills():
    """20 at its configured parameters: nvcc builds it for sm_90a (the -gencode form; -arch=sm_90a
    would also run a plain sm_90 pass that rejects wgmma), the PTX has the instructions the
    chapter is about, and ptxas spills nothing."""
    spec = default_spec("20_wgmma_tf32")
    report = compile_offline(spec, spec.arch)
    assert report["arch"] == "sm_90a"
    assert report["spill_store_bytes"] == 0 and report["stack_bytes"] == 0, report["log"]
    assert "C7508" not in report["log"], "ptxas ignored setmaxnreg"
    text = expand_source(spec.source)
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait",
                        "setmaxnreg.inc", "setmaxnreg.dec", "cvt.rna.tf32.f32"):
        assert instruction in text


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((4096, 4096, 4096), {}),                                           # promoted, small products first
    ((4095, 4097, 333), {"order": 2}),                                  # B copied, big product first
    ((4096, 4096, 4096), {"accumulation": 1, "bm": 256, "stages": 2, "in_flight": 1}),  # 20's tile
], ids=["promoted", "order2", "bm256-unpromoted"])
def test_3xtf32_chapter_builds_both_entries_without_spills(shape, params):
    """23 for sm_90a: the pre-pass entry and the main kernel are both in the build (the runner
    launches both), neither spills, ptxas honours setmaxnreg, and the split and the wgmma's
    scale-d predicate (promotion) are in the source."""
    import re

    cfg = OmegaConf.load(CONF_DIR / "kernel" / "23_wgmma_3xtf32.yaml")
    cfg.params.update(params)
    spec = build_spec(cfg, Problem(*shape, 1.0, 0.0), limits_from_spec("h100_sxm"))
    report = compile_offline(spec, spec.arch)
    log = report["log"]
    assert report["arch"] == "sm_90a"
    assert spec.prepass.entry in log and spec.entry.split("<")[0] in log
    # one report per entry: every one spills nothing and has no stack frame
    assert len(re.findall(r"Compiling entry function", log)) == 2, log
    assert re.findall(r"(\d+) bytes spill stores", log) == ["0", "0"], log
    assert re.findall(r"(\d+) bytes stack frame", log) == ["0", "0"], log
    assert "C7508" not in log, "ptxas ignored setmaxnreg"
    text = expand_source(spec.source)
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "cvt.rna.tf32.f32",
                        "setp.ne.b32 p", "setmaxnreg.inc", "setmaxnreg.dec"):
        assert instruction in text


def _sliced_build(chapter: str, shape, params, instructions, entries: int = 2) -> None:
    """A K-slicing kernel (chapter 25, gemm_tf32, gemm_3xtf32) built for sm_90a at these parameters: its pre-pass and
    the chosen main entry (plain, or the cluster entry exactly when there are slices) build (with
    `entries` counting every kernel in the source), none spills or has a stack frame, ptxas
    honours setmaxnreg, and `instructions` are in the source nvcc was given."""
    import re

    cfg = OmegaConf.load(CONF_DIR / "kernel" / f"{chapter}.yaml")
    cfg.params.update(params)
    spec = build_spec(cfg, Problem(*shape, 1.0, 0.0), limits_from_spec("h100_sxm"))
    log = compile_offline(spec, spec.arch)["log"]
    # a pre-pass that is not a template is built even where it is not launched
    assert len(re.findall(r"Compiling entry function", log)) == entries, log
    assert re.findall(r"(\d+) bytes spill stores", log) == ["0"] * entries, log
    assert re.findall(r"(\d+) bytes stack frame", log) == ["0"] * entries, log
    assert "C7508" not in log, "ptxas ignored setmaxnreg"
    assert ("_cluster<" in spec.entry) == (spec.derived["slices"] > 1)
    text = expand_source(spec.source)
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "ld.shared::cluster",
                        "barrier.cluster.arrive", *instructions):
        assert instruction in text


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((4097, 4097, 4097), {}),                                    # both padded, one block per tile
    ((4096, 64, 4096), {"bn": 64}),                              # one consumer, 8 slices
    ((32, 4096, 4096), {"bm": 64, "stages": 8}),                 # m64n64k8, 4 slices
    ((128, 4096, 8192), {"bm": 128, "in_flight": 1}),            # one group in flight, 4 slices
    ((511, 513, 8191), {}),                                      # 256-row tiles, 8 slices
], ids=["unsplit", "bn64-split8", "bm64-split4", "bm128-split4", "bm256-split8"])
@pytest.mark.parametrize("kernel", ["25_wgmma_tf32_any_shape", "gemm_tf32"])
def test_any_shape_tf32_kernel_builds_without_spills(kernel, shape, params):
    """Chapter 25 and its library copy in each tile and slice shape: pad_unaligned_rows and the
    main kernel build without spills, and the cluster add-up reads the other blocks' shared
    memory (ld.shared::cluster)."""
    _sliced_build(kernel, shape, params, ["m64n64k8"])


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((4097, 4097, 4097), {}),                                    # both streamed, one block per tile
    ((67, 3579, 2991), {"bm": 128, "fit": 2}),                   # 72 rows, 4 slices
    ((4096, 63, 4096), {"bn": 64}),                              # B only, one consumer, 8 slices
    ((32, 4096, 4093), {"bm": 64, "stages": 8}),                 # A only, m64n64k8, 4 slices
], ids=["unsplit", "fitted-split4", "b-bn64-split8", "a-bm64-split4"])
def test_gemm_tf32_streaming_unaligned_rows_builds_without_spills(shape, params):
    """gemm_tf32 with unaligned_rows 2: every producer thread copies rows with 4-byte cp.async
    (its registers still within setmaxnreg's 40) and counts them on the stage's barrier; the main
    kernel builds without spills in each tile and slice shape (the pad pre-pass is in the file
    but not launched), and the consumers fence the async proxy before wgmma reads the stage."""
    _sliced_build("gemm_tf32", shape, {**params, "unaligned_rows": 2},
                  ["cp.async.ca.shared.global", "cp.async.mbarrier.arrive.noinc",
                   "fence.proxy.async.shared::cta"])


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((4095, 4097, 333), {}),                                     # one block per tile
    ((22, 3087, 9792), {"bm": 64, "bn": 64, "fit": 2}),          # 24 rows, 2 slices
    ((511, 513, 8191), {}),                                      # 128 x 128, 4 slices
], ids=["unsplit", "fitted-split2", "split4"])
def test_3xtf32_streaming_unaligned_b_builds_without_spills(shape, params):
    """gemm_3xtf32 (B^T in registers) with unaligned_rows 2: every producer thread copies B's
    rows by 4-byte cp.async and counts them on the stage's barrier, within setmaxnreg's 40
    registers; the A-only pre-pass and the main kernel build without spills (two entries: the
    split_tf32_operands<0> instantiation and the main kernel)."""
    _sliced_build("gemm_3xtf32", shape, {**params, "unaligned_rows": 2},
                  ["cp.async.ca.shared.global", "cp.async.mbarrier.arrive.noinc"], entries=2)


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((22, 739, 326), {"bm": 64, "bn": 64, "fit": 2, "stages": 6, "unaligned_rows": 2}),  # cp.async A and B, 4 slices
    ((297, 44, 673), {"bm": 64, "bn": 64, "fit": 2}),             # cp.async A, 8 slices
    ((8, 644, 3176), {"bm": 64, "bn": 64, "fit": 2, "stages": 6}),  # the TMA's A, 8 rows, 8 slices
    ((4307, 583, 136), {"in_flight": 2, "unaligned_rows": 2}),    # the TMA's A, 128 x 128, unsliced
], ids=["copied-ab-split4", "copied-a-split8", "tma-a-split8", "tma-a-unsplit"])
def test_3xtf32_split_in_stage_builds_without_spills(shape, params):
    """gemm_3xtf32 with split_by 2: every producer thread splits A's rows in the stage (copied by
    4-byte cp.async, or brought by the TMA) within setmaxnreg's 40 registers and fences the async
    proxy before the consumers' wgmma reads them; one entry, no pre-pass, and no spills."""
    _sliced_build("gemm_3xtf32", shape, {**params, "register_operand": 1, "split_by": 2},
                  ["fence.proxy.async.shared::cta", "cvt.rna.tf32.f32"], entries=1)


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((11048, 27, 3851), {"bm": 128, "bn": 64, "fit": 2}),        # 32 columns, two consumers, unsliced
    ((1156, 65, 4351), {"bm": 64, "bn": 128, "fit": 2}),         # 72 columns, one consumer, 2 slices
    ((64, 66, 40001), {"bm": 64, "bn": 64, "min_slice_k": 32}),  # long K, 8 slices
], ids=["fitted-unsplit", "fitted-split2", "split8"])
def test_3xtf32_streaming_unaligned_a_builds_without_spills(shape, params):
    """gemm_3xtf32 with A in registers (register_operand 2) and unaligned_rows 2 at K % 4: every
    producer thread copies A's rows by 4-byte cp.async into the stage's A box, B_big^T and
    B_small^T still come by TMA; the pre-pass without A's copy (split_tf32_b_transposed<0>) and
    the main kernel build without spills, the producers within setmaxnreg's 40 registers."""
    _sliced_build("gemm_3xtf32", shape, {**params, "register_operand": 2, "unaligned_rows": 2},
                  ["cp.async.ca.shared.global", "cp.async.mbarrier.arrive.noinc",
                   "ldmatrix.sync.aligned.m8n8.x4"], entries=2)


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((4095, 4097, 333), {}),                                     # B copied, one block per tile
    ((32, 4096, 4096), {"bm": 64, "bn": 64, "stages": 8}),       # m64n64k8 with scale-d, 2 slices
    ((511, 513, 8191), {}),                                      # 128 x 128, promoted, 4 slices
    ((128, 4096, 8192), {"bm": 64, "stages": 6, "in_flight": 2}),  # two consumers, 2 groups in flight
    ((256, 512, 8192), {"accumulation": 1, "bm": 256, "stages": 2, "in_flight": 1}),  # 256 rows, 8 slices
], ids=["unsplit", "bm64-split2", "promoted-split4", "bm64-bn128", "bm256-unpromoted"])
def test_3xtf32_library_kernel_with_b_in_registers_builds_without_spills(shape, params):
    """gemm_3xtf32 (register_operand 1, B^T's fragments split in registers) in each tile,
    accumulation and slice shape: 23's split pre-pass and the main kernel build without spills
    (the FP32 total and two stages of split fragments stay in registers), the K slices add up
    through the other blocks' shared memory, and the split and the scale-d restart are in the
    source. Two entries: the named pre-pass (both are templates) and the main kernel."""
    _sliced_build("gemm_3xtf32", shape, params, ["setp.ne.b32 p", "cvt.rna.tf32.f32"], entries=2)


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((4096, 64, 4096), {}),                                      # two consumers, 4 slices
    ((4095, 63, 4093), {"bm": 64}),                              # A copied (K % 4), 2 slices
    ((4096, 4096, 4096), {"bn": 128, "stages": 4}),              # m64n128k8, one block per tile
    ((2048, 64, 4096), {"accumulation": 1, "in_flight": 2}),     # unpromoted, 2 groups in flight
], ids=["split4", "bm64-a-copied", "bn128-unsplit", "unpromoted"])
def test_3xtf32_library_kernel_with_a_in_registers_builds_without_spills(shape, params):
    """gemm_3xtf32 with register_operand 2 (A split in registers) in each tile, accumulation and
    slice shape: the transposing split pre-pass and the main kernel build without spills, the K
    slices add up through the other blocks' shared memory, and A's fragments come out of shared
    memory by ldmatrix and are split in registers."""
    _sliced_build("gemm_3xtf32", shape, params | {"register_operand": 2},
                  ["ldmatrix.sync.aligned.m8n8.x4", "cvt.rna.tf32.f32"],
                  entries=2)  # its own pre-pass (both are templates, built only where named)


@needs_nvcc
@pytest.mark.parametrize("kernel,shape,params", [
    ("gemm_tf32", (19, 1287, 2026), {"bm": 64, "bn": 64}),              # 24 rows: m64n24k8, 2 slices of 3 groups
    ("gemm_tf32", (67, 3579, 2991), {"bm": 128, "bn": 128}),            # 72 rows: m64n64k8 + m64n8k8, 4 slices
    ("gemm_tf32", (297, 43, 673), {"bm": 128, "bn": 64}),               # 104 rows: 64 + 40, 13 groups, unsliced
    ("gemm_3xtf32", (19, 1287, 2026), {"bm": 64, "bn": 64}),            # role 0: 24 rows, 4 slices
    ("gemm_3xtf32", (1156, 65, 4351), {"bm": 128, "bn": 128, "register_operand": 2}),  # role 1: 72 columns, 8 slices
    ("gemm_3xtf32", (10938, 192, 425), {"bm": 128, "bn": 128, "register_operand": 2}),  # role 1: 96 columns, unsliced
], ids=["tf32-24", "tf32-72", "tf32-104", "3xtf32-24", "3xtf32-a-72", "3xtf32-a-96"])
def test_fitted_tiles_build_without_spills(kernel, shape, params):
    """`fit` 2's tiles (wgmma's N side any multiple of 8, kernels/include/wgmma_rows.cuh) build for
    sm_90a without spills, in pieces of the m64nNk8 forms, with the K slices' uneven shares."""
    _sliced_build(kernel, shape, params | {"fit": 2}, ["m64n8k8", "m64n56k8"],
                  entries=2)  # the named pre-pass and the main kernel


@pytest.mark.parametrize("shape,params,rows,tiles", [
    ((11335, 212, 516), {"bm": 256, "bn": 128}, 176, 130),   # 90 tiles of 256 rows leave 42 SMs idle
    ((8067, 417, 114), {"bm": 256, "bn": 128}, 248, 132),    # 128 -> 132
    ((1000, 212, 1000), {"bm": 128, "bn": 64}, 64, 64),      # no tile under 64 rows (16 of them, not 33)
    ((4096, 4096, 4096), {"bm": 256, "bn": 128}, 256, 512),  # already past one wave: fit 2's tiles
    ((19, 1287, 2026), {"bm": 64, "bn": 64}, 24, 21),        # fewer rows than 64: fit 2's one tile
])
def test_wave_fitted_rows_fill_one_wave_where_bms_tiles_leave_sms_idle(shape, params, rows, tiles):
    """`fit` 3 (gemm_tf32): as fit 2 where bm's fitted tiles reach one wave of the SMs (132 on the
    H100 and H200), else the rows shared among as many tiles as the columns' tiles leave SMs for,
    each a multiple of 8 and no fewer than 64 rows; the derived tile count follows."""
    cfg = OmegaConf.load(CONF_DIR / "kernel" / "gemm_tf32.yaml")
    cfg.params.update({**params, "fit": 3})
    spec = build_spec(cfg, Problem(*shape, 0.5, 3.0), limits_from_spec("h200"))
    assert (spec.derived["block_m"], spec.derived["tiles"]) == (rows, tiles)
    assert spec.entry.split("<")[1].startswith(f"{rows}, {params['bn']},")
    cfg.params.update({"fit": 2})
    fit2 = build_spec(cfg, Problem(*shape, 0.5, 3.0), limits_from_spec("h200")).derived
    assert tiles >= fit2["tiles"] and (tiles == fit2["tiles"]) == (rows == fit2["block_m"])


@needs_nvcc
def test_wave_fitted_tile_builds_without_spills():
    """`fit` 3's 176-row tile at 11335 x 212 x 516 (pieces of 128 and 48 rows: wgmma_rows.cuh's
    forms) builds for sm_90a without spills."""
    _sliced_build("gemm_tf32", (11335, 212, 516), {"bm": 256, "bn": 128, "stages": 4, "fit": 3},
                  ["m64n8k8", "m64n56k8"], entries=2)


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((1156, 65, 4351), {"bn": 128}),                        # 72 columns, 8 slices
    ((552, 6, 2313), {"bm": 64}),                           # 8 columns (m64n8k8), one consumer, 4 slices
    ((14792, 10, 3067), {}),                                # 16 columns, unsliced
    ((2048, 100, 4093), {"bn": 128, "in_flight": 2}),       # A copied (K % 4), 104 columns
], ids=["72-split8", "8-bm64", "16-unsplit", "104-a-copied"])
def test_swapped_tf32_kernel_builds_without_spills(shape, params):
    """gemm_tf32_swapped (gemm_3xtf32's role 1 with one TF32 product a step) in each tile and
    slice shape builds for sm_90a without spills: A from shared memory by ldmatrix, rounded to
    TF32 in registers, the fitted columns on wgmma's N side."""
    _sliced_build("gemm_tf32_swapped", shape, params,
                  ["ldmatrix.sync.aligned.m8n8.x4", "cvt.rna.tf32.f32"], entries=2)


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((1156, 65, 4351), {"bn": 128}),                        # 72 columns, 8 slices
    ((4748, 23, 6078), {"bm": 128, "bn": 64, "stages": 6}),  # 24 columns, two consumers
    ((11048, 27, 3851), {"bm": 64}),                        # 32 columns, one consumer, unsliced
], ids=["72-split8", "24-two-consumers", "32-bm64-unsplit"])
def test_swapped_tf32_streaming_unaligned_a_builds_without_spills(shape, params):
    """gemm_tf32_swapped with unaligned_rows 2 at K % 4: every producer thread copies A's rows by
    4-byte cp.async into the stage's A box (B_big^T still by TMA); the pre-pass without A's copy
    (split_tf32_b_transposed<0>) and the main kernel build without spills, the producers within
    setmaxnreg's 40 registers."""
    _sliced_build("gemm_tf32_swapped", shape, {**params, "unaligned_rows": 2},
                  ["cp.async.ca.shared.global", "cp.async.mbarrier.arrive.noinc",
                   "ldmatrix.sync.aligned.m8n8.x4", "cvt.rna.tf32.f32"], entries=2)


@needs_nvcc
@pytest.mark.parametrize("shape,params", [
    ((4096, 4096, 4096), {}),                               # persistent, stream-K, 16-byte B copies
    ((4095, 4097, 333), {}),                                # 4-byte B copies (N % 4 != 0)
    ((4096, 4096, 4096), {"schedule": 1, "split_k": 3}),    # one block per tile and K slice
    ((1024, 1024, 1024), {"schedule": 3, "split_k": 2, "bn": 128, "wn": 32, "tm": 8, "bk": 16}),
], ids=["stream-k", "vec1", "split-k", "cluster"])
def test_warp_specialized_chapter_builds_without_spills(shape, params):
    """22 for sm_90a: the producer warpgroup gives registers back and the consumers take them
    (setmaxnreg, which ptxas honours), and neither role spills, in each of its code paths."""
    cfg = OmegaConf.load(CONF_DIR / "kernel" / "22_ffma_warp_specialized.yaml")
    cfg.params.update(params)
    spec = build_spec(cfg, Problem(*shape, 1.0, 0.0), limits_from_spec("h100_sxm"))
    report = compile_offline(spec, spec.arch)
    assert report["arch"] == "sm_90a"
    assert report["spill_store_bytes"] == 0 and report["stack_bytes"] == 0, report["log"]
    assert "C7508" not in report["log"], "ptxas ignored setmaxnreg"
    text = expand_source(spec.source)
    for instruction in ("setmaxnreg.inc", "setmaxnreg.dec", "cp.async.mbarrier.arrive.noinc",
                        "mbarrier.test_wait", "mbarrier.try_wait"):
        assert instruction in text


def test_nvcc_spells_arch_specific_targets_as_gencode():
    from src.job.nvcc import nvcc_arch_options

    assert nvcc_arch_options("sm_90") == ["-arch=sm_90"]
    assert nvcc_arch_options("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]


@needs_nvrtc
def test_3xtf32_prepass_builds_with_nvrtc_as_the_runner_does(tmp_path):
    """23's runner path builds two cubins from one source: the main entry (as for every chapter)
    and its launch.prepass entry, a plain __global__ function found by its name expression."""
    from src.job.compile import build_cubin

    spec = default_spec("23_wgmma_3xtf32")
    main = build_cubin(expand_source(spec.source), spec.entry, spec.arch, tmp_path, spec.name)
    prepass = build_cubin(expand_source(spec.source), spec.prepass.entry, spec.arch, tmp_path,
                          spec.name)
    assert prepass.lowered_name.startswith("_Z19split_tf32_operands")
    assert main.lowered_name.startswith("_Z18sgemm_wgmma_3xtf32") and main.path != prepass.path
    assert open(prepass.path, "rb").read(4) == b"\x7fELF"


def built_without_spills(kernel: str, shape, params: dict) -> KernelSpec:
    """A library kernel at `shape` with `params` over its defaults (alpha 0.5, beta 3), built for
    sm_90 offline: asserts no spill and no stack; the spec it built."""
    cfg = OmegaConf.load(CONF_DIR / "kernel" / f"{kernel}.yaml")
    for name, value in params.items():
        cfg.params[name] = value
    spec = build_spec(cfg, Problem(*shape, 0.5, 3.0), limits_from_spec("h100_sxm"))
    report = compile_offline(spec, "sm_90")
    assert report["spill_store_bytes"] == 0 and report["stack_bytes"] == 0, report["log"]
    return spec


@needs_nvcc
@pytest.mark.parametrize("shape,params,slices", [
    ((57, 38, 46), {}, 1),                                                        # 64 x 64, one block
    ((11048, 27, 3851), {"bm": 128, "bn": 32, "wm": 32, "wn": 32, "tn": 4}, 4),   # 4-byte B copies
    ((22, 3087, 9792), {"bm": 32, "bn": 128, "wm": 32, "wn": 64, "bk": 32}, 11),  # 32 rows, long K
    ((4096, 4096, 4096), {"bm": 128, "bn": 64, "wm": 64, "wn": 32}, 1),           # the largest tile
    ((1000, 1000, 1000), {"bm": 64, "bn": 64, "wm": 64, "wn": 32, "bk": 32}, 2),  # 8 lanes down a warp
    ((119, 119, 119), {"bm": 32, "bn": 32, "wm": 16, "wn": 32, "tm": 4, "tn": 4}, 1),  # 4 x 4 thread tiles
    ((471, 25, 23), {"bm": 16, "bn": 32, "wm": 16, "wn": 32, "tm": 4, "tn": 4}, 1),    # one warp, 16 rows
    ((57, 38, 46), {"bm": 32, "bn": 32, "wm": 16, "wn": 32, "tm": 4, "tn": 4, "c_read": 2}, 1),  # C ahead
    ((4096, 4096, 4096), {"bm": 128, "bn": 64, "wm": 32, "wn": 32, "tn": 4, "c_read": 2}, 1),  # 64 + 32 registers
], ids=["64x64", "128x32-vec1", "32x128-bk32", "128x64", "64x64-wm64", "32x32-t4x4", "16x32-t4x4",
        "32x32-c-ahead-vec1", "128x64-c-ahead"])
def test_ffma_library_kernel_builds_without_spills(shape, params, slices):
    """gemm_ffma from its smallest to its largest tile of the tune space, with 16-byte and 4-byte
    B copies and with K slices: no spills (8 x 8 accumulators and one k's fragments; the K-slice
    epilogue reads the grid's size again rather than holding it across the K loop, which spilled
    4-8 bytes in some tiles)."""
    spec = built_without_spills("gemm_ffma", shape, params)
    # K slices: about blocks_per_sm (2) blocks a SM on the H100's 132, none shorter than 256
    assert spec.grid == (spec.derived["tiles"], slices)


@needs_nvcc
@pytest.mark.parametrize("shape,params,slices", [
    ((57, 38, 46), {}, 1),                                                       # 64 x 64, one block, 4-byte copies
    ((11048, 27, 3851), {"bm": 128, "bn": 32}, 4),                               # 4-byte A and B, K slices
    ((22, 3087, 9792), {"bm": 32, "bn": 128}, 11),                               # 16-byte A, 4-byte B
    ((4096, 4096, 4096), {"bm": 128, "bn": 128, "wm": 64}, 1),                   # the largest tile, 8 warps
    ((1000, 997, 333), {"bm": 32, "bn": 64, "wm": 16, "bk": 16}, 1),             # bk 16
    ((130, 258, 100003), {"stages": 6}, 18),                                     # long K, many slices
    ((12, 867, 938), {"bm": 16, "bn": 64, "wm": 16}, 3),                         # one MMA row tile
], ids=["64x64-vec1", "128x32-vec1", "32x128-k-slices", "128x128", "32x64-bk16", "64x64-long-k", "16x64"])
@pytest.mark.parametrize("kernel", ["gemm_mma_tf32", "gemm_mma_3xtf32"])
def test_mma_tf32_library_kernel_builds_without_spills(kernel, shape, params, slices):
    """gemm_mma_tf32 (TF32) and gemm_mma_3xtf32 (its 3xTF32 build: three products a step, a k
    tile's partial sums) from a one-block product to its largest tile, with 16- and 4-byte copies
    of each operand and with K slices: no spills, and the C tile of the epilogue fits in the
    pipeline's shared memory (or the memory is sized for it). 3xTF32 holds a k tile's sums
    beside the total: its largest tile takes 32-row warp tiles (16 warps)."""
    if kernel == "gemm_mma_3xtf32" and params.get("wm") == 64:
        params = {**params, "wm": 32}
    spec = built_without_spills(kernel, shape, params)
    assert spec.grid == (spec.derived["tiles"], slices)
    p = spec.params
    assert spec.dynamic_smem_bytes >= 4 * p["bm"] * (p["bn"] + 4)   # the epilogue's C tile
    assert spec.derived["vec_a"] == (4 if shape[2] % 4 == 0 else 1)
    assert spec.derived["vec"] == (4 if shape[1] % 4 == 0 else 1)


@needs_nvcc
@pytest.mark.parametrize("shape,params,layout", [
    ((22, 3087, 9792), {}, (1, 24, 1)),                           # few rows, single-float B rows
    ((32, 4096, 4096), {"chunk": 64}, (1, 32, 4)),               # few rows at the widest: 128 sums a thread
    ((11048, 27, 3851), {"step": 16}, (0, 28, 1)),               # few columns, single-float A rows
    ((4096, 32, 4096), {"step": 8, "warps": 4}, (0, 32, 4)),     # few columns, float4 A rows
    ((5, 7, 3), {"warps": 2}, (1, 8, 1)),                        # one block, one short chunk
    ((5000, 96, 4095), {"step": 16}, (0, 96, 1)),                # the widest row of sums
    ((19, 1287, 2026), {"warps": 1, "min_slice_k": 32, "blocks_per_sm": 8}, (1, 20, 1)),  # one warp, 63 slices
    ((14792, 10, 3067), {"staging": 2, "chunk": 32}, (0, 12, 1)),    # A's rows staged: odd K
    ((5000, 96, 4096), {"staging": 2, "chunk": 64, "warps": 4}, (0, 96, 4)),  # staged, the widest row of sums
    ((19, 1287, 2026), {"staging": 2, "chunk": 32, "warps": 1}, (1, 20, 1)),   # B's rows staged: odd N
    ((32, 4096, 4096), {"staging": 2, "chunk": 32, "warps": 4}, (1, 32, 4)),   # staged, 128 sums a thread
    ((19, 1287, 2026), {"staging": 2, "chunk": 64, "warps": 1, "warps_k": 4}, (1, 20, 1)),  # 4 groups along K
    ((32, 4096, 4096), {"staging": 2, "chunk": 64, "warps": 1, "warps_k": 8}, (1, 32, 4)),  # 8 groups, 128 sums
], ids=["rows-vec1", "rows-32-vec4", "cols-vec1", "cols-32-vec4", "tiny", "cols-96", "rows-1warp-slices",
        "cols-staged-odd-k", "cols-96-staged", "rows-staged-odd-n", "rows-32-staged", "rows-warps-k4",
        "rows-warps-k8"])
def test_narrow_kernel_builds_without_spills_in_both_layouts(shape, params, layout):
    """gemm_ffma_narrow in both layouts (few rows: 4 columns x up to 32 rows of sums a thread;
    few columns: a row x up to 96 columns), 16-byte and 4-byte loads of the streamed operand,
    its steps and chunks, the streamed operand staged through shared memory or not: no spills, the
    narrow side rounded up to float4s, two chunk buffers of shared memory (and two of the streamed
    operand's where staged), and the block tile the grid counts."""
    spec = built_without_spills("gemm_ffma_narrow", shape, params)
    few_rows, width, vec = layout
    d = {**spec.params, **spec.derived}
    assert (d["few_rows"], d["width"], d["vec"]) == (few_rows, width, vec)
    # staged: B's chunk at the block's columns (few rows), or A's rows padded a float (few columns)
    stream = (d["chunk"] * 128 * d["warps"] if few_rows else 32 * d["warps"] * (d["chunk"] + 1)) * d["staged"]
    # warps_k > 1: the groups' sums (warps_k x the tile) after the K loop, in the same bytes
    sums = d["warps_k"] * width * 128 * d["warps"] if d["warps_k"] > 1 else 0
    assert spec.dynamic_smem_bytes == max(2 * d["chunk"] * (width + 4 * few_rows) + 2 * stream, sums) * 4
    m, n, _ = shape
    wide = (n, 128 * d["warps"]) if few_rows else (m, 32 * d["warps"])
    assert spec.grid == (-(-wide[0] // wide[1]), d["k_slices"])
    assert spec.block == (32 * d["warps"] * d["warps_k"],)


@needs_nvcc
@pytest.mark.parametrize("kernel", ["24_ffma_skinny", "gemm_ffma_skinny"])
@pytest.mark.parametrize("shape", SHAPE_LIMITED["24_ffma_skinny"] + [(32, 4096, 4096), (4095, 3, 333),
                                                                     (1, 4097, 4095)])
def test_skinny_kernel_builds_without_spills_in_both_layouts(kernel, shape):
    """Chapter 24's and the library's two layouts (few columns, few rows), float4 and
    single-float loads and the widest small side (32 rows: 128 sums per lane) compile without
    spilling."""
    spec = default_spec(kernel, shape)
    report = compile_offline(spec, "sm_90")
    assert report["spill_store_bytes"] == 0 and report["stack_bytes"] == 0, report["log"]
    assert spec.dynamic_smem_bytes == spec.derived["smem_bytes"]


def test_the_shared_memory_opt_in_counts_static_memory_too():
    """48 KiB is the whole default budget of a block, static and dynamic together: exactly 48 KiB
    of dynamic memory beside 4 bytes of static needs the opt-in (it failed at launch without it)."""
    from src.job.compile import needs_smem_opt_in

    assert needs_smem_opt_in(48 * 1024, 4) and needs_smem_opt_in(48 * 1024 + 1, 0)
    assert not needs_smem_opt_in(48 * 1024, 0) and not needs_smem_opt_in(48 * 1024 - 16, 16)


def test_a_pre_pass_is_loaded_without_the_main_entrys_shared_memory_opt_in(monkeypatch):
    """gemm_3xtf32 with A in registers, 8 stages, at 170 x 141 x 3691 asks for 230,528 B of
    dynamic shared memory; its pre-pass (split_tf32_b_transposed<1>) has a 4,224 B static tile and
    no dynamic memory. Raising the pre-pass's limit to the main entry's is over the block's
    227 KiB and the driver refuses it (an invalid argument on an H200). A stand-in driver that
    refuses the same keeps the rule: each entry is loaded for its own launches."""
    from src.job import compile as compile_mod

    limit = limits_from_spec("h200")["max_smem_per_block"]
    from src.tune.plan import candidate_config

    cfg = candidate_config("gemm_3xtf32", "fp32")
    spec = build_spec({**cfg, "params": {**cfg["params"], "register_operand": 2, "bm": 128, "bn": 64,
                                         "fit": 2, "stages": 8, "unaligned_rows": 1}},
                      Problem(m=170, n=141, k=3691, alpha=0.5, beta=3.0), limits_from_spec("h200"))
    assert spec.prepass is not None and spec.dynamic_smem_bytes == 230528
    static = {spec.entry: 0, spec.prepass.entry: 4224}
    raised = {}

    class Function:
        def __init__(self, name):
            self.name, self.shared_size_bytes = name, static[name]
            self.num_regs, self.local_size_bytes, self.max_threads_per_block = 168, 0, 384
            self.attributes = {}

        def __setattr__(self, key, value):
            if key == "max_dynamic_shared_size_bytes":
                if value + self.shared_size_bytes > limit:  # what the driver does
                    raise RuntimeError("CUDA_ERROR_INVALID_VALUE: invalid argument")
                raised[self.name] = value
            object.__setattr__(self, key, value)

    fake_cupy.install_loader(monkeypatch, Function)
    kernel = compile_mod.compile_kernel(spec)
    assert raised == {spec.entry: 230528}  # the pre-pass keeps its default limit
    assert kernel.report.dynamic_smem_bytes == 230528 and kernel.prepass.name == spec.prepass.entry


def _portable_library() -> list[str]:
    """The library kernels a GPU without a dispatch table runs off Hopper (conf/kernel/best_*.yaml
    `default`, less the sm_90a ones; the chapter among them is built for sm_80 above)."""
    from src.job import dispatch
    return sorted({e["kernel"] for d in ("best_fp32", "best_tf32")
                   for e in dispatch.defaults(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / f"{d}.yaml")))
                   if e["kernel"].startswith("gemm_")
                   and OmegaConf.load(CONF_DIR / "kernel" / f"{e['kernel']}.yaml").get("arch") is None})


@needs_nvcc
@pytest.mark.parametrize("gpu,arch", [("a100", "sm_80"), ("rtx4090", "sm_89")])
@pytest.mark.parametrize("name", _portable_library())
def test_the_portable_defaults_build_off_hopper_without_spills(name, gpu, arch):
    """Off Hopper these are what runs: at their defaults, at an odd shape (a skinny one for the
    kernel that only runs those), for the GPU's own architecture and limits (the RTX 4090's
    99 KB of shared memory a block), with no spill and no stack."""
    assert name in ("gemm_ffma", "gemm_ffma_skinny", "gemm_mma_3xtf32", "gemm_mma_tf32")
    shape = (7, 4095, 2049) if name == "gemm_ffma_skinny" else (1000, 999, 1001)
    spec = build_spec(OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml"), Problem(*shape, 0.5, 3.0),
                      limits_from_spec(gpu))
    assert spec.arch is None
    report = compile_offline(spec, arch)
    assert report["spill_store_bytes"] == 0 and report["stack_bytes"] == 0, report["log"]
    assert 0 < report["registers"] <= 255


def _turing_limits() -> dict:
    """An A100's limits with a Turing GPU's compute capability (T4: 7.5), so that only the
    compute-capability rules differ."""
    return {**limits_from_spec("a100"), "compute_capability": 75}


@needs_nvcc
@pytest.mark.parametrize("name", [n for n in CHAPTERS + LIBRARY
                                  if OmegaConf.load(CONF_DIR / "kernel" / f"{n}.yaml").get("arch") is None])
def test_a_kernel_refuses_a_gpu_before_sm_80_exactly_where_ptxas_would(name):
    """On an sm_75 GPU a kernel either builds there (nvcc for sm_75 takes it) or is refused by its
    `compute_capability >= 80` rule, a one-line why, before any compile: never a ptxas error."""
    shape = (7, 4095, 2049) if name in ("gemm_ffma_skinny", "gemm_ffma_narrow") else \
        chapter_shapes(name, sizes=(4096,))[0] if name[0].isdigit() else (1000, 999, 1001)
    cfg = OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml")
    refusal = None
    try:
        spec = build_spec(cfg, Problem(*shape, 0.5, 3.0), _turing_limits())
    except (InvalidParams, UnsupportedSize) as exc:
        refusal = str(exc)
    try:
        compile_offline(build_spec(cfg, Problem(*shape, 0.5, 3.0), limits_from_spec("a100")), "sm_75")
        compiles = True
    except CompileFailed:
        compiles = False
    if refusal is None:
        assert compiles, f"{name} builds on sm_75 by its rules but ptxas refuses it"
        assert spec.name == name
    else:
        assert "compute_capability >= 80" in refusal and not compiles, refusal
