"""Isolation (src/sweep/worker.py) without a GPU: the worker process is replaced by stand-ins
(tests/fault_jobs.py) that hang, crash or report a poisoned context, and the launcher must
record each as its own failure and run the next job in a healthy worker."""

from __future__ import annotations

import os
import time

import pytest

from src.errors import ConfigError
from src.records.record import Record
from src.sweep.worker import Isolation, Worker
from tests import fault_jobs


def job(kernel: str) -> tuple[dict, Record]:
    container = {"kernel": {"name": kernel}, "m": 64, "n": 64, "k": 64}
    return container, Record(kernel=kernel, precision="fp32", backend="nvrtc", m=64, n=64, k=64,
                             alpha=1.0, beta=0.0)


def run(worker: Worker, kernel: str, timeout_s: float = 30.0) -> Record:
    container, fallback = job(kernel)
    record, _outputs = worker.run(container, set(), timeout_s, fallback)
    return record


def test_healthy_jobs_share_one_worker():
    worker = Worker(fault_jobs.ok_serve)
    try:
        pids = {run(worker, f"good{i}").entry for i in range(3)}
        assert len(pids) == 1 and worker.started == 1
        assert int(pids.pop()) != os.getpid()  # the job ran in another process
    finally:
        worker.stop()
    assert not worker.alive


def test_a_ctrl_c_while_the_worker_spawns_leaves_nothing_for_stop_to_trip_on(monkeypatch):
    """Ctrl-C landing while the worker process is being spawned (a soak run, seed 3123084134):
    the atexit handler that stops the worker must end quietly, not join a process that never
    started (multiprocessing asserts, and the sweep printed that traceback)."""
    import multiprocessing

    spawn_process = type(multiprocessing.get_context("spawn").Process())

    def interrupted(self):
        raise KeyboardInterrupt

    worker = Worker(fault_jobs.ok_serve)
    monkeypatch.setattr(spawn_process, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        worker.start_if_stopped()
    worker.stop()  # what the atexit handler does: no AssertionError
    assert not worker.alive and worker.pid is None and worker.started == 0
    monkeypatch.undo()
    try:
        assert run(worker, "good").ok and worker.started == 1  # the next job gets a worker
    finally:
        worker.stop()


def test_a_worker_started_ahead_runs_the_first_job_and_one_dead_before_its_job_is_replaced():
    import signal

    worker = Worker(fault_jobs.ok_serve)
    try:
        worker.start_if_stopped()
        ahead = worker.pid
        assert worker.alive and worker.started == 1
        worker.start_if_stopped()  # running: not started twice
        assert run(worker, "good").entry == str(ahead) and worker.started == 1
        os.kill(ahead, signal.SIGKILL)  # it dies between jobs, as a slot's worker may
        deadline = time.monotonic() + 10
        while worker.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        after = run(worker, "good")
        assert after.ok and after.entry != str(ahead) and worker.started == 2
    finally:
        worker.stop()


def test_a_worker_started_while_the_launcher_ignores_sigterm_still_ends_on_sigterm():
    """After an interrupt the launcher ignores SIGTERM (its cleanup must not be cut short); a
    worker spawned then must not inherit that, or multiprocessing's terminate() at exit cannot
    end it and the launcher waits for ever."""
    import signal

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = Worker(fault_jobs.ok_serve)
    try:
        pid = int(run(worker, "good").entry)
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while worker.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not worker.alive
    finally:
        worker.stop(kill=True)


def test_a_hang_is_killed_at_the_timeout_and_the_next_job_runs_in_a_fresh_worker():
    worker = Worker(fault_jobs.hang_serve)
    try:
        first = run(worker, "good")
        started = time.perf_counter()
        hung = run(worker, "hang", timeout_s=2.0)
        assert 2.0 <= time.perf_counter() - started < 20
        assert hung.status == "failed_timeout" and hung.gflops is None
        assert "made no progress for 2 s after step `compiled`" in hung.error
        assert "isolation.timeout_s" in hung.error
        assert hung.registers == 40  # what the job reported before it hung is kept
        after = run(worker, "good")
        assert after.ok and after.entry != first.entry and worker.started == 2
    finally:
        worker.stop(kill=True)


def test_a_crash_is_recorded_with_its_signal():
    worker = Worker(fault_jobs.crash_serve)
    try:
        crashed = run(worker, "crash")
        assert crashed.status == "failed_crash" and crashed.gflops is None
        assert "died after step `start`" in crashed.error and "exit code -11" in crashed.error
        assert run(worker, "good").ok and worker.started == 2
    finally:
        worker.stop(kill=True)


def test_a_poisoned_worker_is_replaced():
    worker = Worker(fault_jobs.poisoned_serve)
    try:
        first = run(worker, "fault")
        second = run(worker, "fault")
        assert first.status == second.status == "failed_launch"
        assert first.entry != second.entry and worker.started == 2
    finally:
        worker.stop(kill=True)


@pytest.mark.parametrize("section,needle", [
    ({"mode": "threads"}, "isolation.mode must be one of process, inline"),
    ({"timeout_s": 0}, "isolation.timeout_s must be a positive number"),
    ({"timeout_s": "soon"}, "isolation.timeout_s must be a positive number"),
    ({"timeout_s": float("inf")}, "at most 86400"),
    ({"timeout_s": float("nan")}, "got nan"),
])
def test_bad_isolation_settings_are_config_errors(section, needle):
    with pytest.raises(ConfigError, match=needle):
        Isolation.from_cfg({"isolation": section})


def test_default_isolation_is_a_worker_process(compose):
    assert Isolation.from_cfg(compose()) == Isolation(mode="process", timeout_s=120.0)
