"""The cards step (src/records/cards.py) on the published H100 runs, which hold two cards' runs of
the same jobs: split by card, the second card's runs come back as replicates of the first's new
run; the same card's earlier runs, other code and another protocol are dropped."""

from __future__ import annotations

import csv
from pathlib import Path

from src.publish.table import main as table_main
from src.records import cards
from src.records.collect import read_runs, records_from_runs
from src.records.replicates import combine

PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "h100_sxm" / "runs.csv"


def _rows() -> list[dict]:
    with PUBLISHED.open(newline="") as f:
        return list(csv.DictReader(f))


def _by_card() -> tuple[list[dict], list[dict]]:
    """The runs of the card with the most rows (the new run) and of another card (the earlier)."""
    rows = _rows()
    counts: dict[tuple, int] = {}
    for r in rows:
        counts[cards.card(r)] = counts.get(cards.card(r), 0) + 1
    first, second = sorted(counts, key=lambda c: -counts[c])[:2]
    return [r for r in rows if cards.card(r) == first], [r for r in rows if cards.card(r) == second]


def _write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _same_code(new: list[dict], earlier: list[dict]) -> list[dict]:
    """The earlier rows whose kernel, size and source the new run measured too."""
    measured = {(r["kernel"], r["size"], r["source_sha256"]) for r in new}
    return [r for r in earlier if (r["kernel"], r["size"], r["source_sha256"]) in measured]


def test_the_published_runs_hold_two_cards():
    assert len({cards.card(r) for r in _rows()}) >= 2


def test_another_cards_runs_are_kept_as_renumbered_replicates():
    new, earlier = _by_card()
    merged, counts = cards.keep_other_cards(new, earlier)
    same = _same_code(new, earlier)
    assert same and counts == {"kept": len(same), "same_card": 0,
                               "other_job": len(earlier) - len(same)}
    assert merged[:len(new)] == new
    numbers: dict[tuple, list[int]] = {}
    for r in merged:
        numbers.setdefault((r["kernel"], r["size"]), []).append(int(r["replicate"] or 1))
    assert all(len(set(n)) == len(n) for n in numbers.values())  # combine() would refuse repeats
    kept = merged[len(new):]
    assert all(r["job"].startswith(cards.card(r)[0] + ": ") for r in kept)
    again, _ = cards.keep_other_cards(new, kept)  # a row kept before is labelled once
    assert all(r["job"].count(cards.card(r)[0]) == 1 for r in again[len(new):])
    for key, n in numbers.items():
        mine = [int(r["replicate"] or 1) for r in new if (r["kernel"], r["size"]) == key]
        assert min(n[len(mine):], default=max(mine) + 1) > max(mine)


def test_the_same_cards_earlier_runs_are_superseded():
    new, earlier = _by_card()
    merged, counts = cards.keep_other_cards(new, new + earlier)
    same = _same_code(new, earlier)
    assert counts["same_card"] == len(new) and counts["kept"] == len(same)
    assert len(merged) == len(new) + len(same)


def test_other_code_or_another_protocol_is_not_a_replicate():
    new, earlier = _by_card()
    changed = [dict(r, source_sha256="0" * 64) if r["kernel"] == "17_flagship" else r for r in earlier]
    changed = [dict(r, **{"bench.min_samples": "7"}) if r["kernel"] == "01_naive" else r
               for r in changed]
    merged, counts = cards.keep_other_cards(new, changed)
    dropped = sum(r["kernel"] in ("17_flagship", "01_naive") for r in earlier)
    assert dropped and counts["other_job"] == dropped + len(earlier) - len(_same_code(new, earlier))
    assert not any(r["kernel"] in ("17_flagship", "01_naive") for r in merged[len(new):])


def test_the_merged_file_publishes_rows_on_two_cards(tmp_path):
    new, earlier = _by_card()
    path = _write(tmp_path / "runs.csv", new)
    earlier_path = _write(tmp_path / "earlier.csv", earlier)
    assert cards.main([str(path), "--earlier", str(earlier_path)]) == 0
    frame = read_runs(path)
    records = records_from_runs(frame)
    rows = combine(records, list(frame.kernel))
    both = {(r["kernel"], r["size"]) for r in _same_code(new, earlier)}
    assert both and all(row.machines == (2 if (label, row.record.size_label) in both else 1)
                        for label, row in rows)
    assert not list(tmp_path.glob("*.cards"))
    assert table_main([str(path), "--out-dir", str(tmp_path / "out")]) == 0
    text = " ".join((tmp_path / "out" / "progression.md").read_text().split())  # unwrapped
    assert "on up to 2 machine(s)" in text or "on 1–2 cards" in text


def test_no_earlier_file_keeps_the_new_runs_as_they_are(tmp_path):
    new, _ = _by_card()
    path = _write(tmp_path / "runs.csv", new)
    before = path.read_bytes()
    assert cards.main([str(path), "--earlier", str(tmp_path / "missing.csv")]) == 0
    assert path.read_bytes() == before
