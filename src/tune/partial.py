"""A partial re-tune's evidence (`sgemm-lab tune --kernels`, `--missing`, both together): which rows
of the earlier evidence file stay, and the rules that keep its rows and the new ones one screen."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from src.errors import ConfigError
from src.job.training import read as read_evidence


def candidates(settings: dict) -> set[str]:
    """Every kernel the dispatch may choose: the dispatchers' candidates and the fallback."""
    from src.tune.plan import dispatch_candidates

    kernels = dispatch_candidates(settings)
    if settings.get("fallback"):
        kernels.add(settings["fallback"]["kernel"])
    return kernels


def kept_evidence(plan, settings: dict, csv_path: Path, remeasured: set[str]) -> list[dict]:
    """A partial re-tune's rows of the other candidates, from `csv_path`: the candidates named
    must be the dispatch's, and the file must hold the plan's training shapes with its screening
    shapes as stage 1, and the kept candidates' sources as they are today
    (evidence.kept_rows)."""
    from src.tune import evidence

    checked(settings, remeasured)
    rows = earlier_evidence(plan, csv_path, "--kernels", remeasured)
    return evidence.kept_rows(rows, remeasured)


def named(settings: dict, text: str) -> set[str]:
    """`--kernels`' comma list, each of them a candidate of the dispatch (or a ConfigError)."""
    return checked(settings, {k.strip() for k in text.split(",") if k.strip()})


def checked(settings: dict, remeasured: set[str]) -> set[str]:
    """`remeasured`, if it names some kernels and each is a candidate of the dispatch."""
    known = candidates(settings)
    unknown = sorted(remeasured - known)
    if unknown or not remeasured:
        raise ConfigError(f"--kernels names {', '.join(unknown) or 'no kernel'}; it takes a comma "
                          f"list of the dispatch's candidates ({', '.join(sorted(known))}) (rule: "
                          f"a partial re-tune measures candidates of conf/tuning/dispatch.yaml).")
    return remeasured


def earlier_evidence(plan, csv_path: Path, flag: str, remeasured: set[str] = frozenset(),
                     partial: bool = False) -> list[dict]:
    """The rows of `csv_path` that a partial re-tune (`flag`) extends: the file must hold the
    plan's training shapes (`partial`: some of them, as a run cut short saved them), its
    screening shapes as stage 1 (`partial`: the run measures the rest) and, but for the candidates
    measured again (`remeasured`, whose rows are replaced), no other screen shape than those or a
    kernel's own region's, so that its rows and the new ones make one screen."""
    if not csv_path.is_file():
        raise ConfigError(f"{flag} extends the evidence file {csv_path}, which does not exist "
                          f"(rule: a partial re-tune extends an earlier run's evidence); run the "
                          f"whole tune first.")
    rows = read_evidence(csv_path)
    planned = {s.label for s in plan.shapes}
    screening_shapes = planned - {s.label for s in plan.rest + plan.added}
    held = {r["shape"] for r in rows}
    screened = {r["shape"] for r in rows if r["stage"] == 1}
    first = {r["shape"] for r in rows if r["stage"] == 1 and r["kernel"] not in remeasured}
    region = {s.label for shapes in plan.region.values() for s in shapes}  # a kernel's own screen
    if not (held <= planned if partial else held == planned) or (plan.rest and not (
            (partial or screening_shapes <= screened) and first <= screening_shapes | region)):
        raise ConfigError(f"{csv_path} holds {len(held)} training shapes ({len(screened)} screened) "
                          f"and this plan {len(planned)} ({len(screening_shapes)} screened) (rule: "
                          f"a partial re-tune ({flag}) keeps rows measured over the same training "
                          f"shapes and screen); pass the --shapes of that run, or run the whole tune.")
    return rows


def missing_evidence(plan, settings: dict, csv_path: Path,
                     only: set[str] | None = None) -> tuple[list[dict], dict]:
    """`--missing`: (the rows of `csv_path` that stay, {kernel: rows left out}). A row stays while
    its kernel's source is today's; a row of another source (or of none) is left out, and its
    candidate is measured again wherever the plan has it (earlier_evidence's rules hold); with
    `only` (--kernels) another candidate's rows must all be of today's source."""
    from src.tune import evidence

    rows = earlier_evidence(plan, csv_path, "--missing", partial=True)
    today = {k: evidence.source_sha256(k) for k in {r["kernel"] for r in rows}}
    stale = Counter(r["kernel"] for r in rows if r.get("source_sha256") != today[r["kernel"]])
    if only is not None and (unnamed := sorted(set(stale) - only)):
        raise ConfigError(f"--missing --kernels {','.join(sorted(only))} would drop the rows of "
                          f"{', '.join(unnamed)} measured from another source without measuring "
                          f"them again (rule: --kernels with --missing measures only the named "
                          f"candidates' missing jobs; every other row must be of today's source); "
                          f"add them to --kernels, or drop --kernels.")
    return [r for r in rows if r.get("source_sha256") == today[r["kernel"]]], dict(stale)
