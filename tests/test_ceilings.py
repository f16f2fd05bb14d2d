"""Ceilings step (GPU microbenchmarks): the kernels are what they claim on a CPU machine (nvcc,
PTX), the command line fails cleanly without a GPU, and on a GPU the figures are plausible."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from src.job import ceilings
from src.job.nvcc import nvcc_path
from tests.conftest import ROOT

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (no CUDA toolkit)")


def nvcc(tmp_path, source: str, arch: str, *flags: str) -> tuple[str, str]:
    unit = tmp_path / "unit.cu"
    unit.write_text(source)
    out = tmp_path / "unit.out"
    proc = subprocess.run([nvcc_path(), "-std=c++17", "-ftz=true", f"-arch={arch}", *flags,
                           "-o", str(out), str(unit)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return (out.read_text() if "-ptx" in flags else ""), proc.stderr


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ffma_kernel_is_fma_only_and_in_registers(tmp_path, arch):
    ptx, _ = nvcc(tmp_path, ceilings.ffma_source(), arch, "-ptx")
    body = ptx.split(".entry ffma_throughput", 1)[1]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    fma = [i for i, line in enumerate(lines) if re.match(r"fma\.rn(?:\.ftz)?\.f32\b", line)]
    # the unrolled loop body is CHAINS * UNROLL fused multiply-adds back to back, nothing else
    assert len(fma) == ceilings.CHAINS * ceilings.UNROLL
    assert fma == list(range(fma[0], fma[0] + len(fma)))
    assert len(re.findall(r"\bst\.global\.", body)) == 1 and "ld.global" not in body
    _, log = nvcc(tmp_path, ceilings.ffma_source(), arch, "-cubin", "-Xptxas", "-v")
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log


@needs_nvcc
def test_copy_kernel_moves_float4s(tmp_path):
    ptx, _ = nvcc(tmp_path, ceilings.COPY_SOURCE, "sm_90", "-ptx")
    assert re.search(r"ld\.global\.nc\.v4\.f32|ld\.global\.nc\.v4\.u32|ld\.global\.nc\.v4\.b32", ptx), ptx
    assert re.search(r"st\.global\.v4\.(?:f32|u32|b32)", ptx), ptx


def test_ffma_flop_count():
    assert ceilings.ffma_flops(threads=1, iters=1) == 2 * ceilings.CHAINS * ceilings.UNROLL
    assert ceilings.ffma_flops(threads=132 * 2048) == 2 * 8 * 64 * 1024 * 132 * 2048


def test_no_gpu_is_reported_not_measured(tmp_path, monkeypatch):
    def no_gpu():
        raise ceilings.NoGPU("no CUDA GPU is visible to this process (test)")

    monkeypatch.setattr(ceilings.gpu_mod, "detect", no_gpu)
    out = tmp_path / "ceilings.json"
    assert ceilings.main(["-o", str(out)]) == 1
    assert not out.exists()


def test_cli_without_a_gpu(tmp_path):
    """On this machine, when no GPU is visible: exit 1, one line, no traceback, no file."""
    from tests.conftest import _gpu_visible

    if _gpu_visible() is None:
        pytest.skip("a GPU is visible")
    out = tmp_path / "ceilings.json"
    proc = subprocess.run([sys.executable, "-m", "src.job.ceilings", "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert re.search(r"no (NVIDIA driver|CUDA device|CUDA GPU)", proc.stderr), proc.stderr
    assert not out.exists()


@pytest.mark.gpu
def test_measured_ceilings_are_plausible(tmp_path):
    out = tmp_path / "ceilings.json"
    assert ceilings.main(["-o", str(out), "--warmup", "2", "--samples", "10"]) == 0
    result = json.loads(out.read_text())
    assert result["measured"] is True and result["gpu"]
    assert result["ffma"]["samples"] == 10 and result["dram"]["samples"] == 10
    assert result["ffma_gflops"] > 0 and result["dram_gbs"] > 0
    sheet = result["datasheet"]
    if sheet["fp32_gflops"]:  # a known GPU: within reach of its datasheet, never far above it
        assert 0.5 * sheet["fp32_gflops"] < result["ffma_gflops"] < 1.1 * sheet["fp32_gflops"]
    if sheet["mem_bandwidth_gbs"]:
        assert 0.5 * sheet["mem_bandwidth_gbs"] < result["dram_gbs"] < 1.05 * sheet["mem_bandwidth_gbs"]
