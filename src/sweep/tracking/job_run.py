"""A job's MLflow run: params and config at the start, the record's metrics, tags and files at
the end, and a terminal status on every way out.

Jobs log themselves (job_run, around run.py's job) rather than through Hydra's on_job_start /
on_job_end, because Hydra skips on_job_end when a job is interrupted or exits. In a sweep a job
reads the parent run from `mlflow_parent.json` in the sweep directory and nests under it.

Statuses: FINISHED for an ok job, FAILED for a failed one (error.txt holds the error), KILLED
after Ctrl-C or SIGTERM (turned into KeyboardInterrupt while runs are open); nothing is left
RUNNING.
"""

from __future__ import annotations

import json
import logging
import textwrap
import traceback
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from src.records import math_units
from src.records.record import Record
from src.sweep.tracking.signals import (
    install_signal_handlers, let_go, mark_interrupted, restore_signal_handlers, shielded)
from src.sweep.tracking.store import (
    FAILED, FINISHED, KILLED, PARENT_FILE, Parent, Settings, check_reachable, client, context_tags,
    ensure_experiment, first_line, flatten, log_batch)
from src.sweep.tracking.credentials import redact, redact_console
from src.job import tuned

log = logging.getLogger("sgemm")

# Record fields logged as metrics (when not None).
METRICS = (
    "gflops", "time_ms_median", "time_ms_min", "time_ms_max", "time_ms_iqr", "samples",
    "pct_of_cublas_fp32", "pct_of_cublas_tf32", "pct_of_peak",
    "cublas_fp32_gflops", "cublas_tf32_gflops", "rel_err", "tolerance",
    "registers", "static_smem_bytes", "dynamic_smem_bytes", "local_bytes", "compile_seconds",
    "sm_clock_mhz_before", "sm_clock_mhz_after", "samples_throttled",
    "samples_slowdown", "power_capped_share",
    "baseline_gflops", "pct_ci_low", "pct_ci_high", "rel_err_timed", "rel_err_fresh", "check_seconds",
)


# Fields of Record.device logged as tags, with the GPU's name.
DEVICE_TAGS = ("compute_capability", "driver", "cuda_runtime", "nvrtc", "cupy")


# Config keys that are formulas or plumbing, not values: the kernel's derived values, launch
# geometry and constraints are expressions over the parameters (their resolved values, entry,
# grid and block, are logged with the result); where the run is stored needs no column.
UNLOGGED = ("kernel.derived.", "kernel.launch.", "kernel.constraints", "kernel.size_constraints",
            "kernel.entry", "mlflow.", "debug", "cache_dir")


def job_params(cfg: DictConfig) -> dict[str, str]:
    """The composed config's values, flattened, plus `kernel` (the kernel's name) and `precision`
    for the runs table; without the formulas (UNLOGGED) and without a tuned kernel's
    kernel.params.* (chosen in the job, see src/job/tuned.py, and logged with the result)."""
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    params = {k: v for k, v in params.items() if not k.startswith(UNLOGGED)}
    if tuned.applies(cfg):  # decided in the job: logged with the result, as used
        params = {k: v for k, v in params.items() if not k.startswith("kernel.params.")}
    params["kernel"] = str(cfg.kernel.name)
    params["precision"] = str(cfg.kernel.precision)
    return params


def result_params(record: Record, tile_params_deferred: bool) -> dict[str, str]:
    """What the job resolved: the instantiated entry, the launch geometry, the GPU spec, and for
    a tuned kernel the tile parameters it ran with and where they came from."""
    params = {"gpu_spec": record.gpu_spec} if record.gpu_spec else {}
    if record.entry:
        params["kernel.entry"] = record.entry
    if record.grid:
        params["launch.grid"] = " x ".join(str(v) for v in record.grid)
    if record.block:
        params["launch.block"] = " x ".join(str(v) for v in record.block)
    if record.timer:
        params["timer"] = record.timer  # the samples' clock: cupti or events
    if record.dispatched_to:  # best_*: the chapter chosen for this shape, why, and its params
        params["dispatched_to"] = record.dispatched_to
        params["dispatch_rule"] = record.dispatch_rule or ""
    if tile_params_deferred or record.dispatched_to:
        params.update(flatten({"kernel": {"params": record.params}}))
        params["kernel.tuned_from"] = record.tuned_from or "none (config defaults)"
    return params


def pct_of_cublas(record: Record) -> float | None:
    """% of cuBLAS in the record's own precision: a TF32 (tensor-core) kernel against cuBLAS
    TF32, an FP32 one against cuBLAS FP32, so one column sorts every kernel fairly."""
    return record.pct_of_cublas_tf32 if record.precision == "tf32" else record.pct_of_cublas_fp32


# How metrics are rounded for the runs table: finer than the timing noise (about 1%), so no
# figure a reader compares changes; record.json keeps the exact values.
DECIMALS = {"gflops": 1, "pct": 2, "seconds": 3}   # by name suffix / prefix, digits after the point
SIGNIFICANT = {"time_ms": 4, "rel_err": 3, "tolerance": 3}  # by name prefix, significant digits


def rounded(name: str, value: float) -> float:
    """`value` of metric `name` rounded for reading (DECIMALS, SIGNIFICANT); counts, clocks and
    sizes stay as they are."""
    if name.endswith("gflops"):
        return round(value, DECIMALS["gflops"])
    if name.startswith("pct_"):
        return round(value, DECIMALS["pct"])
    if name.endswith("_seconds"):
        return round(value, DECIMALS["seconds"])
    for prefix, digits in SIGNIFICANT.items():
        if name.startswith(prefix):
            return float(f"{value:.{digits}g}")
    return value


def record_metrics(record: Record) -> dict[str, float]:
    metrics = {}
    for name in METRICS:
        value = getattr(record, name)
        if value is not None and not isinstance(value, bool):
            metrics[name] = rounded(name, float(value))
    if pct_of_cublas(record) is not None:
        metrics["pct_of_cublas"] = rounded("pct_of_cublas", float(pct_of_cublas(record)))
    return metrics


def run_name(kernel: str, m: int, n: int, k: int, overrides: list[str] = ()) -> str:
    """`22_ffma_warp_specialized 4096³`, `05_blocktile_2d 2048×1024×512`; a tile sweep's job adds
    the kernel.params.* set on its command line (`06_vectorize 4096³ bk=16 bm=64`)."""
    shape = f"{m}³" if m == n == k else f"{m}×{n}×{k}"
    tiles = sorted(o.split("kernel.params.", 1)[1] for o in overrides
                   if o.lstrip("+~").startswith("kernel.params."))
    return " ".join([str(kernel), shape, *tiles])


def description(record: Record) -> str:
    """The run's description (MLflow's note, shown atop the run page): the error of a failed
    job, the headline figures of an ok one."""
    if not record.ok:
        return f"**{record.status}**\n\n```\n{wrap(record.error or record.status)}```\n"
    pct = pct_of_cublas(record)
    baseline = "cuBLAS TF32" if record.precision == "tf32" else "cuBLAS FP32"
    text = f"{record.gflops:,.1f} GFLOP/s ({record.time_ms_median:.4f} ms median)"
    if record.math:
        text += f" in {math_units.label(record.math)} ({math_units.MEANING.get(record.math, '')})"
    if pct is not None:
        text += f", {pct:.1f}% of {baseline} at the same shape"
    if record.from_cache:
        text += f"; reused from the cache (measured {record.timestamp})"
    return text + "\n"


def wrap(text: str, width: int = 100) -> str:
    """Long lines broken at spaces for reading in a browser (tracebacks and logs keep their
    short lines; the record keeps the exact text)."""
    lines = []
    for line in text.rstrip("\n").splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        lines.append(textwrap.fill(line, width, subsequent_indent=indent,
                                   break_long_words=False, break_on_hyphens=False)
                     if len(line) > width else line)
    return "\n".join(lines) + "\n"


def record_tags(record: Record) -> dict[str, str]:
    tags = {"status": record.status}
    if record.math:  # ffma / 3xtf32 / tf32: a tag, as best_* learns it only when it dispatches
        tags["math"] = record.math
    if record.entry:
        tags["entry"] = record.entry  # the instantiated template, e.g. sgemm_vectorize<128, ...>
    if record.seed is not None:
        tags["seed"] = str(record.seed)  # the inputs' seed (bench.seed=... reproduces them)
    if record.gpu:
        tags["gpu"] = record.gpu
    if record.gpu_spec:
        tags["gpu_spec"] = record.gpu_spec
    for name in DEVICE_TAGS:
        if (record.device or {}).get(name) is not None:
            tags[name] = str(record.device[name])
    return tags


class JobRun:
    """One job's open MLflow run: job_run logs the config, log_result the record and files."""

    def __init__(self, mlflow_client, run_id: str, settings: Settings):
        self.client = mlflow_client
        self.run_id = run_id
        self.settings = settings
        self.record: Record | None = None
        self.tile_params_deferred = False
        self.held = ExitStack()  # hold_signals: closed once the run has ended

    def hold_signals(self) -> None:
        """From now until the run has ended, Ctrl-C and SIGTERM wait (then act): a job whose
        record is being written and logged ends FINISHED with it, never KILLED beside it."""
        self.held.enter_context(shielded())

    def log_config(self, cfg: DictConfig) -> None:
        self.tile_params_deferred = tuned.applies(cfg)
        log_batch(self.client, self.run_id, params=job_params(cfg))
        self.client.log_text(self.run_id, redact(OmegaConf.to_yaml(cfg, resolve=True)), "config.yaml")

    def log_result(self, record: Record, outputs=None) -> None:
        """Metrics, tags and files of a finished job (`outputs`: a job.JobOutputs, optional). A
        store that cannot take them (full, read-only, damaged) is one error paragraph: the
        job's result stands in its record, and is not turned into a failure."""
        self.record = record
        try:
            self._log_result(record, outputs)
        except Exception as exc:  # MLflow's and SQLAlchemy's errors: no common base
            log.error("error [tracking_error]: MLflow could not store the result of %s in %s "
                      "(%s: %s) (rule: a measured result is kept even when its tracking store "
                      "fails: it is in the job's record.json).", record.kernel,
                      redact(self.settings.tracking_uri), type(exc).__name__, first_line(str(exc)))

    def _log_result(self, record: Record, outputs) -> None:
        tags = {**record_tags(record), "mlflow.note.content": description(record)}
        log_batch(self.client, self.run_id, params=result_params(record, self.tile_params_deferred),
                  metrics=record_metrics(record), tags=tags)
        self.client.log_text(self.run_id, json.dumps(record.to_dict(), indent=2, default=str) + "\n",
                             "record.json")
        source = getattr(outputs, "source", None)
        resources = getattr(outputs, "resources", None)
        if source is not None:
            self.client.log_text(self.run_id, source, "kernel.cu")
        if resources is not None:
            self.client.log_text(self.run_id, json.dumps(asdict(resources), indent=2) + "\n",
                                 "resources.json")
        cc = (record.device or {}).get("compute_capability")
        if self.settings.log_ptx and source is not None and record.entry and cc:
            from src.job.compile import nvrtc_ptx

            try:
                self.client.log_text(self.run_id, nvrtc_ptx(source, record.entry, cc), "kernel.ptx")
            except Exception as exc:  # PTX is optional: say why it is missing, keep the run
                log.warning("no PTX logged for %s: %s: %s", record.kernel, type(exc).__name__, exc)

    def end(self, status: str, error: str | None = None, status_tag: str | None = None) -> None:
        tags = {"status": status_tag} if status_tag else {}
        if error:
            self.client.log_text(self.run_id, wrap(error), "error.txt")
            tags["error"] = first_line(error)
            if self.record is None or self.record.ok:  # no description from a record yet
                tags["mlflow.note.content"] = f"**{status_tag or status}**\n\n```\n{wrap(error)}```\n"
        if tags:
            log_batch(self.client, self.run_id, tags=tags)
        self.client.set_terminated(self.run_id, status)

    def end_from_record(self) -> None:
        if self.record is None:
            self.end(FAILED, "the job ended without a record", status_tag="failed_internal")
        elif self.record.ok:
            self.end(FINISHED)
        else:
            self.end(FAILED, self.record.error or self.record.status)


class NoTracking:
    """What job_run gives when tracking is off: log_result does nothing."""

    run_id = None

    def hold_signals(self) -> None:
        pass

    def log_result(self, record: Record, outputs=None) -> None:
        pass


@contextmanager
def job_run(settings: Settings, cfg: DictConfig, run_name: str,
            parent: Parent | None = None) -> Iterator[JobRun]:
    """An MLflow run around one job: params and config.yaml at the start; the caller logs the
    record with log_result. On the way out the run ends FINISHED (record ok), FAILED (record
    failed, or an exception: error.txt has the traceback) or KILLED (Ctrl-C, SIGTERM)."""
    mlflow_client = client(settings.tracking_uri)
    if parent is not None:
        experiment_id = parent.experiment_id
    else:
        experiment_id = ensure_experiment(mlflow_client, settings.experiment_name,
                                          settings.tracking_uri)
    tags = {**context_tags(), "kind": "job", "status": "running"}
    if parent is not None:
        tags["mlflow.parentRunId"] = parent.run_id
    installed = install_signal_handlers()
    job = None
    try:
        with shielded():  # a signal while the run is created is held until it can be ended
            run = mlflow_client.create_run(experiment_id, run_name=run_name, tags=tags)
            job = JobRun(mlflow_client, run.info.run_id, settings)
        job.log_config(cfg)
        yield job
    except KeyboardInterrupt as exc:
        mark_interrupted()
        let_go(exc)  # a store write it cut short may hold the store's lock: released first
        if job is not None:
            with shielded():  # a second Ctrl-C must not leave the run RUNNING
                job.end(KILLED, f"killed: {type(exc).__name__} {exc}".rstrip(), status_tag="killed")
        raise
    except BaseException:
        if job is not None:
            with shielded():
                job.end(FAILED, traceback.format_exc(), status_tag="failed_internal")
        raise
    else:
        with shielded():
            try:
                job.end_from_record()
            except Exception as exc:  # the store failed: the result stands, the run is left
                log.error("error [tracking_error]: MLflow could not end the run of %s in %s "
                          "(%s: %s); the next sweep on this store ends it KILLED (rule: a "
                          "storage fault never turns a measured result into a failure).",
                          job.record.kernel if job.record else run_name, redact(settings.tracking_uri),
                          type(exc).__name__, first_line(str(exc)))
    finally:
        try:
            if job is not None:
                job.held.close()  # a signal held since hold_signals acts now, the run ended
        finally:
            if installed:
                restore_signal_handlers()


@contextmanager
def hydra_job_run(cfg: DictConfig) -> Iterator[JobRun | NoTracking]:
    """job_run for the Hydra job in progress (run.py): settings from its config, anchored to the
    original cwd; in a sweep, the parent run from the sweep directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    root = Path(hc.runtime.cwd)
    redact_console()  # a store from the environment may carry credentials: none on the console
    settings = Settings.from_cfg(cfg, root, hc.job.config_name)
    if not settings.enabled:
        yield NoTracking()
        return
    parent = None
    if hc.mode != RunMode.MULTIRUN:
        check_reachable(settings.tracking_uri)  # a sweep's callback asked before any job
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = root / str(hc.sweep.dir)
        parent = Parent.read(sweep_dir)
        if parent is None:
            log.warning("no MLflow parent run in %s (see the warnings at the start of the sweep); "
                        "this job is tracked as a run of its own", sweep_dir / PARENT_FILE)
        elif redact(settings.tracking_uri) != parent.tracking_uri:  # the file holds no secret
            settings = replace(settings, tracking_uri=parent.tracking_uri)
    name = run_name(cfg.kernel.name, cfg.m, cfg.n, cfg.k, list(hc.overrides.task))
    with job_run(settings, cfg, name, parent) as job:
        yield job
