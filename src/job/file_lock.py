"""A lock file of the job cache: a setup that several processes may want at once (the CUTLASS
peer's nvcc build, a Triton peer's autotune at one shape) is done by the first, under the lock,
while the others wait and then read what it left in the cache instead of doing it again. An
flock: the kernel drops it when its holder dies (a worker killed for a hang), so no stale lock
outlives a process."""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path


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
