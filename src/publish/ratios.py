"""What the published reports share about their ratios against cuBLAS: the dispatching kernels
they summarise (and each one's precision), the geometric mean they summarise with, and the ticks
of their log-scale ratio axes. Apart from suite.py so that a report reading published tables
(compare.py) does not load the suite's check against today's dispatch."""

from __future__ import annotations

import math

import pandas as pd

DISPATCHERS = {"best_fp32": "fp32", "best_tf32": "tf32"}
RATIO_TICKS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)


def geomean(values) -> float | None:
    values = [float(v) for v in values if v is not None and not pd.isna(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
