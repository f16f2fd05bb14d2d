"""Tuning plan: what `sgemm-lab tune` measures on one GPU spec, found on the CPU before any job
runs. Per dispatching kernel (conf/tuning/dispatch.yaml), each candidate kernel's grid
(conf/tune/<kernel>.yaml) at every training shape (conf/suite/training.yaml) where its rules let
at least one candidate build; the FFMA fallback's grid only at shapes no candidate can run. The
counts are exact (the constraints and "measured once" pruning of src/tune/space.py), so
`--budget` can cut the training shapes (round-robin over their classes) until the estimate fits.
Each sweep is the ordinary tuning sweeper (`python -m src.run -m +tune=<kernel> shape=...`): it
spreads over every GPU (hydra/launcher=gpus), reuses cached measurements (resume=true), and
prunes by the same rules.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from src.errors import ConfigError
from src.job.problem import Problem
from src.paths import CONF_DIR
from src.tune import distribution
from src.tune import space as tune

SETTINGS_FILE = CONF_DIR / "tuning" / "dispatch.yaml"


def load_settings(path: Path = SETTINGS_FILE) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    if not data.get("dispatchers"):
        raise ConfigError(f"{path}: `dispatchers` must name each dispatching kernel with its "
                          f"precision and candidate kernels (rule: the tuner measures what the "
                          f"dispatch can choose).")
    return data


def kernel_space(kernel: str) -> dict[str, list]:
    """The grid of conf/tune/<kernel>.yaml."""
    block = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "tune" / f"{kernel}.yaml"))["tune"]
    return tune.Settings.from_cfg(block).space


@dataclass
class Sweep:
    """One tuning sweep: one candidate kernel, in one dispatcher's precision, over its shapes."""

    dispatcher: str
    precision: str
    kernel: str
    space: dict[str, list]
    shapes: list = field(default_factory=list)       # distribution.Shape
    jobs: int = 0                                    # candidates to measure, summed over shapes
    skipped: Counter = field(default_factory=Counter)  # shapes where nothing builds, per rule
    fallback: bool = False

    @property
    def name(self) -> str:
        return f"{self.dispatcher}_{self.kernel}"

    def overrides(self, settings: dict, sweep_dir: Path, extra: list[str] = ()) -> list[str]:
        """The command line of `python -m src.run` for this sweep."""
        args = ["-m", f"+tune={self.kernel}", "shape=" + ",".join(s.label for s in self.shapes),
                f"alpha={settings['alpha']}", f"beta={settings['beta']}",
                f"bench={settings['protocol']}",
                f"bench.best_cublas={str(bool(settings['best_cublas'])).lower()}",
                f"kernel.precision={self.precision}", "tune.strategy=grid", "tune.trials=null",
                f"hydra.sweep.dir={sweep_dir / self.name}"]
        if self.fallback:
            args += [f"tune.space.{k}=[{','.join(str(v) for v in values)}]"
                     for k, values in self.space.items()]
        return args + list(extra)


@dataclass
class Plan:
    gpu_spec: str
    sweeps: list[Sweep]
    shapes: list          # the training shapes planned

    @property
    def jobs(self) -> int:
        return sum(s.jobs for s in self.sweeps)

    def describe(self, seconds_per_job: float, gpus: int) -> str:
        lines = [f"tuning plan for {self.gpu_spec}: {len(self.shapes)} training shapes, "
                 f"{self.jobs} jobs, about {self.jobs * seconds_per_job / max(gpus, 1) / 60:.0f} "
                 f"min on {gpus} GPU(s) ({seconds_per_job:g} s a job)"]
        for s in self.sweeps:
            skipped = "; ".join(f"{n} shapes: {rule}" for rule, n in s.skipped.most_common())
            lines.append(f"  {s.name:<32} {len(s.shapes):>4} shapes {s.jobs:>6} jobs"
                         + (f"  (pruned whole: {skipped})" if skipped else ""))
        return "\n".join(lines)


def candidate_config(kernel: str, precision: str) -> dict:
    """The kernel's config as a sweep of it composes it, in the dispatcher's precision."""
    from src.job.config import kernel_config

    return {**kernel_config(kernel), "precision": precision}


def _sweep(dispatcher: str, precision: str, kernel: str, space: dict, shapes, limits: dict,
           settings: dict, fallback: bool = False) -> tuple[Sweep, set]:
    cfg = candidate_config(kernel, precision)
    sweep = Sweep(dispatcher, precision, kernel, space, fallback=fallback)
    candidates = tune.grid(space)
    runnable = set()
    for shape in shapes:
        pruning = tune.prune(cfg, candidates, Problem(*shape.dims, settings["alpha"],
                                                       settings["beta"]), limits)
        if pruning.valid:
            sweep.shapes.append(shape)
            sweep.jobs += len(pruning.valid)
            runnable.add(shape.dims)
        else:
            sweep.skipped[pruning.pruned.most_common(1)[0][0]] += 1
    return sweep, runnable


def build(gpu_spec: str, shapes, settings: dict | None = None) -> Plan:
    """The sweeps for `shapes` on `gpu_spec` (its datasheet limits decide what builds)."""
    from src.job.gpu import limits_from_spec

    settings = settings or load_settings()
    limits = limits_from_spec(gpu_spec)
    sweeps = []
    for dispatcher, entry in settings["dispatchers"].items():
        precision = entry["precision"]
        covered: set = set()
        for kernel in entry["candidates"]:
            sweep, runnable = _sweep(dispatcher, precision, kernel, kernel_space(kernel), shapes,
                                     limits, settings)
            covered |= runnable
            if sweep.shapes:
                sweeps.append(sweep)
        rest = [s for s in shapes if s.dims not in covered]
        fallback = settings.get("fallback")
        if rest and fallback:
            sweep, _ = _sweep(dispatcher, precision, fallback["kernel"],
                              {k: list(v) for k, v in fallback["space"].items()}, rest, limits,
                              settings, fallback=True)
            if sweep.shapes:
                sweeps.append(sweep)
    return Plan(gpu_spec, sweeps, list(shapes))


def within_budget(gpu_spec: str, training, budget_s: float | None, count: int | None,
                  seconds_per_job: float, gpus: int, settings: dict | None = None) -> Plan:
    """The plan for the first `count` training shapes (round-robin over classes), cut further
    until its estimated wall time fits `budget_s` (None: no budget). The largest count that fits
    is found by bisection; a budget too small for one shape per class is refused."""
    settings = settings or load_settings()
    count = len(training) if count is None else min(count, len(training))
    plan = build(gpu_spec, distribution.stratified(training, count), settings)
    if budget_s is None or plan.jobs * seconds_per_job / max(gpus, 1) <= budget_s:
        return plan
    low, high = 0, count          # fits(low) is assumed, fits(high) is known false
    best = None
    while high - low > 1:
        mid = (low + high) // 2
        trial = build(gpu_spec, distribution.stratified(training, mid), settings)
        if trial.jobs * seconds_per_job / max(gpus, 1) <= budget_s:
            low, best = mid, trial
        else:
            high = mid
    if best is None:
        raise ConfigError(f"--budget {budget_s:g} s holds no training shape on {gpus} GPU(s) at "
                          f"{seconds_per_job:g} s a job (rule: a tuning run measures at least "
                          f"one shape); raise it or pass --protocol quick.")
    return best
