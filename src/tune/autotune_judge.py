"""How many candidates the run-time autotune (src/job/autotune.py) should measure, judged from
the tuning evidence alone, no GPU: at each random training draw, that draw's own rows left out of
the evidence, the first K launches `autotune.planned` names there (the rule's choice, the nearest
model's next ones, the nearest training shapes' best, in the runtime's order, each launch once),
and the best ratio to the stronger cuBLAS measured at the draw among them. K = 1 is the rules
alone; the best of everything measured at the draw is the ceiling no count reaches. A draw whose
first choice was not measured there is left out, and so are `dispatch.autotune_variants` (launches
the evidence does not hold, so nothing here could say what they would find). docs/heldout.md
quotes its table.

`python -m src.tune.autotune_judge --gpu h100_sxm [--candidates 1,4,8] [--dispatchers best_fp32]`
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

from src.errors import LabError
from src.job.problem import shape_label

DISPATCHERS = ("best_fp32", "best_tf32")


def left_out(rows: list[dict], gpu_spec: str, dispatcher: str, counts: list[int],
             drawn: set[tuple[int, int, int]], limit: int | None = None) -> dict[int, dict]:
    """{K: {"shapes", "geomean", "min", "min_shape", "figures"}} and under "ceiling" the best
    measured at each draw: the best measured ratio among autotune's first K launches at each of
    `drawn` (the first `limit` in order), planned from `rows` without that draw's rows."""
    from src.job import autotune, dispatch, training
    from src.job import gpu as gpu_mod
    from src.job.config import kernel_config
    from src.job.problem import Problem

    config = kernel_config(dispatcher)
    precision, limits = str(config["precision"]), gpu_mod.limits_from_spec(gpu_spec)
    mine = [r for r in rows if r["dispatcher"] == dispatcher]
    whole = training.table(mine, dispatcher)
    # today's settings with max(counts) candidates; without the variants, launches no evidence holds
    settings = replace(autotune.default_settings(), enabled=True, candidates=max(counts), counts=(),
                       variants=())
    figures: dict = {k: [] for k in counts}
    figures["ceiling"] = []
    for shape in [s for s in whole.shapes if s in drawn][:limit]:
        rest = [r for r in mine if (r["m"], r["n"], r["k"]) != shape]
        table, problem = training.table(rest, dispatcher), Problem(*shape, 1.0, 0.0)
        ranked = dispatch.ranked(gpu_spec, dispatcher, problem, table)
        if not ranked:
            continue
        first = ranked[0][0]
        choice = dispatch.DispatchChoice(first.kernel, json.loads(first.params), "left out",
                                         dispatch.NEAREST, dispatcher)
        measured: dict = {}  # launch -> its best measured ratio at the draw
        for candidate in whole.candidates:
            value = whole.ratio.get((shape, candidate))
            if value is not None:
                launch = dispatch.launch(candidate, precision, problem, limits)
                measured[launch] = max(value, measured.get(launch, 0.0))
        planned = autotune.planned(choice, config, gpu_spec, problem, rest, settings, limits, table)
        values = [measured.get(launch) for _, launch in planned]
        if not values or values[0] is None:
            continue
        for k in counts:
            figures[k].append((max(v for v in values[:k] if v is not None), shape))
        figures["ceiling"].append((max(measured.values()), shape))
    return {k: _summary(found) for k, found in figures.items()}


def _summary(found: list[tuple[float, tuple[int, int, int]]]) -> dict:
    if not found:
        return {"shapes": 0, "geomean": None, "min": None, "min_shape": None, "figures": []}
    low = min(found)
    return {"shapes": len(found), "geomean": math.exp(sum(math.log(v) for v, _ in found) / len(found)),
            "min": low[0], "min_shape": shape_label(low[1]), "figures": found}


def _counts(text: str) -> list[int]:
    try:
        counts = sorted({int(t) for t in text.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(
            f"--candidates {text!r}: not a comma-separated list of counts >= 1 (rule: each is how "
            f"many launches autotune measures, the rule's choice the first), e.g. 1,4,8")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.tune.autotune_judge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", required=True, help="a GPU spec with evidence (results/tuning/<gpu>.csv) and a tuned file")
    parser.add_argument("--candidates", type=_counts, default=[1, 4, 8], help="counts to judge, e.g. 1,4,8")
    parser.add_argument("--dispatchers", default=",".join(DISPATCHERS), help="best_fp32,best_tf32")
    args = parser.parse_args(argv)
    from src.job import training
    from src.tune.refit import drawn_shapes

    try:
        path = training.evidence_path(args.gpu)
        if not path.is_file():
            raise LabError(f"--gpu {args.gpu}: no evidence file {path} (rule: the judge reads what "
                           f"`sgemm-lab tune --gpu {args.gpu}` measured); tune that GPU first.")
        rows = training.read(path)
        drawn = drawn_shapes(rows)
        print(f"{args.gpu}: autotune's first K launches, each random training draw left out "
              f"(geomean / min of the best measured among them; draws counted)\n")
        print("| dispatcher | " + " | ".join(f"K = {k}" for k in args.candidates) + " | ceiling |")
        print("| --- " * (len(args.candidates) + 2) + "|")
        for name in args.dispatchers.split(","):
            got = left_out(rows, args.gpu, name, args.candidates, drawn)
            cells = [f"{s['geomean']:.3f} / {s['min']:.3f} ({s['shapes']})" if s["shapes"] else "none"
                     for s in (got[k] for k in [*args.candidates, "ceiling"])]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    except LabError as exc:
        print(f"error [{exc.status}]: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
