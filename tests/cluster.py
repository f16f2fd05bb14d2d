"""Real engines for tests/test_slurm.py, started on this machine on loopback only and stopped
again: a single-node SLURM cluster (Debian's slurm-wlm: munged, slurmctld, slurmd), a PostgreSQL
server and an `mlflow server` over it that serves the runs' artifacts.

Every daemon gets its own directory, ports, sockets and config (SLURM_CONF), so nothing here
touches a system's own munge, SLURM or PostgreSQL. Missing packages are installed with apt-get
when running as root (CI); anywhere else the test is skipped with the reason."""

from __future__ import annotations

import getpass
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

APT_PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client", "postgresql")
SLURM_COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
FAKE_GPU_DEVICES = ("/dev/null", "/dev/zero")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bindir() -> Path | None:
    """Debian keeps initdb and pg_ctl out of PATH, under /usr/lib/postgresql/<version>/bin."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    return None


def missing_engines() -> list[str]:
    missing = [cmd for cmd in SLURM_COMMANDS if shutil.which(cmd, path=_sbin_path()) is None]
    return missing + ([] if postgres_bindir() else ["postgresql (initdb, pg_ctl)"])


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def ensure_engines() -> str | None:
    """Installs slurm-wlm's daemons, munge and PostgreSQL with apt-get when they are missing;
    returns why the test must be skipped (not root, no apt-get, or the install failed), else None."""
    missing = missing_engines()
    if not missing:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return (f"SLURM and PostgreSQL are not installed ({', '.join(missing)} missing) and this "
                f"is not a root shell with apt-get to install them: "
                f"apt-get install {' '.join(APT_PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"],
                ["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    missing = missing_engines()
    return f"still missing after apt-get install: {', '.join(missing)}" if missing else None


def wait_for(what: str, ready, timeout_s: float = START_TIMEOUT_S, logs: tuple = ()) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n{Path(p).read_text()[-2000:]}" for p in logs
                              if Path(p).is_file())
            raise RuntimeError(f"{what} not ready within {timeout_s} s\n{tails}")
        time.sleep(0.25)


@dataclass
class Daemons:
    """Processes started here, stopped in reverse order: SIGTERM, a bounded wait, SIGKILL."""

    procs: list = field(default_factory=list)

    def start(self, name: str, cmd: list[str], log: Path, stop_signal=signal.SIGTERM,
              **kwargs) -> subprocess.Popen:
        out = open(log, "ab")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kwargs)
        out.close()
        self.procs.append((name, proc, stop_signal))
        return proc

    def stop(self) -> None:
        for name, proc, stop_signal in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, stop_signal)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=STOP_TIMEOUT_S)
        self.procs.clear()


SLURM_CONF = """\
ClusterName=sgemmtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=300
SchedulerParameters=sched_interval=1
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{gpus} Feature=h100_sxm,h200 State=UNKNOWN
PartitionName=gpu Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    dir: Path
    conf: Path
    env: dict

    def run(self, *cmd: str, timeout: float = 30) -> str:
        proc = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def cancel_all(self, timeout_s: float = STOP_TIMEOUT_S + 10) -> None:
        """Cancels every job and waits (bounded) until none is left: a job's slurmstepd outlives
        slurmd, so the jobs go before the daemons do."""
        jobs = self.run("squeue", "-h", "-o", "%i").split()
        if jobs:
            self.run("scancel", "--full", *jobs)
        wait_for("the cancelled jobs' end", lambda: not self.run("squeue", "-h", "-o", "%i").strip(),
                 timeout_s=timeout_s)


def start_slurm(daemons: Daemons, base: Path) -> SlurmCluster:
    """munged, slurmctld and slurmd of a one-node cluster named after this host, on loopback."""
    base.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "munge"):
        (base / sub).mkdir(mode=0o700, exist_ok=True)
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = base / "munge" / "munge.socket"
    sbin = shutil.which("munged", path=_sbin_path())
    daemons.start("munged", [sbin, "--foreground", "--force", f"--socket={socket_path}",
                             f"--key-file={key}", f"--pid-file={base / 'munge' / 'munged.pid'}",
                             f"--log-file={base / 'munge' / 'munged.log'}",
                             f"--seed-file={base / 'munge' / 'munged.seed'}"],
                  base / "munged.out")
    wait_for("munged", socket_path.exists, logs=(base / "munged.out", base / "munge" / "munged.log"))

    host = socket.gethostname().split(".")[0]
    conf = base / "slurm.conf"
    conf.write_text(SLURM_CONF.format(
        host=host, ctld_port=free_port(), slurmd_port=free_port(), user=getpass.getuser(),
        munge_socket=socket_path, dir=base, cpus=os.cpu_count() or 1, gpus=len(FAKE_GPU_DEVICES)))
    # Two GPUs that are device files every Linux has: SLURM hands them out one per job (and
    # sets CUDA_VISIBLE_DEVICES); no job here opens them.
    (base / "gres.conf").write_text("AutoDetect=off\n" + "".join(
        f"NodeName={host} Name=gpu File={device}\n" for device in FAKE_GPU_DEVICES))
    env = dict(os.environ, SLURM_CONF=str(conf), PATH=_sbin_path())
    cluster = SlurmCluster(base, conf, env)
    daemons.start("slurmctld", [shutil.which("slurmctld", path=_sbin_path()), "-D", "-i"],
                  base / "slurmctld.out", env=env)
    daemons.start("slurmd", [shutil.which("slurmd", path=_sbin_path()), "-D", "-N", host],
                  base / "slurmd.out", env=env)

    def node_idle() -> bool:
        try:
            return cluster.run("sinfo", "-h", "-N", "-o", "%T", timeout=10).strip() in ("idle",)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    wait_for("the SLURM node", node_idle, logs=(base / "slurmctld.log", base / "slurmd.log",
                                               base / "slurmctld.out", base / "slurmd.out"))
    return cluster


@dataclass
class Postgres:
    dir: Path
    port: int
    uri: str


def start_postgres(daemons: Daemons) -> Postgres:
    """A PostgreSQL cluster of its own (initdb as the `postgres` user, which Debian's package
    creates: the server refuses to run as root), on 127.0.0.1 and a socket in its directory."""
    bindir = postgres_bindir()
    base = Path(tempfile.mkdtemp(prefix="sgemm-pg-"))  # not under pytest's root-only tmp
    as_user = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    if as_user:
        shutil.chown(base, "postgres", "postgres")
    data = base / "data"
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U",
                    "mlflow", "--no-sync"], check=True, capture_output=True, timeout=120)
    port = free_port()
    daemons.start("postgres", [*as_user, str(bindir / "postgres"), "-D", str(data), "-h",
                               "127.0.0.1", "-p", str(port), "-k", str(base), "-F"],
                  base / "postgres.log", stop_signal=signal.SIGINT)  # SIGINT: a fast shutdown

    def accepting() -> bool:
        return subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                              capture_output=True).returncode == 0

    wait_for("PostgreSQL", accepting)
    subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "mlflow",
                    "mlflow"], check=True, capture_output=True, timeout=60)
    # The driver named: SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3, 2.0 as psycopg2.
    return Postgres(base, port, f"postgresql+psycopg2://mlflow@127.0.0.1:{port}/mlflow")


def start_mlflow_server(daemons: Daemons, backend_uri: str, artifacts: Path, log: Path) -> str:
    """`mlflow server` over `backend_uri`, serving artifacts from `artifacts` (the store holds
    mlflow-artifacts:/ URIs, never this machine's paths)."""
    import urllib.request

    port = free_port()
    daemons.start("mlflow server",
                  [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
                   "--artifacts-destination", str(artifacts), "--host", "127.0.0.1",
                   "--port", str(port), "--workers", "1"],
                  log, env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    wait_for("mlflow server", healthy, timeout_s=120, logs=(log,))
    return url
