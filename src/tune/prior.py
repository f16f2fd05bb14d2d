"""A screen from another GPU's evidence (`sgemm-lab tune --screen-from GPU`): instead of its own
stage-1 screen, a GPU of the same compute capability measures at each training shape only the
candidates that another GPU's tune found close to its best there or at that shape's nearest
training shapes (conf/tuning/dispatch.yaml `prior`; docs/tuning.md, "A screen from another
GPU's evidence").

    the prior's evidence rows -> `wanted`: {(dispatcher, kernel): {shape: params keys}} ->
    src/tune/plan.build(prior=...) measures, at each shape, the launches with a wanted member

Why it holds, regenerated from evidence files alone (the tables of docs/tuning.md):
    python -m src.tune.prior --prior h200 --target results/tuning/probes/h100_sxm_carried_evidence.csv.gz
(1) where both GPUs measured a candidate at a training shape, does the target's best stay among
the candidates within `within` of the prior's best, and what would keeping only those cost there;
(2) the prior's own nearest model (its conf/tuned/<gpu>.yaml `nearest:`) fitted from only the lists
`wanted` makes, each training draw left out in turn and judged on all the evidence: the loss of
the lists alone (the prior as its own target), beside (1), the loss of the transfer.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from src.errors import ConfigError
from src.job import training

RULE = ("a screen from another GPU's evidence needs that GPU's tuning evidence (results/tuning/"
        "<gpu>.csv, or a file named directly) measured on a GPU of the same compute capability "
        "as the one tuned: the candidates are the same machine code there")


def evidence_of(source: str, gpu_spec: str) -> tuple[str, list[dict]]:
    """(the prior GPU spec, its evidence rows) for `--screen-from SOURCE`: a GPU spec (its
    results/tuning/<spec>.csv) or an evidence file; a ConfigError naming the rule where there is
    no such file, it names no GPU, it is `gpu_spec`'s own, or its compute capability differs."""
    from src.job import gpu as gpu_mod

    path = Path(source) if source.endswith(".csv") else training.evidence_path(source)
    if not path.is_file():
        raise ConfigError(f"--screen-from {source}: no evidence file {path} (rule: {RULE}).")
    rows = training.read(path)
    specs = sorted({str(r["gpu_spec"]) for r in rows})
    if len(specs) != 1 or specs[0] not in gpu_mod.known_specs():
        raise ConfigError(f"--screen-from {source}: {path} holds rows of {', '.join(specs) or 'no GPU'} "
                          f"(rule: {RULE}; one GPU spec with a datasheet, conf/gpu/).")
    prior = specs[0]
    if prior == gpu_spec:
        raise ConfigError(f"--screen-from {source}: the evidence is {gpu_spec}'s own (rule: {RULE}; "
                          f"`--missing` extends a GPU's own evidence).")
    mine, theirs = (gpu_mod.limits_from_spec(s)["compute_capability"] for s in (gpu_spec, prior))
    if mine != theirs:
        raise ConfigError(f"--screen-from {source}: {prior} is compute capability {theirs}, "
                          f"{gpu_spec} {mine} (rule: {RULE}).")
    return prior, rows


def settings_of(settings: dict) -> tuple[float, int]:
    """(within, neighbours) of conf/tuning/dispatch.yaml `prior`, checked: a fraction in (0, 1]
    and a count >= 0; a ConfigError naming the rule."""
    block = settings.get("prior") or {}
    within, neighbours = block.get("within"), block.get("neighbours")
    if isinstance(within, bool) or not isinstance(within, (int, float)) or not 0 < within <= 1:
        raise ConfigError(f"conf/tuning/dispatch.yaml: prior.within = {within!r} (rule: a fraction of "
                          f"the prior's best ratio at a shape, above 0 and at most 1).")
    if isinstance(neighbours, bool) or not isinstance(neighbours, int) or neighbours < 0:
        raise ConfigError(f"conf/tuning/dispatch.yaml: prior.neighbours = {neighbours!r} (rule: how "
                          f"many nearest training shapes' lists join a shape's, an integer >= 0).")
    return float(within), neighbours


def ratios(rows: list[dict]) -> dict[tuple[str, tuple], dict[tuple[str, str], float]]:
    """{(dispatcher, shape): {(kernel, params key): its ratio to the stronger cuBLAS}} of the ok
    rows of an evidence file (twins included, as training.read gives them)."""
    out: dict = defaultdict(dict)
    for r in rows:
        value = training.score(r) if r["status"] == "ok" else None
        if value is not None:
            out[(r["dispatcher"], (int(r["m"]), int(r["n"]), int(r["k"])))][(r["kernel"], r["params"])] = value
    return out


def close_to_best(rows: list[dict], within: float) -> dict[tuple[str, tuple], set]:
    """{(dispatcher, shape): {(kernel, params key)}}: at each shape of the evidence, the ok
    candidates whose ratio is at least `within` of the best there."""
    return {where: {c for c, v in values.items() if v >= within * max(values.values())}
            for where, values in ratios(rows).items()}


def wanted(rows: list[dict], shapes: list[tuple[int, int, int]], within: float,
           neighbours: int) -> dict[tuple[str, str], dict[str, set]]:
    """{(dispatcher, kernel): {shape label: params keys}}: at each of `shapes` (the tune's), the
    candidates `close_to_best` finds at the prior's nearest training shape to it and at its next
    `neighbours` nearest (log2 distance, ties by the shape; the shape itself first where the prior
    measured it): the nearest model scores a candidate only where all its neighbours measured it."""
    close = close_to_best(rows, within)
    measured = [{"dispatcher": d, "m": s[0], "n": s[1], "k": s[2]} for d, s in close]  # a row a shape
    out: dict = defaultdict(dict)
    for dispatcher in sorted({d for d, _ in close}):
        for shape in shapes:
            near = training.nearest(measured, dispatcher, tuple(shape), neighbours + 1)
            keys: dict = defaultdict(set)
            for s in near:
                for kernel, params in close[(dispatcher, s)]:
                    keys[kernel].add(params)
            for kernel, params in keys.items():
                out[(dispatcher, kernel)]["x".join(map(str, shape))] = params
    return dict(out)


# --- why it holds (offline: `python -m src.tune.prior`) ---------------------------------------------

def transfer(prior_rows: list[dict], target_rows: list[dict], within: float) -> dict:
    """Table 1's row at `within`: pairs compared, where the target's best was kept, the target's
    best kept over its best (geomean, min, how many under 0.98), the share of candidates kept."""
    prior, target = ratios(prior_rows), ratios(target_rows)
    regrets, shares = [], []
    for where, theirs in target.items():
        both = [c for c in theirs if c in prior.get(where, {})]
        if len(both) < 5:
            continue
        best = max(prior[where][c] for c in both)
        keep = [c for c in both if prior[where][c] >= within * best]
        regrets.append(max(theirs[c] for c in keep) / max(theirs[c] for c in both))
        shares.append(len(keep) / len(both))
    if not regrets:
        raise ConfigError("the two evidence files share no shape x dispatcher with 5 candidates "
                          "measured in both (rule: the transfer is judged where both GPUs measured).")
    return {"pairs": len(regrets), "geomean": math.exp(sum(map(math.log, regrets)) / len(regrets)),
            "min": min(regrets), "under_098": sum(r < 0.98 for r in regrets),
            "kept": sum(shares) / len(shares)}


def sparse_leave_one_out(rows: list[dict], gpu_spec: str, within: float, neighbours: int) -> dict:
    """Table 2's row: {dispatcher: (share of measured pairs kept, geomean, min at the random draws
    left out, how many draws chose a candidate unmeasured there)}; within None: the whole evidence."""
    from src.job.training import NearestModel, Table
    from src.tune import plan as plan_mod
    from src.tune.fit import Fitter, table
    from src.tune.nearest import caution, fill_of, regions, small_side, waves, waves_cap, weighting
    from src.tune.refit import drawn_shapes, guards

    settings = plan_mod.load_settings()
    from src.job.tuned import tuned_file

    model = yaml.safe_load(tuned_file(gpu_spec).read_text())["nearest"]
    fit = {**(settings.get("fit") or {}), **{k: model[k] for k in
                                             ("weighting", "waves", "small_side", "caution", "regions") if k in model}}
    drawn = drawn_shapes(rows)
    lists = None if within is None else wanted(
        rows, sorted({(int(r["m"]), int(r["n"]), int(r["k"])) for r in rows}), within, neighbours)
    out = {}
    for d in sorted({r["dispatcher"] for r in rows}):
        whole = table(rows, d)
        nearest = NearestModel(int(model["count"]), weighting(fit, d), fill_of(rows, d, whole, gpu_spec, waves(fit, d)),
                               waves(fit, d), small_side(fit, d), caution(fit, d), regions(fit, d), waves_cap(fit, d))
        ratio = whole.ratio if lists is None else {
            (s, c): v for (s, c), v in whole.ratio.items()
            if c.params in lists.get((d, c.kernel), {}).get("x".join(map(str, s)), ())}
        sparse = Table(whole.shapes, whole.candidates, ratio, set(whole.failed))
        inside = Fitter(sparse, guards(settings), fit).inside
        figures = []
        for s in whole.shapes:
            if s in drawn:
                found = training.nearest_choice(sparse, s, [t for t in whole.shapes if t != s], inside, nearest)
                figures.append(whole.ratio.get((s, found[0])) if found else None)
        got = [v for v in figures if v is not None]
        out[d] = (len(ratio) / len(whole.ratio), math.exp(sum(map(math.log, got)) / len(got)), min(got),
                  len(figures) - len(got))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="why a screen from another GPU's evidence holds: two tables")
    parser.add_argument("--prior", required=True, help="the GPU spec whose evidence screens")
    parser.add_argument("--target", type=Path, required=True, help="another GPU's evidence file (.csv, or .csv.gz)")
    args = parser.parse_args(argv)
    prior_rows = training.read(training.evidence_path(args.prior))
    if args.target.suffix == ".gz":  # a probe kept compressed: read through a plain copy
        import gzip
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / args.target.stem
            plain.write_bytes(gzip.decompress(args.target.read_bytes()))
            target_rows = training.read(plain)
    else:
        target_rows = training.read(args.target)
    print(f"| within | pairs (shape x dispatcher) | the target's best kept: geomean / min (under 0.98) | candidates kept |")
    print("| --- | --- | --- | --- |")
    for within in (0.8, 0.85, 0.9, 0.95):
        t = transfer(prior_rows, target_rows, within)
        print(f"| {within} | {t['pairs']} | {t['geomean']:.4f} / {t['min']:.3f} ({t['under_098']}) | {t['kept']:.0%} |")
    print()
    print(f"| lists ({args.prior}'s own nearest model, its draws left out) | pairs kept | FP32 geomean / min | TF32 geomean / min |")
    print("| --- | --- | --- | --- |")
    for within, neighbours in ((None, 0), (0.85, 0), (0.85, 2), (0.85, 4), (0.9, 2), (0.9, 4), (0.95, 4)):
        r = sparse_leave_one_out(prior_rows, args.prior, within, neighbours)
        name = "all the evidence" if within is None else f"within {within}, {neighbours} neighbours"
        fp32, tf32 = r["best_fp32"], r["best_tf32"]
        print(f"| {name} | {fp32[0]:.0%} / {tf32[0]:.0%} | {fp32[1]:.3f} / {fp32[2]:.3f} | {tf32[1]:.3f} / {tf32[2]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
