"""The `sgemm-lab` command (installed with the package; `python -m src.cli` is the same).

    sgemm-lab run [-m] [overrides]   a job or a sweep: exactly `python -m src.run ...`
    sgemm-lab kernels                the kernels: name, precision, what the chapter does, tuned for
    sgemm-lab results                the newest sweep's summary here, else the published table
    sgemm-lab ui [--port N]          MLflow's UI on this directory's store, with ready links
    sgemm-lab links [--port N]       only the links
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from src.paths import CONF_DIR, ROOT

COMMANDS = ("run", "kernels", "results", "ui", "links")


def kernel_rows() -> list[dict]:
    """One row per conf/kernel/*.yaml: name, precision, the first sentence of its header
    comment, and the GPUs whose conf/tuned/<gpu>.yaml tunes it (best_*: has its dispatch rules),
    as composed: a tuned file that starts from another GPU's (its defaults list) counts too."""
    from omegaconf import OmegaConf

    from src.job.config import tuned_config

    tuned_for: dict[str, list[str]] = {}
    for path in sorted((CONF_DIR / "tuned").glob("*.yaml")):
        tuned = tuned_config(path.stem) or {}
        for kernel in [*(tuned.get("kernels") or {}), *(tuned.get("dispatch") or {})]:
            tuned_for.setdefault(str(kernel), []).append(path.stem)
    rows = []
    for path in sorted((CONF_DIR / "kernel").glob("*.yaml")):
        cfg = OmegaConf.load(path)
        rows.append({"kernel": path.stem, "precision": str(cfg.get("precision", "")),
                     "tuned for": ", ".join(tuned_for.get(path.stem, [])) or "-",
                     "what it does": header_sentence(path.read_text())})
    return rows


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


def help_section(group: str) -> str:
    """Text for `python -m src.run --help` (conf/hydra/help/sgemm.yaml, through the resolver
    `sgemm_lab_help` that src/run.py registers): the kernels, one a line, or a group's options.
    Read from conf/ when help is asked for, so a new config shows without editing the help."""
    if group == "kernel":
        rows = kernel_rows()
        width = max(len(r["kernel"]) for r in rows)
        return "\n".join(f"  {r['kernel']:<{width}}  {r['precision']:<4}  {r['what it does']}"
                         for r in rows)
    return " | ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


def show_kernels() -> int:
    from tabulate import tabulate

    rows = kernel_rows()
    print(tabulate([list(r.values()) for r in rows], headers=list(rows[0]), tablefmt="simple"))
    print("\nrun one: sgemm-lab run kernel=<kernel> size=4096; chapters: kernels/README.md")
    return 0


def show_results(root: Path | None = None) -> int:
    root = Path.cwd() if root is None else root  # where the user runs it, not where it was imported
    sweeps = sorted((root / "multirun").glob("*/*/summary.md"), key=lambda p: p.stat().st_mtime)
    if sweeps:
        print(f"newest sweep here: {sweeps[-1]}\n")
        print(sweeps[-1].read_text())
    published = ROOT / "results" / "progression.md"
    if published.is_file():
        if sweeps:
            print(f"published results (dvc repro): {published}")
        else:
            print(f"no sweep under {root / 'multirun'}; the published results ({published}):\n")
            print(published.read_text())
    return 0


def experiment_id(db: Path, name: str) -> str | None:
    import sqlite3

    if not db.is_file():
        return None
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT experiment_id FROM experiments WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


def ui_links(experiment: str, port: int = 5000) -> dict[str, str]:
    """The runs table with a filter and a sort already set, for the README's two questions."""
    base = f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs"

    def link(search: str, order: str) -> str:
        return (f"{base}?searchFilter={quote(search, safe='')}"
                f"&orderByKey={quote(order, safe='')}&orderByAsc=false")

    return {
        "fastest FP32 kernels at 4096 (GFLOP/s, % of cuBLAS FP32)": link(
            "params.m = '4096' and params.n = '4096' and params.k = '4096' "
            "and params.precision = 'fp32'", "metrics.`gflops`"),
        "every kernel at 4096 against cuBLAS in its own precision": link(
            "params.m = '4096' and params.n = '4096' and params.k = '4096'",
            "metrics.`pct_of_cublas`"),
        "failed jobs, newest first (open one: its description is the error)": link(
            "attributes.status = 'FAILED' and tags.kind = 'job'", "attributes.end_time"),
    }


def print_links(port: int, db: Path) -> str | None:
    from src.sweep.tracking.store import default_experiment_name

    name = default_experiment_name(None)
    experiment = experiment_id(db, name)
    if experiment is None:
        print(f"no experiment {name!r} in {db} yet: run a job or a sweep first")
        return None
    for what, url in ui_links(experiment, port).items():
        print(f"{what}:\n  {url}")
    return experiment


def start_ui(port: int, db: Path) -> int:
    from src.sweep.tracking.portable import relocate

    if not db.is_file():
        print(f"error: no MLflow store {db} here (run from the directory you ran sgemm-lab in)",
              file=sys.stderr)
        return 1
    moved = relocate(db)
    if moved:
        print(f"{moved} artifact locations pointed at {db.resolve().parent / 'mlruns'} (the store was moved)")
    print_links(port, db)
    return subprocess.call([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri",
                            f"sqlite:///{db.resolve()}", "--host", "127.0.0.1", "--port", str(port)])


def run_jobs(args: list[str]) -> int:
    """`python -m src.run ARGS`, in this process. It runs as `__main__` because Hydra finds
    conf/ relative to the file of a `__main__` module; imported (module src.run) it would look
    for an importable `conf` package instead and fail. src/run.py's main block turns Ctrl-C and
    SIGTERM into exit status 130 and 143, and a failed single job into 1 (SystemExit)."""
    import runpy

    sys.argv = ["sgemm-lab run", *args]
    runpy.run_module("src.run", run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "run":
        return run_jobs(argv[1:])
    parser = argparse.ArgumentParser(prog="sgemm-lab", description=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--store", type=Path, default=Path("mlflow.db"), help="the sqlite store")
    args = parser.parse_args(argv)
    if args.command == "kernels":
        return show_kernels()
    if args.command == "results":
        return show_results()
    if args.command == "links":
        return 0 if print_links(args.port, args.store) else 1
    return start_ui(args.port, args.store)


if __name__ == "__main__":
    sys.exit(main())
