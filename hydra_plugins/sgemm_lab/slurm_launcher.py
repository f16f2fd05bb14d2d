"""SLURM launcher (`hydra/launcher=slurm`, conf/hydra/launcher/slurm.yaml): hydra-submitit-launcher's
SlurmLauncher, which submits a sweep's jobs as SLURM job arrays through submitit, with three
changes for this lab.

- GPU routing: each job goes to the nodes that carry the GPU it asks for. A `gpu/` config may name
  `slurm.partition` and `slurm.constraint` (conf/gpu/*.yaml); jobs are grouped by them and each
  group is one job array with that partition and constraint (the launcher's own are the default,
  e.g. for gpu=auto). A sweep over gpu=h100_sxm,h200 is two arrays.
- A job SLURM ends (time limit, preemption, scancel: SIGTERM, or submitit's USR2 warning) ends its
  MLflow run KILLED: submitit ignores SIGTERM in the job, so here it is raised as
  tracking.Terminated, which the job's run (tracking.job_run) ends KILLED on. The job then reports
  failure to submitit rather than dying without a word, so the launching process learns of it
  without waiting on SLURM's accounting.
- Every job of a batch is waited for; one without a result (killed, or lost with its node) fails
  the sweep after the others finished, with a message naming it and how to go on (resume=true).

Everything else (submission, job arrays, sbatch parameters, pickling the job to the node, results)
is submitit's and hydra-submitit-launcher's, unchanged.
"""

from __future__ import annotations

import logging
import signal
from collections import defaultdict
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurm
from omegaconf import OmegaConf

from src.sweep.tracking import Terminated  # a KeyboardInterrupt: the job's open MLflow run ends KILLED

log = logging.getLogger(__name__)

ROUTING_KEYS = ("partition", "constraint")  # what a gpu/ config's `slurm:` block may set


class KilledBySlurm(Exception):
    """Raised in the job after SLURM stopped it; an Exception, so submitit records it."""


class SlurmJobLost(RuntimeError):
    """In the launching process: a job that ended without a result."""


class OnceAboutSacct(logging.Filter):
    """submitit asks sacct for job states and warns on every poll when it fails (a cluster
    without accounting): the first warning is kept, the rest dropped. Results come from the
    jobs' result files either way; only a job lost without one needs sacct to be noticed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "sacct error" not in record.getMessage():
            return True
        seen, self.seen = self.seen, True
        return not seen


class Requeued(Terminated):
    """submitit requeued this job (USR2 on preemption): its run ends KILLED, and this attempt
    leaves no result, so that the launching process waits for the requeued one."""


def _slurm_signal(signum, frame):
    raise Terminated(f"stopped by SLURM (signal {signal.Signals(signum).name}: time limit, "
                     f"preemption or scancel)")


class SlurmLauncher(SubmititSlurm):
    # --- in the job, on a node -------------------------------------------------------------------

    def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state) -> JobReturn:
        signal.signal(signal.SIGTERM, _slurm_signal)
        submitit_usr2 = signal.getsignal(signal.SIGUSR2)

        def on_usr2(signum, frame):  # submitit's: requeue a preempted job, give up a timed-out one
            try:
                if callable(submitit_usr2):
                    submitit_usr2(signum, frame)
            except SystemExit:  # requeued: this attempt's run ends KILLED, the next one reruns it
                raise Requeued("requeued by submitit after SLURM's USR2 (preemption)") from None
            except Exception:  # timed out: not requeued
                _slurm_signal(signum, frame)

        signal.signal(signal.SIGUSR2, on_usr2)
        try:
            return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        except Requeued:  # no result for this attempt: the requeued one writes it
            raise SystemExit(-1) from None
        except KeyboardInterrupt as exc:
            raise KilledBySlurm(f"{exc}; its MLflow run ended KILLED") from None

    # --- in the launching process ----------------------------------------------------------------

    def _routing(self, job_overrides: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        """Each job's partition and constraint: its gpu/ config's `slurm:` block over the
        launcher's own. Composed once per distinct set of gpu overrides, not per job."""
        composed: dict[tuple, dict] = {}
        routes = []
        for overrides in job_overrides:
            key = tuple(o for o in overrides if o.lstrip("+~").startswith("gpu"))
            if key not in composed:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                block = OmegaConf.select(cfg, "gpu.slurm", default=None) or {}
                composed[key] = {name: block.get(name) or self.params.get(name)
                                 for name in ROUTING_KEYS}
            routes.append(composed[key])
        return routes

    def _executor(self):
        import submitit

        executor = submitit.AutoExecutor(folder=self.params["submitit_folder"], cluster="slurm",
                                         slurm_max_num_timeout=self.params["max_num_timeout"])
        shared = set(OmegaConf.structured(BaseQueueConf).keys())  # the keys without slurm_
        executor.update_parameters(**{
            (name if name in shared else f"slurm_{name}"): value
            for name, value in self.params.items() if name not in ("submitit_folder",
                                                                   "max_num_timeout")})
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from pathlib import Path

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, route in enumerate(self._routing(job_overrides)):
            groups[tuple(route[name] for name in ROUTING_KEYS)].append(i)
        executor = self._executor()
        submitted = {}
        for route, members in groups.items():
            executor.update_parameters(**{f"slurm_{name}": value
                                          for name, value in zip(ROUTING_KEYS, route)})
            calls = [(list(job_overrides[i]), "hydra.sweep.dir", initial_job_idx + i,
                      f"job_id_for_{initial_job_idx + i}", Singleton.get_state()) for i in members]
            jobs = executor.map_array(self, *zip(*calls))
            where = ", ".join(f"{n}={v}" for n, v in zip(ROUTING_KEYS, route) if v) or "defaults"
            for i, job in zip(members, jobs):
                log.info("\t#%d : %s -> SLURM job %s (%s)", initial_job_idx + i,
                         " ".join(filter_overrides(job_overrides[i])), job.job_id, where)
                submitted[i] = job
        submitit_log = logging.getLogger("submitit")
        if not any(isinstance(f, OnceAboutSacct) for f in submitit_log.filters):
            submitit_log.addFilter(OnceAboutSacct())  # once per process, over all batches
        return [self._result(submitted[i], job_overrides[i], initial_job_idx + i)
                for i in range(len(job_overrides))]

    @staticmethod
    def _result(job, overrides: Sequence[str], idx: int) -> JobReturn:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            return job.results()[0]
        except (FailedJobError, UncompletedJobError) as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            why = next((line for line in reversed(lines) if "KilledBySlurm" in line),
                       lines[-1] if lines else type(exc).__name__)
            message = (f"job #{idx} ({' '.join(filter_overrides(overrides))}) ended without a "
                       f"record: SLURM job {job.job_id}, {why.strip()} (its log: {job.paths.stderr}). "
                       f"The other jobs ran; re-run the same command with resume=true to run "
                       f"only what is missing.")
            log.error(message)
            return JobReturn(overrides=list(overrides), status=JobStatus.FAILED,
                             _return_value=SlurmJobLost(message))
