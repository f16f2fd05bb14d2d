"""Storage faults (issue 35, item 3), as a user meets them: a damaged tracking store, a full disk
under a sweep's records or under MLflow's artifacts, a sweep directory that cannot be made, a
broken record under the collector. Each is one paragraph naming the file and the rule, leaves
no temporary file, and never turns a measured result into a failure. The real runner, Hydra and
MLflow, with the GPU replaced by a pretend H100 (tests/fault_jobs.py)."""

from __future__ import annotations

import json

import pytest

from tests.test_robust import finish, start, store_runs

JOBS = "kernel=01_naive,02_gmem_coalesce,03_smem_blocking"


def test_a_damaged_tracking_store_is_one_paragraph(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_text("not a database, e.g. a file copied over it\n")
    for args in (["-m", JOBS, f"hydra.sweep.dir={tmp_path}/sweep"],
                 ["kernel=01_naive", f"hydra.run.dir={tmp_path}/run"]):
        proc = start(tmp_path, *args, "size=128", f"mlflow.tracking_uri=sqlite:///{db}")
        output = finish(proc, 120)
        assert proc.returncode == 1 and "error [tracking_error]" in output, output
        assert f"MLflow cannot keep runs in {db}: file is not a database" in output
        assert "rule: a local tracking store is a SQLite database" in output
        assert "Traceback" not in output and not list(tmp_path.rglob("record.json"))


def test_a_store_that_cannot_be_created_leaves_no_half_store(tmp_path, monkeypatch):
    """MLflow fails while it makes a fresh store (the disk fills up during its migrations): one
    error naming the file, and no `.mlflow.db.<pid>.new` left beside it."""
    import mlflow

    from src.sweep.tracking.store import TrackingUnavailable, client

    class FullDisk:
        def __init__(self, tracking_uri):
            self.path = tracking_uri[len("sqlite:///"):]

        def search_experiments(self, **kwargs):
            with open(self.path, "w") as half:  # a half-migrated store
                half.write("SQLite format 3\0")
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(mlflow, "MlflowClient", FullDisk)
    db = tmp_path / "mlflow.db"
    with pytest.raises(TrackingUnavailable, match=rf"{db}: No space left on device .*rule: "):
        client(f"sqlite:///{db}")
    assert not db.exists() and not list(tmp_path.glob(".mlflow.db.*"))


def test_a_missing_package_of_mlflows_store_is_named_not_blamed_on_the_file(tmp_path, monkeypatch):
    """mlflow-skinny without `cryptography` (its model registry imports it while it makes a sqlite
    store; seen on the GPU box, 2026-12-05): the error names the package and says to install it,
    not to move a damaged file away; no half store is left."""
    import mlflow

    from src.sweep.tracking.store import TrackingUnavailable, client

    class NoCryptography:
        def __init__(self, tracking_uri):
            pass

        def search_experiments(self, **kwargs):
            raise ModuleNotFoundError("No module named 'cryptography'", name="cryptography")

    monkeypatch.setattr(mlflow, "MlflowClient", NoCryptography)
    db = tmp_path / "mlflow.db"
    with pytest.raises(TrackingUnavailable) as caught:
        client(f"sqlite:///{db}")
    text = str(caught.value)
    assert "No module named 'cryptography' (ModuleNotFoundError)" in text
    assert "Install cryptography" in text and "the file is not at fault" in text
    assert "Move a damaged file away" not in text
    assert not db.exists() and not list(tmp_path.glob(".mlflow.db.*"))


def test_a_full_disk_under_one_record_costs_that_file_not_the_result(tmp_path, tracking_uri):
    """The second job's record.json cannot be written (ENOSPC, via /dev/full): one paragraph
    naming the file; no record.json.tmp left; its MLflow run is FINISHED ok with the result;
    the sweep goes on and ends 0."""
    sweep = tmp_path / "sweep"
    job_dir = sweep / "1_02_gmem_coalesce_128x128x128"
    job_dir.mkdir(parents=True)
    (job_dir / "record.json.tmp").symlink_to("/dev/full")  # every write there: ENOSPC
    proc = start(tmp_path, "-m", JOBS, "size=128", f"hydra.sweep.dir={sweep}",
                 MLFLOW_TRACKING_URI=tracking_uri)
    output = finish(proc, 180)
    assert proc.returncode == 0 and "Traceback" not in output, output
    assert "error [storage_error]: could not write the record of 02_gmem_coalesce 128 to " \
           f"{job_dir / 'record.json'}: No space left on device" in output, output
    assert "no partial file was left" in output
    assert not list(sweep.rglob("*.tmp")) and not (job_dir / "record.json").exists()
    assert len(list(sweep.glob("*/record.json"))) == 2
    runs = {r.data.params.get("kernel"): r for r in store_runs(tracking_uri)}
    assert runs["02_gmem_coalesce"].info.status == "FINISHED"
    assert runs["02_gmem_coalesce"].data.tags["status"] == "ok"
    assert runs["02_gmem_coalesce"].data.metrics["gflops"] == 1.0


def test_a_full_artifact_store_mid_sweep_keeps_the_measured_result(tmp_path, tracking_uri):
    """MLflow cannot store the second job's files: one paragraph; the job's record is ok on disk
    (not failed_internal), its run still ends FINISHED, and the sweep goes on."""
    sweep = tmp_path / "sweep"
    proc = start(tmp_path, "-m", JOBS, "size=128", f"hydra.sweep.dir={sweep}",
                 "+hydra.callbacks.full._target_=tests.fault_jobs.ArtifactStoreFull",
                 MLFLOW_TRACKING_URI=tracking_uri)
    output = finish(proc, 180)
    assert proc.returncode == 0 and "Traceback" not in output, output
    assert output.count("error [tracking_error]: MLflow could not store the result of "
                        "02_gmem_coalesce") == 1, output
    assert "a measured result is kept even when its tracking store fails" in output
    records = [json.loads(p.read_text()) for p in sweep.glob("*/record.json")]
    assert sorted(r["status"] for r in records) == ["ok"] * 3
    runs = store_runs(tracking_uri)
    assert {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_name, r.info.status) for r in runs]


def test_a_sweep_directory_that_cannot_be_made_is_one_paragraph(tmp_path):
    (tmp_path / "a_file").write_text("in the way\n")
    proc = start(tmp_path, "-m", JOBS, "size=128", "mlflow.enabled=false",
                 f"hydra.sweep.dir={tmp_path}/a_file/sweep")
    output = finish(proc, 120)
    assert proc.returncode == 1 and "error [storage_error]: the sweep directory " \
        f"{tmp_path}/a_file/sweep cannot be made or written: Not a directory" in output, output
    assert "Traceback" not in output


def test_collect_names_a_broken_record_and_writes_no_csv(tmp_path, capsys):
    from src.records.collect import main as collect_main
    from src.records.record import Record

    sweep = tmp_path / "sweep"
    for num, text in enumerate([None, '{"kernel": "01_naive", "m": 12', "[1, 2]"]):
        (sweep / f"{num}_job").mkdir(parents=True)
        record = Record(kernel="01_naive", precision="fp32", backend="nvrtc", m=128, n=128, k=128,
                        alpha=1.0, beta=0.0)
        path = record.write(sweep / f"{num}_job")
        if text is not None:
            path.write_text(text)  # truncated; not an object
    with pytest.raises(SystemExit) as code:
        collect_main([str(sweep), "-o", str(tmp_path / "runs.csv")])
    err = capsys.readouterr().err
    assert code.value.code == 1 and f"{sweep}/1_job/record.json is not a readable job record" in err
    assert "rule: a record.json holds one JSON object" in err and "No CSV was written" in err
    assert not (tmp_path / "runs.csv").exists()


def test_a_sweeps_summary_leaves_out_a_broken_record_and_names_it(tmp_path, caplog):
    from src.records.record import Record, load_records

    for num in range(2):
        Record(kernel=f"k{num}", precision="fp32", backend="nvrtc", m=1, n=1, k=1, alpha=1.0,
               beta=0.0).write(tmp_path / f"{num}_job")
    (tmp_path / "1_job" / "record.json").write_text("{")
    assert [r.kernel for r in load_records(tmp_path)] == ["k0"]
    assert f"{tmp_path}/1_job/record.json is not a readable job record" in caplog.text
