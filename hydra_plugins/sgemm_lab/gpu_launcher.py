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

Either way every job of a batch is composed once before the first job starts (on several GPUs by
the slots, a share each at once: src/sweep/pool.py): that compose is the batch's validation (a
job that does not compose stops the sweep before any job ran, with Hydra's error, as Hydra's
check did), so the lab's sweeper (lab_sweeper.py) skips Hydra's own, which composed every job a
second time. On several GPUs the slots (and their job workers) are started first, in setup, and
the jobs are handed out by estimated cost: first those that build or autotune off the GPU before
their first launch (the launcher's `setup_first`: Triton's and CUTLASS's backends, kernels with
`peers`), then the largest M*N*K, then job order: a long job last would leave the other GPUs
idle. Job numbers, directories and results keep the job order.

The launching process creates no CUDA context for this: which GPUs there are comes from the
environment or from NVML.
"""

# (no `from __future__ import annotations`: Hydra execs plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations)

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn, JobStatus, filter_overrides

log = logging.getLogger("sgemm")


@dataclass
class Job:
    """One job of a batch: its number in the sweep, its overrides and its composed config."""

    idx: int
    overrides: List[str]
    config: Any


def problem_size(config) -> int:
    """M*N*K of a job's config; 0 when they are not numbers (such a job is refused at once)."""
    try:
        return int(config.m) * int(config.n) * int(config.k)
    except Exception:  # a bad size or shape is the job's own error, recorded when it runs
        return 0


@dataclass(frozen=True)
class SetupFirst:
    """Which jobs go out first (conf/hydra/launcher/gpus.yaml `setup_first`): those whose kernel's
    backend is one of `backends`, or, with `peers`, whose kernel lists peers (best_*)."""

    backends: tuple = ()
    peers: bool = False

    @classmethod
    def from_cfg(cls, section) -> "SetupFirst":
        from omegaconf import OmegaConf

        from src.errors import ConfigError

        data = OmegaConf.to_container(section) if OmegaConf.is_config(section) else section
        data = {} if data is None else data
        backends = data.get("backends", []) if isinstance(data, dict) else None
        peers = data.get("peers", False) if isinstance(data, dict) else None
        if (not isinstance(data, dict) or set(data) - {"backends", "peers"}
                or not isinstance(backends, list) or not all(isinstance(b, str) for b in backends)
                or not isinstance(peers, bool)):
            raise ConfigError(
                f"hydra.launcher.setup_first must be a mapping with `backends` (a list of backend "
                f"names, e.g. [triton, cutlass]) and `peers` (true or false), got {data!r} (rule: "
                f"it names the jobs handed out first, those that build or autotune before their "
                f"first launch).")
        return cls(tuple(backends), peers)

    def applies(self, config) -> bool:
        """Whether the job of `config` builds or autotunes off the GPU in its first run."""
        try:
            kernel = config.kernel
            return (str(kernel.get("backend")) in self.backends
                    or (self.peers and bool(kernel.get("peers"))))
        except Exception:  # no kernel section: the job's own error, recorded when it runs
            return False


def hand_out_order(jobs: Sequence[Job], setup_first: SetupFirst = SetupFirst()) -> List[int]:
    """Positions of `jobs` in hand-out order: first the jobs `setup_first` names (their build or
    autotune, seconds off the GPU, must not be the sweep's tail), then the largest problem; ties
    in job order."""
    return sorted(range(len(jobs)), key=lambda i: (not setup_first.applies(jobs[i].config),
                                                   -problem_size(jobs[i].config), i))


class SlotLost(RuntimeError):
    """In the launching process: a job whose slot process died before it answered."""


class GpuLauncher(BasicLauncher):
    composes_batch_first = True  # lab_sweeper.LabSweeper: no second compose to validate a batch

    def __init__(self, devices: Optional[List[int]] = None, setup_first: Any = None,
                 prebuild: Any = None) -> None:
        super().__init__()
        self.devices = list(devices) if devices is not None else None
        self.setup_first = setup_first  # read by launch(): a bad one is one clear error there
        self.prebuild = prebuild  # the same
        self._gpus = None
        self._pool = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        """Hydra's, then the slots' start (several GPUs): they start while the sweeper plans
        and the jobs are composed, not when the first batch is launched."""
        from src.errors import LabError

        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        try:
            pooled = self._pooled()
        except LabError:  # a bad hydra.launcher.devices: launch() says so
            return
        if pooled:
            self._started_pool()

    @property
    def gpus(self) -> list:
        """The sweep's GPUs (src/job/devices.py); a bad hydra.launcher.devices raises ConfigError."""
        if self._gpus is None:
            from src.job.devices import sweep_gpus

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
        from src.sweep.prebuild import prebuild_rule

        try:
            pooled = self._pooled()
            setup_first = SetupFirst.from_cfg(self.setup_first)
            build_rule = prebuild_rule(self.prebuild)
        except LabError as exc:  # a bad hydra.launcher.devices, setup_first or prebuild: one clear error
            log.error("error [%s]: %s", exc.status, exc)
            raise SystemExit(1) from None
        from hydra.core.utils import configure_log, setup_globals

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        if not pooled:
            return self._launch_here(self._composed(job_overrides, initial_job_idx))
        pool = self._started_pool()
        return self._launch_on_slots(pool, self._composed(job_overrides, initial_job_idx, pool),
                                     setup_first, build_rule)

    def _composed(self, job_overrides, initial_job_idx: int, pool=None) -> List[Job]:
        """Every job's config, as Hydra's basic launcher composes it (src/sweep/pool.py
        compose_job; with a pool, by its slots at once); what does not compose raises here,
        before any job of the batch has started."""
        from src.sweep.pool import compose_job

        items = [(list(overrides), initial_job_idx + i) for i, overrides in enumerate(job_overrides)]

        def here(overrides, job_idx):
            return compose_job(self.hydra_context, self.config, overrides, job_idx)

        configs = (pool.compose(items, here) if pool is not None
                   else [here(*item) for item in items])
        return [Job(idx, overrides, config) for (overrides, idx), config in zip(items, configs)]

    def _launch_here(self, jobs: List[Job]) -> List[JobReturn]:
        """One after another in this process, as Hydra's basic launcher runs them."""
        from hydra.core.utils import configure_log, run_job

        returns = []
        for job in jobs:
            returns.append(run_job(hydra_context=self.hydra_context, task_function=self.task_function,
                                   config=job.config, job_dir_key="hydra.sweep.dir",
                                   job_subdir_key="hydra.sweep.subdir"))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    def _launch_on_slots(self, pool, jobs: List[Job], setup_first: SetupFirst,
                         build_rule: dict) -> List[JobReturn]:
        from src.sweep import prebuild, progress
        from src.sweep.tracking import signals

        def on_start(job, gpu) -> None:
            signals.raise_if_interrupted()  # an interrupt a library swallowed stops the sweep here
            if progress.current is not None:
                progress.current.job_started(job.overrides, gpu=gpu.label)

        def on_end(job, answer) -> None:
            if progress.current is not None:
                ok = answer.kind == "done" and answer.value.status == JobStatus.COMPLETED
                progress.current.job_ended(answer.value._return_value if ok else None)

        builds = prebuild.started([job.config for job in jobs], build_rule)  # while the GPUs run the rest
        try:
            answers = pool.run(jobs, on_start=on_start, on_end=on_end,
                               order=hand_out_order(jobs, setup_first), held=builds.held, wake=builds.wake)
            builds.join()  # no nvcc left behind: a job that needed it waited on its lock anyway
        finally:
            builds.close()
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
    def _job_return(job: Job, answer) -> JobReturn:
        if answer.kind == "done":
            return answer.value
        idx, overrides = job.idx, job.overrides
        how = ("was interrupted by a signal sent to it alone" if answer.kind == "interrupted"
               else f"died (exit code {answer.value}; a negative code is the signal that killed it)")
        message = (f"job #{idx} ({' '.join(filter_overrides(overrides))}) on GPU {answer.gpu.label} "
                   f"ended without a record: its slot process {how}. The other jobs ran; re-run "
                   f"the same command with resume=true to run only what is missing.")
        log.error(message)
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED,
                         _return_value=SlotLost(message))
