"""Per-shape dispatch: `kernel=best_fp32` and `kernel=best_tf32` choose, per problem, the chapter
that runs it, from the GPU's dispatch table (conf/tuned/<gpu>.yaml, `dispatch:`). Rules are data
with a `why`, tried in order; the first whose `when` (over m, n, k) holds names the kernel and,
optionally, parameters over that chapter's own tuned size classes. A shape no rule covers (or a
GPU with no table) runs the first of the dispatching config's `default` kernels that builds there
(portable ones: sm_80 and up); autotune measures the others. The record says which rule chose
what (`dispatch_rule`).

A tuned file may instead name the nearest-neighbour model (written by `sgemm-lab tune` when
conf/tuning/dispatch.yaml's `fit.model` is `nearest`; docs/tuning.md says why):

    nearest:
      evidence: results/tuning/h100_sxm.csv   # the tuner's measurements, read at run time
      count: 4                                # neighbours
      guards: {gemm_ffma_skinny: "min(m, n) <= 32"}   # where a candidate kernel may run

A shape then runs the candidate with the best sum of log ratios to the stronger cuBLAS over its
`count` nearest training shapes in log2(m, n, k), measured at all of them and allowed there by its
guard (src/job/training.nearest_choice); the rules below it hold only where no candidate is.

    dispatch:
      best_fp32:
        - when: "m <= 64 or n <= 64"
          kernel: 22_ffma_warp_specialized
          params: {bm: 64}            # optional
          why: "..."
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

from src.errors import ConfigError, UnsupportedSize
from src.job import gpu as gpu_mod
from src.job import kept_evidence, training
from src.job.config import kernel_config, tuned_config
from src.job.problem import Problem
from src.job.rules import first_rule, when_text
from src.job.spec import KernelSpec, candidate_spec
from src.paths import ROOT

NEAREST = "nearest"   # DispatchChoice.when of a choice the nearest-neighbour model made


@dataclass(frozen=True)
class DispatchChoice:
    kernel: str                                 # the chapter (conf/kernel/<kernel>.yaml) that runs
    params: dict = field(default_factory=dict)  # the rule's parameters over the chapter's tuned ones
    rule: str = ""                              # which rule chose it, and why
    when: str | None = None                     # that rule's `when` (None: no rule held, the default)
    dispatcher: str = ""                        # the dispatching config that chose it (best_fp32, ...)


def is_dispatcher(kernel_cfg: dict) -> bool:
    return bool(kernel_cfg.get("dispatch"))


def rules(kernel_cfg: dict, gpu_spec: str) -> list[dict]:
    """The dispatch rules of a dispatching kernel config on `gpu_spec`, in order (none: [])."""
    return list(((tuned_config(gpu_spec) or {}).get("dispatch") or {}).get(str(kernel_cfg["name"])) or [])


@lru_cache(maxsize=8)
def _sha256(path: str, mtime: float, size: int) -> str:
    return training.evidence_sha256(Path(path))


def _model_number(model: dict, key: str, name: str, where: str, rule: str,
                  most: float = math.inf) -> float:
    """The `nearest:` model's `key` for dispatcher `name`: one number, or a mapping from dispatcher
    to number (the fit's `auto`; a dispatcher not named, like a file without the key: 0), between 0
    and `most`; anything else is a ConfigError naming `rule`."""
    value = model.get(key, 0)
    if isinstance(value, dict):
        value = value.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= most:
        bound = ">= 0" if most == math.inf else f"from 0 to {most:g}"
        raise ConfigError(f"{where}: {key} {value!r} is not a number {bound} (rule: {rule}).")
    return float(value)


def small_side_of(gpu_spec: str, name: str) -> float:
    """The weight the tuned file's nearest model gives the smaller of m and n again in its
    distance for dispatcher `name` (training.distance); 0 where the file has no model."""
    model = (tuned_config(gpu_spec) or {}).get("nearest")
    return _model_number(model, "small_side", name, f"conf/tuned/{gpu_spec}.yaml: nearest",
                         training.SMALL_SIDE_RULE) if model else 0.0


def _model(gpu_spec: str, name: str, problem: Problem):
    """(where, the evidence path as written, its file, runs, the model's settings: a
    training.NearestModel) of the tuned file's `nearest:` model for dispatcher `name`, or None
    where it has none; `runs(candidate, shape)` is the candidate's guard at the problem, the
    model's `fill` its wave fill (`wave_fills`; None where `waves` is 0)."""
    model = (tuned_config(gpu_spec) or {}).get("nearest")
    if not model:
        return None
    where = f"conf/tuned/{gpu_spec}.yaml: nearest"
    evidence = Path(str(model.get("evidence") or ""))
    path = _resolved(evidence)
    if not path.is_file():
        raise ConfigError(f"{where}: evidence {evidence} is not a file (rule: the nearest-neighbour "
                          f"dispatch reads the tuner's evidence, results/tuning/<gpu>.csv, which "
                          f"`sgemm-lab tune` writes beside the tuned file).")
    fitted = model.get("evidence_sha256")  # a file from before the key: not checked
    if fitted:
        stat = path.stat()
        found = _sha256(str(path), stat.st_mtime, stat.st_size)
        if found != str(fitted):
            raise ConfigError(
                f"{where}: evidence {evidence} is not the file this dispatch was fitted from (its "
                f"sha256 is {found[:12]}..., the fit's {str(fitted)[:12]}...) (rule: the "
                f"nearest-neighbour dispatch weighs the neighbours its fit saw; refit with "
                f"`sgemm-lab tune --gpu {gpu_spec} --fit-only`, or restore the evidence the tuned "
                f"file was fitted from, e.g. `git checkout -- {evidence}`).")
    guards = dict(model.get("guards") or {})
    weighting = model.get("weighting", "equal")  # a file from before the key: equal weights
    if isinstance(weighting, dict):  # one per dispatcher (fit.weighting: auto)
        weighting = weighting.get(name, "equal")
    weighting = str(weighting)
    training.weighting_of(weighting, where)
    waves = _model_number(model, "waves", name, where, training.WAVES_RULE)
    cap = training.waves_cap_checked(_model_number(model, "waves_cap", name, where, training.WAVES_CAP_RULE),
                                     f"{where}: waves_cap")
    side = _model_number(model, "small_side", name, where, training.SMALL_SIDE_RULE)
    share = _model_number(model, "caution", name, where, training.CAUTION_RULE,
                          most=1.0)
    regions = model.get("regions") or []
    if isinstance(regions, dict):  # per dispatcher (fit.reserved_sides: auto); one not named: none
        regions = regions.get(name) or []
    if not isinstance(regions, list) or not all(isinstance(r, str) and r for r in regions):
        raise ConfigError(f"{where}: regions {regions!r} is not {training.REGIONS_RULE} (rule: the "
                          f"nearest model keeps the sides of each reserved region apart).")
    names = {"m": problem.m, "n": problem.n, "k": problem.k}

    def runs(candidate, _shape) -> bool:
        guard = guards.get(candidate.kernel)
        return not guard or first_rule([{"when": guard}], names, f"{where}.guards") is not None

    fill = wave_fills(gpu_spec, str(kernel_config(name)["precision"])) if waves else None
    return (where, evidence, path, runs,
            training.NearestModel(int(model.get("count", 4)), weighting, fill,
                                  waves if fill is not None else 0.0, side, share, tuple(regions), cap))


def _ranked(gpu_spec: str, name: str, problem: Problem, tab: training.Table | None = None
            ) -> tuple[list[tuple[training.Candidate, float]], list[tuple[int, int, int]], tuple]:
    """training.nearest_ranked at the problem under the tuned file's model, from `tab` or the
    model's evidence: (the candidates best first, the neighbours, (the table, the model's
    settings)); ([], [], ()) without a model."""
    model = _model(gpu_spec, name, problem)
    if model is None:
        return [], [], ()
    _, _, path, runs, settings = model
    tab = tab if tab is not None else kept_evidence.table(path, name)
    order, near = training.nearest_ranked(tab, (problem.m, problem.n, problem.k), tab.shapes, runs, settings)
    return order, list(near), (tab, settings)


def ranked(gpu_spec: str, name: str, problem: Problem,
           tab: training.Table | None = None) -> list[tuple[training.Candidate, float]]:
    """Every candidate the nearest-neighbour model weighs at the problem, best first, each with
    its weighted geomean ratio over the neighbours (the first is `nearest`'s choice), from `tab`
    or the tuned file's evidence; [] where the file names no model."""
    return _ranked(gpu_spec, name, problem, tab)[0]


def neighbours(gpu_spec: str, name: str, problem: Problem) -> list[tuple[int, int, int]]:
    """The training shapes the nearest-neighbour model weighs at the problem (its count nearest
    on the problem's side of each reserved region, or the problem alone where it is one); []
    where the tuned file names no model."""
    return _ranked(gpu_spec, name, problem)[1]


def weighing(gpu_spec: str, name: str, problem: Problem, precision: str, limits: dict[str, int],
             top: int = 5) -> tuple[list[tuple], list[tuple[int, int, int]]]:
    """How the nearest-neighbour model weighed its first `top` launches at the problem (candidates
    that build one launch there count once, the first of them named): [(candidate, its score,
    how many more build that launch here, training.weighed at each neighbour)], and the
    neighbours; ([], []) without a model. What `sgemm-lab explain` prints."""
    order, near, weighed_by = _ranked(gpu_spec, name, problem)
    if not weighed_by:
        return [], []
    tab, settings = weighed_by
    shape = (problem.m, problem.n, problem.k)
    launches: dict[str, list] = {}
    for candidate, score in order:
        key = launch(candidate, precision, problem, limits) or candidate.label()
        if key in launches:
            launches[key][2] += 1
        elif len(launches) < top:
            launches[key] = [candidate, score, 0, training.weighed(tab, candidate, shape, near, settings)]
    return [tuple(v) for v in launches.values()], near


def evidence_file(gpu_spec: str) -> Path | None:
    """The evidence file the tuned file's `nearest:` model was fitted from (as written there,
    relative to the project root), or None where the file has no model."""
    model = (tuned_config(gpu_spec) or {}).get("nearest")
    return _resolved(model["evidence"]) if model and model.get("evidence") else None


def _resolved(evidence) -> Path:
    path = Path(str(evidence or ""))
    return path if path.is_absolute() else ROOT / path


def builds(candidate: training.Candidate, precision: str, problem: Problem,
           limits: dict[str, int]) -> bool:
    """Whether `candidate` builds at `problem` on a device of `limits`: its constraints and size
    rules hold there. One measured at every neighbour may not: a fitted tile's shared memory
    grows with the shape (gemm_tf32 256-row, 5 stages: 241,744 B at 491x2432x2944 on an H100)."""
    return launch(candidate, precision, problem, limits) is not None


def launch(candidate: training.Candidate, precision: str, problem: Problem,
           limits: dict[str, int]) -> str | None:
    """What `candidate` launches at `problem` on a device of `limits` (KernelSpec.launch_identity:
    two params that build the same are one kernel, the tuner's twins); None where it does not build."""
    spec = candidate_spec({**kernel_config(candidate.kernel), "precision": precision},
                          json.loads(candidate.params), problem, limits)
    return spec.launch_identity() if isinstance(spec, KernelSpec) else None


@lru_cache(maxsize=None)
def _precision_config(kernel: str, precision: str) -> dict:
    return {**kernel_config(kernel), "precision": precision}


@lru_cache(maxsize=None)
def _limits(gpu_spec: str) -> dict[str, int]:
    return gpu_mod.limits_from_spec(gpu_spec)


@lru_cache(maxsize=None)
def _cluster_blocks(gpu_spec: str) -> dict[int, int]:
    return gpu_mod.cluster_blocks(gpu_spec)


@lru_cache(maxsize=300_000)
def _fill(kernel: str, params: str, precision: str, shape: tuple[int, int, int],
          gpu_spec: str) -> float | None:
    limits = _limits(gpu_spec)
    spec = candidate_spec(_precision_config(kernel, precision), json.loads(params),
                          Problem(*shape, 1.0, 1.0), limits)
    if not isinstance(spec, KernelSpec) or not spec.grid:
        return None
    # what clusters of each size place at once, measured at one block an SM
    held = _cluster_blocks(gpu_spec) if spec.resident_ctas == 1 else {}
    tail = (math.prod(spec.tail.grid), spec.tail.slices) if spec.tail else (0, 1)
    return training.wave_fill(math.prod(spec.grid), spec.resident_ctas, limits["sms"], *tail,
                              slots=held.get(spec.cluster), tail_slots=held.get(tail[1]))


def wave_fills(gpu_spec: str, precision: str) -> Callable[[training.Candidate, tuple], float | None] | None:
    """fill(candidate, shape): the share of its launch's rounds of waves the candidate's blocks
    keep busy at that shape on `gpu_spec`'s SMs (training.wave_fill over its grid and
    `launch.resident_ctas`; a training.WaveFill, which also says whether the launch splits its
    tail), None where it does not build there; what the nearest model's `waves` scales a
    neighbour's ratio by. None for a spec without a datasheet (conf/gpu/): no SM count,
    no scaling."""
    if gpu_spec not in gpu_mod.known_specs():
        return None
    return lambda candidate, shape: _fill(candidate.kernel, candidate.params, precision,
                                          tuple(shape), gpu_spec)


def nearest(gpu_spec: str, name: str, problem: Problem, precision: str | None = None,
            limits: dict[str, int] | None = None) -> DispatchChoice | None:
    """The nearest-neighbour model's choice (the tuned file's `nearest:`), or None where the file
    has none, its evidence holds no row of `name`, or no candidate is measured at all the
    neighbours and allowed at the shape. With the device's `limits`, the first candidate in the
    model's order that also builds at the problem (`builds`, in `precision`)."""
    model = _model(gpu_spec, name, problem)
    if model is None:
        return None
    where, evidence, path, runs, settings = model
    tab = kept_evidence.table(path, name)
    shape = (problem.m, problem.n, problem.k)
    order, near = training.nearest_ranked(tab, shape, tab.shapes, runs, settings)
    passed = 0
    for candidate, geomean in order:
        if limits is None or builds(candidate, str(precision), problem, limits):
            break
        passed += 1
    else:
        return None
    if list(near) == [shape]:  # a training shape: its own measurements alone
        why = (f"{where}: a training shape, its best measured in {evidence}: "
               f"{geomean:.3f}x the stronger cuBLAS there")
    else:
        why = (f"{where}: the best of the {len(near)} nearest training shapes "
               f"({', '.join('x'.join(map(str, s)) for s in near)}) in {evidence}: "
               f"{geomean:.3f}x the stronger cuBLAS there (geomean, {settings.weighting} weights"
               + (f", each scaled by its wave fill here against there to the power {settings.waves:g}"
                  + (f", that ratio at most {settings.waves_cap:g}" if settings.waves_cap else "")
                  if settings.waves else "")
               + (f"; the distance counts the smaller of m and n again at {settings.small_side:g}"
                  if settings.small_side else "")
               + (f"; {settings.caution:g} of each score its worst neighbour's"
                  if settings.caution else "")
               + (f"; neighbours on its side of {' and of '.join(settings.regions)}"
                  if settings.regions else "") + ")")
    if passed:
        why += (f"; its #{passed + 1}: the {passed} ranked above it do not build at "
                f"{problem.m}x{problem.n}x{problem.k} (their tile or size rules)")
    allowed = {c.kernel for c in tab.candidates if runs(c, shape)}
    if allowed == {candidate.kernel}:  # a reserved region, or a shape only one kernel may run
        why += f"; {candidate.kernel} is the only candidate kernel the guards allow here"
    return DispatchChoice(candidate.kernel, json.loads(candidate.params), why, NEAREST)


def choose(kernel_cfg: dict, gpu_spec: str, problem: Problem,
           limits: dict[str, int] | None = None) -> DispatchChoice:
    """The chapter a dispatching kernel config (`dispatch: true`, `default: [...]`) runs at
    `problem` on `gpu_spec`; with the device's `limits`, the nearest-neighbour model's first
    choice that builds there (`nearest`)."""
    name = str(kernel_cfg["name"])
    return replace(_choose(kernel_cfg, name, gpu_spec, problem, limits), dispatcher=name)


def _choose(kernel_cfg: dict, name: str, gpu_spec: str, problem: Problem,
            limits: dict[str, int] | None) -> DispatchChoice:
    by_neighbours = nearest(gpu_spec, name, problem, kernel_cfg.get("precision"), limits)
    if by_neighbours is not None:
        return by_neighbours
    rules_here = rules(kernel_cfg, gpu_spec)
    names = {"m": problem.m, "n": problem.n, "k": problem.k}

    def names_a_kernel(index: int, rule: dict) -> None:
        if not rule.get("kernel"):
            raise ConfigError(f"conf/tuned/{gpu_spec}.yaml: dispatch rule {name}[{index}] names "
                              f"no kernel (rule: every dispatch rule has `kernel:`).")

    found = first_rule(rules_here, names, f"conf/tuned/{gpu_spec}.yaml: dispatch rule {name}",
                       check=names_a_kernel)
    if found is not None:
        index, rule = found
        why = str(rule.get("why", "")).strip()
        return DispatchChoice(str(rule["kernel"]), dict(rule.get("params") or {}),
                              f"conf/tuned/{gpu_spec}.yaml: {name}[{index}] (when {when_text(rule)})"
                              + (f": {why}" if why else ""), when_text(rule))
    entries = defaults(kernel_cfg)
    count, shape = len(entries), f"{problem.m}x{problem.n}x{problem.k}"
    if limits is not None:
        precision = str(kernel_cfg.get("precision"))
        built = {e["kernel"]: candidate_spec(_precision_config(e["kernel"], precision), {}, problem, limits)
                 for e in entries}  # its spec, or the rule it breaks here
        fits = [e for e in entries if isinstance(built[e["kernel"]], KernelSpec)]
        if not fits:
            raise UnsupportedSize(
                f"{name} has no kernel for {shape} on this GPU ({gpu_spec}): no dispatch rule holds "
                f"and none of its {count} defaults builds here ("
                + "; ".join(f"{k}: `{rule}`" for k, rule in built.items())
                + ") (rule: a shape no dispatch rule covers runs the first of the dispatcher's "
                  "defaults that builds on the device; cp.async and TF32 need sm_80).")
        entries = fits
    entry = entries[0]  # without the device's limits: the first
    return DispatchChoice(entry["kernel"], {}, f"{name} default (no dispatch rule for "
                          f"{shape} on {gpu_spec}): the first of its "
                          f"{count} that builds here: {entry['why']}")


def defaults(kernel_cfg: dict) -> list[dict]:
    """A dispatching config's `default`: [{kernel, why}] in order, what runs a shape no rule holds
    at (a GPU without a dispatch table: every shape), the first that builds there; autotune
    measures the rest. A bare chapter name is one entry with the config's own `why`."""
    name, raw = str(kernel_cfg["name"]), kernel_cfg.get("default")
    rule = ("rule: a dispatching kernel config names in `default` the kernels that run a shape no "
            "rule covers, each as {kernel, why}")
    if isinstance(raw, str) and raw:
        raw = [{"kernel": raw, "why": kernel_cfg.get("why") or "the dispatcher's one default"}]
    if not raw or not isinstance(raw, (list, tuple)):
        raise ConfigError(f"kernel {name} dispatches per shape but has no `default` ({rule}).")
    entries = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict) or not entry.get("kernel") or not str(entry.get("why") or "").strip():
            raise ConfigError(f"kernel {name}: default[{index}] is {entry!r}, not a kernel with a "
                              f"one-line why ({rule}).")
        entries.append({"kernel": str(entry["kernel"]), "why": str(entry["why"]).strip()})
    return entries
