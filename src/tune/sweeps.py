"""Tuning step: the plan's sweeps run, each as its own `python -m src.run -m +tune=<kernel> ...`
(Hydra runs one app a process), on every GPU of the node; a sweep that finished in an earlier run
with the same fingerprint (its command line, GPU spec, held pairs, kernel source and configs) is
not run again, so a tune resumed after an interruption replays no finished sweep."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from src.errors import Terminated
from src.paths import ROOT


FINISHED = "finished.json"  # in a sweep's directory: what it ran with, written when it exited 0
CUT_GRACE_S = 20.0  # a cut sweep's process ends its jobs' MLflow runs KILLED in this long, or is killed


def sweep_fingerprint(sweep, overrides: list[str], gpu_spec: str | None) -> dict:
    """What a finished sweep's records depend on besides the GPU's own figures: its command line
    (`overrides`), the GPU spec, what it left to the evidence file (`held`), the candidates it
    lists (their file is named on the command line, not they), its kernel's source
    as NVRTC builds it, and the configs its jobs compose (the kernel's and its tune grid, the
    bench protocols, the GPU's datasheet)."""
    import hashlib

    from src.paths import CONF_DIR
    from src.tune import evidence

    files = [CONF_DIR / "kernel" / f"{sweep.kernel}.yaml", CONF_DIR / "tune" / f"{sweep.kernel}.yaml",
             *sorted((CONF_DIR / "bench").glob("*.yaml")), CONF_DIR / "gpu" / f"{gpu_spec}.yaml"]
    return {"overrides": list(overrides), "gpu_spec": gpu_spec, "held": sweep.held,
            "candidates": sweep.candidates,
            "source_sha256": evidence.source_sha256(sweep.kernel),
            "configs": {str(f.relative_to(CONF_DIR)): hashlib.sha256(f.read_bytes()).hexdigest()
                        for f in files if f.is_file()}}


def finished_before(target: Path, fingerprint: dict) -> bool:
    """Whether `target` holds a sweep that exited 0 with this very fingerprint."""
    try:
        return json.loads((target / FINISHED).read_text()) == fingerprint
    except (OSError, ValueError):
        return False


def parts(sweeps, max_jobs: int | None) -> list:
    """Each sweep of more than `max_jobs` jobs cut into parts of at most that many (whole shapes
    in order; a shape of more jobs is a part alone), each its own sweep (`<name>_part<i>`, its
    stage's tag last), so that a run cut short (a time limit, a preemption) keeps every finished
    part: a sweep's records become evidence rows when it ends. The shapes where the evidence holds
    every candidate (no job) go with the first part. None or 0: every sweep whole."""
    from dataclasses import replace

    out = []
    for sweep in sweeps:
        if not max_jobs or sweep.jobs <= max_jobs:
            out.append(sweep)
            continue
        groups, count = [[]], 0
        for shape in sweep.shapes:
            here = sweep.jobs_at[shape.label]
            if groups[-1] and count + here > max_jobs:
                groups.append([])
                count = 0
            groups[-1].append(shape)
            count += here
        idle = [s for s in sweep.covered if s.label not in sweep.jobs_at]
        for i, group in enumerate(groups, 1):
            labels = [s.label for s in group]
            out.append(replace(sweep, shapes=group, covered=group + (idle if i == 1 else []),
                               jobs_at={label: sweep.jobs_at[label] for label in labels},
                               held={k: v for k, v in sweep.held.items() if k in labels},
                               tag=f"_part{i}{sweep.tag}"))
    return out


def run_sweeps(sweeps, settings: dict, sweep_dir: Path, extra: list[str],
               gpu_spec: str | None = None) -> int:
    """Each sweep as its own `python -m src.run` (Hydra runs one app a process); the count of
    sweeps that failed. A sweep that finished in an earlier run with the same fingerprint
    (sweep_fingerprint) is not run again: its directory's records are this run's (a tune resumed
    after an interruption replays no finished sweep). Any other sweep directory is cleared first:
    its records come back from the measurement cache."""
    from src.job.file_lock import write_atomically

    failed = 0
    for sweep in sweeps:
        if not sweep.jobs:  # the evidence holds every candidate of it (--missing): nothing to run
            continue
        target = sweep_dir / sweep.name
        overrides = sweep.overrides(settings, sweep_dir, extra)
        fingerprint = sweep_fingerprint(sweep, overrides, gpu_spec)
        if finished_before(target, fingerprint):
            print(f"== {sweep.name}: finished in an earlier run with the same command line, "
                  f"source and configs; its records are kept", flush=True)
            continue
        if target.exists():
            shutil.rmtree(target)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if sweep.held:
            write_atomically(sweep.file(sweep_dir, "held"), json.dumps(sweep.held, sort_keys=True))
        if sweep.candidates is not None:
            write_atomically(sweep.file(sweep_dir, "candidates"), json.dumps(sweep.candidates))
        args = [sys.executable, "-m", "src.run", *overrides]
        print(f"== {sweep.name}: {len(sweep.shapes)} shapes, {sweep.jobs} jobs", flush=True)
        if sweep_exit(args) != 0:
            failed += 1
            print(f"   {sweep.name} exited with an error; its measured jobs are kept", flush=True)
            continue
        target.mkdir(parents=True, exist_ok=True)
        write_atomically(target / FINISHED, json.dumps(fingerprint, indent=1, sort_keys=True) + "\n")
    return failed


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM (SLURM's time limit or preemption, scancel, a supervisor) raised in the tune as
    Terminated, a KeyboardInterrupt, so that it keeps a cut sweep's finished jobs as
    Ctrl-C does (SIGTERM's default action ended the process where it stood). A repeated SIGTERM is
    ignored while the evidence is saved; the earlier handler comes back after. Main thread only
    (Python runs signal handlers there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(f"terminated by signal {signum} (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sweep_exit(args: list[str], grace_s: float = CUT_GRACE_S) -> int:
    """One sweep's `python -m src.run` to its exit code. Ctrl-C, or a time limit's SIGINT, reaches
    it too (one process group): it then has `grace_s` to end its open MLflow runs KILLED and stop
    its workers (subprocess.run's 0.25 s left its runs RUNNING for the next sweep to end) before
    it is killed; the interrupt goes on. A SIGTERM the tune got (Terminated) is passed on to it
    (a `kill` of the tune's pid alone reaches no child; the sweep ignores a second one, as SLURM
    sends it to both). A second Ctrl-C kills it at once."""
    proc = subprocess.Popen(args, cwd=ROOT)
    try:
        return proc.wait()
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated) and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
        raise
