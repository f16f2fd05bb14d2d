"""A library kernel's params mean today what they meant when they were measured: every published
run (results/<gpu>/*runs.csv, results/tuning/probes/*runs.csv) measured from today's kernel source
(its `source_sha256`, or a source whose evidence rows `sgemm-lab tune --carry-over` carried to today's:
the same code at every carried candidate) builds, from its recorded params at its shape, the launch it recorded (entry,
grid, block, dynamic shared memory). The evidence the dispatch is fitted from names candidates by
params and source only, so a change to a kernel config's derived rules (conf/kernel/*.yaml) that
moves what existing params build would silently re-label measured rows; this catches it (such a
change must come with a new parameter value, as `fit: 3` did, or a re-measurement)."""

from __future__ import annotations

import json
from functools import lru_cache

import pandas as pd
import pytest
import yaml

from src.job import gpu as gpu_mod
from src.job.config import kernel_config
from src.job.problem import Problem
from src.job.spec import KernelSpec, candidate_spec
from src.paths import CONF_DIR, RESULTS_DIR
from src.tune.evidence import source_sha256

RUNS = sorted([*RESULTS_DIR.glob("*/*runs.csv"), *(RESULTS_DIR / "tuning" / "probes").glob("*runs.csv")])
# the library kernels (`library: true`), read from the files: composing each config at collection costs seconds
LIBRARY = sorted(p.stem for p in (CONF_DIR / "kernel").glob("*.yaml")
                 if (yaml.safe_load(p.read_text()) or {}).get("library") is True)


@lru_cache(maxsize=None)
def _limits(gpu_spec: str) -> dict[str, int]:
    return gpu_mod.limits_from_spec(gpu_spec)


@lru_cache(maxsize=1)
def _carried_pairs() -> frozenset[tuple[str, str, str]]:
    """(kernel, source_sha256, carried_from) of every carried evidence row, the files read once."""
    found: set[tuple[str, str, str]] = set()
    for path in (RESULTS_DIR / "tuning").glob("*.csv"):
        rows = pd.read_csv(path, usecols=["kernel", "source_sha256", "carried_from"], low_memory=False)
        carried = rows.dropna(subset=["carried_from"]).drop_duplicates()
        found.update(zip(carried.kernel, carried.source_sha256, carried.carried_from))
    return frozenset(found)


def carried_sources(kernel: str) -> frozenset[str]:
    """The sources whose evidence rows of `kernel` were carried over to today's (`carried_from` of
    results/tuning/<gpu>.csv): published runs measured from them ran today's code there."""
    today = source_sha256(kernel)
    return frozenset(str(then) for k, now, then in _carried_pairs() if k == kernel and now == today)


def moved_launches(runs: pd.DataFrame, kernel: str, config: dict, today) -> tuple[int, list[str]]:
    """(rows checked, 'MxNxK params: recorded -> today' for each that builds another launch now):
    the ok rows of `kernel` (run directly, or dispatched to) measured from source `today` (a
    hash, or a set of them)."""
    sources = {today} if isinstance(today, str) else set(today)
    ran = runs.dispatched_to.where(runs.dispatched_to.notna(), runs.kernel) if "dispatched_to" in runs else runs.kernel
    rows = runs[(runs.status == "ok") & (ran == kernel) & runs.source_sha256.isin(sources)
                & runs.params.notna() & runs.entry.notna()]
    moved = []
    for r in rows.itertuples(index=False):
        problem = Problem(int(r.m), int(r.n), int(r.k), float(r.alpha), float(r.beta))
        spec = candidate_spec(config, json.loads(r.params), problem, _limits(str(r.gpu_spec)))
        recorded = (r.entry, json.loads(r.grid), json.loads(r.block), int(r.dynamic_smem_bytes))
        now = ((spec.entry, list(spec.grid), list(spec.block), spec.dynamic_smem_bytes)
               if isinstance(spec, KernelSpec) else f"does not build ({spec})")
        if now != recorded:
            moved.append(f"{r.m}x{r.n}x{r.k} {r.params}: {recorded} -> {now}")
    return len(rows), moved


def _published_runs() -> pd.DataFrame:
    frames = [pd.read_csv(p, low_memory=False, dtype={"params": str, "entry": str, "gpu_spec": str})
              for p in RUNS]
    frames = [f for f in frames if {"entry", "params", "source_sha256", "gpu_spec"} <= set(f.columns)]
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def published_runs() -> pd.DataFrame:
    return _published_runs()


@pytest.mark.parametrize("kernel", LIBRARY)
def test_params_build_the_launch_they_were_measured_as(published_runs, kernel):
    config = kernel_config(kernel)
    checked, moved = moved_launches(published_runs, kernel, config,
                                    {source_sha256(kernel), *carried_sources(kernel)})
    if not checked:
        pytest.skip(f"no published run of {kernel} was measured from today's source")
    assert not moved, f"{len(moved)} of {checked} rows build another launch now, e.g. {moved[:3]}"


def test_a_changed_derived_rule_is_caught(published_runs):
    """The check is not vacuous: gemm_tf32 with fit 2's tile rows rounded to 16, not 8, moves
    the recorded launches whose fitted rows were an odd multiple of 8."""
    config = kernel_config("gemm_tf32")
    derived = dict(config["derived"])
    derived["block_m"] = derived["block_m"].replace("8 * ceil_div(ceil_div(m, row_tiles), 8)",
                                                    "16 * ceil_div(ceil_div(m, row_tiles), 16)")
    assert derived["block_m"] != config["derived"]["block_m"]
    checked, moved = moved_launches(published_runs, "gemm_tf32", {**config, "derived": derived},
                                    {source_sha256("gemm_tf32"), *carried_sources("gemm_tf32")})
    if not checked:
        pytest.skip("no published run of gemm_tf32 was measured from today's source")
    assert moved and len(moved) < checked
