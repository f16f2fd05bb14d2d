"""Tuning step: a kernel's search space -> candidates pruned by its constraints -> measured by a
strategy (exhaustive grid, or Optuna TPE: src/tune/tpe.py) -> the best per GPU and size class,
written back to conf/tuned/<gpu>.yaml.

The space is data (`tune.space` in conf/tune/<kernel>.yaml: parameter -> values) and so are
the rules: a candidate is checked against the kernel config's own constraints and size
constraints (src/job/spec.py) with the GPU's limits before anything is compiled. A candidate that
breaks one is pruned and counted under the rule it broke; it costs microseconds, not a compile.

The sweeper plugin (hydra_plugins/sgemm_lab/tune_sweeper.py) drives this module: it launches
the surviving candidates as ordinary Hydra jobs (each verified and timed by src/job/pipeline.py in the
worker process), reuses measurements already in the cache when `resume=true`, and hands the
records back here for the summary and the write-back.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from src.errors import InvalidParams
from src.job.problem import Problem
from src.records.record import Record
from src.job.spec import KernelSpec, candidate_spec

STRATEGIES = ("grid", "tpe")
COUNTED_STATUSES = ("ok", "failed_compile", "failed_verification")  # the rest: failed_other


@dataclass
class Settings:
    space: dict[str, list]
    strategy: str = "grid"
    trials: int | None = None        # tpe: how many candidates to measure
    batch: int = 8                   # candidates asked and compiled ahead per launch
    seed: int = 0
    compile_threads: int | None = None
    write_back: bool = False
    size_class: str = "True"         # the `when` the written-back entry gets
    candidates: list[dict] | None = None  # grid: exactly these, in order (None: the whole space);
                                          # from tune.candidates or tune.candidates_file (JSON)
    held: str | None = None          # grid: a JSON file {shape MxNxK: [params keys]} of candidates
                                     # measured already (`sgemm-lab tune --missing`): not measured

    @classmethod
    def from_cfg(cls, block) -> "Settings":
        data = dict(block or {})
        space = {str(k): list(v) for k, v in dict(data.get("space") or {}).items()}
        if not space or any(not values for values in space.values()):
            raise InvalidParams("a tuning sweep needs tune.space: each tunable parameter with a "
                                "non-empty list of values (see conf/tune/).")
        strategy = str(data.get("strategy", "grid"))
        if strategy not in STRATEGIES:
            raise InvalidParams(f"tune.strategy must be one of {', '.join(STRATEGIES)}, got "
                                f"{strategy!r}.")
        trials = data.get("trials")
        if strategy == "tpe" and (not isinstance(trials, int) or trials <= 0):
            raise InvalidParams(f"tune.strategy=tpe needs tune.trials, the number of candidates "
                                f"to measure (a positive integer), got {trials!r}.")
        candidates = _listed(data)
        if candidates is not None:
            candidates = [{str(k): v for k, v in dict(c).items()} for c in candidates]
            if not candidates or any(set(c) != set(space) for c in candidates):
                raise InvalidParams(f"tune.candidates must list one or more candidates, each "
                                    f"setting every parameter of tune.space "
                                    f"({', '.join(space)}) and no other; got {candidates!r}.")
        held = data.get("held")
        if held is not None and (strategy != "grid" or not Path(str(held)).is_file()):
            raise InvalidParams(f"tune.held must name a JSON file of the candidates measured "
                                f"already, for strategy grid, got {held!r} with strategy "
                                f"{strategy!r} (rule: a grid sweep leaves out what the evidence "
                                f"holds; `sgemm-lab tune --missing` writes that file).")
        return cls(space=space, strategy=strategy, trials=trials, candidates=candidates,
                   held=None if held is None else str(held),
                   batch=int(data.get("batch") or 8), seed=int(data.get("seed") or 0),
                   compile_threads=data.get("compile_threads"),
                   write_back=bool(data.get("write_back", False)),
                   size_class=str(data.get("size_class", "True")))


def _listed(data: dict) -> list | None:
    """`tune.candidates`, or the JSON list in the file `tune.candidates_file` names (what
    `sgemm-lab tune` passes: hundreds listed on the command line cost each job's compose about a
    second); None for neither."""
    listed, path = data.get("candidates"), data.get("candidates_file")
    if path is None:
        return listed
    try:
        loaded = None if listed is not None else json.loads(Path(str(path)).read_text())
        why = "tune.candidates is given too" if listed is not None else f"it holds a {type(loaded).__name__}"
    except (OSError, ValueError) as exc:
        loaded, why = None, f"{type(exc).__name__}: {exc}"
    if not isinstance(loaded, list):
        raise InvalidParams(f"tune.candidates_file must name a JSON file of a list of candidates, "
                            f"tune.candidates left out; got {path!r}: {why} (rule: a grid sweep's "
                            f"candidates are one list, given once).")
    return loaded


def grid(space: dict[str, list]) -> list[dict]:
    """Every combination, in the space's order (the last parameter varies fastest)."""
    names = list(space)
    return [dict(zip(names, values)) for values in itertools.product(*space.values())]


def candidates_of(settings: Settings) -> list[dict]:
    """What a grid sweep measures: its listed candidates, else every combination of its space."""
    return list(settings.candidates) if settings.candidates is not None else grid(settings.space)


def space_size(space: dict[str, list]) -> int:
    return math.prod(len(values) for values in space.values())


HELD = "measured already: the evidence file holds it (sgemm-lab tune --missing)"


def held_at(settings: Settings, problem: Problem) -> set[str]:
    """The params keys `settings.held` lists at the problem's shape."""
    held = {} if settings.held is None else json.loads(Path(settings.held).read_text())
    return set(held.get(f"{problem.m}x{problem.n}x{problem.k}", []))


# A candidate whose parameters build the very kernel and launch of an earlier one at this shape
# (a parameter that acts only on some shapes, e.g. a K-slice length where no K slices are cut)
SAME_KERNEL = "same kernel and launch as an earlier candidate at this shape: measured once"


@dataclass
class Pruning:
    """The verdict on candidates before compiling: a spec for each valid one, a count per rule,
    and for each candidate that builds the same kernel as an earlier one, that one's key."""

    valid: list[tuple[dict, KernelSpec]] = field(default_factory=list)
    pruned: Counter = field(default_factory=Counter)
    same_as: dict[str, str] = field(default_factory=dict)

    @property
    def pruned_total(self) -> int:
        return sum(self.pruned.values())


check = candidate_spec  # the candidate's spec, or the rule it breaks (src/job/spec.py)


def kernel_identity(spec: KernelSpec) -> str:
    """What one launch of the candidate runs (KernelSpec.launch_identity)."""
    return spec.launch_identity()


def built(spec: KernelSpec) -> bytes:
    """A 16-byte digest of what the candidate builds (`kernel_identity`)."""
    return hashlib.blake2b(kernel_identity(spec).encode(), digest_size=16).digest()


@dataclass(frozen=True)
class Outline:
    """The pruning of a candidate list at one problem, without the specs: indices into the
    list, in its order."""

    valid: tuple[int, ...]
    same_as: tuple[tuple[int, int], ...]   # (a twin, the first candidate that builds its launch)
    pruned: Counter                        # candidates per rule broken, SAME_KERNEL for the twins


def outline(verdicts) -> Outline:
    """Each candidate's verdict in order (the rule it breaks, or `built`'s digest) -> the first
    candidate of each kernel and launch kept, the others its twins (SAME_KERNEL), the rest
    counted under the rule each breaks."""
    valid, same_as, pruned, first = [], [], Counter(), {}
    for i, verdict in enumerate(verdicts):
        if isinstance(verdict, str):
            pruned[verdict] += 1
        elif verdict in first:
            pruned[SAME_KERNEL] += 1
            same_as.append((i, first[verdict]))
        else:
            first[verdict] = i
            valid.append(i)
    return Outline(tuple(valid), tuple(same_as), pruned)


def prune(kernel_cfg: dict, candidates: list[dict], problem: Problem, limits: dict) -> Pruning:
    """Each candidate checked against the kernel's rules at this problem; of those that build the
    same kernel and launch, the first is kept and the others counted under SAME_KERNEL."""
    specs = [check(kernel_cfg, params, problem, limits) for params in candidates]
    kept = outline(built(s) if isinstance(s, KernelSpec) else s for s in specs)
    return Pruning(valid=[(candidates[i], specs[i]) for i in kept.valid], pruned=kept.pruned,
                   same_as={params_key(candidates[d]): params_key(candidates[f])
                            for d, f in kept.same_as})


class Pruner:
    """`prune` of one candidate list for one kernel config and GPU, at many problems, without the
    specs. Each candidate's verdict at a problem (the rule it breaks, or `built`'s digest) is kept
    for the process: `sgemm-lab tune` plans the same sweeps several times in one run (the
    budget's plan, the evidence's, the screen's, each saved part's), and building every
    candidate's spec at every training shape took most of a minute each time."""

    _memo: dict[tuple, str | bytes] = {}
    MEMO_LIMIT = 2_000_000  # verdicts kept at most (about 150 bytes each); then start again

    def __init__(self, kernel_cfg: dict, candidates: list[dict], limits: dict):
        self.kernel_cfg, self.candidates, self.limits = kernel_cfg, candidates, limits
        self.keys = [params_key(c) for c in candidates]
        # the config and limits as they are now: an edited config is another pruner's verdicts
        self._base = (json.dumps(kernel_cfg, sort_keys=True, default=str),
                      json.dumps(limits, sort_keys=True, default=str))

    @staticmethod
    def verdict(kernel_cfg: dict, params: dict, problem: Problem, limits: dict) -> str | bytes:
        """A candidate's verdict at `problem`: the rule it breaks, or `built`'s digest."""
        spec = check(kernel_cfg, params, problem, limits)
        return built(spec) if isinstance(spec, KernelSpec) else spec

    def _memo_key(self, problem: Problem, key: str) -> tuple:
        return (self._base, problem.m, problem.n, problem.k, problem.alpha, problem.beta, key)

    def _verdict(self, params: dict, key: str, problem: Problem) -> str | bytes:
        verdict = self._memo.get(self._memo_key(problem, key))
        if verdict is None:
            verdict = self.verdict(self.kernel_cfg, params, problem, self.limits)
            self.keep(problem, [verdict], [key])
        return verdict

    def keep(self, problem: Problem, verdicts: list, keys: list[str] | None = None) -> None:
        """Verdicts at `problem` (of `keys`, default every candidate's in order), computed here or
        on other cores (src/tune/prefill.py), kept for the process."""
        for key, verdict in zip(self.keys if keys is None else keys, verdicts):
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            self._memo[self._memo_key(problem, key)] = verdict

    def holds(self, problem: Problem) -> bool:
        """Whether every candidate's verdict at `problem` is kept already (a second tune in one
        process, as the tests run several, computes none of them again)."""
        return all(self._memo_key(problem, key) in self._memo for key in self.keys)

    def at(self, problem: Problem) -> Outline:
        """`prune`'s outline at `problem`."""
        return outline(self._verdict(p, k, problem) for p, k in zip(self.candidates, self.keys))

    def same_as(self, kept: Outline) -> dict[str, str]:
        """{a twin's params key: the first's}, as Pruning.same_as."""
        return {self.keys[d]: self.keys[f] for d, f in kept.same_as}

    def launches(self, kept: Outline) -> dict[str, list[str]]:
        """{the first params key of each launch of `kept`: it and its twins' keys, in order}."""
        out = {self.keys[i]: [self.keys[i]] for i in kept.valid}
        for dup, first in kept.same_as:
            out[self.keys[first]].append(self.keys[dup])
        return out


def overrides_for(params: dict) -> list[str]:
    return [f"kernel.params.{name}={value}" for name, value in params.items()]


def params_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


# --- summary and write-back ------------------------------------------------------------------------

def group(record: Record) -> str:
    """How the summary counts a measured candidate, by its record's status."""
    return record.status if record.status in COUNTED_STATUSES else "failed_other"


def summary(settings: Settings, kernel: str, problem: Problem, records: list[Record],
            pruned: Counter, candidates: int, cached: int, seconds: float,
            gpu: str | None) -> dict:
    """What a tuning sweep found, as plain data (tune_summary.json)."""
    counts = Counter(group(r) for r in records)
    ok = sorted((r for r in records if r.ok), key=lambda r: r.gflops, reverse=True)
    best = ok[0] if ok else None
    return {
        "kernel": kernel, "gpu": gpu, "m": problem.m, "n": problem.n, "k": problem.k,
        "strategy": settings.strategy, "seed": settings.seed,
        "space_size": space_size(settings.space), "candidates_considered": candidates,
        "pruned": int(sum(pruned.values())), "pruned_by_rule": dict(pruned.most_common()),
        "measured": len(records), "from_cache": cached,
        "ok": counts["ok"], "failed_compile": counts["failed_compile"],
        "failed_verification": counts["failed_verification"],
        "failed_other": counts["failed_other"],
        "seconds": round(seconds, 1),
        "best": None if best is None else {
            "params": best.params, "gflops": best.gflops,
            "pct_of_cublas_fp32": best.pct_of_cublas_fp32, "registers": best.registers,
        },
        "top": [{"params": r.params, "gflops": r.gflops, "pct_of_cublas_fp32": r.pct_of_cublas_fp32}
                for r in ok[:10]],
    }


def summary_markdown(data: dict) -> str:
    size = (str(data["m"]) if data["m"] == data["n"] == data["k"]
            else f"{data['m']}x{data['n']}x{data['k']}")
    lines = [
        f"# Tuning {data['kernel']} at {size} on {data['gpu'] or 'unknown GPU'} ({data['strategy']})",
        "",
        f"- space: {data['space_size']:,} combinations; considered {data['candidates_considered']:,}",
        f"- pruned before compiling: {data['pruned']:,}",
    ]
    for rule, count in data["pruned_by_rule"].items():
        lines.append(f"    - {count:,}: `{rule}`")
    lines += [
        f"- measured: {data['measured']:,} ({data['from_cache']:,} from the cache)",
        f"- ok: {data['ok']:,}; failed to compile: {data['failed_compile']:,}; failed "
        f"verification: {data['failed_verification']:,}; other failures: {data['failed_other']:,}",
        f"- wall time: {data['seconds']:.1f} s",
        "",
    ]
    if data["top"]:
        names = list(data["top"][0]["params"])
        lines.append("| rank | " + " | ".join(names) + " | GFLOP/s | % of cuBLAS FP32 |")
        lines.append("|" + "---|" * (len(names) + 3))
        for rank, row in enumerate(data["top"], start=1):
            pct = row["pct_of_cublas_fp32"]
            lines.append(f"| {rank} | " + " | ".join(str(row["params"][n]) for n in names)
                         + f" | {row['gflops']:,.1f} | {'' if pct is None else f'{pct:.1f}'} |")
    return "\n".join(lines) + "\n"


def write_back(path: Path, kernel: str, when: str, params: dict, why: str) -> None:
    """Put `params` for `kernel`'s size class `when`, with its one-line `why`, into a tuned file,
    keeping everything else
    (comments included: ruamel.yaml round-trips the file). An existing entry with the same
    `when` is replaced; a new one goes before the kernel's catch-all ("True") entry."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    yaml = YAML()
    yaml.width = 200
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)  # the hand-written files' layout
    if path.is_file():
        data = yaml.load(path.read_text()) or CommentedMap()
    else:
        data = CommentedMap()
        data.yaml_set_start_comment(
            f"Tuned tile parameters for gpu spec {path.stem}, written by the tuning sweeper\n"
            f"(hydra_plugins/sgemm_lab/tune_sweeper.py). Per kernel, size classes in order: the\n"
            f"first whose `when` (over m, n, k) holds applies.")
    kernels = data.setdefault("kernels", CommentedMap())
    classes = kernels.setdefault(kernel, CommentedSeq())
    flow = CommentedMap(params)
    flow.fa.set_flow_style()
    entry = CommentedMap([("when", DoubleQuotedScalarString(when)), ("params", flow),
                          ("why", DoubleQuotedScalarString(why))])
    for index, existing in enumerate(classes):
        if str(existing.get("when")) == when:
            entry["when"] = existing["when"]  # as it was written, quotes and all
            classes[index] = entry
            break
    else:
        catch_all = next((i for i, e in enumerate(classes) if str(e.get("when")) == "True"), None)
        classes.insert(len(classes) if catch_all is None else catch_all, entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    with tmp.open("w") as handle:
        yaml.dump(data, handle)
    tmp.replace(path)


def why_note(data: dict, when: str) -> str:
    """The written class's one-line `why` (at most 100 characters, as every `why` of a tuned file):
    what the sweep found and when; the sweep's tune_summary.md holds every candidate."""
    best = data["best"]
    pct = best.get("pct_of_cublas_fp32")
    size = (str(data["m"]) if data["m"] == data["n"] == data["k"]
            else f"{data['m']}x{data['n']}x{data['k']}")
    day = datetime.now(timezone.utc).date().isoformat()
    note = (f"{data['strategy']} sweep {day}: {best['gflops']:,.0f} GFLOP/s at {size}"
            + (f" ({pct:.0f}% of cuBLAS FP32)" if pct is not None else "")
            + f", best of {data['ok']}")
    return note[:100]
