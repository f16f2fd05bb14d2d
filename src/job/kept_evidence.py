"""The tuner's evidence read once per process (per version of the file): every job of a sweep
asks the same questions of it (is the shape covered well, which candidates), and reading and
tabling an H100's file (224,000 rows) took 3 to 4 s of CPU a job while its GPU waited.

    results/tuning/<gpu>.csv -> rows (training.read) -> one dispatcher's table (training.table)

A version is the file's path, size, modification time and inode: a tune that rewrites it (in
place or by a rename) is read again. The rows and tables are shared: callers only read them. Two
files' rows are kept at once (an H100's take about 200 MB of memory), four tables.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from src.job import training


def _version(path: Path) -> tuple:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino


def rows(path: Path) -> list[dict]:
    """training.read(path), read once per version of the file."""
    return _rows(*_version(Path(path)))


def table(path: Path, dispatcher: str) -> training.Table:
    """training.table(rows(path), dispatcher), built once per version of the file."""
    return _table(*_version(Path(path)), dispatcher)


@lru_cache(maxsize=2)
def _rows(path: str, size: int, mtime_ns: int, inode: int) -> list[dict]:
    return training.read(Path(path))


@lru_cache(maxsize=4)
def _table(path: str, size: int, mtime_ns: int, inode: int, dispatcher: str) -> training.Table:
    return training.table(_rows(path, size, mtime_ns, inode), dispatcher)
