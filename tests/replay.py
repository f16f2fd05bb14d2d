"""Replaying recorded jobs through the tracking step as run.py runs them: tracking.job_run around
the job, log_result with its record and outputs, the recorded H100 record in place of a GPU run;
and a sweep's launching process (callbacks.MlflowSweep)."""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

from mlflow import MlflowClient

from src.sweep import tracking
from src.sweep.callbacks import MlflowSweep
from src.job.compile import ResourceReport, expand_source
from src.job.measure import JobOutputs
from src.records.record import Record
from src.paths import KERNELS_DIR
from tests.conftest import ROOT, compose_config


@lru_cache(maxsize=None)
def composed(kernel: str, params: tuple, uri: str):
    return compose_config(f"kernel={kernel}", f"mlflow.tracking_uri={uri}",
                          *[f"kernel.params.{key}={value}" for key, value in params])


def config_of(record: Record, uri: str):
    """The config that made `record`, pointed at the store `uri`: as composed from
    `kernel=... kernel.params.*=... m=... n=... k=... alpha=... beta=...` (composed once per
    kernel and tile parameters, the shape set after: composing takes a while)."""
    cfg = copy.deepcopy(composed(record.kernel, tuple(record.params.items()), uri))
    cfg.m, cfg.n, cfg.k, cfg.alpha, cfg.beta = record.m, record.n, record.k, record.alpha, record.beta
    return cfg


def outputs_of(record: Record, cfg) -> JobOutputs:
    """What the job handed the tracking step on the H100: the source once the spec was built
    (a recorded entry), the resource report once compiled (recorded registers)."""
    outputs = JobOutputs()
    if cfg.kernel.backend == "nvrtc" and record.entry:
        outputs.source = expand_source(KERNELS_DIR / cfg.kernel.source)
    if record.registers is not None:
        outputs.resources = ResourceReport(
            registers=record.registers, static_smem_bytes=record.static_smem_bytes,
            dynamic_smem_bytes=record.dynamic_smem_bytes, local_bytes=record.local_bytes,
            max_threads_per_block=1024, compile_seconds=record.compile_seconds,
            source_sha256=record.source_sha256)
    return outputs


def replay_job(record: Record, uri: str, name: str, parent=None, sweep_dir: Path | None = None,
               settings: tracking.Settings | None = None, run_title: str | None = None) -> str:
    """One job as run.py runs it, with `record` as its result (written to the job directory
    `name` of `sweep_dir`); its run is named `run_title` (run.py's name: tracking.run_name), else
    `name`. Returns the run id."""
    cfg = config_of(record, uri)
    settings = settings or tracking.Settings.from_cfg(cfg, ROOT, "config")
    with tracking.job_run(settings, cfg, run_title or name, parent) as job:
        if sweep_dir is not None:
            record.write(sweep_dir / name)
        job.log_result(record, outputs_of(record, cfg))
    return job.run_id


def job_name(num: int, record: Record) -> str:
    return f"{num}_{record.kernel}_{record.m}x{record.n}x{record.k}"


def start_sweep(uri: str, sweep_dir: Path, *overrides: str) -> tuple[MlflowSweep, object]:
    """The launching process: Hydra's on_multirun_start; returns the callback and its config."""
    config = compose_config(f"mlflow.tracking_uri={uri}", f"hydra.sweep.dir={sweep_dir}",
                            *overrides, return_hydra_config=True)
    callback = MlflowSweep()
    callback.on_multirun_start(config)
    return callback, config


def all_runs(client: MlflowClient) -> list:
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids, max_results=1000)


def artifact(client: MlflowClient, run_id: str, path: str, tmp_path: Path) -> str:
    dst = tmp_path / "download" / run_id
    dst.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, path, str(dst))).read_text()


def artifact_names(client: MlflowClient, run_id: str) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id)}
