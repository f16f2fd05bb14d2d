"""Config as input (issue 22): a kernel config is data a user edits, so a source outside the
kernel folders, an expression that would run for minutes, or one that cannot be evaluated is a
config error (`invalid_config`) naming the rule, found before anything is compiled or logged."""

from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf

from src.errors import ConfigError, InvalidParams
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.job.spec import build_spec
from tests.conftest import CONF_DIR
from tests.test_cli import run_cli, run_single_in_process, tracked_runs

H100 = limits_from_spec("h100_sxm")
P1024 = Problem(1024, 1024, 1024, 1.0, 0.0)


def vectorize(**changes) -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "06_vectorize.yaml"))
    cfg.update(changes)
    return cfg


@pytest.mark.parametrize("source", ["../../../../etc/passwd", "/etc/hostname", "../README.md",
                                    "../tests/conftest.py"])
def test_a_source_outside_the_kernel_folders_is_refused(source):
    with pytest.raises(ConfigError, match=r"rule: kernel.source and its #includes stay inside kernels/"):
        build_spec(vectorize(source=source), P1024, H100)


def test_an_include_outside_the_kernel_folders_is_refused(tmp_path, monkeypatch):
    from src import paths
    from src.job.compile import expand_source

    folder = tmp_path / "kernels"
    folder.mkdir()
    (folder / "k.cu").write_text('#include "../secret.h"\n')
    (tmp_path / "secret.h").write_text("password\n")
    monkeypatch.setattr(paths, "KERNEL_DIRS", (folder,))
    monkeypatch.setattr(paths, "KERNELS_DIR", folder)
    with pytest.raises(ConfigError, match="secret.h"):
        expand_source(folder / "k.cu")


def test_the_cli_refuses_such_a_source_and_logs_nothing_of_it(tmp_path, tracking_uri):
    proc = run_cli(tmp_path, "kernel.source=../../../../etc/passwd", "size=128",
                   MLFLOW_TRACKING_URI=tracking_uri)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [invalid_config]" in output, output
    assert "Traceback" not in output and "root:" not in output
    parents, _ = tracked_runs(tracking_uri)
    from mlflow import MlflowClient

    names = {a.path for a in MlflowClient(tracking_uri).list_artifacts(parents[0].info.run_id)}
    assert "kernel.cu" not in names and parents[0].data.tags["status"] == "invalid_config"


@pytest.mark.parametrize("rule", ["4000000 ** 4000000 > 0", "bm ** bm ** bm > 0",
                                  "(bm << 4000000) > 0", " * ".join(["m"] * 30) + " > 0"])
def test_an_expression_that_would_run_for_minutes_is_refused_at_once(rule):
    start = time.process_time()
    with pytest.raises(ConfigError, match=r"integers below 2\*\*256"):
        build_spec(vectorize(constraints=[rule]), P1024, H100)
    assert time.process_time() - start < 1.0


def test_ordinary_big_numbers_still_evaluate():
    spec = build_spec(vectorize(constraints=["m * n * k * 4 < 2 ** 64", "2 ** 31 - 1 > m"]),
                      P1024, H100)
    assert spec.name == "06_vectorize"


@pytest.mark.parametrize("rule,error,needle", [
    ("bm + 'x' > 0", ConfigError, "TypeError"),
    ("sqrt(bm) > 0", ConfigError, "sqrt"),
    ("'x' * 100000000 > 0", ConfigError, "strings cannot be multiplied"),
    ("m % (bm - bm) == 0", InvalidParams, "divides by zero"),
])
def test_an_expression_that_cannot_be_evaluated_is_a_config_error(rule, error, needle):
    with pytest.raises(error, match=needle):
        build_spec(vectorize(constraints=[rule]), P1024, H100)


def test_the_runner_reports_a_broken_constraint_as_a_config_error(tmp_path):
    """Through the runner's steps, in this process (the command's exit and output for such a
    config: test_the_cli_refuses_such_a_source_and_logs_nothing_of_it)."""
    code, record = run_single_in_process(tmp_path, "kernel.constraints=['sqrt(bm) > 0']",
                                         "size=128", "mlflow.enabled=false")
    assert code == 1 and record["status"] == "invalid_config", record
    assert "sqrt" in record["error"] and "Traceback" not in record["error"]


def test_pruning_a_tuning_space_is_bounded_too():
    from src.tune import space as tune

    cfg = vectorize(constraints=["bm ** bm ** bm > 0"])
    start = time.process_time()
    with pytest.raises(ConfigError):
        tune.prune(cfg, [{"bm": 64}, {"bm": 128}], P1024, H100)
    assert time.process_time() - start < 1.0
