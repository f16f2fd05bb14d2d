"""Expected failures. Each carries the `status` its job is recorded with and a one-paragraph
message that names the rule that was broken; the runner prints the message, not a traceback."""


class LabError(Exception):
    status = "failed"


class InvalidProblem(LabError):
    """M, N, K, alpha or beta are not usable numbers."""

    status = "invalid_problem"


class InvalidParams(LabError):
    """Tile parameters break one of the kernel's constraints (conf/kernel/*.yaml)."""

    status = "invalid_params"


class UnsupportedSize(LabError):
    """The problem size breaks one of the kernel's size constraints."""

    status = "unsupported_size"


class ConfigError(LabError):
    """A kernel or GPU config is malformed (a bug in conf/, not in the command line)."""

    status = "invalid_config"


class NoGPU(LabError):
    status = "no_gpu"


class OutOfMemory(LabError):
    status = "out_of_memory"


class PeerMissing(LabError):
    """A peer baseline (conf/kernel/triton_*.yaml) whose package is not installed: the row is
    skipped, not failed (the optional extra `.[peers]` installs it)."""

    status = "skipped_missing_peer"


class CompileFailed(LabError):
    status = "failed_compile"


class LaunchFailed(LabError):
    status = "failed_launch"


class VerificationFailed(LabError):
    status = "failed_verification"

    def __init__(self, message: str, rel_err: float | None):
        super().__init__(message)
        self.rel_err = rel_err


class TimedVerificationFailed(VerificationFailed):
    """The first launch was right but a timed launch, or a launch on fresh inputs after the
    timing, was not: the kernel's later launches do other work than its first."""

    status = "failed_timed_verification"
    rel_err_field = "rel_err_timed"  # the record field its rel_err goes to (rel_err: the first launch's)


class Implausible(LabError):
    """A figure beyond what the GPU can do for the kernel's precision (its math ceiling or the
    time the bytes that must move take at full memory bandwidth): a measurement or kernel bug."""

    status = "failed_implausible"


class StorageError(LabError):
    """A file the lab writes or reads (a record, the tracking store, a sweep directory) cannot
    be written or read: a full disk, a read-only directory, a damaged file. The message names
    the file and what to do; nothing half-written is left behind."""

    status = "storage_error"


class InternalError(LabError):
    """An unexpected exception: a bug in the lab itself, recorded so that a sweep goes on."""

    status = "failed_internal"


class Terminated(KeyboardInterrupt):
    """SIGTERM (a supervisor, SLURM's time limit or preemption), raised like Ctrl-C where a handler
    turns it into an exception, so that cleanup runs on the way out (open runs end KILLED, a
    tune keeps its finished jobs); not a LabError: nothing failed."""
