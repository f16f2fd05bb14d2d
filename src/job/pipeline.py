"""One Hydra job, step by step: config -> prepare -> measure -> record.

Every expected failure (errors.LabError) ends the job with its status and message in the
record; the caller decides what that means for the process (run.py). A job normally runs in a
worker process (src/sweep/worker.py), which relays `progress` after each step to its launcher.
With `resume=true`, a job whose exact measurement is in the cache (src/job/cache.py) is
not run again: its record is the cached one, marked `from_cache`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from omegaconf import DictConfig

from src.errors import Implausible, InternalError, LabError
from src.job import autotune
from src.job.baselines import Baselines
from src.job.cache import Cache
from src.job.cache import key as measurement_key
from src.job.compile import DEFAULT_CACHE_DIR
from src.job.measure import JobOutputs, check_cached, measure
from src.job.prepare import PreparedJob, prepare
from src.records.record import Record, mark_failed, new_record

log = logging.getLogger(__name__)


def _no_progress(step: str, record: Record) -> None:
    pass


def _describe(record: Record, prepared: PreparedJob) -> None:
    """What preparing decided, kept in the record (even if the job fails later)."""
    record.params = dict(prepared.kernel_cfg.get("params") or {})
    record.math = prepared.kernel_cfg.get("math") or record.math  # best_*: the chosen chapter's
    record.tuned_from = prepared.tuned_from
    if prepared.dispatched is not None:
        record.dispatched_to = prepared.dispatched.kernel
        record.dispatch_rule = prepared.dispatched.rule
    spec = prepared.spec
    record.entry, record.grid, record.block = spec.entry, list(spec.grid), list(spec.block)


def cached_is_plausible(prepared: PreparedJob, cached: Record) -> bool:
    """Whether a cached figure passes the checks a fresh one does (else it is measured again)."""
    try:
        check_cached(prepared, cached)
    except Implausible as exc:
        log.warning("measurement cache: not served, measuring again: %s", exc)
        return False
    return True


def run_job(cfg: DictConfig, outputs: JobOutputs | None = None,
            explicit_params: set[str] = frozenset(), progress=_no_progress,
            run_id: str | None = None, baselines: Baselines | None = None) -> Record:
    """Run one job; `outputs`, if given, receives what the tracking step logs besides the record;
    `explicit_params`: kernel.params.* names set on the command line (they beat tuned values);
    `progress(step, record)` is called after each step (the worker relays it to its launcher);
    `run_id`: the job's MLflow run, kept in the record (and so in the measurement cache);
    `baselines`: the process's cuBLAS figures (a fresh set if None)."""
    from omegaconf import OmegaConf

    kcfg = OmegaConf.to_container(cfg.kernel, resolve=True)
    bench = OmegaConf.to_container(cfg.bench, resolve=True)
    record = new_record(
        str(kcfg.get("name")), str(kcfg.get("precision")), str(kcfg.get("backend")), cfg,
        params=dict(kcfg.get("params") or {}), bench=bench, mlflow_run_id=run_id,
        replicate=cfg.get("replicate"), math=kcfg.get("math"))
    try:
        prepared = prepare(cfg, explicit_params)
        _describe(record, prepared)
        if outputs is not None:
            outputs.source = prepared.source
        device = prepared.require_device()
        record.gpu, record.gpu_spec, record.device = (device.name, prepared.target.gpu_spec_name,
                                                      asdict(device))
        progress("spec", record)

        cache_dir = str(cfg.get("cache_dir") or DEFAULT_CACHE_DIR)
        settings = autotune.Settings.from_cfg(cfg)
        if settings.enabled and prepared.dispatched is not None:  # best_*: before the timed measurement
            prepared = autotune.run(prepared, kcfg, settings, record, cache_dir,
                                    bool(cfg.get("use_tuned", True)))
            _describe(record, prepared)
            if outputs is not None:
                outputs.source = prepared.source
            progress("autotuned", record)
        cache = Cache(cache_dir)
        digest = measurement_key(prepared)
        if cfg.get("resume"):
            cached = cache.get(digest)
            same_run = cached is not None and (cached.replicate or 1) == (record.replicate or 1)
            if same_run and cached_is_plausible(prepared, cached):  # a replicate is a new run
                cached.from_cache = True
                return cached
        measure(prepared, baselines if baselines is not None else Baselines(), record, outputs,
                progress, cache_dir)
        cache.put(digest, record)
    except LabError as exc:
        mark_failed(record, exc)
    except Exception as exc:  # a bug, not bad input: record it so a sweep goes on
        if cfg.get("debug"):
            raise
        mark_failed(record, InternalError(
            f"internal error while running {record.kernel} (a bug in sgemm-lab; rerun with "
            f"debug=true for the traceback): {type(exc).__name__}: {exc}"))
    return record
