"""The `sgemm-lab` command (installed with the package; `python -m src.cli` is the same).

    sgemm-lab run [-m] [overrides]   a job or a sweep: exactly `python -m src.run ...`
    sgemm-lab kernels                the kernels: name, precision, what the chapter does, tuned for
    sgemm-lab results [--local]      the published table; --local: the newest sweep here
    sgemm-lab ui [--port N]          MLflow's UI on this directory's store, with ready links
    sgemm-lab ui --published         ... on the published runs (no GPU needed; built once)
    sgemm-lab links [--published]    only the links
    sgemm-lab tune [--gpu SPEC] [--shapes N] [--budget S] [--fit-only]   learn this GPU's dispatch
    sgemm-lab tune --against EARLIER.csv                               does a re-run choose alike?
    sgemm-lab explain MxNxK [--gpu SPEC] [--precision fp32|tf32]       which rule chose what, and why
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from src.paths import COMPARE_DIR, CONF_DIR, ROOT, published_sets

COMMANDS = ("run", "kernels", "results", "ui", "links", "tune", "explain")


def kernel_rows() -> list[dict]:
    """kernel_list's rows with the GPUs whose conf/tuned/<gpu>.yaml tunes each kernel (best_*: has
    its dispatch rules), as composed: a tuned file that starts from another GPU's (its defaults
    list) counts too."""
    from src.job.config import tuned_config

    tuned_for: dict[str, list[str]] = {}
    for path in sorted((CONF_DIR / "tuned").glob("*.yaml")):
        tuned = tuned_config(path.stem) or {}
        for kernel in [*(tuned.get("kernels") or {}), *(tuned.get("dispatch") or {})]:
            tuned_for.setdefault(str(kernel), []).append(path.stem)
    return [{"kernel": r["kernel"], "precision": r["precision"],
             "tuned for": ", ".join(tuned_for.get(r["kernel"], [])) or "-",
             "what it does": r["what it does"]} for r in kernel_list()]


def header_sentence(text: str, limit: int = 90) -> str:
    """The first sentence of a config's opening comment, after `Chapter NN (file):`."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    words = " ".join(lines)
    words = re.sub(r"^(Chapter \d+ \([^)]*\)|Baseline):\s*", "", words)
    sentence = re.split(r"(?<=\.)\s", words, maxsplit=1)[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[:limit - 1].rstrip() + "…"


RUN_HELP = """\
sgemm-lab: one job = one kernel x one problem on one GPU; -m sweeps any key.
  sgemm-lab run kernel=17_flagship size=4096            (or python -m src.run ...)
  sgemm-lab run -m 'kernel=glob(*)' size=1024,4096
== Pick one of each (group=option) ==
kernel=NAME     default 06_vectorize (precision, what the chapter does; sgemm-lab kernels says more)
{kernel}

gpu=NAME        default auto (the detected device's spec): {gpu}
bench=NAME      timing protocol, default default (quick: smoke tests, not for publishing): {bench}
hydra/launcher=NAME   how a sweep's jobs run: gpus (default: one at a time on each visible GPU; hydra.launcher.devices=[0,1]) | basic (one after another) | joblib (local processes) | slurm (a SLURM cluster)
+tune=KERNEL    a tuning sweep with -m: {tune}
+suite=NAME     a shape suite with -m (every shape of it, e.g. -m +suite=llm kernel=best_fp32): {suite}

== Key overrides (key=value) ==
size=4096                 m = n = k; or set m=2048 n=1024 k=512 one by one
shape=MxNxK               m, n and k at once (one sweep axis: shape=4096x2048x1024,1000x1000x1000)
alpha=1.0 beta=0.0        C = alpha * A @ B + beta * C
kernel.params.NAME=VALUE  a tile parameter (defaults and rules: conf/kernel/<kernel>.yaml)
use_tuned=false           the kernel's defaults instead of this GPU's tuned values
resume=true               reuse verified measurements with the same key from cache_dir
debug=true                a bug raises with its traceback instead of failing its job
bench.KEY=VALUE           warmup, min_samples, max_samples, target_rel_iqr, max_seconds, flush_l2
bench.timer=events        CUDA event pairs instead of CUPTI kernel timestamps (default cupti)
bench.best_cublas=true    also pair with cuBLASLt autotuned for the shape (the stronger baseline)
mlflow.enabled=false      no MLflow tracking
mlflow.tracking_uri=URI   another store or server (default: mlflow.db here, or $MLFLOW_TRACKING_URI)
mlflow.experiment_name=NAME   default sgemm-lab/config
mlflow.log_ptx=true       also keep each compiled kernel's PTX
isolation.mode=inline     run the GPU work in this process (default process: a fault fails one job)
isolation.timeout_s=120   a step (compile, verify, time) without progress this long is a hang

The composed config: --cfg job. Hydra's own flags: --hydra-help. Docs: README.md, docs/, kernels/README.md."""
HELP_FLAGS = ("--help", "-h")


def wants_run_help(args: list[str]) -> bool:
    """`run --help` / `-h`: answered here from conf/'s files, before Hydra composes anything."""
    return any(arg in HELP_FLAGS for arg in args)


def run_help() -> str:
    """`sgemm-lab run --help` (= `python -m src.run --help`): what a user picks and overrides. The
    kernel list and each group's options are read from conf/'s files (a new config shows without
    editing the help); nothing is composed, so the answer costs a directory listing and a small
    YAML read per kernel. The `tuned` group is left out on purpose: nobody picks it."""
    rows = kernel_list()
    width = max(len(r["kernel"]) for r in rows)
    kernels = "\n".join(f"  {r['kernel']:<{width}}  {r['precision']:<4}  {r['what it does']}"
                         for r in rows)
    groups = {group: " | ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
              for group in ("gpu", "bench", "tune", "suite")}
    return RUN_HELP.format(kernel=kernels, **groups)


def kernel_list() -> list[dict]:
    """One row per conf/kernel/*.yaml, read as plain YAML (no composition): name, precision and
    the first sentence of its header comment."""
    import yaml

    rows = []
    for path in sorted((CONF_DIR / "kernel").glob("*.yaml")):
        text = path.read_text()
        data = yaml.safe_load(text) or {}
        rows.append({"kernel": path.stem, "precision": str(data.get("precision", "")),
                     "what it does": header_sentence(text)})
    return rows


def show_kernels() -> int:
    from tabulate import tabulate

    rows = kernel_rows()
    print(tabulate([list(r.values()) for r in rows], headers=list(rows[0]), tablefmt="simple"))
    print("\nrun one: sgemm-lab run kernel=<kernel> size=4096; chapters: kernels/README.md")
    return 0


def show_results(root: Path | None = None, local: bool = False) -> int:
    """The published tables (results/<gpu>/progression.md, one per GPU measured); with `local`,
    the newest sweep's summary under ./multirun instead (a local sweep without a GPU holds only
    failures)."""
    root = Path.cwd() if root is None else root  # where the user runs it, not where it was imported
    if not local:
        for published in (s / "progression.md" for s in published_sets()):
            print(f"published results ({published}; your own sweeps: sgemm-lab results --local):\n")
            print(published.read_text())
        print(f"the GPUs side by side: {COMPARE_DIR / 'progression.md'}")
        return 0
    sweeps = sorted((root / "multirun").glob("*/*/summary.md"), key=lambda p: p.stat().st_mtime)
    if not sweeps:
        print(f"no sweep under {root / 'multirun'}; the published results: sgemm-lab results")
        return 1
    print(f"newest sweep here: {sweeps[-1]}\n")
    print(sweeps[-1].read_text())
    return 0


def experiment_id(db: Path, name: str) -> str | None:
    import sqlite3

    if not db.is_file():
        return None
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT experiment_id FROM experiments WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


def has_view(db: Path, experiment: str) -> bool:
    """Whether the experiment holds the lab's saved view (experiments made before it do not)."""
    import sqlite3

    from src.sweep.tracking.views import EVERY_RUN, SHARED_VIEW_PREFIX

    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT 1 FROM experiment_tags WHERE experiment_id = ? AND key = ?",
                           (experiment, SHARED_VIEW_PREFIX + EVERY_RUN)).fetchone()
    return row is not None


def ui_links(experiment: str, port: int = 5000, with_view: bool = True) -> dict[str, str]:
    """The runs table (the figures as columns) with a filter and a sort already set, for the
    README's questions."""
    from src.sweep.tracking.views import question_links

    return question_links(f"http://127.0.0.1:{port}", experiment, with_view)


def print_links(port: int, db: Path, name: str | None = None) -> str | None:
    """The experiment `name` (default: the runs' default experiment) of the store `db`: its runs
    table, then the questions' links; returns its id (None: no such experiment)."""
    from src.sweep.tracking.store import default_experiment_name
    from src.sweep.tracking.views import runs_url

    name = name or default_experiment_name(None)
    experiment = experiment_id(db, name)
    if experiment is None:
        print(f"no experiment {name!r} in {db} yet: run a job or a sweep first "
              f"(or see the published runs: sgemm-lab ui --published)")
        return None
    view = has_view(db, experiment)
    print(f"{name}, every run:\n  {runs_url(f'http://127.0.0.1:{port}', experiment, with_view=view)}")
    for what, url in ui_links(experiment, port, view).items():
        print(f"{what}:\n  {url}")
    return experiment


def the_store(store: Path | None, published: bool) -> tuple[Path, str | None]:
    """The sqlite store to show and its experiment's name: the published runs' (built on first
    use), else `store` (default ./mlflow.db) and the runs' default experiment."""
    if published:
        from src.publish.store import DEFAULT_STORE, EXPERIMENT, ensure_published

        db = store or DEFAULT_STORE
        ensure_published(db)
        return db, EXPERIMENT
    return store or Path("mlflow.db"), None


def start_ui(port: int, db: Path, name: str | None = None, published: bool = False) -> int:
    from src.sweep.tracking.portable import relocate
    from src.ui import serve

    if not db.is_file():
        print(f"error: no MLflow store {db} here (run from the directory you ran sgemm-lab in, "
              f"or see the published runs: sgemm-lab ui --published)", file=sys.stderr)
        return 1
    moved = 0 if published else relocate(db)  # the published store is built where it is
    if moved:
        print(f"{moved} artifact locations pointed at {db.resolve().parent / 'mlruns'} (the store was moved)")
    print_links(port, db, name)
    return serve(db, port)


def run_jobs(args: list[str]) -> int:
    """`python -m src.run ARGS`, in this process. It runs as `__main__` because Hydra finds
    conf/ relative to the file of a `__main__` module; imported (module src.run) it would look
    for an importable `conf` package instead and fail. src/run.py's main block turns Ctrl-C and
    SIGTERM into exit status 130 and 143, and a failed single job into 1 (SystemExit)."""
    import runpy

    # Hydra finds its plugins (the gpus launcher, the tuning sweeper) by scanning the path entries
    # of the hydra_plugins package; an editable install reaches the clone through an import hook,
    # which is no such entry. The clone's root goes first, as `python -m src.run` started in it has.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.argv = ["sgemm-lab run", *args]
    runpy.run_module("src.run", run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "run":
        if wants_run_help(argv[1:]):
            print(run_help())
            return 0
        return run_jobs(argv[1:])
    if argv and argv[0] == "tune":  # its own options (src/tune/command.py)
        from src.errors import Terminated
        from src.tune.command import main as tune_main

        try:
            return tune_main(argv[1:])
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGINT, SIGTERM: it said what it kept
            return 143 if isinstance(exc, Terminated) else 130
    if argv and argv[0] == "explain":
        from src.tune.explain import main as explain_main

        return explain_main(argv[1:])
    parser = argparse.ArgumentParser(prog="sgemm-lab", description=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--store", type=Path, default=None,
                        help="the sqlite store (default ./mlflow.db; with --published, where the "
                             "published store is built)")
    parser.add_argument("--published", action="store_true",
                        help="ui, links: the published runs (results/*.csv), no GPU needed")
    parser.add_argument("--local", action="store_true",
                        help="results: the newest sweep under ./multirun, not the published table")
    args = parser.parse_args(argv)
    if args.command == "kernels":
        return show_kernels()
    if args.command == "results":
        return show_results(local=args.local)
    try:
        db, name = the_store(args.store, args.published)
    except (OSError, ValueError) as exc:  # the published CSVs missing or not runs CSVs
        print(f"error: cannot build the published store: {exc}", file=sys.stderr)
        return 1
    if args.command == "links":
        return 0 if print_links(args.port, db, name) else 1
    return start_ui(args.port, db, name, args.published)


if __name__ == "__main__":
    sys.exit(main())
