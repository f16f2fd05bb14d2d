"""The tuning plan cut to a budget (`sgemm-lab tune --shapes N --budget SECONDS`): the first N
training shapes, round-robin over their classes, fewer until the plan's estimated wall time fits."""

from __future__ import annotations

from src.errors import ConfigError
from src.tune import distribution
from src.tune.plan import Plan, build, load_settings


def within_budget(gpu_spec: str, training, budget_s: float | None, count: int | None,
                  seconds_per_job: float, gpus: int, settings: dict | None = None) -> Plan:
    """The plan for the first `count` training shapes (round-robin over classes), cut further
    until its estimated wall time (both stages, stage 2 at its upper bound: the survivors are not
    known before the screen runs) fits `budget_s` (None: no budget). The largest count that fits
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
