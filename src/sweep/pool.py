"""Sweep step on several GPUs: a pool of slots, one per GPU (src/job/devices.py), each a process
pinned to its GPU (CUDA_VISIBLE_DEVICES) that runs the sweep's jobs one at a time, exactly as
Hydra's basic launcher runs them in the launching process: Hydra's run_job, the job's MLflow child
run, its worker process (src/sweep/worker.py: a fault or a hang costs that job alone, and the slot
starts a fresh worker for its next job). Jobs go to the next free slot in the order the launcher
gives (setup first, then longest); results come back in job order. The slots start as the pool is
made, and each starts its worker at once, so their start (processes, imports, CUDA context)
overlaps what the launcher does before the first job. The slots also compose the batch's jobs
(compose(): a share each, at once, before any job runs): composed one after another in the
launcher (about 0.1 s each), 104 tuning candidates were seconds of idle GPUs.

Why processes, not threads of the launcher: Hydra's run_job sets process-wide state for the job it
runs (the HydraConfig singleton the job reads, the logging handlers that write the job's log file,
the cwd with hydra.job.chdir), so two jobs at once need two processes. Why a process of our own
per GPU, not joblib's or submitit's local launcher: neither pins a job to a GPU (joblib's workers
see every GPU; submitit's local mode puts every job on the first), and a slot that lives for the
whole sweep keeps its worker, with its CUDA context, compiled modules and cuBLAS figures, from job
to job, as the one-GPU sweep does.

Signals: the launching process alone decides. Slots are in a process group of their own (a
terminal's Ctrl-C reaches the launcher only); on Ctrl-C or SIGTERM the launcher passes the same
signal on, once, to each slot with a job in flight, which ends its job's run KILLED, kills its
worker and exits; the launcher waits for them (GRACE_S), then re-raises. A slot dies with the
launcher (PR_SET_PDEATHSIG), and its worker with it.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import pickle
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import wait

from src.job.devices import Gpu
from src.sweep.tracking import signals
from src.sweep.worker import die_with_parent

log = logging.getLogger("sgemm")

GRACE_S = 60.0  # after an interrupt: how long a slot may take to end its job's run KILLED


@dataclass
class Answer:
    """What a slot said of one job. kind: done (value: what the job returned), raised (value: the
    exception that stopped the job and the sweep, e.g. SystemExit), lost (its slot died; value:
    the exit code) or interrupted (the slot was signalled by someone other than the launcher)."""

    kind: str
    value: object
    gpu: Gpu


# --- the slot's side ------------------------------------------------------------------------

def _slot_main(serve, conn, env: dict, context: bytes) -> None:
    os.environ.update(env)  # before anything here starts CUDA: this process and its worker see one GPU
    os.setpgrp()  # a terminal's Ctrl-C goes to the launcher alone, which passes it on once
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not the launcher's SIG_IGN, if inherited
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
    try:
        serve(conn, context)
    except KeyboardInterrupt:  # idle when the interrupt came: no job to end
        pass


def answer(conn, kind: str, position: int, value) -> None:
    """Send the launcher `kind` and `value` for job `position` (cloudpickle: an exception of any
    class, a function defined in __main__)."""
    import cloudpickle

    try:
        data = cloudpickle.dumps(value)
    except Exception as exc:  # an unpicklable return value: its description goes back instead
        if hasattr(value, "_return_value"):
            value._return_value = RuntimeError(f"{type(value._return_value).__name__}: "
                                               f"{value._return_value} (unpicklable: {exc})")
            data = cloudpickle.dumps(value)
        else:
            data = cloudpickle.dumps(RuntimeError(f"{type(value).__name__}: {value}"))
    conn.send((kind, position, data))


def receive(conn):
    """The next message from the launcher (Slot.send): None, ("compose", share) or ("run",
    position, job); EOFError or OSError when the launcher has gone."""
    return pickle.loads(conn.recv_bytes())


def start_worker_ahead(config) -> None:
    """The slot's job worker (src/sweep/worker.py), started with the slot, not by its first job
    (its imports and CUDA context overlap the composing), when jobs run in one (isolation=process)."""
    from src.errors import ConfigError
    from src.sweep.worker import Isolation, shared_worker

    try:
        if Isolation.from_cfg(config).mode != "process":
            return
    except ConfigError:  # each job refuses it with this error when it runs
        return
    shared_worker().start_if_stopped()


def compose_job(hydra_context, master_config, overrides, job_idx: int):
    """One job's config as Hydra's basic launcher composes it (with the job's id and number), the
    lab's compose rules (src/compose/rules.py) installed first; Hydra's error if it does not."""
    from omegaconf import open_dict

    from src.compose import rules

    rules.install()
    config = hydra_context.config_loader.load_sweep_config(master_config, list(overrides))
    with open_dict(config):
        config.hydra.job.id = config.hydra.job.num = job_idx
    return config


def _compose_share(conn, hydra_context, master_config, share) -> None:
    """Compose `share` [(position, overrides, job_idx)]: [(position, config)] back, or at the
    first that does not compose "not_composed" (the launcher composes it, raising in job order)."""
    composed = []
    for position, overrides, job_idx in share:
        try:
            composed.append((position, compose_job(hydra_context, master_config, overrides, job_idx)))
        except Exception:  # the launcher composes it again and raises the error, in job order
            answer(conn, "not_composed", position, None)
            return
    answer(conn, "composed", -1, composed)


def serve_hydra_jobs(conn, context: bytes) -> None:
    """A slot's loop: what the launcher sends, until it says None: ("compose", share) composes
    a share of a batch's jobs (compose_job) and sends their configs back; ("run", position,
    job) runs a job as Hydra's basic launcher runs it (run_job on the config composed for it,
    gpu_launcher.Job)."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, run_job, setup_globals

    hydra_context, task_function, config, state = pickle.loads(context)
    Singleton.set_state(state)
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    start_worker_ahead(config)
    while True:
        try:
            message = receive(conn)
        except (EOFError, OSError):
            return
        if message is None:
            return
        if message[0] == "compose":
            _compose_share(conn, hydra_context, config, message[1])
            continue
        _, position, job = message
        try:
            ret = run_job(hydra_context=hydra_context, task_function=task_function,
                          config=job.config, job_dir_key="hydra.sweep.dir",
                          job_subdir_key="hydra.sweep.subdir")
            configure_log(config.hydra.hydra_logging, config.hydra.verbose)
        except KeyboardInterrupt:  # the launcher's interrupt, passed on: the job's run ended KILLED
            signals.ignore_from_now()
            answer(conn, "interrupted", position, None)
            return
        except BaseException as exc:  # the job stopped the sweep, as it would in one process
            answer(conn, "raised", position, exc)
            continue
        answer(conn, "done", position, ret)


# --- the launcher's side --------------------------------------------------------------------

def _next(waiting: list[int], held) -> int:
    """Index in `waiting` of the job to hand out: the first not held, else the first (nothing
    else is left: it waits for its build in its worker, on the build's lock)."""
    if held is not None:
        for i, position in enumerate(waiting):
            if not held(position):
                return i
    return 0


def _drain(wake) -> None:
    """Read what `wake` holds (one message per build ended); a closed one holds nothing."""
    try:
        while wake.poll():
            wake.recv()
    except (EOFError, OSError):
        pass


class Slot:
    """One GPU's process, started when first needed and again if it dies."""

    def __init__(self, gpu: Gpu, serve, context: bytes) -> None:
        self.gpu = gpu
        self._serve = serve
        self._context = context
        self._ctx = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
        self._process = None
        self.conn = None
        self.started = 0  # how many processes this slot has started
        self._asked = False  # told to end (ask_to_stop), not yet joined

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> None:
        self.stop(kill=True)
        parent_conn, child_conn = self._ctx.Pipe()
        # not a daemon: a daemon may not start children, and the slot starts the job's worker
        self._process = self._ctx.Process(
            target=_slot_main, args=(self._serve, child_conn, self.gpu.env, self._context),
            name=f"sgemm-slot-gpu{self.gpu.label}")
        self._process.start()
        child_conn.close()
        self.conn = parent_conn
        self.started += 1

    def start_if_stopped(self) -> None:
        """Start the slot's process, if it is not running, without a job for it yet."""
        if not self.alive:
            self._start()

    def send(self, message) -> None:
        """`message` to the slot (receive() there) through cloudpickle: a config a slot composed
        holds Hydra plugin classes the launcher's plugin scan loaded again (pickle refuses them)."""
        import cloudpickle

        data = cloudpickle.dumps(message)
        if not self.alive:
            self._start()
        try:
            self.conn.send_bytes(data)
        except (BrokenPipeError, OSError):  # it died between jobs: a fresh one takes the job
            self._start()
            self.conn.send_bytes(data)

    def receive(self) -> tuple[str, object]:
        try:
            kind, _position, data = self.conn.recv()
            return kind, pickle.loads(data)
        except (EOFError, OSError, pickle.UnpicklingError):
            process = self._process
            if process is not None:
                process.join(timeout=5)
            code = process.exitcode if process is not None else None
            self.stop(kill=True)
            return "lost", code

    def signal(self, signum: int) -> None:
        if self.alive:
            try:
                os.kill(self._process.pid, signum)
            except ProcessLookupError:
                pass

    def ask_to_stop(self) -> None:
        """Tell the slot's process to end (its worker with it), without waiting for it."""
        if self.alive and not self._asked:
            try:
                self.conn.send_bytes(pickle.dumps(None))
                self._asked = True
            except (OSError, BrokenPipeError):
                pass

    def stop(self, kill: bool = False) -> None:
        process, conn = self._process, self.conn
        self._process = self.conn = None
        if process is None:
            return
        asked, self._asked = self._asked, False
        if not kill and process.is_alive():
            try:
                if not asked:
                    conn.send_bytes(pickle.dumps(None))
                process.join(timeout=30)  # it stops its worker on the way out
            except (OSError, BrokenPipeError):
                pass
        if process.is_alive():
            process.kill()
        process.join(timeout=30)
        conn.close()


class Pool:
    """A slot per GPU; run() hands out a list of jobs and returns their answers in order."""

    def __init__(self, gpus: list[Gpu], context: bytes = b"", serve=None) -> None:
        self.slots = [Slot(gpu, serve or serve_hydra_jobs, context) for gpu in gpus]
        atexit.register(self.stop)
        for slot in self.slots:  # now, not at the first job: their start overlaps the caller's work
            slot.start_if_stopped()

    def run(self, jobs: list, on_start=None, on_end=None, order=None, held=None,
            wake=None) -> list[Answer | None]:
        """Each job to the next free slot, one at a time per slot, in `order` (positions in
        `jobs`; None: as listed). `on_start(job, gpu)` before a job is handed out, `on_end(job,
        answer)` when its answer is in. A job for which `held(position)` is true (it waits for
        a build, src/sweep/prebuild.py) is passed over while another is waiting, and goes out
        first once it is not held; `wake`, a connection, becomes readable when that may have
        changed. The answers are in the order of `jobs`, whatever the order they ran in. After
        a job `raised`, no further job starts (their answers stay None); those in flight
        finish."""
        answers: list[Answer | None] = [None] * len(jobs)
        waiting = list(range(len(jobs)) if order is None else order)
        if sorted(waiting) != list(range(len(jobs))):
            raise ValueError(f"order must list each of the {len(jobs)} jobs' positions once")
        busy: dict[Slot, int] = {}
        halted = False
        try:
            while busy or (waiting and not halted):
                for slot in self.slots:
                    if slot in busy or not waiting or halted:
                        continue
                    position = waiting.pop(_next(waiting, held))
                    if on_start is not None:
                        on_start(jobs[position], slot.gpu)
                    slot.send(("run", position, jobs[position]))
                    busy[slot] = position
                watched = [slot.conn for slot in busy]
                if wake is not None and held is not None and any(map(held, waiting)):
                    watched.append(wake)
                ready = wait(watched)
                if wake is not None and wake in ready:
                    _drain(wake)
                for slot in [s for s in busy if s.conn in ready]:
                    position = busy.pop(slot)
                    kind, value = slot.receive()
                    answers[position] = Answer(kind, value, slot.gpu)
                    halted = halted or kind == "raised"
                    if on_end is not None:
                        on_end(jobs[position], answers[position])
        except BaseException as exc:
            self._interrupt(exc, list(busy))
            raise
        return answers

    def compose(self, items: list, compose_here) -> list:
        """The configs of `items` [(overrides, job_idx)] in order, composed by the slots at once
        (round-robin shares, compose_job in each); a share that does not compose whole, or whose
        slot dies, is composed here by `compose_here(overrides, job_idx)` in job order, so the
        first error in job order raises here, before any job of the batch runs."""
        configs, waiting = [None] * len(items), {}
        for s, slot in enumerate(self.slots):
            share = [(i, list(items[i][0]), items[i][1]) for i in range(s, len(items), len(self.slots))]
            try:
                if share:
                    slot.send(("compose", share))
                    waiting[slot.conn] = slot
            except (OSError, BrokenPipeError):  # composed here, below
                pass
        try:
            while waiting:
                for conn in wait(list(waiting)):
                    kind, value = waiting.pop(conn).receive()
                    if kind == "composed":
                        for position, config in value:
                            configs[position] = config
        except BaseException as exc:
            self._interrupt(exc, [])
            raise
        return [config if config is not None else compose_here(*item)
                for config, item in zip(configs, items)]

    def _interrupt(self, exc: BaseException, busy: list[Slot]) -> None:
        """Ctrl-C or SIGTERM (tracking.Terminated) in the launcher: each slot with a job in flight
        gets the same signal, once, and GRACE_S to end its job's run KILLED; then every slot is
        ended. Anything else: every slot is killed at once."""
        if isinstance(exc, KeyboardInterrupt):
            signals.ignore_from_now()  # the process is on its way out: no second interrupt here
            signum = signal.SIGTERM if isinstance(exc, signals.Terminated) else signal.SIGINT
            for slot in busy:
                slot.signal(signum)
            deadline = time.monotonic() + GRACE_S
            pending = [slot for slot in busy if slot.alive]
            while pending and time.monotonic() < deadline:
                ready = wait([slot.conn for slot in pending], timeout=deadline - time.monotonic())
                for slot in [s for s in pending if s.conn in ready]:
                    pending.remove(slot)
                    slot.receive()
        self.stop(kill=True)

    def stop(self, kill: bool = False) -> None:
        if not kill:  # all at once: each stops its worker, which took 0.1-0.2 s a slot in turn
            for slot in self.slots:
                slot.ask_to_stop()
        for slot in self.slots:
            slot.stop(kill=kill)
        atexit.unregister(self.stop)
