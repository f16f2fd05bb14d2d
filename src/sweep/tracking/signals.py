"""Signals while runs are open: SIGTERM becomes KeyboardInterrupt (Terminated), and the process
remembers that it was interrupted, so that its unfinished sweep run ends KILLED, not FAILED.

The first Ctrl-C or SIGTERM interrupts; every later one is ignored until the handlers are put
back, so a user pressing Ctrl-C again (or a supervisor repeating SIGTERM) cannot break into the
cleanup that ends the open runs KILLED (`shielded` gives the same protection to a cleanup that
runs without an interrupt, e.g. ending a run FAILED)."""

from __future__ import annotations

import gc
import signal
import sys
import threading
import traceback
from contextlib import contextmanager

from src.errors import Terminated  # SIGTERM, raised like Ctrl-C so that open runs end KILLED

_interrupted = False  # set once this process is interrupted: its unfinished sweep ends KILLED
_signal_seen: int | None = None  # the signal that interrupted it (raise_if_interrupted)
_ignoring = False     # set when the first signal switched both signals to SIG_IGN


_DEFAULT_HANDLERS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def ignore_from_now() -> None:
    """Ignore Ctrl-C and SIGTERM from now on: the process is leaving after an interrupt, and
    its cleanup (runs ended KILLED, at exit) must not be cut short by the next one."""
    global _ignoring
    if _main_thread():
        for signum in _DEFAULT_HANDLERS:
            signal.signal(signum, signal.SIG_IGN)
        _ignoring = True


def _on_signal(signum, frame):
    global _signal_seen
    mark_interrupted()
    _signal_seen = signum
    ignore_from_now()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(f"terminated by signal {signum} (SIGTERM)")


def _quiet_lost_interrupt(unraisable) -> None:
    """sys.unraisablehook: our handler's exception raised where Python cannot raise it (a
    weakref callback or __del__ run by the garbage collector; measured in the soak: SQLAlchemy's
    class registry) is lost there, and Python would print its traceback. The interrupt is
    remembered (raise_if_interrupted stops the sweep before its next job), so one line says so;
    every other unraisable exception goes to the hook that was there before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _interrupted:
        name = "SIGINT (Ctrl-C)" if _signal_seen == signal.SIGINT else "SIGTERM"
        print(f"interrupted ({name}) while the garbage collector ran a cleanup, which drops "
              "exceptions: the sweep stops before its next job, if it has one", file=sys.stderr)
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def install_signal_handlers() -> bool:
    """While runs are open: SIGTERM raises Terminated, and both it and Ctrl-C mark the process
    interrupted. Signals that something else (a launcher) already handles are left alone, and so
    is everything outside the main thread. True if installed (undo: restore_signal_handlers)."""
    if not _main_thread():
        return False
    global _previous_unraisablehook
    installed = False
    for signum, default in _DEFAULT_HANDLERS.items():
        if signal.getsignal(signum) is default:
            signal.signal(signum, _on_signal)
            installed = True
    if installed and sys.unraisablehook is not _quiet_lost_interrupt:
        _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _quiet_lost_interrupt
    return installed


def restore_signal_handlers() -> None:
    """Put the default handlers back where ours are. After an interrupt the signals stay
    ignored: the process is on its way out, and what runs at its exit (the sweep's run ended
    KILLED, at atexit) must not be cut short by the next Ctrl-C (`reset` undoes that, for a
    process that carries on)."""
    if not _main_thread() or _ignoring:
        return
    for signum, default in _DEFAULT_HANDLERS.items():
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, default)


def reset() -> None:
    """Default handlers, and no interrupt remembered: for a process that goes on after one
    (a test runner)."""
    global _ignoring, _interrupted
    if _main_thread():
        for signum, default in _DEFAULT_HANDLERS.items():
            if signal.getsignal(signum) in (_on_signal, signal.SIG_IGN):
                signal.signal(signum, default)
    global _signal_seen
    _ignoring = _interrupted = False
    _signal_seen = None
    if sys.unraisablehook is _quiet_lost_interrupt:
        sys.unraisablehook = _previous_unraisablehook


@contextmanager
def shielded():
    """Run a cleanup (ending runs) to its end: a Ctrl-C or SIGTERM arriving meanwhile is held
    and raised after it, once, as the signal's handler would have."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in _DEFAULT_HANDLERS}
    for signum in _DEFAULT_HANDLERS:
        signal.signal(signum, lambda received, frame: pending.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if pending:
        handler = previous[pending[0]]
        if callable(handler):
            handler(pending[0], None)
        elif handler == signal.SIG_DFL:  # SIGTERM's default: end the process
            signal.raise_signal(pending[0])


def let_go(exc: BaseException) -> None:
    """Drop the frames an interrupt holds (its traceback, and those of the exceptions it was
    raised during), then collect: a Ctrl-C or SIGTERM that lands while SQLAlchemy writes to
    MLflow's sqlite store (measured: several rows in one INSERT, as its result was being set up)
    leaves that write's transaction open on a connection only those frames still hold, and the
    store stays locked for every process until they go: the next write, this process's own run
    ended KILLED too, waited sqlite's 20 s and failed, and the runs were left RUNNING (the soak,
    tests/test_soak.py). Called before an interrupted job or sweep ends its runs; what the
    console says of an interrupt is one line, not its traceback. Any other exception keeps its
    frames: its traceback is the report of what went wrong."""
    if not isinstance(exc, KeyboardInterrupt):
        return
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # the frames done with; a running one is kept
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
    gc.collect()


def mark_interrupted() -> None:
    global _interrupted
    _interrupted = True


def was_interrupted() -> bool:
    return _interrupted


def raise_if_interrupted() -> None:
    """Raise the interrupt again if this process was interrupted and is still going: a library
    may swallow the exception a signal handler raises (measured: a SIGTERM that landed while
    Hydra validated a sweep's next batch was lost, the handlers were already switched to ignore,
    and the sweep ran to its end ignoring every later SIGTERM). Called before each job."""
    if not _interrupted:
        return
    if _signal_seen == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated("terminated by an earlier signal (SIGTERM) whose exception was lost")
