"""Pure work split over every core by `fork`: the fit's leave-one-outs, its cross-validation folds,
its wave-fill table and the plan's verdicts are each many independent calls of one function, so
each worker process, forked after the inputs are built, reads them as inherited (closures and all,
nothing pickled on the way in) and sends back only its results, in the order asked. Serial where
there is one core, one item, no `fork` (the workers could not inherit the function) or inside a
worker already (no pool of pools)."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_COST = 20_000  # rough units of work (candidates x shapes, evidence rows) below which one core wins
_WORK: tuple[Callable, list] | None = None  # (function, items): what a worker reads as forked
_IN_WORKER = False


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _mark_worker() -> None:
    global _IN_WORKER
    _IN_WORKER = True


def _run(indices: list[int]) -> list:
    fn, items = _WORK
    return [fn(items[i]) for i in indices]


def can_split(workers: int, items: int) -> bool:
    """Whether `items` calls would go to `workers` forked processes (not serial)."""
    return (workers >= 2 and items >= 2 and not _IN_WORKER
            and "fork" in multiprocessing.get_all_start_methods())


def mapped(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None,
           chunks: str = "each", cost: int | None = None) -> list[R]:
    """[fn(item) for item in items], on `workers` forked processes (default: every core), or
    serial where `cost` (the whole work in rough units: candidates x shapes, evidence rows) is
    under MIN_COST, too little to pay for starting the workers. `chunks`: "each" hands the
    workers one item at a time (few items of uneven cost: a fit per fold), "stripes" one stripe
    of every `workers`-th item each (many cheap items, one round trip a worker). An exception in
    `fn` is raised here, as the serial loop would."""
    global _WORK
    items = list(items)
    workers = min(cores() if workers is None else workers, len(items))
    if not can_split(workers, len(items)) or (cost is not None and cost < MIN_COST):
        return [fn(item) for item in items]
    parts = ([[i] for i in range(len(items))] if chunks == "each"
             else [list(range(j, len(items), workers)) for j in range(workers)])
    _WORK = (fn, items)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                 initializer=_mark_worker) as pool:
            done = list(pool.map(_run, parts))
    finally:
        _WORK = None
    out: list = [None] * len(items)
    for part, results in zip(parts, done):
        for i, result in zip(part, results):
            out[i] = result
    return out
