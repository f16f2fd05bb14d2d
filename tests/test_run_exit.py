"""The runner's process ends once its work is done, whatever a library leaves to the interpreter's
finalization (issue 35: a soak sweep wrote its summary and never exited, its main thread in the
final garbage collection). Here a stand-in library object sits in a reference cycle whose
finalizer blocks when the interpreter finalizes; the runner must still exit, with its status."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_cli import cli_env

# A library object in a reference cycle: only the final garbage collection reaches it, and its
# finalizer then blocks (as one waiting on a lock a thread held when the interpreter stopped it).
BLOCKING_FINALIZER = """
import runpy, sys, time

class HeldAtExit:
    def __del__(self):
        if sys.is_finalizing():
            time.sleep(600)

held = HeldAtExit()
held.cycle = held
runpy.run_module("src.run", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("args, status", [
    (["m=-1"], 1),                                               # a single run refused at once
    (["-m", "kernel=01_naive,06_vectorize", "m=-1", "mlflow.enabled=false"], 1),  # a sweep that ends
])
def test_the_runner_exits_though_a_finalizer_would_block(tmp_path, args, status):
    try:
        proc = subprocess.run([sys.executable, "-c", BLOCKING_FINALIZER, *args,
                               f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"],
                              cwd=ROOT, env=cli_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db"),
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the runner did its work and then hung in the interpreter's finalization")
    assert proc.returncode == status, proc.stderr[-2000:]
    assert "m=-1" in proc.stdout + proc.stderr  # it did the work: the refusal names the rule's input
