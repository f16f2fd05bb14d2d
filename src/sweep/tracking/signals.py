"""Signals while runs are open: SIGTERM becomes KeyboardInterrupt (Terminated), and the process
remembers that it was interrupted, so that its unfinished sweep run ends KILLED, not FAILED."""

from __future__ import annotations

import signal
import threading

class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that open runs end KILLED on the way out."""


_interrupted = False  # set once this process is interrupted: its unfinished sweep ends KILLED


_DEFAULT_HANDLERS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}


def _on_signal(signum, frame):
    mark_interrupted()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(f"terminated by signal {signum} (SIGTERM)")


def install_signal_handlers() -> bool:
    """While runs are open: SIGTERM raises Terminated, and both it and Ctrl-C mark the process
    interrupted. Signals that something else (a launcher) already handles are left alone, and so
    is everything outside the main thread. True if installed (undo: restore_signal_handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    installed = False
    for signum, default in _DEFAULT_HANDLERS.items():
        if signal.getsignal(signum) is default:
            signal.signal(signum, _on_signal)
            installed = True
    return installed


def restore_signal_handlers() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum, default in _DEFAULT_HANDLERS.items():
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, default)


def mark_interrupted() -> None:
    global _interrupted
    _interrupted = True


def was_interrupted() -> bool:
    return _interrupted
