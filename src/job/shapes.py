"""Shapes as one value: `shape=MxNxK` sets m, n and k together, so a shape suite is one sweep axis
(conf/suite/: `python -m src.run -m +suite=llm kernel=best_fp32`) rather than three that Hydra
would cross. conf/config.yaml reads m, n and k through the `shape_dim` resolver registered here:
with shape unset they are `size` (or what m=, n=, k= say)."""

from __future__ import annotations

import re

from omegaconf import OmegaConf

SHAPE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


def digits(shape) -> tuple[int, int, int] | None:
    """(m, n, k) of "MxNxK" with any non-negative integers, or None when it is not that form."""
    match = SHAPE.match(str(shape))
    return tuple(int(g) for g in match.groups()) if match else None


def parse(shape: str) -> tuple[int, int, int] | None:
    """(m, n, k) of "MxNxK", or None when it is not three positive integers joined by x."""
    dims = digits(shape)
    return dims if dims and min(dims) > 0 else None


def shape_dim(shape, index, default):
    """Dimension `index` (0 m, 1 n, 2 k) of `shape`, or `default` when no shape is set. A shape
    that does not parse is handed on as it is, and a zero as a zero, for the problem's check to
    refuse with its rule (m=0, not the whole shape)."""
    if shape is None or str(shape) == "":
        return default
    dims = digits(shape)
    return str(shape) if dims is None else dims[int(index)]


OmegaConf.register_new_resolver("shape_dim", shape_dim, replace=True)
