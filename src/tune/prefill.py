"""The plan's verdicts on every core: each dispatch candidate's whole grid checked at every
training shape where it may be measured (the rule it breaks, or a digest of the kernel and
launch it builds), computed in worker processes before the plan is built and handed to
space.Pruner, which the plan then reads. The first plan of a tune builds every candidate's spec
at every shape (the H200's 172 shapes: 620,808 specs, about 90 s on one core, before a GPU job
runs); the verdicts are pure functions of the kernel config, the parameters, the problem and the
GPU's limits, so the work splits by shape. Off where there is one core, too little to split, or
no `fork` (src/tune/forked.py: the workers inherit the configs instead of receiving them)."""
from __future__ import annotations

import time

from src.job.problem import Problem
from src.tune import space as tune
from src.tune.forked import can_split, cores, mapped

MIN_VERDICTS = 50_000  # below this one core is about as fast as starting the workers


def tasks(settings: dict, shapes, limits: dict) -> list[tuple[dict, list[dict], list]]:
    """[(kernel config, its whole grid, the dims where it may be measured)] for each dispatcher's
    candidates (in its precision), as plan._stage lists them before a screen."""
    from src.tune.fit import holds
    from src.tune.plan import candidate_config, kernel_space, measured_where

    where = measured_where(settings)
    out = []
    for entry in settings["dispatchers"].values():
        for kernel in entry["candidates"]:
            dims = [s.dims for s in shapes if holds(where.get(kernel), s.dims)]
            out.append((candidate_config(kernel, entry["precision"]),
                        tune.grid(kernel_space(kernel)), dims))
    return out


def prefill(settings: dict, shapes, limits: dict, workers: int | None = None) -> int:
    """The verdicts of `tasks` this process does not hold yet, computed on `workers` processes
    (default: every core, src/tune/forked.py) and kept by space.Pruner for this process; how many
    (0 where it did not split the work)."""
    workers = cores() if workers is None else workers
    alpha, beta = settings["alpha"], settings["beta"]
    work, pruners = [], []
    for cfg, candidates, dims in tasks(settings, shapes, limits):
        pruner = tune.Pruner(cfg, candidates, limits)  # what this process holds is not done again
        pruners.append(pruner)
        work.append((cfg, candidates, [d for d in dims if not pruner.holds(Problem(*d, alpha, beta))]))
    total = sum(len(candidates) * len(dims) for _, candidates, dims in work)
    jobs = [(i, dims[j::workers]) for i, (_, _, dims) in enumerate(work)
            for j in range(workers) if dims[j::workers]]
    if total < MIN_VERDICTS or not can_split(workers, len(jobs)):
        return 0

    def verdicts(job: tuple[int, list]) -> list[list]:
        cfg, candidates, _ = work[job[0]]
        return [[tune.Pruner.verdict(cfg, params, problem, limits) for params in candidates]
                for problem in (Problem(*d, alpha, beta) for d in job[1])]

    for (i, chunk), found in zip(jobs, mapped(verdicts, jobs, workers)):
        for d, verdict in zip(chunk, found):
            pruners[i].keep(Problem(*d, alpha, beta), verdict)
    return total


def for_plan(gpu_spec: str, settings: dict, count: int | None) -> None:
    """`prefill` for the plan of `sgemm-lab tune` (the first `count` training shapes, round-robin
    over their classes, as budget.within_budget takes them), said in one line where it ran."""
    from src.job.gpu import limits_from_spec
    from src.tune import distribution

    started, training = time.perf_counter(), distribution.training()
    shapes = distribution.stratified(training, min(count or len(training), len(training)))
    done = prefill(settings, shapes, limits_from_spec(gpu_spec))
    if done:
        print(f"checked {done} candidates at their shapes on {cores()} cores in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
