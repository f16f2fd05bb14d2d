"""A local MLflow store that still shows its files after being copied or moved.

MLflow writes each experiment's and run's artifact location into `mlflow.db` as an absolute path
(it resolves relative ones when they are stored), so a copied `mlflow.db` + `mlruns/` points at
the old directory and the UI shows no artifacts. `relocate` points every location that names an
`mlruns/` folder at the `mlruns/` beside the database, where the files now are.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from src.sweep.tracking.store import ARTIFACTS_DIR

# (table, column) pairs of MLflow's schema that hold artifact locations
LOCATIONS = (("experiments", "artifact_location"), ("runs", "artifact_uri"))


def relocated(location: str, artifacts_dir: Path) -> str | None:
    """`location` moved under `artifacts_dir`, if it names an `mlruns/` folder elsewhere."""
    marker = f"/{ARTIFACTS_DIR}/"
    if marker not in location or not location.startswith(("/", "file:")):
        return None
    tail = location.split(marker, 1)[1]
    moved = (artifacts_dir / tail).as_uri()
    # the same folder written as a path or as a file: URI (MLflow stores experiment 0's as a
    # path) has not moved
    same = location if location.startswith("file:") else Path(location).as_uri()
    return None if moved == same else moved


def relocate(db: Path) -> int:
    """Point the store `db` at the `mlruns/` beside it; returns how many locations changed."""
    artifacts_dir = db.resolve().parent / ARTIFACTS_DIR
    changed = 0
    with sqlite3.connect(db) as conn:
        for table, column in LOCATIONS:
            rows = conn.execute(f"SELECT rowid, {column} FROM {table}").fetchall()
            for rowid, location in rows:
                moved = relocated(location or "", artifacts_dir)
                if moved is not None:
                    conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (moved, rowid))
                    changed += 1
    return changed
