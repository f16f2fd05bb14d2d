"""Evidence -> dispatch: results/tuning/<gpu>.csv fitted under conf/tuning/dispatch.yaml into
conf/tuned/<gpu>.yaml (every `auto` of the nearest model resolved from its leave-one-out
figures, src/tune/judge.py; the rules and the model, src/tune/fit.py), then how the fit
cross-validates, printed; and whether two runs' evidence fits the same choices (`--against`).
What `sgemm-lab tune` does after measuring, and all that `--fit-only` does (no GPU)."""

from __future__ import annotations

from pathlib import Path

from src.errors import ConfigError
from src.paths import ROOT
from src.tune.partial import candidates


def guards(settings: dict, outside_reserved: bool = True) -> dict[str, str | None]:
    """{kernel: where it may be chosen}: its size constraints over m, n, k and where it is measured
    (with `outside_reserved`, outside the regions other candidates hold: the nearest model's and
    the screen's guards; without, the tree's, whose reserved regions are rules of their own)."""
    from src.job.config import kernel_config
    from src.tune import fit

    kernels = candidates(settings)
    from src.tune.plan import measured_where

    where = measured_where(settings, outside_reserved)
    return {k: fit.conjunction([p for p in (fit.guard_of(kernel_config(k)), where.get(k)) if p])
            for k in sorted(kernels)}


def drawn_shapes(rows: list[dict]) -> set[tuple[int, int, int]]:
    """The training set's random draws among the evidence rows' shapes (not the suites' or picked)."""
    from src.tune.distribution import not_drawn

    return {(r["m"], r["n"], r["k"]) for r in rows} - not_drawn()


def resolved_fit(rows: list[dict], settings: dict, gpu_spec: str,
                 kept: dict | None = None) -> tuple[dict, dict]:
    """(the fit settings with every `auto` resolved from the evidence `rows`, the leave-one-out
    figures they were chosen from: the weightings', the powers' under `"waves"`, the small-side
    weights' under `"small_side"`, the cautions' under `"caution"`): the weighting first, then the
    waves under it, then the small-side weight, then the caution, then whether the reserved
    regions' sides stay apart (src/tune/judge.resolved; a tie keeps `kept`'s, the tuned file's
    now: nearest.incumbent)."""
    from src.tune import fit, judge
    from src.tune.nearest import AUTO, reserved_sides
    from src.tune.plan import reserved

    fit_settings, whens = settings.get("fit") or {}, sorted(reserved(settings).values())
    sides = reserved_sides(fit_settings)  # the nearest model keeps each reserved region's sides apart
    if sides is True or isinstance(sides, dict):  # given: every dispatcher's LOO keeps them apart
        fit_settings = {**fit_settings, "regions": whens if sides is True else
                        {d: whens for d, on in sides.items() if on}}
    apart = judge.leave_one_out(rows, guards(settings), fit_settings, drawn := drawn_shapes(rows))
    fit_settings = judge.resolved(fit_settings, apart, kept=kept)
    if fit.waves_auto(fit_settings):  # chosen under each dispatcher's resolved weighting
        apart["waves"] = judge.waves_apart(rows, guards(settings), fit_settings, drawn, gpu_spec)
        fit_settings = judge.resolved(fit_settings, apart, apart["waves"], kept=kept)
    if fit.small_side_auto(fit_settings):  # under the resolved weighting and waves
        apart["small_side"] = judge.small_side_apart(rows, guards(settings), fit_settings, drawn, gpu_spec)
        fit_settings = judge.resolved(fit_settings, apart, sides=apart["small_side"], kept=kept)
    if fit.caution_auto(fit_settings):  # under all the above
        apart["caution"] = judge.caution_apart(rows, guards(settings), fit_settings, drawn, gpu_spec)
        fit_settings = judge.resolved(fit_settings, apart, cautions=apart["caution"], kept=kept)
    if sides == AUTO:  # under all the above: per dispatcher, kept apart where the LOO favours it
        apart["reserved_sides"] = judge.sides_apart(rows, guards(settings), fit_settings, drawn, gpu_spec, whens)
        chosen = judge.chosen_weightings(apart["reserved_sides"], float(fit_settings.get("weighting_tie", 0.01)),
                                         plain=False, kept=(kept or {}).get("reserved_sides"))
        fit_settings = {**fit_settings, "regions": {d: whens for d, on in chosen.items() if on},
                        "reserved_sides_chosen": sorted(chosen)}
    return fit_settings, apart


def write_fit(gpu_spec: str, settings: dict, csv_path: Path,
              tuned_path: Path | None = None) -> tuple[list[dict], dict, dict, dict]:
    """(the evidence rows, the dispatch fitted from them, the fit settings used: `auto` resolved
    per dispatcher, judge.resolved; the leave-one-out figures, the powers' under `"waves"`):
    `csv_path` fitted under `settings` and written into conf/tuned/<gpu>.yaml (or tuned_path;
    an existing file keeps its header)."""
    from src.job.tuned import tuned_file
    from src.job.training import evidence_sha256, read
    from src.tune import fit, nearest
    from src.tune.plan import reserved

    sha = evidence_sha256(csv_path)
    rows = read(csv_path)
    if not rows:
        raise ConfigError(f"{csv_path} holds no measured candidate: nothing to fit.")
    cited = str(csv_path.relative_to(ROOT)) if csv_path.is_relative_to(ROOT) else str(csv_path)
    fit_settings, apart = resolved_fit(rows, settings, gpu_spec,
                                       nearest.incumbent(tuned_path or tuned_file(gpu_spec)))
    dispatch = fit.fit(rows, guards(settings, outside_reserved=False), fit_settings, reserved(settings))
    fit.write(tuned_path or tuned_file(gpu_spec), dispatch, cited,
              fit.nearest_model(cited, guards(settings), fit_settings, sha))
    return rows, dispatch, fit_settings, apart


def refit(gpu_spec: str, settings: dict, csv_path: Path, tuned_path: Path | None = None) -> dict:
    """The dispatch fitted from `csv_path`, written into conf/tuned/<gpu>.yaml (or tuned_path),
    then how it cross-validates and the ceiling of its candidates, printed."""
    from src.tune import fit, judge
    from src.tune.plan import reserved

    rows, dispatch, fit_settings, apart = write_fit(gpu_spec, settings, csv_path, tuned_path)
    auto = (settings.get("fit") or {}).get("weighting") == fit.AUTO
    for line in judge.report(rows, guards(settings), guards(settings, outside_reserved=False),
                             reserved(settings), fit_settings, drawn_shapes(rows), apart, auto,
                             gpu_spec):
        print(line, flush=True)
    return dispatch


def compare(gpu_spec: str, settings: dict, csv_path: Path, other: Path) -> int:
    """Print whether the fits of two runs' evidence choose alike at their common training shapes
    (judge.agreement, `reproduce.tolerance` of conf/tuning/dispatch.yaml); 1 if a choice differs
    beyond it."""
    from src.job.training import read
    from src.job.tuned import tuned_file
    from src.tune import judge, nearest
    from src.tune.plan import reserved

    for path in (csv_path, other):
        if not path.is_file():
            raise ConfigError(f"--against compares two evidence files; {path} is not one.")
    tolerance = float((settings.get("reproduce") or {}).get("tolerance", 0.02))
    rows = read(csv_path)  # every `auto` as this run's fit resolves it, for both runs
    fit_settings = resolved_fit(rows, settings, gpu_spec, nearest.incumbent(tuned_file(gpu_spec)))[0]
    reports = judge.agreement(rows, read(other), guards(settings), fit_settings, tolerance,
                              guards(settings, outside_reserved=False), reserved(settings))
    for dispatcher, r in reports.items():
        print(f"{dispatcher}: {r['agrees']} shapes the same choice, {r['within_noise']} another "
              f"within {tolerance:.0%} in both runs, {len(r['differs'])} differ, {r['unmeasured']} "
              f"not comparable (a choice unmeasured in one run)")
        for d in r["differs"]:  # run_a, run_b: (the first fit's choice, the second's) in that run
            print(f"   {d['shape']}: {csv_path.name} chose {d['a']}, {other.name} {d['b']}; measured "
                  f"{d['run_a'][0]:.3f}x / {d['run_a'][1]:.3f}x in the first, "
                  f"{d['run_b'][0]:.3f}x / {d['run_b'][1]:.3f}x in the second")
    return 1 if any(r["differs"] for r in reports.values()) else 0
