"""Tuning plan: what `sgemm-lab tune` measures on one GPU spec, found on the CPU before any job
runs. Per dispatching kernel (conf/tuning/dispatch.yaml), each candidate kernel's grid
(conf/tune/<kernel>.yaml) at the training shapes (conf/suite/training.yaml) where its rules let
at least one candidate build; the FFMA fallback's grid only at shapes no candidate can run.

Stages (`screen:` in the settings): stage 1 measures every candidate at the screening shapes
(the first few of the round-robin order over the shape classes); stage 2 measures at the other
shapes only the survivors (src/tune/screen.py: within a margin of the best at some screening shape
of the same dispatcher), the whole grids at a shape where no survivor builds, and the fallback
where no candidate builds; stage 3 measures `training.added`'s draws the same way with the
survivors of a second screen over stages 1 and 2 (screen.rescreened). Before a screen has run,
the stage after it is planned as if every candidate survived: an upper bound. The counts are exact (the constraints and "measured once" pruning of
src/tune/space.py), so `--budget` can cut the training shapes (round-robin over their classes)
until the bound fits. Each sweep is the ordinary tuning sweeper (`python -m src.run -m
+tune=<kernel> shape=...`): it spreads over every GPU (hydra/launcher=gpus), reuses cached
measurements (resume=true), and prunes by the same rules.
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
from src.tune import distribution, gpu_regions
from src.tune.fit import conjunction, holds
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
    shapes: list = field(default_factory=list)       # distribution.Shape: those with jobs to run
    covered: list = field(default_factory=list)      # every shape where a candidate builds (held ones too)
    skipped: Counter = field(default_factory=Counter)  # shapes where nothing builds, per rule
    fallback: bool = False
    stage: int = 1
    candidates: list[dict] | None = None             # stage 2's or 3's survivors (None: the whole grid)
    tag: str = ""                                    # tells a stage's sweeps of one kernel apart
    held: dict[str, list[str]] = field(default_factory=dict)  # {shape: params keys} the evidence holds: not measured
    jobs_at: dict[str, int] = field(default_factory=dict)    # {shape: candidates to measure there}, of `shapes`

    @property
    def jobs(self) -> int:
        """Candidates to measure, summed over its shapes."""
        return sum(self.jobs_at.values())

    @property
    def name(self) -> str:
        return f"{self.dispatcher}_{self.kernel}{self.tag}"

    def candidate_list(self) -> list[dict]:
        """What the sweep measures at each of its shapes, before the constraints prune."""
        return list(self.candidates) if self.candidates is not None else tune.grid(self.space)

    def file(self, sweep_dir: Path, what: str) -> Path:
        """Where the sweep's `what` ("held" pairs, the listed "candidates") is written for its
        tuning sweeper (`tune.held`, `tune.candidates_file`)."""
        return sweep_dir / f"{self.name}.{what}.json"

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
        if self.candidates is not None:
            args.append(f"++tune.candidates_file={self.file(sweep_dir, 'candidates')}")
        if self.held:
            args.append(f"++tune.held={self.file(sweep_dir, 'held')}")
        return args + list(extra)


@dataclass
class Plan:
    gpu_spec: str
    sweeps: list[Sweep]   # stage 1: every candidate at the screening shapes
    shapes: list          # the training shapes planned
    rest: list = field(default_factory=list)        # stage 2's shapes (none: one stage)
    stage2: list[Sweep] = field(default_factory=list)
    screened: bool = False  # stage 2 holds the survivors (False: the upper bound, all survive)
    region: dict = field(default_factory=dict)  # {kernel: stage-2 shapes it is screened at too}
    held: dict | None = None  # {(dispatcher, kernel): {shape: params keys}}: pairs the evidence holds (--missing)
    added: list = field(default_factory=list)       # stage 3's shapes: `training.added`'s draws
    stage3: list[Sweep] = field(default_factory=list)
    rescreened: bool = False  # stage 3 holds the second screen's survivors (False: an upper bound)
    prior: str | None = None  # the GPU whose evidence screened (src/tune/prior.py): one stage, no screen of its own

    @property
    def jobs(self) -> int:
        """Every stage's jobs (a stage after a screen not yet run: its upper bound)."""
        return sum(s.jobs for s in self.sweeps + self.stage2 + self.stage3)

    def only(self, kernels: set[str]) -> "Plan":
        """The plan with the sweeps of `kernels` alone (a partial re-tune: the other candidates'
        rows come from the evidence file)."""
        return Plan(self.gpu_spec, [s for s in self.sweeps if s.kernel in kernels], self.shapes,
                    self.rest, [s for s in self.stage2 if s.kernel in kernels], self.screened,
                    self.region, self.held, self.added,
                    [s for s in self.stage3 if s.kernel in kernels], self.rescreened, self.prior)

    def describe(self, seconds_per_job: float, gpus: int) -> str:
        bound = "" if (self.screened or not self.rest) and (self.rescreened or not self.added) else "at most "
        lines = [f"tuning plan for {self.gpu_spec}: {len(self.shapes)} training shapes, "
                 f"{bound}{self.jobs} jobs, about {self.jobs * seconds_per_job / max(gpus, 1) / 60:.0f} "
                 f"min on {gpus} GPU(s) ({seconds_per_job:g} s a job)"]
        if self.prior:
            lines.append(f" screened by {self.prior}'s evidence (--screen-from): at each shape the "
                         f"candidates close to its best there or at the nearest shapes, one stage")
        if self.held is not None:
            pairs = sum(len(v) for by_shape in self.held.values() for v in by_shape.values())
            lines.append(f" the evidence file holds {pairs} candidates at their shapes (today's "
                         f"sources): the jobs below leave them out")
        if self.rest:
            lines.append(f" stage 1 (screen): {len(self.shapes) - len(self.rest) - len(self.added)} shapes, "
                         f"{sum(s.jobs for s in self.sweeps)} jobs, every candidate"
                         + "".join(f"; {k} at {len(v)} more of its own"
                                   for k, v in sorted(self.region.items())))
        lines += self._sweep_lines(self.sweeps)
        for shapes, sweeps, head, which in (
                (self.rest, self.stage2, "stage 2: {} shapes", "the survivors of the screen"
                 if self.screened else "at most: every candidate, until the screen has run"),
                (self.added, self.stage3, "stage 3: {} added shapes", "the survivors of the second "
                 "screen" if self.rescreened else "at most: stage 2's candidates, until stages 1 "
                 "and 2 have run")):
            if shapes:
                lines.append(f" {head.format(len(shapes))}, {sum(s.jobs for s in sweeps)} jobs ({which})")
                lines += self._sweep_lines(sweeps)
        return "\n".join(lines)

    @staticmethod
    def _sweep_lines(sweeps) -> list[str]:
        lines = []
        for s in sweeps:
            if not s.jobs:  # every candidate held by the evidence: nothing to run
                continue
            skipped = "; ".join(f"{n} shapes: {rule}" for rule, n in s.skipped.most_common())
            listed = f" of {len(s.candidates)} listed" if s.candidates is not None else ""
            lines.append(f"  {s.name:<38} {len(s.shapes):>4} shapes {s.jobs:>6} jobs{listed}"
                         + (f"  (pruned whole: {skipped})" if skipped else ""))
        return lines


def dispatch_candidates(settings: dict) -> set[str]:
    """The kernels the dispatchers choose among (conf/tuning/dispatch.yaml `dispatchers`)."""
    return {k for d in settings["dispatchers"].values() for k in d["candidates"]}


def reserved(settings: dict) -> dict[str, str]:
    """{kernel: the `when` of the shape region it holds} (conf/tuning/dispatch.yaml `reserved`):
    there no other candidate is measured or chosen. The owner must be a candidate."""
    kernels = dispatch_candidates(settings)
    out = {}
    for owner, region in (settings.get("reserved") or {}).items():
        if owner not in kernels or not isinstance(region, dict) or not region.get("when"):
            raise ConfigError(f"conf/tuning/dispatch.yaml: reserved.{owner} must be a candidate of a "
                              f"dispatcher with a `when` (rule: a reserved region is a shape region "
                              f"one candidate holds, the others measured and chosen outside it).")
        out[owner] = str(region["when"])
    return out


def measured_where(settings: dict, outside_reserved: bool = True) -> dict[str, str]:
    """{kernel: the `when` of the shapes it is measured at} (conf/tuning/dispatch.yaml): its own
    `measured_where`, and (`outside_reserved`) outside every region another candidate holds."""
    where = {k: str(v["when"]) for k, v in (settings.get("measured_where") or {}).items()}
    if not outside_reserved:
        return where
    kernels = dispatch_candidates(settings)
    for owner, region in reserved(settings).items():
        for kernel in sorted(kernels - {owner}):
            where[kernel] = conjunction([f"not ({region})"] + ([where[kernel]] if kernel in where else []))
    return where


def candidate_config(kernel: str, precision: str) -> dict:
    """The kernel's config as a sweep of it composes it, in the dispatcher's precision."""
    from src.job.config import kernel_config

    return {**kernel_config(kernel), "precision": precision}


def _sweep(dispatcher: str, precision: str, kernel: str, space: dict, shapes, limits: dict,
           settings: dict, fallback: bool = False, stage: int = 1,
           candidates: list[dict] | None = None, tag: str = "",
           held: dict | None = None, wanted: dict | None = None) -> tuple[Sweep, set]:
    """The sweep of `kernel` over `shapes` and the dims where a candidate of it builds; `held`
    ({(dispatcher, kernel): {shape: params keys}}): pairs the evidence holds, left out of its
    jobs (a shape where every candidate is held has no job but stays `covered`: the evidence
    gives its same_as rows there); `wanted` ({shape: params keys}, src/tune/prior.wanted): a
    launch none of whose candidates is wanted at a shape is not measured there either."""
    cfg = candidate_config(kernel, precision)
    sweep = Sweep(dispatcher, precision, kernel, space, fallback=fallback, stage=stage,
                  candidates=candidates, tag=tag)
    listed = sweep.candidate_list()
    runnable = set()
    where = measured_where(settings).get(kernel)
    mine = (held or {}).get((dispatcher, kernel), {})
    pruner = tune.Pruner(cfg, listed, limits)  # kept verdicts: the plan is rebuilt in one run
    for shape in shapes:
        if where and not holds(where, shape.dims):
            sweep.skipped[f"measured_where: {where}"] += 1
            continue
        outline = pruner.at(Problem(*shape.dims, settings["alpha"], settings["beta"]))
        if outline.valid:
            runnable.add(shape.dims)
            sweep.covered.append(shape)
            # held when any candidate of the launch is (a grown axis lists a new value first)
            there = mine.get(shape.label, set())
            asked = None if wanted is None else wanted.get(shape.label, set())
            held_here = sorted(first for first, keys in pruner.launches(outline).items()
                               if not there.isdisjoint(keys) or asked is not None and asked.isdisjoint(keys))
            if len(held_here) < len(outline.valid):
                sweep.shapes.append(shape)
                sweep.jobs_at[shape.label] = len(outline.valid) - len(held_here)
                if held_here:
                    sweep.held[shape.label] = held_here
        else:
            sweep.skipped[outline.pruned.most_common(1)[0][0]] += 1
    return sweep, runnable


def _stage(shapes, limits: dict, settings: dict, stage: int,
           survivors: dict | None = None, screened_at: dict | None = None,
           held: dict | None = None, prior: dict | None = None) -> list[Sweep]:
    """One stage's sweeps over `shapes`. Stage 1 and an unscreened stage 2 or 3 (survivors None):
    every candidate kernel's whole grid, the fallback where none builds. A screened stage: each
    kernel's survivors (in grid order), the whole grids at shapes where no survivor builds, then
    the fallback where no candidate builds; a kernel not again at the shapes stage 1 screened it
    at (`screened_at`: {kernel: their dims}, its region screen: region_screens). With `prior`
    (src/tune/prior.wanted), each grid at each shape only where a launch is wanted there."""
    tag = "_prior" if prior is not None else "" if stage == 1 else f"_stage{stage}"
    sweeps = []

    def unscreened(kernel: str, among: list) -> list:
        done = (screened_at or {}).get(kernel, set())
        return [s for s in among if s.dims not in done]

    for dispatcher, entry in settings["dispatchers"].items():
        precision = entry["precision"]
        covered: set = set()
        if survivors is not None:
            for kernel in entry["candidates"]:
                space = kernel_space(kernel)
                keep = survivors.get((dispatcher, kernel), set())
                listed = [p for p in tune.grid(space) if tune.params_key(p) in keep]
                if not listed:
                    continue
                sweep, runnable = _sweep(dispatcher, precision, kernel, space,
                                         unscreened(kernel, shapes), limits, settings,
                                         stage=stage, candidates=listed, tag=tag, held=held)
                covered |= runnable
                if sweep.covered:
                    sweeps.append(sweep)
        whole_tag = tag + ("_all" if survivors is not None else "")
        rest = [s for s in shapes if s.dims not in covered]
        for kernel in entry["candidates"]:
            if not rest:
                break
            sweep, runnable = _sweep(dispatcher, precision, kernel, kernel_space(kernel),
                                     unscreened(kernel, rest), limits, settings, stage=stage,
                                     tag=whole_tag, held=held, wanted=None if prior is None else
                                     prior.get((dispatcher, kernel), {}))
            covered |= runnable
            if sweep.covered:
                sweeps.append(sweep)
        rest = [s for s in shapes if s.dims not in covered]
        fallback = settings.get("fallback")
        if rest and fallback:
            sweep, _ = _sweep(dispatcher, precision, fallback["kernel"],
                              {k: list(v) for k, v in fallback["space"].items()}, rest, limits,
                              settings, fallback=True, stage=stage, tag=tag, held=held)
            if sweep.covered:
                sweeps.append(sweep)
    return sweeps


def screening(shapes, settings: dict) -> tuple[list, list]:
    """(stage 1's shapes, stage 2's): the first `screen.shapes` of the round-robin order over the
    shape classes, and the others in their planned order; all in stage 1 without `screen`."""
    count = (settings.get("screen") or {}).get("shapes")
    if count is None or count >= len(shapes):
        return list(shapes), []
    screen = distribution.stratified(list(shapes), int(count))
    picked = {s.dims for s in screen}
    return screen, [s for s in shapes if s.dims not in picked]


def build(gpu_spec: str, shapes, settings: dict | None = None,
          survivors: dict | None = None, held: dict | None = None,
          rescreened: dict | None = None, prior: tuple[str, dict] | None = None) -> Plan:
    """The sweeps for `shapes` on `gpu_spec` (its datasheet limits decide what builds), in stages
    where the settings screen; stage 2 from `survivors` ({(dispatcher, kernel): params keys},
    src/tune/screen.py), stage 3 (the added draws) from `rescreened`, each an upper bound while
    its screen has not run (stage 3's: stage 2's candidates). `held`
    ({(dispatcher, kernel): {shape: params keys}}, evidence.held_pairs): what the evidence file holds
    already, planned but not measured again (`sgemm-lab tune --missing`). `prior` (GPU, wanted:
    src/tune/prior.py): one stage at every shape, its rows stage 2 (survivors of that screen)."""
    from src.job.gpu import limits_from_spec

    settings = gpu_regions.on_gpu(settings or load_settings(), gpu_spec)
    limits = limits_from_spec(gpu_spec)
    if prior is not None:
        return Plan(gpu_spec, _stage(list(shapes), limits, settings, 2, held=held, prior=prior[1]),
                    list(shapes), held=held, prior=prior[0])
    screens = (settings.get("screen") or {}).get("shapes") is not None  # else one stage, added too
    added = [s for s in shapes if s.added] if screens else []
    screen, rest = screening([s for s in shapes if s not in added], settings)
    first = _stage(screen, limits, settings, 1, held=held)
    region = region_screens(screen, rest, limits, settings)
    for kernel, extra in region.items():
        for dispatcher, entry in settings["dispatchers"].items():
            if kernel in entry["candidates"]:
                sweep, _ = _sweep(dispatcher, entry["precision"], kernel, kernel_space(kernel),
                                  extra, limits, settings, stage=1, tag="_region", held=held)
                if sweep.covered:
                    first.append(sweep)
    screened_at = {k: {s.dims for s in v} for k, v in region.items()}
    second = _stage(rest, limits, settings, 2, survivors, screened_at, held) if rest else []
    third = _stage(added, limits, settings, 3, survivors if rescreened is None else rescreened,
                   screened_at, held) if added else []
    return Plan(gpu_spec, first, list(shapes), rest, second, screened=survivors is not None,
                region=region, held=held, added=added, stage3=third,
                rescreened=rescreened is not None)


def region_screens(screen, rest, limits: dict, settings: dict) -> dict[str, list]:
    """{kernel: stage-2 shapes stage 1 measures it at as well}: a kernel `screen.region_shapes`
    names ({kernel: count}) is screened at `count` shapes of its own `measured_where` region at
    least; where the screening shapes hold fewer, the first of its region's stage-2 shapes (in
    planned order) where something of its grid builds make up the count. Its survivors are then
    its best tiles where it was made to win, not none (a region the screen misses)."""
    counts = (settings.get("screen") or {}).get("region_shapes") or {}
    where = measured_where(settings)
    out = {}
    for kernel, count in sorted(counts.items()):
        entry = next((e for e in settings["dispatchers"].values() if kernel in e["candidates"]),
                     None)
        if entry is None:
            raise ConfigError(f"conf/tuning/dispatch.yaml: screen.region_shapes names {kernel}, "
                              f"which no dispatcher's candidates list (rule: a region screen "
                              f"measures a candidate of the dispatch).")
        rule = where.get(kernel)
        held = sum(1 for s in screen if rule is None or holds(rule, s.dims))
        need = int(count) - held
        if need <= 0:
            continue
        sweep, _ = _sweep("", entry["precision"], kernel, kernel_space(kernel), rest, limits,
                          settings)
        if sweep.shapes:
            out[kernel] = sweep.shapes[:need]
    return out
