"""The Triton peers' autotune choice shared through the cache_dir (src/job/triton_tuning.py),
without a GPU or Triton: two processes' worth of askers (threads, each with its own lock file
handle, as two slots' workers have) and a stand-in autotune. The first autotunes and keeps its
choice; a second asking meanwhile waits for it and reuses it, saying so, with the first's
seconds; a choice for another GPU or shape, or an unreadable one, is never reused; a cache that
cannot be written costs the sharing only."""

from __future__ import annotations

import json
import threading
import time

import pytest

from src.job import triton_tuning
from src.job.recording import Tuning
from src.job.triton_tuning import Choice, shared

H200_4096 = {"kernel_sha256": "abc", "triton": "3.9.0", "gpu": "NVIDIA H200", "arch": "sm_90",
             "m": 4096, "n": 4096, "k": 4096, "has_beta": False, "input_precision": "tf32x3"}
CHOSEN = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8,
          "num_stages": 3, "num_ctas": 1}


def autotune_as(seconds: float, tuned: list):
    def autotune():
        tuned.append(seconds)
        return Choice(dict(CHOSEN), Tuning(seconds, "BLOCK_M: 128, BLOCK_N: 256"))
    return autotune


def test_a_second_process_asking_meanwhile_waits_and_reuses_the_first_s_choice(tmp_path):
    tuned, tuning, asking, got = [], threading.Event(), threading.Event(), {}

    def slow_autotune():  # the first's autotune lasts until the second has asked, and then some
        tuning.set()
        asking.wait(timeout=30)
        time.sleep(0.3)
        return autotune_as(7.5, tuned)()

    def ask(i, autotune):
        got[i] = shared(tmp_path, H200_4096, autotune)

    first = threading.Thread(target=ask, args=(0, slow_autotune))
    first.start()
    assert tuning.wait(timeout=30)  # the first holds the lock, autotuning
    second = threading.Thread(target=ask, args=(1, autotune_as(1.0, tuned)))
    second.start()
    asking.set()
    first.join(timeout=60)
    second.join(timeout=60)
    assert tuned == [7.5]  # one autotune
    assert got[0] == Choice(CHOSEN, Tuning(7.5, "BLOCK_M: 128, BLOCK_N: 256", reused=False))
    assert got[1] == Choice(CHOSEN, Tuning(7.5, "BLOCK_M: 128, BLOCK_N: 256", reused=True))


def test_the_choice_is_kept_per_gpu_and_shape_and_read_back_by_a_later_process(tmp_path):
    tuned = []
    shared(tmp_path, H200_4096, autotune_as(7.5, tuned))
    kept = json.loads(triton_tuning.path_for(tmp_path, H200_4096).read_text())
    assert (kept["kwargs"], kept["seconds"], kept["described"]) == (CHOSEN, 7.5, H200_4096)
    assert shared(tmp_path, H200_4096, autotune_as(1.0, tuned)).tuning.reused
    for other in ({"gpu": "NVIDIA H100 80GB HBM3"}, {"m": 1024}, {"has_beta": True},
                  {"input_precision": "ieee"}, {"triton": "3.8.0"}, {"kernel_sha256": "def"}):
        assert not shared(tmp_path, {**H200_4096, **other}, autotune_as(2.0, tuned)).tuning.reused
    assert tuned == [7.5] + [2.0] * 6


@pytest.mark.parametrize("text", ["{not json", json.dumps({"kwargs": CHOSEN}), json.dumps(
    {"described": {**H200_4096, "gpu": "NVIDIA H100"}, "kwargs": CHOSEN, "seconds": 1.0, "config": "x"})])
def test_an_unreadable_or_foreign_choice_is_autotuned_again_and_replaced(tmp_path, text):
    path = triton_tuning.path_for(tmp_path, H200_4096)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    tuned = []
    assert not shared(tmp_path, H200_4096, autotune_as(7.5, tuned)).tuning.reused
    assert tuned == [7.5] and json.loads(path.read_text())["described"] == H200_4096


def test_a_cache_that_cannot_be_written_costs_the_sharing_only(tmp_path, caplog):
    (tmp_path / "peers").write_text("a file where the folder would be")
    tuned = []
    first = shared(tmp_path, H200_4096, autotune_as(7.5, tuned))
    again = shared(tmp_path, H200_4096, autotune_as(7.5, tuned))
    assert first == again and not again.tuning.reused and tuned == [7.5, 7.5]
    assert "autotuning in this process only" in caplog.text
