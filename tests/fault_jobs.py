"""Stand-ins for the worker's serve loop (src/sweep/worker.py), for CPU tests of isolation: they speak
the worker's protocol but, in place of a GPU job, hang, crash, poison themselves or sleep. Spawned
worker processes import them by name from here."""

from __future__ import annotations

import os
import signal
import threading
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
        os.write(1, f"job started in worker {os.getpid()}\n".encode())  # one write: never split
        time.sleep(120)
        conn.send(("done", _record(container, gflops=1.0).to_dict(), None, True))


def _meet(rendezvous: str, gpu: str, meet: int) -> dict:
    """Run as a job on `gpu` once `meet` jobs run at once (at most a minute), each a file in the
    directory `rendezvous` while it runs; what the job saw: when it ran, the most jobs at once on
    all GPUs and on its own."""
    start = time.time()
    mine = os.path.join(rendezvous, f"{gpu}.{os.getpid()}.{time.monotonic_ns()}")
    open(mine, "w").close()
    most = same = 0
    while True:
        running = os.listdir(rendezvous)
        most = max(most, len(running))
        same = max(same, sum(name.split(".")[0] == gpu for name in running))
        if most >= meet or time.time() - start > 60:
            break
        time.sleep(0.05)
    time.sleep(0.2)  # another job on the same GPU now would be seen
    same = max(same, sum(name.split(".")[0] == gpu for name in os.listdir(rendezvous)))
    os.unlink(mine)
    return {"visible": gpu, "start": start, "end": time.time(), "most_at_once": most,
            "most_on_this_gpu": same}


def gpu_serve(conn):
    """Jobs on a pretend GPU, each ok once it has met another job in flight (_meet: FAKE_MEET jobs
    at once, default 2, in the directory FAKE_RENDEZVOUS). Its record's `device` says what the job
    saw: the GPU it was pinned to (CUDA_VISIBLE_DEVICES), its worker's and slot's pids, when it
    ran, the most jobs at once. Jobs of kernel broken_out_of_bounds kill their worker (SIGSEGV)
    at once, as its fault poisons a real worker."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    for container in _jobs(conn):
        if container["kernel"]["name"] == "broken_out_of_bounds":
            os.kill(os.getpid(), signal.SIGSEGV)
        seen = _meet(os.environ["FAKE_RENDEZVOUS"], gpu, int(os.environ.get("FAKE_MEET", "2")))
        device = {"name": "Pretend GPU", "pci_bus_id": f"0000:0{gpu}:00.0", "worker_pid": os.getpid(),
                  "slot_pid": os.getppid(), **seen}
        record = _record(container, gflops=1.0, time_ms_median=1.0, rel_err=0.0, tolerance=1e-5,
                         gpu="Pretend GPU", device=device)
        conn.send(("done", record.to_dict(), None, True))


def pool_serve(conn, rendezvous: bytes):
    """A slot of src/sweep/pool.py that runs stand-in jobs, dicts: each meets another job in
    flight (_meet, in the directory `rendezvous`) when one is given, waits until the file
    `until` exists (at most a minute) when it names one, then answers what it saw; job `die`
    ends its slot process at once (exit code 3)."""
    from src.sweep.pool import answer, receive

    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    while True:
        message = receive(conn)
        if message is None:
            return
        if message[0] == "compose":  # a share of a batch: each config is its overrides joined,
            shares = [(i, " ".join(overrides)) for i, overrides, _idx in message[1]]  # or it dies
            if any("die" in text for _i, text in shares):
                os._exit(3)
            answer(conn, "composed", -1, [(i, f"{text} on {gpu}") for i, text in shares])
            continue
        _, position, job = message
        if job["name"] == "die":
            os._exit(3)
        seen = _meet(rendezvous.decode(), gpu, 2) if rendezvous else {"visible": gpu}
        deadline = time.time() + 60
        while job.get("until") and not os.path.exists(job["until"]) and time.time() < deadline:
            time.sleep(0.05)
        answer(conn, "done", position, {"name": job["name"], "pid": os.getpid(), **seen})


def stop_meeting_serve(conn, context: bytes):
    """A slot that answers each job at once and, told to end, waits (at most 20 s) until every
    slot has been told (context: "DIRECTORY|SLOTS"), noting in DIRECTORY whether they all were."""
    from src.sweep.pool import answer, receive

    directory, slots = context.decode().split("|")
    while True:
        message = receive(conn)
        if message is None:
            break
        answer(conn, "done", message[1], message[2])
    open(os.path.join(directory, f"told.{os.getpid()}"), "w").close()
    deadline = time.time() + 20
    while sum(n.startswith("told.") for n in os.listdir(directory)) < int(slots) and time.time() < deadline:
        time.sleep(0.05)
    met = sum(n.startswith("told.") for n in os.listdir(directory)) >= int(slots)
    open(os.path.join(directory, f"{'met' if met else 'alone'}.{os.getpid()}"), "w").close()


def _note(line: str) -> None:
    with open(os.environ["FAKE_EVENTS"], "a") as out:
        out.write(line + "\n")


def _await_event(prefix: str, count: int = 1) -> None:
    """Wait (at most a minute) until $FAKE_EVENTS holds `count` lines starting with `prefix`."""
    deadline = time.time() + 60
    while time.time() < deadline:
        with open(os.environ["FAKE_EVENTS"]) as events:
            if sum(line.startswith(prefix) for line in events) >= count:
                return
        time.sleep(0.05)


def noting_build(kernel: dict, arch: str, cache_dir: str) -> None:
    """A stand-in for a build ahead (hydra.launcher.prebuild.<backend>=tests.fault_jobs.noting_build),
    run in the launching process: notes its start in $FAKE_EVENTS (with whether CuPy was imported
    there), lasts until two jobs have started (other jobs run while it builds), then notes its end, or
    fails with CompileFailed when FAKE_BUILD_FAILS is set."""
    import sys

    from src.errors import CompileFailed

    _note(f"build start {kernel['name']} {arch} {cache_dir} cupy={'cupy' in sys.modules}")
    _await_event("job ", 2)
    if os.environ.get("FAKE_BUILD_FAILS"):
        _note(f"build failed {kernel['name']}")
        raise CompileFailed(f"peer {kernel['name']}: nvcc could not build it (a stand-in failure)")
    _note(f"build end {kernel['name']}")


build_released = threading.Event()
released_builds: list = []


def released_build(kernel: dict, arch: str, cache_dir: str) -> None:
    """A build ahead, in the test's own process, that lasts until the test sets build_released,
    then fails for a kernel named `broken`."""
    assert build_released.wait(60)
    released_builds.append((kernel["name"], arch, cache_dir))
    if kernel["name"] == "broken":
        raise RuntimeError("nvcc: exit 1")


def build_waiting_serve(conn):
    """Every job ok, after noting "job KERNEL M" in $FAKE_EVENTS and waiting (at most a minute)
    for the build ahead to end (noting_build): a job handed out before that holds its GPU."""
    for container in _jobs(conn):
        _note(f"job {container['kernel']['name']} {container['m']}")
        _await_event("build ")  # its start...
        _await_event("build ", 2)  # ...and its end or failure
        record = _record(container, gflops=1.0, time_ms_median=1.0, rel_err=0.0, tolerance=1e-5,
                         gpu="NVIDIA H100 80GB HBM3")
        conn.send(("done", record.to_dict(), None, True))


def note_composes() -> None:
    """From now on in this process, each job Hydra composes for a sweep is noted in the file
    $FAKE_EVENTS ("composed OVERRIDES on GPU"); the batch's job with size=256 is composed only
    once a line starting with $FAKE_AWAIT (default "slot") is there (at most 60 s)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    compose = ConfigLoaderImpl.load_sweep_config
    awaited = os.environ.get("FAKE_AWAIT", "slot")

    def load_sweep_config(self, master_config, sweep_overrides):
        if "size=256" in sweep_overrides:
            deadline = time.time() + 60
            while time.time() < deadline:
                with open(os.environ["FAKE_EVENTS"]) as events:
                    if any(line.startswith(awaited) for line in events):
                        break
                time.sleep(0.05)
        config = compose(self, master_config, sweep_overrides)
        _note(f"composed {' '.join(sweep_overrides)} on {os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
        return config

    ConfigLoaderImpl.load_sweep_config = load_sweep_config


def serve_noting_start(conn, context: bytes) -> None:
    """A slot's loop (src/sweep/pool.py's serve_hydra_jobs) that first notes, in the file
    $FAKE_EVENTS, that this slot process has started, then each job it composes."""
    from src.sweep.pool import serve_hydra_jobs

    _note(f"slot {os.environ.get('CUDA_VISIBLE_DEVICES', '')} started")
    note_composes()
    serve_hydra_jobs(conn, context)

def ok_serve_noting_start(conn):
    """ok_serve, after noting in the file $FAKE_EVENTS that this worker process has started."""
    with open(os.environ["FAKE_EVENTS"], "a") as out:
        out.write(f"worker {os.environ.get('CUDA_VISIBLE_DEVICES', '')} started {os.getpid()}\n")
    ok_serve(conn)


def serve_noting_worker_start(conn, context: bytes) -> None:
    """A slot's loop (serve_hydra_jobs) whose job worker serves ok_serve_noting_start; each job
    it composes is noted."""
    import src.sweep.worker
    from src.sweep.pool import serve_hydra_jobs

    src.sweep.worker._serve = ok_serve_noting_start
    note_composes()
    serve_hydra_jobs(conn, context)


class StandInWorkers(Callback):
    """A Hydra callback (+hydra.callbacks.stand_in._target_=tests.fault_jobs.StandInWorkers): in
    the job's own process, wherever a launcher runs it (a slot of the GPU launcher), the worker
    serves jobs with the stand-in FAKE_SERVE names (default ok_serve)."""

    def on_job_start(self, config, **kwargs) -> None:
        import src.sweep.worker

        serve = globals()[os.environ.get("FAKE_SERVE", "ok_serve")]
        if src.sweep.worker._serve is not serve:
            src.sweep.worker._serve = serve
            # a slot started its worker with the real loop before this first job: not the stand-in
            src.sweep.worker.shared_worker().stop(kill=True)


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
# nothing ahead; each job runs in a stand-in worker (ok_serve: every job ok at 1 GFLOP/s). The
# jobs run in this process (the stand-ins are patched into it), as on one GPU, whatever GPUs the
# machine has, unless FAKE_GPUS names pretend ones (then add StandInWorkers for the slots).
FAKE_GPU_RUN = """
import faulthandler
import os
import runpy
import signal
import src.job.compile
import src.job.gpu
import src.sweep.worker
import tests.fault_jobs

os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("FAKE_GPUS", "")
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
