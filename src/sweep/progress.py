"""Progress of a sweep in the launching process: before each job a line with N of M, the time
spent, an estimate of the time left and the ok / failed counts so far, then the job's overrides
(a long list, such as a tuning sweep's `++tune.candidates=[...]`, as its count of items: the whole
value stays in the job's .hydra/overrides.yaml).

Hydra's basic launcher runs the jobs one after another in this process and calls the callbacks
around each (on_job_start, on_job_end), so one Progress object sees them all; on several GPUs the
lab's launcher (hydra_plugins/sgemm_lab/gpu_launcher.py) calls it as it hands each job out. The total comes
from the sweep's overrides (Hydra's own splitting) or, in a tuning sweep, from the tuning
sweeper, which adds the candidates it will measure (`add_total`). In a terminal the line carries
tqdm's bar and rate; otherwise (a log file, CI) it is plain text.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    def __init__(self, total: int | None = None, stream=None, clock=time.monotonic):
        self.total = total
        self.stream = stream if stream is not None else sys.stdout
        self.clock = clock
        self.started = clock()
        self.done = self.ok = self.failed = 0
        self.running = 0  # jobs handed out and not ended (several at once on several GPUs)

    def add_total(self, count: int) -> None:
        self.total = (self.total or 0) + count

    def reused(self, count: int) -> None:
        """`count` jobs of the total taken from the measurement cache instead of run."""
        self.done += count
        self.ok += count

    def job_started(self, overrides: list[str], gpu: str | None = None) -> None:
        """`gpu`: which GPU runs the job, when a sweep runs on several (its CUDA_VISIBLE_DEVICES)."""
        from src.sweep.tracking.credentials import redact  # a tracking URI's password stays out

        # redacted before it is shortened: a cut could leave a password without its `@`
        what = " ".join(brief(redact(o)) for o in overrides)
        what += f"  [GPU {gpu}]" if gpu is not None else ""
        print(self.line(what), file=self.stream, flush=True)
        self.running += 1

    def job_ended(self, record: dict | None) -> None:
        """`record`: what the job returned (run.py: its record as a dict), None if it raised."""
        self.running = max(self.running - 1, 0)
        self.done += 1
        if isinstance(record, dict) and record.get("status") == "ok":
            self.ok += 1
        else:
            self.failed += 1

    def line(self, what: str) -> str:
        elapsed = self.clock() - self.started
        counts = f"{self.ok} ok, {self.failed} failed"
        number = self.done + self.running + 1
        if self._terminal():
            meter = tqdm.format_meter(self.done, self.total, elapsed, ncols=60,
                                      postfix=counts, unit="job")
            return f"[{number}/{self.total or '?'}] {what}\n  {meter}"
        total = f" of {self.total}" if self.total else ""
        eta = ""
        if self.total and self.done:
            left = elapsed / self.done * max(self.total - self.done, 0)
            eta = f", about {_clock(left)} left"
        return f"job {number}{total}: {what}  ({_clock(elapsed)} elapsed{eta}; {counts} so far)"

    def _terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())


BRIEF_CHARS = 80  # an override longer than this is shortened on the progress line


def brief(override: str) -> str:
    """`override` as the progress line shows it: whole when short; a long list as its count of
    top-level items (`++tune.candidates=[70 items]`); any other long value cut, with an ellipsis."""
    if len(override) <= BRIEF_CHARS or "=" not in override:
        return override
    name, value = override.split("=", 1)
    if value.startswith("[") and value.endswith("]"):
        # commas outside any nested bracket or quoted string separate the items (counted here:
        # Hydra's override parser takes 27 ms on a 70-candidate list, once a job in the launcher)
        depth, items, quote = 0, 1 if value[1:-1].strip() else 0, None
        for char in value[1:-1]:
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char in "[{(":
                depth += 1
            elif char in "]})":
                depth -= 1
            elif char == "," and depth == 0:
                items += 1
        return f"{name}=[{items} items]"
    return f"{override[:BRIEF_CHARS - 3]}..."


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def sweep_size(config, arguments: list[str]) -> int | None:
    """How many jobs Hydra's basic sweeper makes of `arguments` (None for another sweeper, which
    reports its own total, or when the overrides cannot be counted here)."""
    if not str(config.hydra.sweeper.get("_target_", "")).endswith(("BasicSweeper", "LabSweeper")):
        return None
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        search_path = ConfigSearchPathImpl()  # the run's own, searchpath additions included
        for source in config.hydra.runtime.config_sources:
            search_path.append(source.provider, f"{source.schema}://{source.path}")
        loader = ConfigLoaderImpl(config_search_path=search_path)
        # as the basic sweeper does: the config's hydra.sweeper.params first (a shape suite's
        # shapes, conf/suite/), then the command line's
        params = config.hydra.sweeper.get("params") or {}
        arguments = [f"{key}={value}" for key, value in params.items()] + list(arguments)
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
        return sum(len(batch) for batch in BasicSweeper.split_arguments(parsed, None))
    except Exception:  # a count is a nicety: never stop a sweep for it
        return None


# The sweep in progress in this process (None between sweeps): the tuning sweeper adds to it.
current: Progress | None = None
