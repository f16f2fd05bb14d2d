"""Soak (issue 22): four sweeps started at the same moment on a fresh store, each interrupted
(Ctrl-C or SIGTERM, once or repeatedly, at a random point) or left to finish. At the end every
finished job has its record and its FINISHED MLflow run under its own sweep's parent, no run is
RUNNING, no sweep shares a directory or a run with another. The seed is printed on failure."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest

from tests.test_robust import SAME_TIME_DIR, check_sweep_intact, start, store_runs, sweep_dirs

pytestmark = pytest.mark.integration  # four real sweeps at once, interrupted

SWEEPS = 4
JOBS = "kernel=01_naive,02_gmem_coalesce,03_smem_blocking,04_blocktile_1d"  # 0.3 s each


def test_four_sweeps_at_once_interrupted_at_random_stay_whole(tmp_path):
    seed = int(os.environ.get("SOAK_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    plans = [None] + [rng.choice([None, signal.SIGINT, signal.SIGTERM]) for _ in range(SWEEPS - 1)]
    plans[1] = plans[1] or signal.SIGINT  # at least one sweep interrupted, one left alone
    procs = [start(tmp_path, "-m", JOBS, "size=128",
                   f"hydra.sweep.dir={SAME_TIME_DIR.format(root=tmp_path)}",
                   serve="paced_serve", MLFLOW_TRACKING_URI=uri) for _ in range(SWEEPS)]
    started = time.monotonic()
    stops = [started + rng.uniform(6, 14) for _ in procs]  # imports and start-up take seconds
    repeats = [rng.random() < 0.5 for _ in procs]
    pending = {i for i, plan in enumerate(plans) if plan is not None}
    while pending and time.monotonic() - started < 60:
        for i in sorted(pending):
            if procs[i].poll() is not None:
                pending.discard(i)
            elif time.monotonic() >= stops[i]:
                procs[i].send_signal(plans[i])
                if not repeats[i]:
                    pending.discard(i)
        time.sleep(0.02)
    context = f"seed {seed}, plans {plans}, repeats {repeats}"
    outputs = []
    for i, proc in enumerate(procs):
        try:
            outputs.append(proc.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:  # a sweep that never ends: say which, and where it is
            proc.send_signal(signal.SIGUSR1)  # its stacks (faulthandler), then it is killed
            time.sleep(1)
            proc.kill()
            tail = proc.communicate()[0]
            raise AssertionError(f"{context}: sweep {i} still running after 120 s\n"
                                 f"{tail[-6000:]}") from None

    runs = store_runs(uri)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"], context
    dirs = sweep_dirs(tmp_path)
    by_id = {r.info.run_id: r for r in runs}
    for proc, plan, output in zip(procs, plans, outputs):
        assert "Traceback" not in output, f"{context}\n{output}"
        # 0: finished; 130/143: interrupted; -2/-15: a signal before the handlers were in
        # place, or after the sweep was over (no run open either way)
        assert proc.returncode in (0, 130, 143, -2, -15) and (plan or proc.returncode == 0), \
            f"{context}: exit {proc.returncode}\n{output}"
        sweep_dir = dirs.get(proc.pid)
        if sweep_dir is None or not (sweep_dir / "mlflow_parent.json").is_file():
            # stopped before its run began: no job ran
            assert proc.returncode != 0 and not (sweep_dir and list(sweep_dir.glob("*/record.json"))), context
            continue
        parent = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
        finished = by_id[parent].info.status == "FINISHED"
        assert finished or proc.returncode != 0, context
        check_sweep_intact(sweep_dir, runs, finished=finished)
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    assert len(parents) == len({d for d in dirs.values()
                                if (d / "mlflow_parent.json").is_file()}), context
    assert sum(len(r.data.tags.get("mlflow.parentRunId", "")) > 0 for r in runs) == \
        len(runs) - len(parents), context  # every job run is under a sweep
