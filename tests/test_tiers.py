"""The GPU suite's shards (`--shard K/N`, tests/conftest.py): N shards of a selection are disjoint
and together are the whole selection, and a malformed shard is a usage error."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

FILES = ["tests/test_cheating.py", "tests/test_plausibility.py"]


def collected(*args: str) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *FILES, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, [line for line in proc.stdout.splitlines() if "::" in line]


def test_shards_split_the_selection_without_loss_or_overlap():
    code, everything = collected()
    assert code == 0 and len(everything) > 6
    shards = [collected(f"--shard={k}/3")[1] for k in (1, 2, 3)]
    assert sorted(sum(shards, [])) == sorted(everything)
    assert all(shards) and max(map(len, shards)) - min(map(len, shards)) <= 1


def test_a_shard_out_of_range_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--shard=4/3",
                           FILES[0]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and "expected K/N with 1 <= K <= N" in proc.stderr
