"""Stand-ins for the worker's serve loop (src/sweep/worker.py), for CPU tests of isolation: they speak
the worker's protocol but, in place of a GPU job, hang, crash, poison themselves or sleep. Spawned
worker processes import them by name from here."""

from __future__ import annotations

import os
import signal
import time

from hydra.experimental.callback import Callback

from src.records.record import Record


def _record(container: dict, **fields) -> Record:
    return Record(kernel=container["kernel"]["name"], precision="fp32", backend="nvrtc",
                  m=container["m"], n=container["n"], k=container["k"], alpha=1.0, beta=0.0,
                  **fields)


def _jobs(conn):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        yield message[0]  # (config, explicit params, MLflow run id)


def ok_serve(conn):
    """Every job ok (1 GFLOP/s, as a real record has them: time, error, GPU); the record
    carries this worker's pid (to tell workers apart)."""
    for container in _jobs(conn):
        record = _record(container, gflops=1.0, entry=str(os.getpid()), time_ms_median=1.0,
                         rel_err=0.0, tolerance=1e-5, gpu="NVIDIA H100 80GB HBM3")
        conn.send(("done", record.to_dict(), None, True))


def paced_serve(conn):
    """Every job ok after 0.3 s (time for a signal to land mid-job), its record naming the
    job's MLflow run as the real pipeline's does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        container, _explicit, run_id = message
        time.sleep(0.3)
        record = _record(container, gflops=1.0, time_ms_median=1.0, rel_err=0.0,
                         tolerance=1e-5, gpu="NVIDIA H100 80GB HBM3", mlflow_run_id=run_id)
        conn.send(("done", record.to_dict(), None, True))


def hang_serve(conn):
    """Jobs of kernel `hang` report one step, then never answer; the others are ok."""
    for container in _jobs(conn):
        if container["kernel"]["name"] == "hang":
            conn.send(("progress", "compiled", _record(container, registers=40).to_dict()))
            while True:
                time.sleep(1)
        conn.send(("done", _record(container, gflops=1.0, entry=str(os.getpid())).to_dict(),
                   None, True))


def crash_serve(conn):
    """Jobs of kernel `crash` kill their worker with SIGSEGV; the others are ok."""
    for container in _jobs(conn):
        if container["kernel"]["name"] == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        conn.send(("done", _record(container, gflops=1.0, entry=str(os.getpid())).to_dict(),
                   None, True))


def poisoned_serve(conn):
    """Every job fails as a fault does: the worker reports its context poisoned and exits."""
    for container in _jobs(conn):
        record = _record(container, status="failed_launch", error="illegal address",
                         entry=str(os.getpid()))
        conn.send(("done", record.to_dict(), None, False))
        return


def slow_serve(conn):
    """Every job takes two minutes, as a long GPU job does; says so on stdout when it starts."""
    for container in _jobs(conn):
        print(f"job started in worker {os.getpid()}", flush=True)
        time.sleep(120)
        conn.send(("done", _record(container, gflops=1.0).to_dict(), None, True))


class SlowJobs(Callback):
    """A Hydra callback (+hydra.callbacks.slow._target_=tests.fault_jobs.SlowJobs) that makes
    every job of a sweep take two minutes: in the job's own process, wherever a launcher runs
    it, the worker serves jobs with slow_serve."""

    def on_job_start(self, config, **kwargs) -> None:
        import src.sweep.worker

        src.sweep.worker._serve = slow_serve


class SwallowedSigterm(Callback):
    """A Hydra callback (+hydra.callbacks.swallow._target_=tests.fault_jobs.SwallowedSigterm):
    after the first job, the process gets SIGTERM inside code that swallows every exception, as
    a library did once (a signal during Hydra's batch validation was lost)."""

    def on_job_end(self, config, **kwargs) -> None:
        if getattr(self, "done", False):
            return
        self.done = True
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler runs here and raises...
        except BaseException:
            pass  # ...and the exception is lost


def fake_h100():
    """What gpu.detect() reports on an H100 SXM, for a launcher on a machine without one."""
    from src.job.gpu import Device

    return Device(name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sms=132,
                  max_threads_per_block=1024, max_smem_per_block=232448, l2_bytes=52428800,
                  driver="13.0", cuda_runtime="13.0", nvrtc="13.0", cupy="14.0")


# `python -m src.run ...` on a pretend H100: the launcher detects a fake device and compiles
# nothing ahead; each job runs in a stand-in worker (ok_serve: every job ok at 1 GFLOP/s).
FAKE_GPU_RUN = """
import faulthandler
import os
import runpy
import signal
import src.job.compile
import src.job.gpu
import src.sweep.worker
import tests.fault_jobs

src.job.gpu.detect = tests.fault_jobs.fake_h100
src.job.compile.precompile = lambda *args, **kwargs: []
src.sweep.worker._serve = getattr(tests.fault_jobs, os.environ.get("FAKE_SERVE", "ok_serve"))
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test asks a hung run where it is
runpy.run_module("src.run", run_name="__main__", alter_sys=True)
"""


class ArtifactStoreFull(Callback):
    """A Hydra callback (+hydra.callbacks.full._target_=tests.fault_jobs.ArtifactStoreFull): from
    the second job on, MLflow cannot store a job's record.json artifact (the disk under mlruns/
    filled up), in the launching process where the jobs' runs are logged."""

    def on_job_start(self, config, **kwargs) -> None:
        self.jobs = getattr(self, "jobs", 0) + 1
        if self.jobs != 2:
            return
        from mlflow import MlflowClient

        log_text = MlflowClient.log_text

        def full(client, run_id, text, artifact_file):
            if artifact_file == "record.json":
                raise OSError(28, "No space left on device")
            return log_text(client, run_id, text, artifact_file)

        MlflowClient.log_text = full
