"""Staged writing of a step's published files: each is written under its own name in a staging
folder beside them, and all replace the published ones together, only once every one was
written. A step that fails midway (a bad input, a full disk) leaves the published files as they
were and no new ones."""

from __future__ import annotations

import contextlib
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

STAGING = ".new"  # a folder, so each file keeps its name (matplotlib picks a format by extension)


@contextmanager
def staged(out_dir: Path) -> Iterator[Callable[[str], Path]]:
    """`with staged(dir) as new: write(new("a.csv"))`: the files named through `new` land in
    `dir` when the block ends without an error; on an error none does."""
    staging = out_dir / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # of a run killed before it could clean up
    staging.mkdir(parents=True)
    names: list[str] = []

    def new(name: str) -> Path:
        names.append(name)
        return staging / name

    try:
        yield new
        for name in names:  # renames within one file system: each is whole at once
            (staging / name).replace(out_dir / name)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
