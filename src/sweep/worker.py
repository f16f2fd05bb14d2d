"""Isolation step: a job's GPU work runs in a worker process, so a kernel that faults or hangs
takes down only its own job.

A CUDA fault (illegal address, misaligned access, launch failure) is sticky: it poisons the
CUDA context of the process it happened in, and every later CUDA call there fails. A hang
(a kernel that never returns) blocks its process for good. So the launching process never
touches the GPU itself: it hands each job to a worker (`multiprocessing`, spawned, never
forked, since a CUDA context does not survive a fork) and waits for it.

- A healthy job: the worker answers with the record and stays up for the next job, keeping
  its CUDA context, compiled modules and cuBLAS baselines (the cost per job is one pickled
  config out and one pickled record back). The worker's start (imports, CuPy, the CUDA
  context) is paid once: by the first job, or, in a slot of the GPU launcher, while the sweep
  is still being composed (src/sweep/pool.py starts it with the slot).
- A fault: the worker answers with the failed record, says its context is poisoned and exits;
  the next job starts a fresh worker.
- A hang: the worker reports each step it finishes (spec, compiled, verified, timed); when no
  step finishes within `isolation.timeout_s` the launching process kills it, records the job
  as failed_timeout (with the last step reached) and the next job starts a fresh worker.
- A crash (the worker died: a segfault, the OOM killer): recorded as failed_crash.
- Ctrl-C or SIGTERM in the launching process: the worker is killed with it (the worker
  ignores SIGINT itself, so a terminal's Ctrl-C reaches the launcher, which decides).

`isolation.mode=inline` runs the job in the launching process instead (no worker), as before.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from functools import lru_cache

from src.errors import ConfigError, LabError
from src.records.record import Record

log = logging.getLogger("sgemm")

MODES = ("process", "inline")
MAX_TIMEOUT_S = 86400  # a step silent for a day is a hang; larger values overflow poll()


class JobTimeout(LabError):
    status = "failed_timeout"


class WorkerCrashed(LabError):
    status = "failed_crash"


@dataclass(frozen=True)
class Isolation:
    mode: str = "process"
    timeout_s: float = 120.0

    @classmethod
    def from_cfg(cls, cfg) -> "Isolation":
        section = cfg.get("isolation") or {}
        mode = str(section.get("mode", "process"))
        timeout = section.get("timeout_s", 120)
        if mode not in MODES:
            raise ConfigError(f"isolation.mode must be one of {', '.join(MODES)}, got {mode!r}.")
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not 0 < timeout <= MAX_TIMEOUT_S):  # also refuses inf and nan
            raise ConfigError(f"isolation.timeout_s must be a positive number of seconds, at most "
                              f"{MAX_TIMEOUT_S} (a day), got {timeout!r}.")
        return cls(mode=mode, timeout_s=float(timeout))


# --- the worker's side ----------------------------------------------------------------------

def die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this worker when its launcher dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass  # elsewhere the worker still ends when its pipe closes (EOFError below)


def _context_healthy() -> bool:
    """False when this process's CUDA context is poisoned by a fault (sticky errors)."""
    try:
        import cupy as cp

        cp.cuda.runtime.deviceSynchronize()  # a sticky error raises here, and on every call
        return True
    except Exception:
        return False


def _warm_up() -> None:
    """CuPy's import and the device's CUDA context now, before the first job is read: a worker
    started ahead of its jobs (a slot's, src/sweep/pool.py) has them ready when the job comes."""
    try:
        import cupy as cp

        cp.cuda.runtime.free(0)  # cudaFree(0): the usual way to create the primary context
    except Exception:  # no driver or no GPU: the job finds that itself and says so (no_gpu)
        pass


def _serve(conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C and kills us
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from omegaconf import OmegaConf

    from src.job.baselines import Baselines
    from src.job.measure import JobOutputs
    from src.job.pipeline import run_job

    _warm_up()
    baselines = Baselines()  # this worker's cuBLAS figures, kept for the jobs it runs next
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        container, explicit, run_id = message
        cfg = OmegaConf.create(container)
        outputs = JobOutputs()

        def progress(step: str, record: Record) -> None:
            conn.send(("progress", step, record.to_dict()))

        record = run_job(cfg, outputs, explicit, progress=progress, run_id=run_id,
                         baselines=baselines)
        # A failed launch may have left the context poisoned; a fault always does. A job that
        # never reached the GPU (bad input, no GPU) cannot have hurt it.
        healthy = record.gpu is None or (record.status != "failed_launch" and _context_healthy())
        conn.send(("done", record.to_dict(), outputs, healthy))
        if not healthy:
            # Leave now: Python's shutdown would free device memory in the poisoned context,
            # and CuPy would print an error for every buffer.
            conn.close()
            os._exit(0)


def _worker_main(target, conn) -> None:
    """The worker's entry: SIGTERM back to its default first. A spawned process inherits the
    signals its launcher ignores, and a launcher on its way out after an interrupt ignores
    SIGTERM (signals.ignore_from_now); a worker started then would outlive multiprocessing's
    terminate() at exit, and the launcher would wait for it for ever."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    target(conn)


# --- the launcher's side --------------------------------------------------------------------

class Worker:
    """One worker process, started ahead of the jobs (start_if_stopped) or when first needed, and
    replaced after a fault, a hang or a death before its job."""

    def __init__(self, target=None) -> None:
        self._target = target  # None: _serve (tests pass stand-ins that hang or crash)
        self._ctx = multiprocessing.get_context("spawn")
        self._process = None
        self._conn = None
        self.started = 0  # how many worker processes this launcher has started

    def _start(self) -> None:
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(self._target or _serve, child_conn),
                                    daemon=True, name="sgemm-worker")
        try:
            process.start()
        finally:  # a Ctrl-C during the spawn leaves no half-started worker for stop() to join
            child_conn.close()
            if process.pid is None:
                parent_conn.close()
        self._process, self._conn = process, parent_conn
        self.started += 1
        log.info("job worker process %d started%s", self._process.pid,
                 "" if self.started == 1 else f" (replacing a failed one, {self.started} so far)")

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start_if_stopped(self) -> None:
        """Start the worker process now, without a job for it yet (its start overlaps what the
        caller does before the first job); one that dies meanwhile is replaced by run()."""
        if not self.alive:
            if self._process is not None:
                self.stop(kill=True)
            self._start()

    def stop(self, kill: bool = False) -> None:
        """End the worker: politely (it finishes its loop) or, for a hang, with SIGKILL."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None or process.pid is None:  # none, or never started
            return
        if not kill and process.is_alive():
            try:
                conn.send(None)
                process.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
        if process.is_alive():
            process.kill()
        process.join(timeout=30)
        conn.close()

    def run(self, container: dict, explicit: set[str], timeout_s: float, fallback: Record,
            run_id: str | None = None):
        """Run one job (its resolved config as a plain dict) in the worker; return (record,
        outputs). `fallback` is the record to fail when the worker never reports one."""
        from src.job.measure import JobOutputs

        self.start_if_stopped()  # none yet, or it died (a fault, a hang, a crash before this job)
        last = fallback
        step = "start"
        try:
            self._conn.send((container, set(explicit), run_id))
            while True:
                if not self._conn.poll(timeout_s):
                    self.stop(kill=True)
                    return _failed(last, JobTimeout(
                        f"kernel {last.kernel} made no progress for {timeout_s:g} s after step "
                        f"`{step}` (rule: each step of a job, compile, verify or time, ends within "
                        f"isolation.timeout_s); probably a hang. Its worker process was killed; "
                        f"the next job runs in a fresh one.")), JobOutputs()
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    code = self._process.exitcode if self._process is not None else None
                    self._process.join(timeout=5) if self._process is not None else None
                    code = self._process.exitcode if self._process is not None else code
                    self.stop(kill=True)
                    return _failed(last, WorkerCrashed(
                        f"the worker process running kernel {last.kernel} died after step "
                        f"`{step}` (exit code {code}; a negative code is the signal that killed "
                        f"it) without reporting a result. The next job runs in a fresh worker.")
                    ), JobOutputs()
                if message[0] == "progress":
                    _, step, data = message
                    last = Record.from_dict(data)
                    continue
                _, data, outputs, healthy = message
                if not healthy:
                    self.stop()
                return Record.from_dict(data), outputs
        except BaseException:  # Ctrl-C, SIGTERM (tracking.Terminated): the job dies with us
            self.stop(kill=True)
            raise


def _failed(record: Record, exc: LabError) -> Record:
    from src.records.record import mark_failed

    mark_failed(record, exc)
    return record


_worker: Worker | None = None


def shared_worker() -> Worker:
    """The launching process's worker (one per process; a sweep's jobs share it)."""
    global _worker
    if _worker is None:
        _worker = Worker()
        atexit.register(_worker.stop, kill=True)
    return _worker


@lru_cache(maxsize=None)
def inline_baselines():
    """The launching process's cuBLAS figures, for jobs run inline (isolation.mode=inline)."""
    from src.job.baselines import Baselines

    return Baselines()


def refused(cfg, run_id: str | None = None) -> Record | None:
    """The job's failed record when its inputs break a rule (isolation.*, the problem, bench.*),
    found in this process without a GPU: no worker is started for it. None when they hold."""
    from src.job.prepare import check_inputs
    from src.records.record import new_record

    try:
        Isolation.from_cfg(cfg)
        check_inputs(cfg)
    except LabError as exc:
        record = new_record(str(cfg.kernel.get("name")), str(cfg.kernel.get("precision")),
                            str(cfg.kernel.get("backend")), cfg, mlflow_run_id=run_id)
        return _failed(record, exc)
    return None


def run_isolated(cfg, explicit: set[str], run_id: str | None = None):
    """Run a job as `cfg.isolation` says: returns (record, outputs), whatever the kernel does.
    `run_id`: the job's MLflow run, recorded with the result."""
    from omegaconf import OmegaConf

    from src.job.measure import JobOutputs
    from src.job.pipeline import run_job
    from src.records.record import new_record

    early = refused(cfg, run_id)
    if early is not None:
        return early, JobOutputs()
    isolation = Isolation.from_cfg(cfg)
    if isolation.mode == "inline":
        outputs = JobOutputs()
        return run_job(cfg, outputs, explicit, run_id=run_id, baselines=inline_baselines()), outputs
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop("hydra", None)
    fallback = new_record(str(cfg.kernel.get("name")), str(cfg.kernel.get("precision")),
                          str(cfg.kernel.get("backend")), cfg, mlflow_run_id=run_id)
    start = time.perf_counter()
    result = shared_worker().run(container, explicit, isolation.timeout_s, fallback, run_id)
    log.debug("job in worker %d took %.3f s", os.getpid(), time.perf_counter() - start)
    return result
