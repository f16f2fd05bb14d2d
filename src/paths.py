"""Where the project's data lives: the config tree (conf/) and the kernel chapters (kernels/).

One place, so that no module works out the repository root from its own depth in the tree."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
KERNELS_DIR = ROOT / "kernels"
