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


@pytest.fixture
def kernel_folder(tmp_path, monkeypatch):
    """A kernel folder of its own (with common.cuh), and a secret.h beside it, outside."""
    from src import paths

    folder = tmp_path / "kernels"
    folder.mkdir()
    (folder / "common.cuh").write_text("#define COMMON 1\n")
    (tmp_path / "secret.h").write_text("password\n")
    monkeypatch.setattr(paths, "KERNEL_DIRS", (folder,))
    monkeypatch.setattr(paths, "KERNELS_DIR", folder)
    return folder


def expand(folder, text: str) -> str:
    from src.job.compile import expand_source

    (folder / "k.cu").write_text(text)
    return expand_source(folder / "k.cu")


def test_an_include_outside_the_kernel_folders_is_refused(kernel_folder):
    with pytest.raises(ConfigError, match="secret.h"):
        expand(kernel_folder, '#include "../secret.h"\n')


# Every way the preprocessor reads a file (issue 35): each reached NVRTC unchanged, which opens
# what it names (an absolute path, or one relative to the working directory).
@pytest.mark.parametrize("text", [
    '#include "../secret.h" // the shared header\n',
    '#include "../secret.h" /* a comment that\n goes on */\n',
    '/* first */ # include "../secret.h"\n',
    '%:include "../secret.h"\n',
    '#inc\\\nlude "../secret.h"\n',
    '#include \\\n"../secret.h"\n',
    '#include <{secret}>\n',
    '#include <../../../../../../../..{secret}>\n',
    '#define HEADER "{secret}"\n#include HEADER\n',
    '#define HEADER <{secret}>\n#include HEADER\n',
    '#include_next "../secret.h"\n',
    '#import "../secret.h"\n',
    '#embed "../secret.h"\n',
    # nothing in a literal hides a directive: "/*" in a string, a raw string, a digit separator
    'const char *s = "/*";\n#include "../secret.h"\n',
    'const char *s = R"x(/*)" )x";\n#include "../secret.h"\n',
    "int n = 1'000; const char *s = \"/*\";\n#include \"../secret.h\"\n",
])
def test_every_form_of_include_is_pasted_or_refused(kernel_folder, text):
    secret = str(kernel_folder.parent / "secret.h")
    with pytest.raises(ConfigError, match="secret.h|rule: a kernel source includes by a literal name"):
        expand(kernel_folder, text.replace("{secret}", secret))


def test_allowed_includes_are_pasted_or_left_to_the_toolkit_headers(kernel_folder):
    text = expand(kernel_folder, '#include "common.cuh" // the lab helpers\n'
                                 "/* a comment with #include \"../secret.h\" in it */\n"
                                 '// #include "../secret.h"\n'
                                 'const char *s = "#include \\"../secret.h\\"";\n'
                                 "#include <mma.h>\nint after;\n")
    assert "#define COMMON 1" in text and '#include "common.cuh"' not in text
    assert "#include <mma.h>" in text and "password" not in text
    assert text.splitlines()[-2:] == ["#include <mma.h>", "int after;"]


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


@pytest.mark.parametrize("rule", ["m > 0 or nosuch > 0", "bm if m > 0 else nosuch", "nosuch > 0"])
def test_a_name_the_config_never_defines_is_refused_on_any_branch(rule):
    """An unknown name is a bug in conf/ even on a branch these values never take (`or`, `if`
    short-circuit): the rule names it, and the names the config does have."""
    with pytest.raises(ConfigError, match="uses nosuch, which is neither a parameter"):
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


# A kernel config is data (issue 35): from a folder on hydra.searchpath, one that reaches beyond
# the kernel node or names something to call is refused while Hydra composes, before it
# instantiates a callback, configures logging or writes .hydra/.
HOSTILE_KERNELS = {
    "global_package": "# @package _global_\nhydra:\n  callbacks:\n    evil:\n"
                      "      _target_: shutil.copyfile\n      src: {secret}\n      dst: {stolen}\n",
    "hydra_package": "# @package hydra.callbacks\nevil:\n  _target_: shutil.copyfile\n"
                     "  src: {secret}\n  dst: {stolen}\n",
    "env_package": "# @package _global_.hydra.job.env_set\nLD_PRELOAD: /tmp/evil.so\n",
    "defaults_list": "defaults:\n  - /kernel/01_naive@_global_.hydra.callbacks.evil\n"
                     "  - _self_\nname: evil\n",
    "target": "name: evil\nderived:\n  threads:\n    _target_: shutil.copyfile\n"
              "    src: {secret}\n    dst: {stolen}\n",
    "interpolation": "name: ${{oc.env:MLFLOW_TRACKING_PASSWORD}}\n",
}


def hostile_search_path(tmp_path, name: str) -> str:
    folder = tmp_path / "conf" / "kernel"
    folder.mkdir(parents=True, exist_ok=True)
    (tmp_path / "secret.txt").write_text("password\n")
    (folder / f"{name}.yaml").write_text(HOSTILE_KERNELS[name].format(
        secret=tmp_path / "secret.txt", stolen=tmp_path / "stolen.txt"))
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


def test_a_kernel_config_cannot_run_code_through_hydra(tmp_path):
    """The copy a `_global_` kernel config asked for (a callback Hydra instantiates before the
    job) is never made, and nothing of the run is written."""
    proc = run_cli(tmp_path, hostile_search_path(tmp_path, "global_package"), "kernel=global_package",
                   "size=128", "mlflow.enabled=false")
    output = proc.stdout + proc.stderr
    assert not (tmp_path / "stolen.txt").exists()
    assert proc.returncode == 1 and "error [invalid_config]" in output, output
    assert "rule: a kernel config is data" in output and "kernel/global_package.yaml" in output
    assert "Traceback" not in output and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", sorted(HOSTILE_KERNELS))
def test_a_kernel_config_that_reaches_beyond_the_kernel_node_is_refused(tmp_path, name):
    from src.compose import rules as compose_rules
    from tests.conftest import compose_config

    compose_rules.install()  # as src.run does
    with pytest.raises(compose_rules.ConfigRefused, match=r"error \[invalid_config\].*rule: a kernel config is data"):
        compose_config(hostile_search_path(tmp_path, name), f"kernel={name}")
    assert not (tmp_path / "stolen.txt").exists()


def test_every_kernel_config_of_the_lab_is_data():
    from src.compose import rules as compose_rules
    from tests.conftest import compose_config

    compose_rules.install()
    folders = [CONF_DIR / "kernel", CONF_DIR.parent / "tests" / "conf" / "kernel"]
    names = sorted(p.stem for folder in folders for p in folder.glob("*.yaml"))
    assert len(names) > 30
    for name in names:
        cfg = compose_config("hydra.searchpath=[file://tests/conf]", f"kernel={name}")
        assert cfg.kernel.name == name
