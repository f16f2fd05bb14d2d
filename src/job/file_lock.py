"""A lock file of the job cache: a setup that several processes may want at once (the CUTLASS
peer's nvcc build, a Triton peer's autotune at one shape, a dispatch autotune) is done by the
first, under the lock, while the others wait and then read what it left in the cache instead of
doing it again. An flock: the kernel drops it when its holder dies (a worker killed for a hang),
so no stale lock outlives a process. What the first leaves is written whole or not at all
(write_atomically), so a reader never sees half a file."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("sgemm")


@contextlib.contextmanager
def held(path: Path):
    """Hold the exclusive lock on `path` (created if missing) for the block; waits for another
    holder. OSError when the file cannot be opened (a read-only cache): the caller decides."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def entry_held(path: Path, what: str, instead: str):
    """Hold the lock of the cache entry `path` (`path`.lock, its folder made if missing) for the
    block and yield True: a second process waits here, then finds the entry. When the cache cannot
    be used (read-only, full), warn once ("`what`: cannot use ...; `instead`") and yield False:
    the caller does the work in this process without sharing it."""
    with contextlib.ExitStack() as stack:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(held(path.with_suffix(".lock")))
            locked = True
        except OSError as exc:
            log.warning("%s: cannot use %s (%s: %s); %s", what, path.parent, type(exc).__name__,
                        exc, instead)
            locked = False
        yield locked


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` through a temporary beside it, renamed over it: whole or not at all.
    OSError (a read-only or full cache) is the caller's; no temporary is left behind."""
    fd, private = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(private, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(private)
        raise
