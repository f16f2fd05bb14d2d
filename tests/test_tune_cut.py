"""A tune cut short by Ctrl-C or a time limit's SIGINT (`timeout -s INT 520 sgemm-lab tune ...`),
with real processes: the signal reaches the tune and its sweep's `python -m src.run` (one process
group), and src.tune.sweeps.sweep_exit gives the sweep's process time to end its open MLflow runs
KILLED before it is killed (subprocess.run gave it 0.25 s, and the next sweep found its runs
RUNNING). The sweep's process is stood in for by a small script whose SIGINT handler takes a
second, as ending runs does, and leaves a file when it is done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

# the sweep's process: on SIGINT a second of cleanup, then a file saying it finished, exit 130
CHILD = """
import pathlib, signal, sys, time
done = pathlib.Path(sys.argv[1])
def cleanup(*_):
    time.sleep(float(sys.argv[2]))
    done.write_text("runs ended KILLED")
    sys.exit(130)
signal.signal(signal.SIGINT, cleanup)
pathlib.Path(str(done) + ".pid").write_text(str(__import__("os").getpid()))
time.sleep(60)
"""

# the tune as src.tune.command runs one sweep (SIGTERM raised as Terminated while it measures),
# with src.cli's exit status: 130 for Ctrl-C or SIGINT, 143 for SIGTERM
TUNE = """
import sys
from src.errors import Terminated
from src.tune import sweeps
try:
    with sweeps.sigterm_as_interrupt():
        sweeps.sweep_exit([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]],
                          grace_s=float(sys.argv[4]))
except KeyboardInterrupt as exc:
    sys.exit(143 if isinstance(exc, Terminated) else 130)
sys.exit(0)
"""


def cut(tmp_path: Path, cleanup_s: float, grace_s: float, child_script: str = CHILD, send=lambda pid: os.killpg(pid, signal.SIGINT)) -> tuple[int, Path, int]:
    """The tune started in a process group of its own, `send` given its pid once the sweep's
    process is up (by default SIGINT to the group, as `timeout -s INT` and Ctrl-C send it): (the
    tune's exit code, the file the sweep's process leaves when its cleanup finished, the sweep's
    pid)."""
    done = tmp_path / "done"
    tune = subprocess.Popen([sys.executable, "-c", TUNE, child_script, str(done), str(cleanup_s),
                             str(grace_s)], cwd=ROOT, start_new_session=True)
    pid_file = Path(str(done) + ".pid")
    deadline = time.monotonic() + 30
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and tune.poll() is None, "the sweep's process never started"
        time.sleep(0.05)
    send(tune.pid)
    return tune.wait(timeout=30), done, int(pid_file.read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_cut_sweep_ends_its_runs_before_the_tune_passes_the_interrupt_on(tmp_path):
    code, done, pid = cut(tmp_path, cleanup_s=1.0, grace_s=20.0)
    assert code == 130  # the tune is interrupted still: the evidence so far, no fit
    assert done.read_text() == "runs ended KILLED"  # the second of cleanup was waited for
    assert gone(pid)


def test_a_sweep_that_outlasts_its_grace_is_killed(tmp_path):
    started = time.monotonic()
    code, done, pid = cut(tmp_path, cleanup_s=30.0, grace_s=0.5)
    assert code == 130 and time.monotonic() - started < 20
    assert not done.exists() and gone(pid)  # killed and reaped, not left behind


# the sweep's process under SIGTERM: a second of cleanup, then the file, exit 143
CHILD_TERM = CHILD.replace("signal.SIGINT", "signal.SIGTERM").replace("sys.exit(130)", "sys.exit(143)")

def test_a_sigterm_to_the_tune_alone_reaches_its_sweep_which_ends_its_runs_first(tmp_path):
    """SIGTERM to the tune's pid only (a supervisor's `kill`; SLURM signals every process of the
    step, and the sweep ignores the second): the tune passes it to the sweep's process, waits for
    its cleanup, and ends with SIGTERM's status, not killed where it stood."""
    code, done, pid = cut(tmp_path, cleanup_s=1.0, grace_s=20.0, child_script=CHILD_TERM,
                          send=lambda tune: os.kill(tune, signal.SIGTERM))
    assert code == 143
    assert done.read_text() == "runs ended KILLED"  # the sweep got it and its cleanup was waited for
    assert gone(pid)
