"""The command line answers at once: `--help`, `sgemm-lab kernels` and a bad input import none of
the heavy libraries (MLflow alone takes 2 s to import), and a bad input starts no worker process.
Held as an import budget, not a timing: a CPU test never asserts a speed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEAVY = ("mlflow", "pandas", "cupy", "dvc", "matplotlib", "optuna", "sqlalchemy", "numpy")


def imported_modules(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime ARGS` in tmp_path; return the process and the top-level names of
    every module it imported."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=path, HYDRA_FULL_ERROR="0"))
    names = {line.split("|")[-1].strip().split(".")[0]
             for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return proc, names


@pytest.mark.parametrize("command", [("-m", "src.run", "--help"), ("-m", "src.cli", "run", "-h"),
                                     ("-m", "src.cli", "kernels")])
def test_help_and_the_kernel_list_import_no_heavy_library(tmp_path, command):
    proc, names = imported_modules(tmp_path, *command)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "06_vectorize" in proc.stdout
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


@pytest.mark.parametrize("args,status", [(["size=0"], "invalid_problem"),
                                         (["bench.min_samples=0"], "invalid_config"),
                                         (["isolation.timeout_s=-1"], "invalid_config")])
def test_a_bad_input_is_refused_before_a_worker_or_mlflow_starts(tmp_path, args, status):
    proc, names = imported_modules(tmp_path, "-m", "src.run", *args,
                                   f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert f"error [{status}]" in output and "Traceback" not in output
    assert "job worker process" not in output  # refused in the launching process
    assert not names & {"mlflow", "cupy", "pandas"}, sorted(names & {"mlflow", "cupy", "pandas"})
    assert f'"status": "{status}"' in (tmp_path / "run" / "record.json").read_text()
    assert not (tmp_path / "mlflow.db").exists()  # tracking on (the default), no store touched


def test_the_installed_command_finds_the_labs_hydra_plugins(tmp_path):
    """`sgemm-lab run` as installed (an editable install, started from any directory, with no
    PYTHONPATH): Hydra's plugin scan finds the gpus launcher, so a sweep runs its job and
    records it (without a GPU: no_gpu), as `python -m src.run` does in the clone."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import sys; from src.cli import main; sys.exit(main(['run', '-m', 'kernel=01_naive', "
            f"'size=64', 'mlflow.enabled=false', 'hydra.sweep.dir={tmp_path}/sweep']))")
    found = subprocess.run([sys.executable, "-c", "import src.cli"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip("the package is not installed in this interpreter (pip install -e .)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert "Unknown plugin class" not in output and "Could not find" not in output, output
    assert list((tmp_path / "sweep").glob("*/record.json")), output
