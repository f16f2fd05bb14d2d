"""Autotune step of a dispatching job (`kernel=best_fp32|best_tf32`, `dispatch.autotune` on by default,
conf/dispatch/default.yaml): at a shape no dispatch rule covers well, a few candidates are
measured briefly on the job's own inputs before its timed measurement; the fastest verified one
runs the job, and the choice is kept in `<cache_dir>/dispatch/` so a later job at the shape, in
this process or another, reuses it without measuring (as cuBLASLt's and Triton's autotunes do).

    prepared job (the rule's choice) -> covered well? -> candidates -> the kept choice, or each
    candidate compiled, verified, timed briefly (under a lock) -> the winner's prepared job

Covered well (src/job/autotune_coverage.py): the nearest training shape is near and its own
measurements agree with the rule's choice, or without evidence a rule other than a catch-all
holds.
Candidates (`candidates`): the rule's choice first, then the best measured candidates at the
nearest training shapes (evidence), or else the dispatch rules' other choices and the
dispatcher's defaults (a GPU without a table: every portable kernel that builds, measured on the
GPU itself). The record says what happened: `autotuned`,
`autotune_why`, `autotune_candidates`, `autotune_s`; the brief timings are not the job's figure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import OmegaConf

from src.errors import LabError, LaunchFailed
from src.job import cache as measurement_cache
from src.job import dispatch, kept_evidence, training
from src.job.config import kernel_config
from src.job.file_lock import entry_held, write_atomically
from src.job.autotune_settings import Settings, default_settings  # noqa: F401 (autotune.Settings, .default_settings)
from src.job.autotune_coverage import Coverage, coverage  # noqa: F401 (autotune.coverage: the step's first question)
from src.job.prepare import PreparedJob, prepare_kernel
from src.job.problem import Problem, shape_label
from src.job.protocol import BenchProtocol
from src.paths import CONF_DIR
from src.records.record import Record

log = logging.getLogger("sgemm")

SUBDIR = "dispatch"  # under cache_dir: one JSON file per autotuned key

# What `autotuned` says in the record.
MEASURED = "measured"        # this job measured the candidates (and kept the choice)
REUSED = "reused"            # the choice was read from cache_dir: measured by an earlier job or process
NOT_NEEDED = "not_needed"    # a rule covers the shape well: the rule's choice runs, nothing measured
ALL_FAILED = "all_failed"    # no candidate compiled and verified: the rule's choice runs


@dataclass(frozen=True)
class Candidate:
    kernel: str     # the chapter (conf/kernel/<kernel>.yaml)
    params: dict    # over the chapter's tuned parameters (a measured candidate's: all of them)
    source: str     # where it comes from: the rule, the evidence at a training shape


def candidates(choice: dispatch.DispatchChoice, dispatcher_cfg: dict, gpu_spec: str,
               shape: tuple[int, int, int], rows: list[dict] | None, nearest: int,
               variants: tuple = (), table: training.Table | None = None) -> list[Candidate]:
    """Every candidate in the order they are tried (the caller keeps the first few that build):
    the rule's choice, then its `variants` (dispatch.autotune_variants of its kernel: its params
    with theirs laid over); then, with evidence, the nearest-neighbour model's next choices (the tuned
    file's `nearest:`, over this evidence: each candidate's weighted geomean ratio at its nearest
    training shapes, best first), then the measured ones at the `nearest` training shapes, rank 1
    at each shape (nearest first), then rank 2, ...; without, the other rules' choices in order
    and the dispatcher's defaults in order. Repeats are left in (the caller drops a candidate that builds
    the same kernel as an earlier one). Why the model's order first: docs/tuning.md, "Autotune at
    run time" (left out of the fit, its first few find more of the ceiling than the ranks).
    `table`: training.table(rows, the dispatcher), where the caller has it already."""
    name = str(dispatcher_cfg["name"])
    found = [Candidate(choice.kernel, dict(choice.params), RULE_SOURCE)]
    found += [Candidate(choice.kernel, v.over(choice.params), f"the rule's choice with "
                        f"{json.dumps(dict(v.params), sort_keys=True)}: {v.why}")
              for v in variants if v.kernel == choice.kernel]
    if rows is not None:
        table = table or training.table(rows, name)
        for rank, (c, ratio) in enumerate(dispatch.ranked(gpu_spec, name, Problem(*shape, 1.0, 0.0), table)):
            found.append(Candidate(c.kernel, json.loads(c.params),
                                   f"the nearest model's #{rank + 1}, {ratio:.3f}x the stronger "
                                   f"cuBLAS at the nearest training shapes"))
        nearby = training.nearest(rows, name, shape, nearest, shapes=table.shapes)
        ok_at: dict = {near: [] for near in nearby}
        for r in rows:
            if r["dispatcher"] == name and r["status"] == "ok" and (r["m"], r["n"], r["k"]) in ok_at:
                ok_at[(r["m"], r["n"], r["k"])].append(r)
        ranked = [(near, sorted(ok_at[near], key=lambda r: (-(training.score(r) or 0.0), r["kernel"],
                                                             r["params"]))) for near in nearby]
        for rank in range(max((len(ok) for _, ok in ranked), default=0)):
            for near, ok in ranked:
                if rank < len(ok):
                    r = ok[rank]
                    found.append(Candidate(r["kernel"], json.loads(r["params"]),
                                           f"#{rank + 1} at {shape_label(near)}, {training.score(r) or 0.0:.3f}x the "
                                           f"stronger cuBLAS"))
        return found
    for index, rule in enumerate(dispatch.rules(dispatcher_cfg, gpu_spec)):
        found.append(Candidate(str(rule["kernel"]), dict(rule.get("params") or {}),
                               f"{name}[{index}]'s choice (when {rule.get('when', 'True')})"))
    for index, entry in enumerate(dispatch.defaults(dispatcher_cfg)):
        found.append(Candidate(entry["kernel"], {}, f"{name}'s default[{index}]: {entry['why']}"))
    return found


def planned(choice: dispatch.DispatchChoice, dispatcher_cfg: dict, gpu_spec: str, problem: Problem,
            rows: list[dict] | None, settings: Settings, limits: dict | None,
            table: training.Table | None = None) -> list[tuple[Candidate, object]]:
    """[(candidate, its launch)]: what autotune measures at `problem`, without a GPU: the first
    `settings.count(dispatcher)` of `candidates` that build, each launch once (dispatch.launch with the
    device's `limits`; without them, each (kernel, params) once, as listed)."""
    seen, out = set(), []
    shape = (problem.m, problem.n, problem.k)
    for c in candidates(choice, dispatcher_cfg, gpu_spec, shape, rows, settings.nearest,
                        settings.variants, table):
        params = json.dumps(c.params, sort_keys=True)
        launch = (dispatch.launch(training.Candidate(c.kernel, params), str(dispatcher_cfg["precision"]),
                                  problem, limits) if limits is not None else (c.kernel, params))
        if launch is not None and launch not in seen:
            seen.add(launch)
            out.append((c, launch))
            if len(out) == settings.count(str(dispatcher_cfg["name"])):
                break
    return out


def brief_protocol(bench: BenchProtocol, protocol: str) -> BenchProtocol:
    """The job's protocol with conf/bench/<protocol>.yaml's own values laid over it."""
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "bench" / f"{protocol}.yaml"), resolve=True)
    values.pop("defaults", None)
    return BenchProtocol.from_config({**dict(bench.settings), **values})


def _params(job: PreparedJob) -> dict:
    return dict(job.kernel_cfg.get("params") or {})


def _identity(job: PreparedJob) -> str:
    tail = [[job.spec.tail.entry, list(job.spec.tail.grid)]] if job.spec.tail else []
    return json.dumps([job.spec.name, job.spec.entry, job.source_sha256, list(job.spec.grid),
                       list(job.spec.block), *tail], sort_keys=True, default=str)


def choose(results: list[dict], margin: float) -> int | None:
    """The candidate that runs (an index into `results`, the rule's choice first), or None when
    none was timed: the fastest verified one, unless the rule's choice was timed and the fastest
    beats it by no more than `margin` (a brief timing's tie: the rule's choice has the tuner's
    evidence behind it, the brief timing one run)."""
    timed = [i for i, result in enumerate(results) if "gflops" in result]
    if not timed:
        return None
    fastest = max(timed, key=lambda i: results[i]["gflops"])
    if 0 in timed and results[fastest]["gflops"] <= results[0]["gflops"] * (1 + margin):
        return 0
    return fastest


def key(prepared: PreparedJob, dispatcher: str, jobs: list[PreparedJob]) -> dict:
    """What a choice depends on: the GPU (name, driver, runtime), the dispatcher and its
    precision, the shape, whether alpha and beta are zero, and each candidate (its kernel,
    parameters, entry and the SHA-256 of its source)."""
    device = prepared.require_device()
    data = device if isinstance(device, dict) else vars(device)
    problem = prepared.problem
    described = {
        "device": {f: data.get(f) for f in measurement_cache.DEVICE_FIELDS},
        "gpu_spec": prepared.target.gpu_spec_name, "dispatcher": dispatcher,
        "precision": prepared.kernel_cfg.get("precision"),
        "shape": [problem.m, problem.n, problem.k],
        "alpha_zero": problem.alpha == 0.0, "beta_zero": problem.beta == 0.0,
        "candidates": [{"kernel": job.spec.name, "params": _params(job), "entry": job.spec.entry,
                        "source_sha256": job.source_sha256} for job in jobs],
    }
    return json.loads(json.dumps(described, sort_keys=True, default=str))  # canonical


def path_for(cache_dir: Path | str, described: dict) -> Path:
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    return Path(cache_dir) / SUBDIR / f"{digest[:24]}.json"


def _read(path: Path, described: dict) -> dict | None:
    """The kept choice, or None (absent, unreadable, another key's: measure again)."""
    try:
        data = json.loads(path.read_text())
        if data["described"] != described:
            return None
        winner, results = int(data["winner"]), list(data["results"])
        if len(results) != len(described["candidates"]) or not 0 <= winner < len(results):
            return None
        return {"winner": winner, "results": results, "seconds": float(data["seconds"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, described: dict, winner: int, results: list[dict], seconds: float) -> None:
    text = json.dumps({"described": described, "winner": winner, "results": results,
                       "seconds": seconds}, indent=1)
    try:
        write_atomically(path, text)  # a reader never sees half a choice
    except OSError as exc:
        log.warning("dispatch autotune cache: cannot write %s (%s: %s); the next job at this "
                    "shape measures again", path, type(exc).__name__, exc)


def _measure(jobs: list[PreparedJob], brief: BenchProtocol, cache_dir: str) -> list[dict]:
    """Each candidate compiled, verified and timed briefly on the same inputs (the job's shape,
    alpha, beta and seed): {"gflops": ...} or {"error": "status: why"} per candidate. A fault
    ends the job (its CUDA context is gone): LaunchFailed."""
    import cupy as cp

    from src.job.measure import time_candidate
    from src.job.problem import make_inputs
    from src.job.verify import reference

    problem = jobs[0].problem
    inputs = make_inputs(problem, brief.seed)
    results = []
    try:
        ref = reference(problem, inputs)
        for job in jobs:
            try:
                _, median_ms = time_candidate(replace(job, bench=brief), inputs, ref, cache_dir)
                results.append({"gflops": problem.flops / (median_ms * 1e-3) / 1e9})
            except LaunchFailed as exc:
                raise LaunchFailed(f"autotune at {problem.label}: candidate {job.spec.name} "
                                   f"{json.dumps(_params(job), sort_keys=True)} faulted, which "
                                   f"ends the job (its CUDA context is lost): {exc}") from exc
            except LabError as exc:
                first = (str(exc).splitlines() or [""])[0][:300]
                results.append({"error": f"{exc.status}: {first}"})
    finally:
        inputs = ref = None
        cp.get_default_memory_pool().free_all_blocks()
    return results


RULE_SOURCE = "the rule's choice"  # the first candidate's source (`candidates`)
RAN_MARK = "  <- runs"  # ends the record's line of the candidate that ran


def recorded_candidates(lines) -> list[tuple[str, dict, str, float | None]] | None:
    """An autotuned record's `autotune_candidates` (a list, or the runs CSV's JSON of it) read
    back: (kernel, params, the rest of the line, its brief GFLOP/s or None) per line, in order (the
    measured ones, then those left out before measuring); None where a line is not `_line`'s."""
    try:
        lines = json.loads(lines) if isinstance(lines, str) else lines
        parsed = []
        for line in lines if isinstance(lines, list) else []:
            kernel, _, rest = str(line).partition(" ")
            params, end = json.JSONDecoder().raw_decode(rest)
            gflops = re.match(r": ([\d,.]+) GFLOP/s", rest[end:])
            parsed.append((kernel, params, rest[end:], float(gflops[1].replace(",", "")) if gflops else None))
    except ValueError:  # not JSON, or a line without its params
        return None
    return parsed if parsed and all(isinstance(p[1], dict) for p in parsed) else None


def recorded(lines, margin: float) -> tuple[tuple[str, dict], tuple[str, dict]] | None:
    """From an autotuned record's `autotune_candidates`: the rule's choice (kernel, params), named
    first, and the candidate `choose` takes from the recorded brief timings under `margin`
    (today's, for a row measured under another); None where the lines name no rule's choice or
    no candidate was timed. Where the pick is not the rule's choice, a tie at the lines' whole
    GFLOP/s goes to the line marked as run (the runner chose on the unrounded timings)."""
    parsed = recorded_candidates(lines)
    if not parsed or f"({RULE_SOURCE})" not in parsed[0][2]:
        return None
    winner = choose([{} if g is None else {"gflops": g} for *_, g in parsed], margin)
    if winner is None:
        return None
    if winner:  # a tie at the whole GFLOP/s goes to the line that ran
        winner = next((i for i, p in enumerate(parsed)
                       if i and p[2].endswith(RAN_MARK) and p[3] == parsed[winner][3]), winner)
    return parsed[0][:2], parsed[winner][:2]


def _line(job: PreparedJob, candidate: Candidate, result: dict, ran: bool) -> str:
    what = f"{job.spec.name} {json.dumps(_params(job), sort_keys=True)}"
    if "error" in result:
        return f"{what}: left out ({candidate.source}): {result['error']}"
    return f"{what}: {result['gflops']:,.0f} GFLOP/s ({candidate.source})" + (RAN_MARK if ran else "")


def run(prepared: PreparedJob, dispatcher_cfg: dict, settings: Settings, record: Record,
        cache_dir: str, use_tuned: bool = True) -> PreparedJob:
    """The prepared job that runs this dispatching job: the rule's choice (`prepared`) when the
    autotune is off, the shape is covered well or every candidate fails; else the fastest
    verified candidate (kept or measured now). Fills the record's autotune fields."""
    if not settings.enabled or prepared.dispatched is None:
        return prepared
    started = time.perf_counter()
    name = str(dispatcher_cfg["name"])
    gpu_spec = prepared.target.gpu_spec_name
    problem = prepared.problem
    shape = (problem.m, problem.n, problem.k)
    path = Path(settings.evidence) if settings.evidence else training.evidence_path(gpu_spec)
    rows = kept_evidence.rows(path) if path.is_file() else None
    table = kept_evidence.table(path, name) if rows is not None else None
    covered = coverage(prepared.dispatched, name, shape, rows, settings.max_distance, str(path),
                       margin=settings.margin, table=table)
    record.autotune_why = covered.why
    if covered.well:
        record.autotuned = NOT_NEEDED
        return prepared

    # the first `settings.count(name)` that build, each kernel once; the rule's choice is `prepared`
    listed = candidates(prepared.dispatched, dispatcher_cfg, gpu_spec, shape, rows, settings.nearest,
                        settings.variants, table)
    kept: list[tuple[Candidate, PreparedJob]] = [(listed[0], prepared)]
    seen, refused = {_identity(prepared)}, []
    for candidate in listed[1:]:
        if len(kept) >= settings.count(name):
            break
        chapter = {**kernel_config(candidate.kernel), "precision": prepared.kernel_cfg["precision"]}
        try:
            job = prepare_kernel(chapter, problem, prepared.target, prepared.bench,
                                 use_tuned=use_tuned, overrides=candidate.params or None)
        except LabError as exc:
            first = (str(exc).splitlines() or [""])[0][:300]
            refused.append(f"{candidate.kernel} {json.dumps(candidate.params, sort_keys=True)}: "
                           f"left out ({candidate.source}): {exc.status}: {first}")
            continue
        if _identity(job) not in seen:
            seen.add(_identity(job))
            kept.append((candidate, job))
    jobs = [job for _, job in kept]

    described = key(prepared, name, jobs)
    where = path_for(cache_dir, described)
    with entry_held(where, "dispatch autotune cache", "measuring in this job only"):
        found = _read(where, described)
        if found is not None:
            record.autotuned = REUSED
            results, seconds = found["results"], found["seconds"]
            winner = choose(results, settings.margin)  # today's margin over the kept timings
        else:
            record.autotuned = MEASURED
            results = _measure(jobs, brief_protocol(prepared.bench, settings.protocol), cache_dir)
            seconds = time.perf_counter() - started
            winner = choose(results, settings.margin)
            if winner is not None:
                _write(where, described, winner, results, seconds)
    record.autotune_s = seconds
    record.autotune_candidates = [_line(job, candidate, result, i == winner)
                                  for i, ((candidate, job), result) in enumerate(zip(kept, results))
                                  ] + refused
    if winner is None:
        record.autotuned = ALL_FAILED
        record.autotune_why = (f"{covered.why}; every candidate failed (autotune_candidates says "
                               f"why), so the rule's choice runs")
        return prepared
    candidate, job = kept[winner]
    rule = (f"autotune at {problem.label}: the fastest verified of {len(jobs)} candidates "
            f"({candidate.source}; {record.autotuned}); the rule: {prepared.dispatched.rule}")
    return replace(job, bench=prepared.bench, peers=prepared.peers,
                   peers_not_built=prepared.peers_not_built,
                   dispatched=replace(prepared.dispatched, kernel=candidate.kernel,
                                      params=dict(candidate.params), rule=rule))
