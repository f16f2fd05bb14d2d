"""The lab's default launcher (`hydra/launcher=gpus`, conf/config.yaml): a sweep's jobs on every GPU
of the node at once, one job at a time on each GPU.

- One GPU visible (or none): Hydra's basic launcher, unchanged: the jobs run one after another in
  this process, each in the worker process of src/sweep/worker.py.
- Several (CUDA_VISIBLE_DEVICES, else NVML's count; `hydra.launcher.devices=[0,2]` picks some by
  position): a slot process per GPU, pinned to it, runs the jobs handed to it one at a time as the
  basic launcher would (src/sweep/pool.py says how, and why processes of our own). The launcher
  prints each job's progress line as it hands it out, naming the GPU, and returns the jobs'
  results in job order, so that sweepers, summaries and records read as in one process. The
  slots live for the whole sweep: a tuning sweep's batches reuse them.

The launching process creates no CUDA context for this: which GPUs there are comes from the
environment or from NVML.
"""

# (no `from __future__ import annotations`: Hydra execs plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations)

import logging
from pathlib import Path
from typing import List, Optional, Sequence

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn, JobStatus, filter_overrides

log = logging.getLogger("sgemm")


class SlotLost(RuntimeError):
    """In the launching process: a job whose slot process died before it answered."""


class GpuLauncher(BasicLauncher):
    def __init__(self, devices: Optional[List[int]] = None) -> None:
        super().__init__()
        self.devices = list(devices) if devices is not None else None
        self._gpus = None
        self._pool = None

    @property
    def gpus(self) -> list:
        """The sweep's GPUs (src/sweep/devices.py); a bad hydra.launcher.devices raises ConfigError."""
        if self._gpus is None:
            from src.sweep.devices import sweep_gpus

            self._gpus = sweep_gpus(self.devices)
        return self._gpus

    @property
    def slots(self) -> int:
        """How many jobs run at once (a sweeper hands out at least this many per batch)."""
        return len(self.gpus) if self._pooled() else 1

    def _pooled(self) -> bool:
        return len(self.gpus) > 1 or self.devices is not None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from src.errors import LabError

        try:
            pooled = self._pooled()
        except LabError as exc:  # a bad hydra.launcher.devices: one clear error, no traceback
            log.error("error [%s]: %s", exc.status, exc)
            raise SystemExit(1) from None
        if not pooled:
            return super().launch(job_overrides, initial_job_idx)
        return self._launch_on_slots(job_overrides, initial_job_idx)

    def _launch_on_slots(self, job_overrides, initial_job_idx: int) -> List[JobReturn]:
        from hydra.core.utils import configure_log, setup_globals

        from src.sweep import progress
        from src.sweep.tracking import signals

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        pool = self._started_pool()
        jobs = [(initial_job_idx + i, list(overrides)) for i, overrides in enumerate(job_overrides)]

        def on_start(job, gpu) -> None:
            signals.raise_if_interrupted()  # an interrupt a library swallowed stops the sweep here
            if progress.current is not None:
                progress.current.job_started(job[1], gpu=gpu.label)

        def on_end(job, answer) -> None:
            if progress.current is not None:
                ok = answer.kind == "done" and answer.value.status == JobStatus.COMPLETED
                progress.current.job_ended(answer.value._return_value if ok else None)

        answers = pool.run(jobs, on_start=on_start, on_end=on_end)
        raised = next((a.value for a in answers if a is not None and a.kind == "raised"), None)
        if raised is not None:  # as in one process: what a job raised (sys.exit) ends the sweep
            raise raised
        return [self._job_return(job, answer) for job, answer in zip(jobs, answers)]

    def _started_pool(self):
        """The sweep's slots, started once: Hydra's context, the task and the sweep's config go
        to each slot as submitit's launcher sends them to a node (cloudpickle, which carries the
        task function of `python -m src.run`'s __main__ by value)."""
        if self._pool is None:
            import cloudpickle
            from hydra.core.singleton import Singleton

            from src.sweep.pool import Pool

            context = cloudpickle.dumps((self.hydra_context, self.task_function, self.config,
                                         Singleton.get_state()))
            self._pool = Pool(self.gpus, context)
            log.info("sweep on %d GPUs at once (CUDA_VISIBLE_DEVICES %s), one job at a time on each",
                     len(self.gpus), ", ".join(gpu.label for gpu in self.gpus))
        return self._pool

    @staticmethod
    def _job_return(job, answer) -> JobReturn:
        if answer.kind == "done":
            return answer.value
        idx, overrides = job
        how = ("was interrupted by a signal sent to it alone" if answer.kind == "interrupted"
               else f"died (exit code {answer.value}; a negative code is the signal that killed it)")
        message = (f"job #{idx} ({' '.join(filter_overrides(overrides))}) on GPU {answer.gpu.label} "
                   f"ended without a record: its slot process {how}. The other jobs ran; re-run "
                   f"the same command with resume=true to run only what is missing.")
        log.error(message)
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED,
                         _return_value=SlotLost(message))
