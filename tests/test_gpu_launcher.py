"""A sweep on every GPU of a node (issue 38), without a GPU: pretend GPUs named in
CUDA_VISIBLE_DEVICES, slots of src/sweep/pool.py running stand-in jobs (tests/fault_jobs.py), and
the real runner through the lab's launcher (hydra_plugins/sgemm_lab/gpu_launcher.py) with
stand-in workers. Jobs that must meet another job in flight prove that the GPUs run at once
without timing anything; each GPU runs one job at a time; results, statuses, records and MLflow
runs are those of the same sweep on one GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from src.errors import ConfigError
from src.job import devices
from src.job.devices import Gpu, sweep_gpus
from src.sweep.pool import Pool
from tests import fault_jobs
from tests.conftest import ROOT
from tests.test_cli import cli_env, tracked_runs

STAND_IN = "+hydra.callbacks.stand_in._target_=tests.fault_jobs.StandInWorkers"
KERNELS = "kernel=06_vectorize,broken_out_of_bounds,01_naive,02_gmem_coalesce,03_smem_blocking"


def gpus(*labels: str) -> list[Gpu]:
    return [Gpu(label, {"CUDA_VISIBLE_DEVICES": label}) for label in labels]


# --- which GPUs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,labels", [
    ("2,3", ["2", "3"]), ("GPU-aa, GPU-bb", ["GPU-aa", "GPU-bb"]), ("1,1,0", ["1", "0"]),
    ("0,-1,1", ["0"]), ("-1", []), ("", []),
])
def test_the_gpus_are_those_cuda_visible_devices_names(monkeypatch, text, labels):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", text)
    monkeypatch.setattr(devices, "_nvml_count", lambda: 8)  # not asked: the variable decides
    assert devices.visible() == (labels, {})
    assert sweep_gpus() == [Gpu(label, {"CUDA_VISIBLE_DEVICES": label}) for label in labels]


def test_without_cuda_visible_devices_nvml_counts_them_in_pci_order(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "_nvml_count", lambda: 3)
    found = sweep_gpus()
    assert [gpu.label for gpu in found] == ["0", "1", "2"]
    assert found[2].env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2"}


def test_devices_picks_visible_gpus_by_position(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert sweep_gpus([2, 0]) == gpus("6", "4")


@pytest.mark.parametrize("requested", [[3], [0, 0], [], "0", 1, [True], [-1], ["0"]])
def test_bad_devices_name_the_rule(monkeypatch, requested):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with pytest.raises(ConfigError, match=r"hydra.launcher.devices must list distinct positions "
                                          r"of visible GPUs, 0 to 2 \(3 visible"):
        sweep_gpus(requested)


# --- the pool -----------------------------------------------------------------------------------

def test_every_gpu_runs_a_job_at_once_and_each_one_at_a_time(tmp_path):
    """Each job waits (at most a minute) for another in flight: all meet, so the two GPUs ran
    jobs at once; none saw a second job on its own GPU; each GPU kept its slot process."""
    (tmp_path / "rendezvous").mkdir()
    pool = Pool(gpus("0", "1"), str(tmp_path / "rendezvous").encode(), serve=fault_jobs.pool_serve)
    try:
        answers = pool.run([{"name": f"job{i}"} for i in range(6)])
    finally:
        pool.stop()
    seen = [answer.value for answer in answers]
    assert [answer.kind for answer in answers] == ["done"] * 6
    assert [job["name"] for job in seen] == [f"job{i}" for i in range(6)]
    assert all(job["most_at_once"] == 2 and job["most_on_this_gpu"] == 1 for job in seen), seen
    assert all(answer.gpu.label == job["visible"] for answer, job in zip(answers, seen))
    assert {job["visible"] for job in seen} == {"0", "1"}
    assert len({job["pid"] for job in seen}) == 2 and [s.started for s in pool.slots] == [1, 1]


def test_answers_come_in_job_order_whatever_order_the_jobs_end_in(tmp_path):
    """The first job ends only after the last (it waits for a file the last one's end makes)."""
    release = tmp_path / "release"
    jobs = [{"name": "first", "until": str(release)}] + [{"name": f"then{i}"} for i in range(3)]
    ended = []

    def on_end(job, answer):
        ended.append(job["name"])
        if job["name"] == "then2":
            release.touch()

    pool = Pool(gpus("0", "1"), serve=fault_jobs.pool_serve)
    try:
        answers = pool.run(jobs, on_end=on_end)
    finally:
        pool.stop()
    assert ended == ["then0", "then1", "then2", "first"]
    assert [answer.value["name"] for answer in answers] == ["first", "then0", "then1", "then2"]


def test_a_slot_that_dies_costs_its_job_alone_and_is_started_again(tmp_path):
    """Slot 0's process dies in the first job while slot 1 runs the second (held until the
    death is known): the second is answered, slot 0 takes the third in a fresh process."""
    seen_death = tmp_path / "dead"
    jobs = [{"name": "die"}, {"name": "held", "until": str(seen_death)}, {"name": "after"}]

    def on_end(job, answer):
        if job["name"] == "die":
            seen_death.touch()

    pool = Pool(gpus("0", "1"), serve=fault_jobs.pool_serve)
    try:
        answers = pool.run(jobs, on_end=on_end)
    finally:
        pool.stop()
    assert (answers[0].kind, answers[0].value, answers[0].gpu.label) == ("lost", 3, "0")
    assert [a.kind for a in answers[1:]] == ["done", "done"]
    assert answers[1].gpu.label == "1" and answers[2].gpu.label == "0"
    assert [slot.started for slot in pool.slots] == [2, 1]


def test_jobs_go_out_in_the_order_given_and_answers_come_in_job_order(tmp_path):
    """One slot, so the hand-out order is the order the jobs ran in."""
    jobs = [{"name": f"job{i}"} for i in range(4)]
    handed = []
    pool = Pool(gpus("0"), serve=fault_jobs.pool_serve)
    try:
        answers = pool.run(jobs, on_start=lambda job, gpu: handed.append(job["name"]), order=[2, 0, 3, 1])
        with pytest.raises(ValueError, match="each of the 4 jobs' positions once"):
            pool.run(jobs, order=[2, 0, 0, 1])
    finally:
        pool.stop()
    assert handed == ["job2", "job0", "job3", "job1"]
    assert [answer.value["name"] for answer in answers] == ["job0", "job1", "job2", "job3"]


def test_the_slots_compose_a_share_each_and_a_lost_share_is_composed_here():
    """Pool.compose: the configs in job order, the slots a round-robin share each; the share of
    a slot that dies while composing is composed by the caller, in job order, and the slot is
    started again for the jobs."""
    items = [([f"job{i}"], i) for i in range(5)]
    here = []
    pool = Pool(gpus("0", "1"), serve=fault_jobs.pool_serve)
    try:
        assert pool.compose(items, lambda o, idx: here.append(idx)) == [
            "job0 on 0", "job1 on 1", "job2 on 0", "job3 on 1", "job4 on 0"]
        assert here == []
        dying = [([f"job{i}"] if i != 3 else ["die"], i) for i in range(5)]
        composed = pool.compose(dying, lambda o, idx: here.append(idx) or f"{o[0]} here")
        answers = pool.run([{"name": "after"}, {"name": "after"}])
    finally:
        pool.stop()
    assert composed == ["job0 on 0", "job1 here", "job2 on 0", "die here", "job4 on 0"]
    assert here == [1, 3] and [a.kind for a in answers] == ["done", "done"]
    assert [slot.started for slot in pool.slots] == [1, 2]


def test_the_largest_problems_go_out_first_then_job_order():
    from omegaconf import OmegaConf

    from hydra_plugins.sgemm_lab.gpu_launcher import Job, hand_out_order

    sizes = [(64, 64, 64), (4096, 4096, 4096), ("abc", 1, 1), (8, 4096, 4096), (4096, 4096, 4096),
             (4096, 8, 4096)]
    jobs = [Job(i, [], OmegaConf.create({"m": m, "n": n, "k": k, "kernel": {"backend": "nvrtc"}}))
            for i, (m, n, k) in enumerate(sizes)]
    assert hand_out_order(jobs) == [1, 4, 3, 5, 0, 2]  # 8x4096x4096 = 4096x8x4096: job order


def test_jobs_that_build_or_autotune_go_out_first_as_the_launchers_rule_says():
    """The rule is data (conf/hydra/launcher/gpus.yaml `setup_first`): a kernel of a listed
    backend, or one listing peers, goes out before a larger problem without such a setup."""
    from omegaconf import OmegaConf

    from hydra_plugins.sgemm_lab.gpu_launcher import Job, SetupFirst, hand_out_order

    kernels = [({"backend": "nvrtc"}, 4096), ({"backend": "triton"}, 1024),
               ({"backend": "dispatch", "peers": ["triton_fp32"]}, 1024),
               ({"backend": "dispatch", "peers": []}, 4096), ({"backend": "cutlass"}, 4096),
               ({"backend": "nvrtc"}, 1024), ({}, 8192)]
    jobs = [Job(i, [], OmegaConf.create({"m": size, "n": size, "k": size, "kernel": kernel}))
            for i, (kernel, size) in enumerate(kernels)]
    rule = OmegaConf.load(ROOT / "conf" / "hydra" / "launcher" / "gpus.yaml").setup_first
    assert hand_out_order(jobs, SetupFirst.from_cfg(rule)) == [4, 1, 2, 6, 0, 3, 5]
    assert hand_out_order(jobs, SetupFirst(("triton",), peers=False)) == [1, 6, 0, 3, 4, 2, 5]
    assert hand_out_order(jobs, SetupFirst.from_cfg(None)) == hand_out_order(jobs) == [6, 0, 3, 4, 1, 2, 5]


@pytest.mark.parametrize("section", [{"backends": "triton"}, {"peers": "yes"}, {"backend": []}, [1]])
def test_a_bad_setup_first_names_the_rule(section):
    from hydra_plugins.sgemm_lab.gpu_launcher import SetupFirst

    with pytest.raises(ConfigError, match=r"hydra.launcher.setup_first must be a mapping .*rule: it "
                                          r"names the jobs handed out first"):
        SetupFirst.from_cfg(section)


# --- the runner, through the lab's launcher -----------------------------------------------------

def sweep(tmp_path: Path, visible: str, *args: str, meet: int = 2, **env: str):
    """`python -m src.run -m ARGS` on the pretend GPUs `visible` (CUDA_VISIBLE_DEVICES), each
    job in a stand-in worker (gpu_serve: it waits to meet `meet` jobs in flight; FAKE_SERVE in
    `env` names another)."""
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "src.run", "-m", *args, STAND_IN, f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, env=cli_env(CUDA_VISIBLE_DEVICES=visible, FAKE_RENDEZVOUS=str(rendezvous),
                              FAKE_MEET=str(meet), **{"FAKE_SERVE": "gpu_serve", **env}),
        capture_output=True, text=True, timeout=300)


def records(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/record.json"))}


def test_a_sweep_on_two_gpus_runs_them_at_once_with_records_and_runs_as_on_one(tmp_path, tracking_uri):
    """The same sweep, a faulting kernel in it, on one pretend GPU and on two: the same job
    directories, statuses and summary, one MLflow parent with a FINISHED or FAILED child per job;
    on two, every ok job met another in flight, none shared its GPU, and the fault on one GPU
    left the other's worker untouched (one worker for all its jobs)."""
    common = ["hydra.searchpath=[file://tests/conf]", KERNELS, "size=64", "isolation.timeout_s=60"]
    uri_two = tracking_uri.replace("store/mlflow.db", "store2/mlflow.db")  # an empty store too
    (tmp_path / "store2").mkdir()
    (tmp_path / "store2" / "mlflow.db").write_bytes((tmp_path / "store" / "mlflow.db").read_bytes())
    one = sweep(tmp_path / "one", "0", *common, meet=1, MLFLOW_TRACKING_URI=tracking_uri)
    assert one.returncode == 0, one.stdout + one.stderr
    two = sweep(tmp_path / "two", "0,1", *common, MLFLOW_TRACKING_URI=uri_two)
    assert two.returncode == 0, two.stdout + two.stderr
    assert "Traceback" not in two.stdout + two.stderr

    by_one, by_two = records(tmp_path / "one" / "sweep"), records(tmp_path / "two" / "sweep")
    statuses = {name: r["status"] for name, r in by_one.items()}
    assert statuses == {name: r["status"] for name, r in by_two.items()}
    assert statuses["1_broken_out_of_bounds_64x64x64"] == "failed_crash"
    assert list(statuses.values()).count("ok") == 4
    for name, record in by_two.items():  # each job's directory holds that job's record
        assert name.split("_", 1)[1].startswith(record["kernel"])
    summary = "summary.md"
    assert (tmp_path / "one" / "sweep" / summary).read_text() == \
        (tmp_path / "two" / "sweep" / summary).read_text()

    ok = [r for r in by_two.values() if r["status"] == "ok"]
    assert all(r["device"]["most_at_once"] == 2 and r["device"]["most_on_this_gpu"] == 1 for r in ok)
    on = {gpu: [r for r in ok if r["device"]["visible"] == gpu] for gpu in ("0", "1")}
    assert on["0"] and on["1"]
    assert {r["device"]["pci_bus_id"] for r in on["0"]} == {"0000:00:00.0"}  # each names its GPU
    assert len({r["device"]["worker_pid"] for r in on["0"]}) == 1  # the fault was on GPU 1
    assert all(r["device"]["most_on_this_gpu"] == 1 for r in by_one.values() if r["status"] == "ok")
    assert "[GPU 0]" in two.stdout and "[GPU 1]" in two.stdout and "job 5 of 5" in two.stdout

    for uri in (tracking_uri, uri_two):
        parents, jobs = tracked_runs(uri)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert all(job.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for job in jobs)
        assert sorted(job.data.tags["status"] for job in jobs) == sorted(statuses.values())


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupt_ends_every_gpus_job_killed_and_every_process(tmp_path, tracking_uri, signum, code):
    """Two GPUs, each in a two-minute job, when the launcher alone gets SIGTERM or SIGINT: both
    runs and the sweep's end KILLED, nothing RUNNING, the third job never starts, and no slot or
    worker process is left."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.run", "-m", "kernel=01_naive,02_gmem_coalesce,03_smem_blocking",
         "size=64", STAND_IN, f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, env=cli_env(CUDA_VISIBLE_DEVICES="0,1", FAKE_SERVE="slow_serve",
                              MLFLOW_TRACKING_URI=tracking_uri),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines, workers = [], []
        for line in proc.stdout:  # bounded by the process: its jobs sleep two minutes at most
            lines.append(line)
            if "job started in worker " in line:  # a line of the launcher may run into it
                workers.append(int(line.split()[-1]))
                if len(workers) == 2:
                    break
        assert len(workers) == 2, "".join(lines)
        slots = [int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                 for pid in workers]
        proc.send_signal(signum)
        output = "".join(lines) + proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, output
    assert "interrupted: " in output and "Traceback" not in output
    parents, jobs = tracked_runs(tracking_uri)
    assert len(parents) == 1 and len(jobs) == 2, output
    assert parents[0].info.status == "KILLED" and [j.info.status for j in jobs] == ["KILLED"] * 2
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers + slots) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers + slots if Path(f"/proc/{pid}").exists()]


@pytest.mark.parametrize("setting, error", [
    ("hydra.launcher.devices=[0,2]", "hydra.launcher.devices"),              # no GPU 2 of two
    ("hydra.launcher.prebuild.cutlass=build_it", "hydra.launcher.prebuild must map"),  # not a function
])
def test_a_bad_launcher_setting_is_one_clear_error(tmp_path, setting, error):
    proc = sweep(tmp_path, "0,1", "kernel=01_naive,06_vectorize", "size=64", "mlflow.enabled=false",
                 setting)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and f"error [invalid_config]: {error}" in output, output
    assert "Traceback" not in output and not list((tmp_path / "sweep").glob("*/record.json"))


def test_a_tuning_sweep_on_two_gpus_measures_what_it_measures_on_one(tmp_path):
    """The tuning sweeper hands its batches to the launcher: on two pretend GPUs the same
    candidates are measured, pruned and summarized as on one, by workers on both."""
    from tests.test_tune import SMALL_SPACE

    def tune(where: Path, visible: str):
        return subprocess.run(
            [sys.executable, "-c", fault_jobs.FAKE_GPU_RUN, "-m", "+tune=10_warptiling", "size=256",
             *SMALL_SPACE, "bench=quick", f"cache_dir={where}/cache", "mlflow.enabled=false",
             STAND_IN, f"hydra.sweep.dir={where}/sweep"],
            cwd=ROOT, env=cli_env(FAKE_GPUS=visible), capture_output=True, text=True, timeout=300)

    one, two = tune(tmp_path / "one", "0"), tune(tmp_path / "two", "0,1")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    kept = ("space_size", "candidates_considered", "pruned", "pruned_by_rule", "measured", "ok")
    summaries = [json.loads((tmp_path / run / "sweep" / "tune_summary.json").read_text())[0]
                 for run in ("one", "two")]
    assert [{key: s[key] for key in kept} for s in summaries][0] == {key: summaries[1][key] for key in kept}
    trials = [sorted(json.dumps(r["params"], sort_keys=True) for r in records(tmp_path / run / "sweep").values())
              for run in ("one", "two")]
    assert trials[0] == trials[1] and len(trials[0]) == summaries[0]["measured"] > 1
    workers = {r["entry"] for r in records(tmp_path / "two" / "sweep").values()}
    assert len(workers) == 2 and "[GPU 1]" in two.stdout


def progress_lines(output: str) -> list[str]:
    """The overrides of each progress line, in the order the jobs were handed out."""
    return [line.split(": ", 1)[1].split("  [GPU")[0] for line in output.splitlines()
            if line.startswith("job ") and "  [GPU" in line]


def test_longest_jobs_go_out_first_and_records_keep_job_order(tmp_path):
    """On two pretend GPUs the 256^3 jobs are handed out first, then 128^3 and 64^3, each size
    in job order, and last the jobs of size 0; the job directories and numbers keep the job
    order, and the size-0 jobs are recorded failed while the sweep goes on, as on one GPU."""
    args = ["kernel=05_blocktile_2d,01_naive", "size=64,0,256,128", "mlflow.enabled=false"]
    two = sweep(tmp_path / "two", "0,1", *args, FAKE_SERVE="ok_serve")
    one = sweep(tmp_path / "one", "0", *args, FAKE_SERVE="ok_serve")
    assert two.returncode == 0 and one.returncode == 0, two.stdout + two.stderr + one.stderr
    jobs = [f"kernel={kernel} size={size} mlflow.enabled=False" for kernel in ("05_blocktile_2d", "01_naive")
            for size in (64, 0, 256, 128)]
    assert progress_lines(two.stdout) == [jobs[i] for i in (2, 6, 3, 7, 0, 4, 1, 5)]
    assert "job 8 of 8" in two.stdout
    by_two, by_one = records(tmp_path / "two" / "sweep"), records(tmp_path / "one" / "sweep")
    assert list(by_two) == [f"{i}_{kernel}_{size}x{size}x{size}" for i, (kernel, size) in enumerate(
        (kernel, size) for kernel in ("05_blocktile_2d", "01_naive") for size in (64, 0, 256, 128))]
    assert {name: r["status"] for name, r in by_two.items()} == {name: r["status"] for name, r in by_one.items()}
    assert [r["status"] for r in by_two.values()] == ["ok", "invalid_problem", "ok", "ok"] * 2
    assert (tmp_path / "two" / "sweep" / "summary.md").read_text() == \
        (tmp_path / "one" / "sweep" / "summary.md").read_text()


def test_peer_jobs_go_out_first_on_several_gpus_and_a_bad_rule_is_one_clear_error(tmp_path):
    """The main sweep's peers (Triton, CUTLASS, best_* with its `peers`) are handed out before
    a larger chapter job, each group largest first; the records keep the job order."""
    args = ["kernel=05_blocktile_2d,triton_tf32,best_fp32,cutlass_3xtf32", "size=64,256",
            "mlflow.enabled=false"]
    two = sweep(tmp_path / "two", "0,1", *args, FAKE_SERVE="ok_serve")
    assert two.returncode == 0, two.stdout + two.stderr
    jobs = [f"kernel={kernel} size={size} mlflow.enabled=False"
            for kernel in ("05_blocktile_2d", "triton_tf32", "best_fp32", "cutlass_3xtf32")
            for size in (64, 256)]
    assert progress_lines(two.stdout) == [jobs[i] for i in (3, 5, 7, 2, 4, 6, 1, 0)]
    assert [name.split("_", 1)[0] for name in records(tmp_path / "two" / "sweep")] == \
        [str(i) for i in range(8)]
    bad = sweep(tmp_path / "bad", "0,1", *args, "hydra.launcher.setup_first.peers=often")
    output = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "error [invalid_config]: hydra.launcher.setup_first" in output, output
    assert "Traceback" not in output


@pytest.mark.parametrize("visible", ["0", "0,1"])
def test_a_job_that_does_not_compose_stops_the_sweep_before_any_job_runs(tmp_path, visible):
    """Every job is composed before the first starts (that compose is Hydra's batch check):
    Hydra's error, exit 1, no job run, as when Hydra's sweeper checked the batch itself."""
    proc = sweep(tmp_path, visible, "kernel=01_naive,07_nope", "size=64", "mlflow.enabled=false",
                 FAKE_SERVE="ok_serve")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Could not find 'kernel/07_nope'" in output, output
    assert "Traceback" not in output and not list((tmp_path / "sweep").glob("*/record.json"))
    assert not progress_lines(proc.stdout)


# `python -m src.run ...` whose slots (tests/fault_jobs.py serve_noting_start, or with
# FAKE_SLOT_SERVE another) write an event to $FAKE_EVENTS, one line each, as each slot process (or
# each slot's job worker) starts and as each slot composes a job; the batch's job with size=256
# is composed only once a line starting with $FAKE_AWAIT is there.
EVENTS_RUN = """
import os, runpy
import src.sweep.pool
import tests.fault_jobs

src.sweep.pool.serve_hydra_jobs = getattr(tests.fault_jobs, os.environ.get("FAKE_SLOT_SERVE",
                                                                           "serve_noting_start"))
runpy.run_module("src.run", run_name="__main__", alter_sys=True)
"""


def events_sweep(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    events = tmp_path / "events"
    events.write_text("")
    proc = subprocess.run(
        [sys.executable, "-c", EVENTS_RUN, "-m", "kernel=01_naive", "size=64,128,256",
         "mlflow.enabled=false", *args, f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, env=cli_env(CUDA_VISIBLE_DEVICES="0,1", FAKE_EVENTS=str(events), **env),
        capture_output=True, text=True, timeout=300)
    return proc, events.read_text().splitlines()


def test_the_slots_compose_the_batch_a_share_each_once_started(tmp_path):
    """The slots compose the batch's jobs (each job once, each slot a share, in the slot's own
    process, which has started by then), and every job then runs."""
    proc, lines = events_sweep(tmp_path, STAND_IN, FAKE_SERVE="ok_serve")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    composed = [line for line in lines if line.startswith("composed ")]
    assert len(composed) == 3 and {line.split()[-1] for line in composed} == {"0", "1"}, lines
    assert all(lines.index(f"slot {line.split()[-1]} started") < lines.index(line) for line in composed)
    assert [r["status"] for r in records(tmp_path / "sweep").values()] == ["ok"] * 3


def test_each_slot_starts_its_job_worker_before_it_composes(tmp_path):
    """Each slot starts its worker with itself, not at its first job: a worker has started
    before the batch's last job is composed, and that worker (one per slot, none replaced) ran
    the slot's jobs."""
    proc, lines = events_sweep(tmp_path, FAKE_AWAIT="worker", FAKE_SLOT_SERVE="serve_noting_worker_start")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    composed = [i for i, line in enumerate(lines) if line.startswith("composed ")]
    workers = [i for i, line in enumerate(lines) if line.startswith("worker ")]
    assert len(composed) == 3 and sorted(lines[i].split()[1] for i in workers) == ["0", "1"], lines
    assert workers[0] < composed[-1], lines
    done = records(tmp_path / "sweep")
    assert [r["status"] for r in done.values()] == ["ok"] * 3
    assert {r["entry"] for r in done.values()} <= {lines[i].split()[-1] for i in workers}


# --- the GPU tests, spread the same way ---------------------------------------------------------

@pytest.mark.parametrize("worker,visible,pinned", [
    ("gw0", "4,5", "4"), ("gw3", "4,5", "5"), ("gw1", "", ""), (None, "4,5", "4,5"),
])
def test_each_xdist_worker_sees_one_gpu(monkeypatch, worker, visible, pinned):
    from tests.conftest import pin_xdist_worker_to_one_gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    pin_xdist_worker_to_one_gpu()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == pinned


# --- builds ahead, on the launching process's CPU -----------------------------------------------

BUILD_KERNELS = "kernel=best_fp32,01_naive,cutlass_3xtf32,02_gmem_coalesce,best_tf32,03_smem_blocking"


def build_sweep(tmp_path: Path, **env: str):
    """The sweep of BUILD_KERNELS on two pretend H100s, the CUTLASS build ahead being
    tests.fault_jobs.noting_build, each job in build_waiting_serve; its events, in order."""
    events = tmp_path / "events"
    events.write_text("")
    proc = sweep(tmp_path, "0,1", BUILD_KERNELS, "size=64", "gpu=h100_sxm", "mlflow.enabled=false",
                 f"cache_dir={tmp_path}/cache",
                 "hydra.launcher.prebuild.cutlass=tests.fault_jobs.noting_build",
                 FAKE_SERVE="build_waiting_serve", FAKE_EVENTS=str(events), **env)
    return proc, events.read_text().splitlines()


def test_the_cutlass_library_is_built_ahead_while_the_gpus_run_the_other_jobs(tmp_path):
    """The build runs once, in the launching process (no CuPy there), for the H100's sm_90 into
    the sweep's cache; while it lasts the GPUs run jobs that need no build (each holds its GPU
    until the build ends, so none is free early), and the jobs that need it, cutlass_3xtf32's
    own and best_fp32's (its peer), go out only after it. best_tf32 (a Triton peer) waits for
    nothing. Records keep the job order."""
    proc, events = build_sweep(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [e for e in events if e.startswith("build ")] == [
        f"build start cutlass_3xtf32 sm_90 {tmp_path}/cache cupy=False", "build end cutlass_3xtf32"]
    end = events.index("build end cutlass_3xtf32")
    before = [e.split()[1] for e in events[:end] if e.startswith("job ")]
    after = [e.split()[1] for e in events[end:] if e.startswith("job ")]
    assert len(before) == 2 and not {"cutlass_3xtf32", "best_fp32"} & set(before), events
    assert {"cutlass_3xtf32", "best_fp32"} <= set(after), events
    handed = [line.split()[0].split("=")[1] for line in progress_lines(proc.stdout)]
    assert handed[:2] == ["best_tf32", "01_naive"], handed  # setup first, then job order
    assert set(handed[2:4]) == {"best_fp32", "cutlass_3xtf32"}, handed  # first once built
    done = records(tmp_path / "sweep")
    assert [r["status"] for r in done.values()] == ["ok"] * 6
    assert [name.split("_", 1)[0] for name in done] == [str(i) for i in range(6)]


def test_a_failed_build_ahead_hands_its_jobs_out_and_the_sweep_goes_on(tmp_path):
    """The build ahead fails: said once as a warning, and its jobs are handed out as the others
    are (each builds in its worker and records what that gives: here the stand-in's ok)."""
    proc, events = build_sweep(tmp_path, FAKE_BUILD_FAILS="1")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "building cutlass_3xtf32 for sm_90 ahead failed (CompileFailed: peer cutlass_3xtf32: " \
           "nvcc could not build it" in output and "Traceback" not in output
    failed = events.index("build failed cutlass_3xtf32")
    assert {"cutlass_3xtf32", "best_fp32"} <= {e.split()[1] for e in events[failed:] if e.startswith("job ")}
    assert len(records(tmp_path / "sweep")) == 6


def test_the_slots_are_told_to_end_all_at_once(tmp_path):
    """Each slot, told to end, waits for the others to be told: stopped one after another, the
    first would wait alone (each slot's end, stopping its worker, then added up at the sweep's
    end)."""
    pool = Pool(gpus("0", "1", "2"), f"{tmp_path}|3".encode(), serve=fault_jobs.stop_meeting_serve)
    assert [a.kind for a in pool.run([{"name": f"job{i}"} for i in range(3)])] == ["done"] * 3
    pool.stop()
    ends = sorted(name.split(".")[0] for name in os.listdir(tmp_path) if not name.startswith("told."))
    assert ends == ["met"] * 3
