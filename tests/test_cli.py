"""The command line as a user meets it: clear errors with non-zero exits for a single run, and
sweeps that record a failed job and go on to write their summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

ALL_KERNELS = sorted(p.stem for p in (ROOT / "conf" / "kernel").glob("*.yaml"))
assert {"01_naive", "17_flagship", "cublas_fp32", "cublas_tf32"} <= set(ALL_KERNELS)


def run_cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, HYDRA_FULL_ERROR="0")
    return subprocess.run(
        [sys.executable, "-m", "src.run", *args, f"hydra.run.dir={tmp_path}/run",
         f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.parametrize("args,status,needle", [
    (["kernel=06_vectorize", "kernel.params.bk=6"], "invalid_params", "tm % 4 == 0 and tn % 4 == 0 and bk % 4 == 0"),
    (["kernel=05_blocktile_2d", "size=1000"], "unsupported_size", "m % bm == 0"),
    (["size=0"], "invalid_problem", "m=0"),
    (["size=abc"], "invalid_problem", "m='abc'"),
])
def test_bad_input_is_one_clear_error(tmp_path, args, status, needle):
    proc = run_cli(tmp_path, *args)
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert f"error [{status}]" in output and needle in output, output
    assert "Traceback" not in output
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["status"] == status and record["gflops"] is None


def test_unknown_kernel_lists_the_choices(tmp_path):
    proc = run_cli(tmp_path, "kernel=07_nope")
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "Could not find 'kernel/07_nope'" in output
    for name in ALL_KERNELS:
        assert name in output
    assert "Traceback" not in output


def test_sweep_records_every_job_and_goes_on_after_failures(tmp_path):
    """A sweep over every kernel config plus a bad-parameter job: every job leaves a record
    (ok on a GPU machine, no_gpu without one), the bad one is invalid_params, the summary is
    written, and the sweep itself succeeds."""
    proc = run_cli(tmp_path, "-m", "kernel=glob(*)", "size=128", "bench=quick")
    assert proc.returncode == 0, proc.stderr
    sweep = tmp_path / "sweep"
    records = [json.loads(p.read_text()) for p in sweep.glob("*/record.json")]
    assert sorted(r["kernel"] for r in records) == ALL_KERNELS
    for r in records:
        assert r["status"] in ("ok", "no_gpu"), r
        if r["status"] != "ok":
            assert r["gflops"] is None and r["error"]
    summary = (sweep / "summary.md").read_text()
    for name in ALL_KERNELS:
        assert name in summary
    assert (sweep / "summary.csv").is_file()

    bad = run_cli(tmp_path / "bad", "-m", "kernel=06_vectorize", "kernel.params.bk=6,8",
                  "size=128", "bench=quick")
    assert bad.returncode == 0, bad.stderr
    statuses = {json.loads(p.read_text())["params"]["bk"]: json.loads(p.read_text())["status"]
                for p in (tmp_path / "bad" / "sweep").glob("*/record.json")}
    assert statuses[6] == "invalid_params" and statuses[8] in ("ok", "no_gpu")
    assert "invalid_params" in (tmp_path / "bad" / "sweep" / "summary.md").read_text()
