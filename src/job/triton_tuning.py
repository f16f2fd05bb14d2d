"""Share step of the Triton peers' autotune (src/job/triton_gemm.py): the config Triton's autotune
chose for one key (the kernel's source, Triton's version, the GPU, M, N, K, beta or not, the
input precision) is kept in `<cache_dir>/peers/triton/<key>.json` with the autotune's seconds,
so another process (another GPU's slot in the same sweep, a later sweep) launches that config
without autotuning again. Triton's autotune results live in its process only; its own
`cache_results` keys by architecture, not by GPU (an H100's choice would serve an H200), and
holds no lock. Here the autotune runs under a lock per key (src/job/file_lock.py): a second
process asking meanwhile waits for the first's choice. A choice read back says `reused`."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from src.job.file_lock import entry_held, write_atomically
from src.job.recording import Tuning

log = logging.getLogger("sgemm")


@dataclass(frozen=True)
class Choice:
    """A chosen config: the keyword arguments a launch passes Triton (Config.all_kwargs()) and
    the setup as the record keeps it (seconds, Triton's text of the config, reused)."""

    kwargs: dict
    tuning: Tuning


def path_for(cache_dir: Path | str, described: dict) -> Path:
    key = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    return Path(cache_dir) / "peers" / "triton" / f"{key[:24]}.json"


def shared(cache_dir: Path | str, described: dict, autotune: Callable[[], Choice]) -> Choice:
    """The choice kept for `described` in `cache_dir` (reused), else `autotune()`'s, kept there
    for the next process. A cache that cannot be written costs the sharing only."""
    path = path_for(cache_dir, described)
    with entry_held(path, "triton autotune cache", "autotuning in this process only") as locked:
        if not locked:
            return autotune()
        kept = _read(path, described)
        if kept is not None:
            return kept
        choice = autotune()
        _write(path, described, choice)
        return choice


def _read(path: Path, described: dict) -> Choice | None:
    """The choice in `path`, reused; None when there is none or it is unreadable (autotune again)."""
    try:
        data = json.loads(path.read_text())
        if data["described"] != described:  # a key collision or an edited file
            return None
        return Choice(dict(data["kwargs"]), Tuning(float(data["seconds"]), data["config"], reused=True))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, described: dict, choice: Choice) -> None:
    text = json.dumps({"described": described, "kwargs": choice.kwargs,
                       "seconds": choice.tuning.seconds, "config": choice.tuning.config}, indent=1)
    try:
        write_atomically(path, text)  # a reader never sees half a choice
    except OSError as exc:
        log.warning("triton autotune cache: cannot write %s (%s: %s); the next process autotunes "
                    "again", path, type(exc).__name__, exc)

