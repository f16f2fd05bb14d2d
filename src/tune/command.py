"""`sgemm-lab tune`: plan (src/tune/plan.py) -> stage 1's tuning sweeps (every candidate at the
screening shapes) -> the survivors (src/tune/screen.py) -> stage 2's sweeps (the survivors at the
other shapes); each sweep one `python -m src.run -m +tune=<kernel> shape=...` (every GPU of the
node, cached, resumable: a re-run takes stage 1 from the cache, so the same survivors) -> the
evidence file
results/tuning/<gpu>.csv (src/tune/evidence.py) -> the fitted dispatch in conf/tuned/<gpu>.yaml
(src/tune/refit.py). `--fit-only` re-fits from an existing evidence file, no GPU needed;
`--against OTHER.csv` says whether another run's evidence fits the same choices (within noise).

    sgemm-lab tune [--gpu SPEC] [--shapes N] [--budget SECONDS] [--protocol quick] [--dry-run]
    sgemm-lab tune --kernels gemm_tf32,gemm_3xtf32   # measure these again, keep the others' rows
    sgemm-lab tune --missing                         # measure only what the evidence lacks
    sgemm-lab tune --missing --kernels gemm_ffma_skinny   # ... of these candidates only
    sgemm-lab tune --carry-over REV                  # REV's rows where today's builds the same
    sgemm-lab tune --gpu h100_sxm --missing --screen-from h200   # another GPU's evidence screens
    sgemm-lab tune --fit-only --gpu h100_sxm
    sgemm-lab tune --gpu h100_sxm --against earlier.csv      # exit 1 if a choice differs
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from src.errors import ConfigError, LabError
from src.job.training import evidence_path, read as read_evidence
from src.paths import ROOT
from src.tune.partial import kept_evidence, missing_evidence, named
from src.tune.refit import compare, guards, refit
from src.tune.sweeps import parts, run_sweeps, sigterm_as_interrupt

SWEEP_DIR = ROOT / "sweeps" / "tuning"


def detected_spec() -> str:
    from src.job import gpu as gpu_mod

    device = gpu_mod.detect()  # NoGPU with its message
    spec = gpu_mod.spec_for_device_name(device.name)
    if spec is None:
        raise ConfigError(f"no conf/gpu/ spec matches the device {device.name!r} (rule: the tuner "
                          f"writes conf/tuned/<spec>.yaml for a known spec); pass --gpu SPEC.")
    return spec.name


def visible_gpus() -> int:
    from src.job.devices import sweep_gpus

    try:
        return max(1, len(sweep_gpus()))
    except Exception:  # no NVML here: the estimate assumes one
        return 1


def carry_over(gpu_spec: str, settings: dict, csv_path: Path, rev: str,
               tuned_path: Path | None = None) -> int:
    """`--carry-over REV`: the evidence rows of REV's sources that hold for today's carried over
    (src/tune/carry.py), the file rewritten and the dispatch re-fitted from it."""
    from src.job.training import read
    from src.tune import carry, evidence

    if not csv_path.is_file():
        raise ConfigError(f"--carry-over rewrites the evidence file {csv_path}, which does not "
                          f"exist (rule: it carries measured rows over a source change).")
    import os

    from src.job.compile import DEFAULT_CACHE_DIR

    cache_dir = Path(os.environ.get("SGEMM_LAB_CACHE") or ROOT / DEFAULT_CACHE_DIR).resolve()
    rows, report = carry.carry_over(read(csv_path), rev, gpu_spec, ROOT, cache_dir)
    for kernel, (carried, left) in sorted(report.items()):
        print(f"{kernel}: {carried} rows carried over to today's source (the same code and launch "
              f"at their shape), {left} left to be measured again", flush=True)
    if not report:
        print(f"every row of {csv_path} is of today's sources: nothing to carry over")
        return 0
    evidence.write(rows, csv_path)
    dispatch = refit(gpu_spec, settings, csv_path, tuned_path)
    print(f"fitted {sum(len(r) for r in dispatch.values())} rules from {csv_path}")
    return 0


def rows_of(sweeps, sweep_dir: Path, gpu_spec: str, settings: dict,
            kept: list[dict] = ()) -> list[dict]:
    from src.tune import evidence

    return [r for s in sweeps for r in evidence.sweep_rows(s, sweep_dir, gpu_spec, settings, kept)]


def screened(plan, settings: dict, rows: list[dict], only: set[str] | None = None,
             rescreen: bool = False):
    """The plan with stage 2 made of the survivors of the stage-1 `rows`, and (`rescreen`: stage
    2 has run) stage 3 of the second screen's over the stage-1 and -2 rows (the sweeps of `only`
    alone, in a partial re-tune)."""
    from src.tune import plan as plan_mod
    from src.tune import screen

    g = guards(settings)
    survivors = screen.survivors([r for r in rows if r["stage"] == 1], settings, g)
    again = screen.rescreened(rows, settings, g, survivors) if rescreen else None
    full = plan_mod.build(plan.gpu_spec, plan.shapes, settings, survivors, plan.held, again)
    return full if only is None else full.only(only)


def screen_done(plan, sweep_dir: Path, max_jobs: int | None = None) -> bool:
    """Whether the sweep directory holds a record of every stage-1 job (a finished screen)."""
    from src.records.record import load_records

    return bool(plan.rest) and all(
        not s.jobs or (sweep_dir / s.name).is_dir() and len(load_records(sweep_dir / s.name)) >= s.jobs
        for s in parts(plan.sweeps, max_jobs))


def cluster_check(gpu_spec: str) -> None:
    """Say whether this card's clusters place what `gpu_spec`'s datasheet says (src/job/clusters.py:
    the wave fill counts that figure), in a process of its own, so that this one holds no CUDA
    context while the sweeps run. Only where a driver is; it never stops the tune."""
    from src.job import gpu as gpu_mod

    if not gpu_mod.driver_loadable():
        return
    proc = subprocess.run([sys.executable, "-m", "src.job.clusters", gpu_spec], cwd=ROOT,
                          capture_output=True, text=True)
    print((proc.stdout + proc.stderr).strip(), flush=True)


def measure(plan, settings: dict, args, gpu_spec: str, csv_path: Path, kept: list[dict],
            only: set[str] | None, per_job: float, gpus: int) -> int:
    """Both stages' sweeps (stage 2 from the screen of stage 1's rows and the kept ones), the
    evidence (kept rows + measured ones) and the fit; 1 if a sweep failed."""
    from src.tune import evidence

    earlier = read_evidence(csv_path) if csv_path.is_file() else []
    rows: list[dict] = []

    def run(sweeps) -> int:
        """Each sweep, then the evidence so far saved (evidence.merged: the earlier file's rows
        with the new ones in place), so that a run cut short loses no finished sweep, nor the
        finished jobs of the sweep it cut (an interrupted job writes no record), and `--missing`
        resumes it."""
        failed = 0
        for sweep in parts(sweeps, settings.get("sweep_max_jobs")):
            try:
                failed += run_sweeps([sweep], settings, args.sweep_dir, args.overrides, gpu_spec)
            except KeyboardInterrupt:  # Ctrl-C, a time limit's SIGINT, SIGTERM (sigterm_as_interrupt)
                print(f"\n{sweep.name} cut short: the jobs it finished go into {csv_path} "
                      f"(`--missing` measures the rest)", flush=True)
                raise
            finally:
                rows.extend(rows_of([sweep], args.sweep_dir, gpu_spec, settings, kept))
                if sweep.jobs:
                    evidence.write(evidence.merged(earlier, rows), csv_path)
        return failed

    cluster_check(gpu_spec)
    print(plan.describe(per_job, gpus), flush=True)
    started = time.perf_counter()
    failed = run(plan.sweeps)
    seconds = [time.perf_counter() - started]
    if plan.rest:
        plan = screened(plan, settings, rows + kept, only)
        print("after the screen:\n" + plan.describe(per_job, gpus), flush=True)
        started = time.perf_counter()
        failed += run(plan.stage2)
        seconds.append(time.perf_counter() - started)
    if plan.added:
        plan = screened(plan, settings, rows + kept, only, rescreen=True)
        print("after the second screen:\n" + plan.describe(per_job, gpus), flush=True)
        started = time.perf_counter()
        failed += run(plan.stage3)
        seconds.append(time.perf_counter() - started)
    evidence.write(kept + rows, csv_path)
    print(f"{len(kept) + len(rows)} rows -> {csv_path}"
          + (f" ({len(kept)} kept from the earlier run)" if kept else ""))
    # the wall time a reader asks for ("how long on 1, 2, 4 GPUs"), said by the command itself
    cached = sum(1 for r in rows if r.get("from_cache"))
    print(f"tuning sweeps: {' + '.join(f'{s:.0f} s' for s in seconds)} (stages "
          f"{', '.join(str(i + 1) for i in range(len(seconds)))}) on {gpus} GPU(s); {len(rows)} rows, "
          f"{cached} of them from the measurement cache", flush=True)
    if args.no_fit:  # the GPU box measures; the fit (minutes of CPU) runs anywhere, later
        print(f"--no-fit: {args.tuned or 'conf/tuned/' + gpu_spec + '.yaml'} is not refitted, and "
              f"its dispatch refuses the new evidence until `sgemm-lab tune --gpu {gpu_spec} "
              f"--fit-only` (no GPU) has run")
        return 1 if failed else 0
    dispatch = refit(gpu_spec, settings, csv_path, args.tuned)
    print(f"fitted {sum(len(r) for r in dispatch.values())} rules -> "
          f"{args.tuned or 'conf/tuned/' + gpu_spec + '.yaml'}")
    return 1 if failed else 0


def screen_from(source: str | None, gpu_spec: str, settings: dict, shapes) -> tuple[str, dict] | None:
    """`--screen-from SOURCE`: (the prior GPU, its wanted lists at `shapes`) for plan.build, or
    None without the flag (src/tune/prior.py; its ConfigError names the rule)."""
    if source is None:
        return None
    from src.tune import prior

    gpu, rows = prior.evidence_of(source, gpu_spec)
    within, neighbours = prior.settings_of(settings)
    return gpu, prior.wanted(rows, [s.dims for s in shapes], within, neighbours)


def positive(kind):
    """argparse's type for a count or a time: `kind` of the text, refused unless above 0."""
    def parsed(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {kind.__name__} "
                                             f"(rule: a tune measures at least one shape)")
        return value
    parsed.__name__ = f"positive {kind.__name__}"
    return parsed


def arguments() -> argparse.ArgumentParser:
    """`sgemm-lab tune`'s command line."""
    parser = argparse.ArgumentParser(prog="sgemm-lab tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", help="the GPU spec (default: the detected device's)")
    parser.add_argument("--shapes", type=positive(int), default=None,
                        help="the first N training shapes, round-robin over their classes")
    parser.add_argument("--budget", type=positive(float), default=None,
                        help="seconds of wall time: fewer shapes until the estimate fits")
    parser.add_argument("--protocol", default=None, help="conf/bench/ file (default: the plan's)")
    parser.add_argument("--fit-only", action="store_true", help="re-fit from the evidence file")
    parser.add_argument("--csv", type=Path, default=None, help="the evidence file (default "
                        "results/tuning/<gpu>.csv)")
    parser.add_argument("--tuned", type=Path, default=None,
                        help="where the fitted dispatch goes (default conf/tuned/<gpu>.yaml)")
    parser.add_argument("--sweep-dir", type=Path, default=SWEEP_DIR)
    parser.add_argument("--kernels", default=None,
                        help="comma list of candidates to measure again; the other candidates' "
                             "rows are kept from the evidence file (their sources unchanged); "
                             "with --missing: only these candidates' missing jobs")
    parser.add_argument("--carry-over", metavar="REV", default=None,
                        help="carry the evidence rows measured from REV's kernel sources over to "
                             "today's where each candidate builds the same code and launch; re-fit")
    parser.add_argument("--missing", action="store_true",
                        help="measure only what the evidence file lacks: its rows of today's "
                             "sources are kept, the plan's other candidates measured")
    parser.add_argument("--screen-from", metavar="GPU", default=None,
                        help="another GPU's evidence (its spec, or an evidence file) screens instead "
                             "of a screen of this GPU's own: at each shape only the candidates close "
                             "to its best there or at the nearest shapes (conf/tuning/dispatch.yaml "
                             "`prior`); same compute capability")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--no-fit", action="store_true",
                        help="measure and write the evidence, leave the fit to --fit-only")
    parser.add_argument("--against", type=Path, default=None,
                        help="another run's evidence: do both fit the same choices? (no GPU)")
    parser.add_argument("overrides", nargs="*", help="more overrides for every sweep (after --)")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse_args(argv)
    from src.job.gpu import known_specs
    from src.tune import budget, distribution, evidence, plan as plan_mod, prefill, gpu_regions

    try:
        if args.no_fit and (args.fit_only or args.carry_over or args.against is not None):
            raise ConfigError("--no-fit measures and leaves the fit out; --fit-only, --carry-over "
                              "and --against measure nothing (rule: --no-fit goes with a tune "
                              "that measures, e.g. --missing); drop one of them.")
        gpu_spec = args.gpu or detected_spec()
        settings = gpu_regions.on_gpu(plan_mod.load_settings(), gpu_spec)  # the regions this GPU keeps
        if args.protocol:
            settings["protocol"] = args.protocol
        csv_path = args.csv or evidence_path(gpu_spec)
        if args.against is not None:
            return compare(gpu_spec, settings, csv_path, args.against)
        if args.carry_over:
            return carry_over(gpu_spec, settings, csv_path, args.carry_over, args.tuned)
        if args.fit_only:
            if not csv_path.is_file():
                raise ConfigError(f"--fit-only needs the evidence file {csv_path}; run "
                                  f"`sgemm-lab tune` on a {gpu_spec} first.")
            dispatch = refit(gpu_spec, settings, csv_path, args.tuned)
            print(f"fitted {sum(len(r) for r in dispatch.values())} rules from {csv_path}")
            return 0
        if gpu_spec not in known_specs():  # a plan needs the card's limits (a fit reads files only)
            raise ConfigError(f"--gpu {gpu_spec}: no such GPU spec in conf/gpu/ (rule: the tuner "
                              f"measures on a named spec's limits and writes conf/tuned/<spec>.yaml; "
                              f"known: {', '.join(sorted(known_specs()))}); add conf/gpu/{gpu_spec}.yaml "
                              f"from the card's datasheet, or name one of them.")
        gpus = visible_gpus()
        per_job = float(settings["seconds_per_job"].get(settings["protocol"], 4.0))
        prefill.for_plan(gpu_spec, settings, args.shapes)  # the plan's verdicts, on every core
        plan = budget.within_budget(gpu_spec, distribution.training(), args.budget,
                                    args.shapes, per_job, gpus, settings)
        prior = screen_from(args.screen_from, gpu_spec, settings, plan.shapes)
        if prior is not None:
            plan = plan_mod.build(gpu_spec, plan.shapes, settings, prior=prior)
        only, kept = None, []
        if args.kernels is not None:
            only = named(settings, args.kernels)
        if args.missing:  # the evidence's rows stay; the plan measures what they do not hold
            kept, stale = missing_evidence(plan, settings, csv_path, only)
            plan = plan_mod.build(gpu_spec, plan.shapes, settings, held=evidence.held_pairs(kept),
                                  prior=prior)
            print(f"keeping {len(kept)} rows of today's sources from {csv_path}"
                  + "".join(f"; {n} rows of {k} are of another source, measured again"
                            for k, n in sorted(stale.items())), flush=True)
        elif only is not None:  # a partial re-tune: the others' rows from the evidence
            kept = kept_evidence(plan, settings, csv_path, only)
            print(f"keeping {len(kept)} rows of the other candidates from {csv_path}", flush=True)
        if only is not None:  # --kernels (with --missing: only those candidates' missing jobs)
            plan = plan.only(only)
        if args.dry_run:
            if screen_done(plan, args.sweep_dir, cap := settings.get("sweep_max_jobs")):  # stage 2 known
                rows = rows_of(parts(plan.sweeps, cap), args.sweep_dir, gpu_spec, settings, kept)
                plan = screened(plan, settings, rows + kept, only,
                                rescreen=any(r["stage"] == 2 for r in kept))
            print(plan.describe(per_job, gpus), flush=True)
            return 0
        with sigterm_as_interrupt():  # SLURM's SIGTERM keeps the cut sweep's jobs, as Ctrl-C does
            return measure(plan, settings, args, gpu_spec, csv_path, kept, only, per_job, gpus)
    except LabError as exc:
        print(f"error [{exc.status}]: {exc}", file=sys.stderr)
        return 1
