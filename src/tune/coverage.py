"""Where a training set is sparsest: the shapes of a pool (draws that stand for the shapes users
run) chosen one at a time, each the one that most shortens the pool's summed log2 distance to its
nearest known shape (a greedy facility location, src/job/training.distance's metric). A shape so
chosen lands where the pool is dense and the known shapes few; a held-out shape in such a region
otherwise takes its neighbours from another kernel's region (docs/heldout.md, "Grown shapes")."""

from __future__ import annotations

import numpy as np


def covering(pool: list[tuple[int, int, int]], known: list[tuple[int, int, int]], count: int) -> list[int]:
    """Indices into `pool` of up to `count` shapes, in the order chosen. Gains are rounded to 1e-9
    before the first largest is taken, so float sums that differ in their last bits choose alike;
    none is chosen once no draw shortens any distance."""
    logs = np.log2(np.array(pool, dtype=np.float64).reshape(-1, 3))
    known_logs = np.log2(np.array(known, dtype=np.float64).reshape(-1, 3))

    def apart(a, b):  # every row of a to every row of b
        return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1))

    nearest = apart(logs, known_logs).min(axis=1)   # `known` holds a shape at least
    between = apart(logs, logs)
    chosen: list[int] = []
    for _ in range(min(count, len(pool))):
        gain = np.round(np.maximum(nearest[:, None] - between, 0.0).sum(axis=0), 9)
        best = int(np.argmax(gain))
        if gain[best] <= 0:
            break
        chosen.append(best)
        nearest = np.minimum(nearest, between[:, best])
    return chosen
