"""Entry point: `python -m src.run [-m] [overrides]`. Thin on purpose: job.run_job does the work.

A single run exits non-zero when its job fails; in a sweep (-m) a failed job is recorded and the
sweep goes on (the job ran in a worker process, src/sweep/worker.py, so even a fault or a hang costs
only that job), and callbacks.SweepSummary prints the table at the end. Each job is an MLflow run
(tracking.hydra_job_run), nested under the sweep's run (callbacks.MlflowSweep) in a sweep.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from src.compose import rules as compose_rules
from src.errors import StorageError
from src.job import shapes  # noqa: F401  (registers ${shape_dim:}, used for m, n and k)
from src.sweep import callbacks  # noqa: F401  (registers ${pid:}, used in hydra.sweep.dir)
from src.sweep.tracking import Terminated, signals, TrackingUnavailable, hydra_job_run
from src.job.tuned import explicit_params
from src.sweep.worker import refused, run_isolated

log = logging.getLogger("sgemm")

compose_rules.install()  # before Hydra composes: a kernel config is data, it cannot run code


def fail_fast_on_bad_input(cfg: DictConfig, output_dir: Path) -> None:
    """A single run whose inputs break a rule (the problem, bench.*, isolation.*) ends here, in
    about a second: its record.json and the error, before a worker or a tracking store (MLflow's
    import alone takes 2 s) is started. In a sweep the same refusal is the job's record and run."""
    record = refused(cfg)
    if record is not None:
        unwritten = write_record(record, output_dir)
        if unwritten is not None:
            log.error("error [%s]: %s", unwritten.status, unwritten)
        log.error("error [%s]: %s", record.status, record.error)
        sys.exit(1)


def write_record(record, output_dir: Path) -> StorageError | None:
    """record.json, or the StorageError that kept it from being written (a full disk, a
    read-only directory): the job's result is no less measured for it, so it is still logged."""
    try:
        record.write(output_dir)
    except StorageError as exc:
        return exc
    return None


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    """One job; returns its record as a dict (what a sweeper, e.g. the tuning one, reads)."""
    hc = HydraConfig.get()
    signals.raise_if_interrupted()  # an interrupt a library swallowed stops the sweep here
    sweep_dir = Path(hc.runtime.cwd) / str(hc.sweep.dir)
    if hc.mode != RunMode.MULTIRUN:
        fail_fast_on_bad_input(cfg, Path(hc.runtime.output_dir))
    elif (skipped := callbacks.not_run_after_no_gpu(cfg, sweep_dir)) is not None:
        skipped.write(Path(hc.runtime.output_dir))  # no worker, no MLflow run: nothing ran
        log.info(skipped.console_line())
        return skipped.to_dict()
    try:
        with hydra_job_run(cfg) as tracked:
            record, outputs = run_isolated(cfg, explicit_params(list(hc.overrides.task)),
                                           tracked.run_id)
            tracked.hold_signals()  # the record, its run's files and FINISHED go together
            unwritten = write_record(record, Path(hc.runtime.output_dir))
            tracked.log_result(record, outputs)
    except TrackingUnavailable as exc:  # raised before the job ran: nothing to record
        log.error("error [%s]: %s", exc.status, exc)
        sys.exit(1)
    if hc.mode == RunMode.MULTIRUN:
        callbacks.note_no_gpu(sweep_dir, record)
    if unwritten is not None:  # the result stands (console, MLflow); its file is missing
        log.error("error [%s]: %s", unwritten.status, unwritten)
    if unwritten is not None and hc.mode != RunMode.MULTIRUN:
        log.info(record.console_line())
        sys.exit(1)
    if record.ok or hc.mode == RunMode.MULTIRUN:
        log.info(record.console_line())  # a sweep goes on; its summary lists the failures
    else:
        log.error("error [%s]: %s", record.status, record.error)
        sys.exit(1)
    return record.to_dict()


def print_help_if_asked() -> None:
    """`--help` is answered from conf/'s files before Hydra composes anything (src.cli.run_help).
    src.cli is loaded by name only then: help text is no part of a job's result, so the DVC bench
    stage (which lists what src.run imports) does not depend on it."""
    cli = importlib.import_module("src.cli")
    if cli.wants_run_help(sys.argv[1:]):
        print(cli.run_help())
        sys.exit(0)


def refuse_keyless_overrides(args: list[str]) -> None:
    """`=5` (an override with no key) is refused in one line: Hydra accepts it from its parser
    and then fails deep in composing, with a 40-line traceback."""
    keyless = [arg for arg in args if not arg.startswith("-") and arg.lstrip("+~").startswith("=")]
    if keyless:
        print(f"error [invalid_override]: the override {keyless[0]!r} names no key (rule: an "
              f"override is key=value, e.g. m=4096 or kernel=06_vectorize; python -m src.run "
              f"--help lists the keys).", file=sys.stderr)
        sys.exit(1)


def exit_code(exc: SystemExit) -> int:
    """sys.exit's argument as a process status, as the interpreter would turn it into one."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def end_process(code: int) -> NoReturn:
    """The process's end once its work is done: non-daemon threads are joined and the atexit
    handlers run (slots and workers stopped, unfinished runs ended KILLED; in this order, as the
    interpreter's own exit runs them), logs and output are flushed, and then the process
    exits without the interpreter's finalization. Why: a soak sweep once wrote its summary and
    never exited, its main thread in the final garbage collection with no Python frame; that
    collection runs the finalizers of every library object still in a reference cycle, and one
    that blocks there hangs a finished sweep. Nothing of the lab's own is left to finalize."""
    # First what the interpreter's exit runs before atexit: the callbacks registered with
    # threading (concurrent.futures' and joblib's executors stop their workers) and the join of
    # non-daemon threads; skipping it left a joblib-launched sweep waiting on its loky workers.
    threading._shutdown()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say
            pass
    os._exit(code)


def run_main() -> NoReturn:
    code = 0
    try:
        print_help_if_asked()
        refuse_keyless_overrides(sys.argv[1:])
        main()
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (tracking.Terminated): runs end KILLED
        signals.ignore_from_now()  # a Ctrl-C again must not cut the exit's cleanup short
        print(f"interrupted: {str(exc) or 'Ctrl-C'}", file=sys.stderr)
        code = 143 if isinstance(exc, Terminated) else 130
    except SystemExit as exc:
        code = exit_code(exc)
    end_process(code)


if __name__ == "__main__":
    run_main()
