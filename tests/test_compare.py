"""The GPU as an axis of the published results, without a GPU: the compare step (src/publish/
compare.py) puts the per-GPU sets side by side, a GPU or row never measured shown as such; the
guard (src/job/gpu_guard.py) keeps each GPU's measuring stages to that GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from src.job import gpu_guard
from src.publish import compare
from tests.conftest import ROOT

H100_SET = ROOT / "results" / "h100_sxm"
H100_NAME = "NVIDIA H100 80GB HBM3"  # the published runs' device name
# TEST FIXTURE, NOT A MEASUREMENT: a second GPU's set made of the published H100 tables under
# another spec name and device label, less one progression row and one suite shape; it only
# gives the compare step two measured GPUs to lay out. Nothing of it is ever published.
FIXTURE_GPU = "h200"
FIXTURE_LABEL = "TEST FIXTURE: H100 figures relabelled, not an H200 measurement"
DROPPED_ROW = ("17_flagship", 8192)
DROPPED_SHAPE = "333x333x333"


@pytest.fixture
def results(tmp_path):
    """results/ with the published H100 set's tables and the second-GPU test fixture."""
    root = tmp_path / "results"
    (root / "h100_sxm").mkdir(parents=True)
    for name in ("progression.csv", "suite.csv"):
        shutil.copy2(H100_SET / name, root / "h100_sxm" / name)
    (root / FIXTURE_GPU).mkdir()
    progression = pd.read_csv(H100_SET / "progression.csv")
    kernel, size = DROPPED_ROW
    progression = progression[~((progression.kernel == kernel) & (progression.m == size))]
    progression.assign(gpu=FIXTURE_LABEL).to_csv(root / FIXTURE_GPU / "progression.csv", index=False)
    suite = pd.read_csv(H100_SET / "suite.csv")
    suite[suite["shape"] != DROPPED_SHAPE].to_csv(root / FIXTURE_GPU / "suite.csv", index=False)
    return root


def test_progression_side_by_side_from_the_recorded_tables(results, tmp_path):
    gpus = ["h100_sxm", FIXTURE_GPU, "a100"]  # a100: no set at all
    progression, _ = compare.write_compare(results, gpus, tmp_path / "out", ["17_flagship", "cublas_fp32"])
    h100 = pd.read_csv(H100_SET / "progression.csv")
    # every (kernel, size) of the published H100 table, once per GPU
    assert len(progression) == 3 * len(h100)
    mine = progression[progression.gpu_spec == "h100_sxm"].reset_index(drop=True)
    assert list(mine.kernel) == list(h100.kernel) and list(mine.gflops) == list(h100.gflops)
    assert set(mine.gpu) == {H100_NAME} and set(mine.status) == set(h100.status)
    # the % shown is cuBLAS in the kernel's own precision
    tf32 = h100[h100.precision == "tf32"].iloc[0]
    row = mine[(mine.kernel == tf32.kernel) & (mine["size"] == str(tf32.m))].iloc[0]
    assert row.pct_of_cublas == tf32.pct_of_cublas_tf32
    # missing: the whole a100, and the one row the fixture lacks; never dropped
    assert set(progression[progression.gpu_spec == "a100"].status) == {compare.NOT_MEASURED}
    fixture = progression[progression.gpu_spec == FIXTURE_GPU].set_index(["kernel", "size"])
    assert fixture.loc[("17_flagship", "8192"), "status"] == compare.NOT_MEASURED
    assert pd.isna(fixture.loc[("17_flagship", "8192"), "gflops"])
    assert fixture.loc[("17_flagship", "4096"), "gflops"] == \
        h100[(h100.kernel == "17_flagship") & (h100.m == 4096)].gflops.iloc[0]
    written = pd.read_csv(tmp_path / "out" / "progression.csv", dtype={"size": str})
    assert list(written.columns) == compare.PROGRESSION_COLUMNS and len(written) == len(progression)

    text = (tmp_path / "out" / "progression.md").read_text()
    assert text.startswith(f"# SGEMM progression side by side: h100_sxm ({H100_NAME}), "
                           f"{FIXTURE_GPU} ({FIXTURE_LABEL}), a100 (not measured)")
    flagship = {line.split(" | ")[2]: line for line in text.splitlines() if line.startswith("| 17_flagship |")}
    assert set(flagship) == {"h100_sxm", FIXTURE_GPU, "a100"}
    assert flagship[FIXTURE_GPU].endswith("| not measured |") and "not measured" not in flagship["h100_sxm"]
    assert flagship["a100"].count("not measured") == 4
    # the README's table: the headline kernels only, in the order asked
    headline = (tmp_path / "out" / "headline.md").read_text().splitlines()
    assert [line.split(" | ")[0] for line in headline[2:]] == ["| 17_flagship"] * 3 + ["| cublas_fp32"] * 3


def test_suite_side_by_side_from_the_recorded_tables(results, tmp_path):
    gpus = ["h100_sxm", FIXTURE_GPU, "a100"]
    _, suite = compare.write_compare(results, gpus, tmp_path / "out")
    h100 = pd.read_csv(H100_SET / "suite.csv")
    assert len(suite) == 3 * len(h100)
    mine = suite[suite.gpu_spec == "h100_sxm"]
    assert sorted(mine.ratio.dropna()) == sorted(h100.ratio.dropna())
    dropped = suite[(suite["shape"] == DROPPED_SHAPE) & (suite.gpu_spec == FIXTURE_GPU)]
    assert len(dropped) == 2 and set(dropped.status) == {compare.NOT_MEASURED}
    text = (tmp_path / "out" / "suite.md").read_text()
    assert "| fp32 | best_fp32 | a100 | not measured | | | |" in text
    # the H100's geometric mean as its own suite table gives it
    ok = h100[(h100.kernel == "best_fp32") & (h100.status == "ok")]
    expected = f"{compare.geomean(ok.ratio):.4f} / {ok.ratio.min():.4f}"
    assert f"| fp32 | best_fp32 | h100_sxm | {len(h100[h100.kernel == 'best_fp32'])} | 0 | {expected} |" in text
    row = next(line for line in text.splitlines() if f"| {DROPPED_SHAPE} |" in line)
    assert row.count("not measured") == 2  # the fixture's dropped shape and the a100


def test_a_gpu_not_measured_is_a_legend_entry_of_each_figure(results, tmp_path):
    progression, suite = compare.write_compare(results, ["h100_sxm", "a100"], tmp_path / "out")
    for frame in (progression, suite):
        labels = [h.get_label() for h in compare.legend_handles(frame, ["h100_sxm", "a100"])]
        assert labels == ["h100_sxm", "a100: not measured"]
    for name in ("progression.png", "suite.png"):
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_needs_one_measured_gpu_and_each_gpu_once(results, tmp_path):
    with pytest.raises(ValueError, match="no GPU of a100, gh200 has a published table"):
        compare.write_compare(results, ["a100", "gh200"], tmp_path / "out")
    with pytest.raises(ValueError, match="name each GPU spec once"):
        compare.write_compare(results, ["h100_sxm", "h100_sxm"], tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# --- the guard of a GPU's measuring stages ------------------------------------------------------

def test_the_guard_lets_a_gpu_measure_its_own_set_only():
    assert gpu_guard.device_refusal("h100_sxm", [H100_NAME]) is None
    assert gpu_guard.device_refusal("h200", ["NVIDIA H200"]) is None
    why = gpu_guard.device_refusal("h200", [H100_NAME])
    assert why and f"{H100_NAME!r} (spec h100_sxm)" in why and "results/h200/" in why
    # every visible GPU counts (a sweep uses them all); a GH200 is not an H200
    assert gpu_guard.device_refusal("h200", ["NVIDIA H200", H100_NAME]) is not None
    assert "spec gh200" in gpu_guard.device_refusal("h200", ["NVIDIA GH200 480GB"])


def test_the_guard_refuses_runs_of_another_gpu(tmp_path):
    runs = H100_SET / "runs.csv"
    assert gpu_guard.runs_refusal("h100_sxm", runs) is None
    why = gpu_guard.runs_refusal("h200", runs)
    assert why and "measured on h100_sxm" in why


def _guard(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no device, even on a GPU machine
    return subprocess.run([sys.executable, "-m", "src.job.gpu_guard", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_guard_refuses_without_a_gpu_and_an_unknown_spec():
    proc = _guard("h200")
    assert proc.returncode == 1 and "refusing to measure results/h200/ without a h200 GPU" in proc.stderr
    proc = _guard("h300")
    assert proc.returncode == 1 and "no GPU spec 'h300'" in proc.stderr and "h200" in proc.stderr
