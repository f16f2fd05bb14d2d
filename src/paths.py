"""Where the project's data lives: the config tree (conf/) and the kernels (kernels/: the
chapters, the GEMM library and the headers both include).

One place, so that no module works out the repository root from its own depth in the tree."""

from __future__ import annotations

import argparse
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
KERNELS_DIR = ROOT / "kernels"
CHAPTERS_DIR = KERNELS_DIR / "chapters"   # the progression: one idea per chapter
LIBRARY_DIR = KERNELS_DIR / "gemm"        # the production kernels the dispatch runs
INCLUDE_DIR = KERNELS_DIR / "include"     # the headers both include (the tile vocabulary)
TEST_KERNELS_DIR = ROOT / "tests" / "kernels"  # the test-only broken kernels (tests/conf/kernel/)
KERNEL_DIRS = (KERNELS_DIR, TEST_KERNELS_DIR)
SOURCE_SUFFIXES = (".cu", ".cuh")
RESULTS_DIR = ROOT / "results"            # one published set per GPU spec: results/<gpu>/
COMPARE_DIR = RESULTS_DIR / "compare"     # the GPUs side by side (dvc.yaml: compare)


def existing_file(rule: str):
    """argparse's type for an input file: its Path, or a one-line refusal naming the file and
    `rule` (what the file is and which step writes it) when no file is there."""
    def checked(text: str) -> Path:
        path = Path(text)
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{path} is not a file (rule: {rule})")
        return path
    return checked


def published_sets(results: Path = RESULTS_DIR) -> list[Path]:
    """The published per-GPU sets, results/<gpu>/ with a runs.csv, by spec name."""
    return sorted(p.parent for p in results.glob("*/runs.csv") if p.parent != COMPARE_DIR)


def kernel_file(path: Path | str, kernel: str = "?") -> Path:
    """`path` (relative to kernels/, or absolute) resolved, if it is a CUDA source inside one of
    the kernel folders; else ConfigError. Keeps a config (`kernel.source`) or an #include from
    handing any file on the machine to NVRTC and, through MLflow, to whoever reads the runs."""
    from src.errors import ConfigError

    resolved, inside = _resolved(str(path))
    if not inside or resolved.suffix not in SOURCE_SUFFIXES:
        raise ConfigError(
            f"kernel {kernel}: source {str(path)!r} resolves to {resolved}, which is not a CUDA "
            f"source ({', '.join(SOURCE_SUFFIXES)}) in the kernel folders (rule: kernel.source "
            f"and its #includes stay inside {', '.join(_shown(d) for d in KERNEL_DIRS)}).")
    if not resolved.is_file():
        raise ConfigError(f"kernel {kernel}: source {resolved} does not exist.")
    return resolved


@lru_cache(maxsize=1024)
def _resolved(path: str) -> tuple[Path, bool]:
    """`path` resolved under kernels/ and whether it lies in a kernel folder (memoised: a tune's
    plan builds 160,000 specs, each resolving its source through the file system)."""
    resolved = (KERNELS_DIR / path).resolve()
    return resolved, any(resolved.is_relative_to(folder.resolve()) for folder in KERNEL_DIRS)


def _shown(folder: Path) -> str:
    return (str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)) + "/"
