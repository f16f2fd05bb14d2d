"""A sweep's progress line: N of M, time spent and left, ok / failed so far; tqdm's meter in a
terminal, plain text elsewhere; M counted from the overrides as Hydra's basic sweeper splits them."""

from __future__ import annotations

import io

from src.sweep.progress import Progress, sweep_size
from tests.conftest import CONF_DIR, compose_config


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_count_jobs_and_estimate_the_rest():
    clock, out = Clock(), io.StringIO()
    progress = Progress(4, out, clock)
    progress.job_started(["kernel=01_naive", "size=1024"])
    clock.now += 30
    progress.job_ended({"status": "ok"})
    progress.job_started(["kernel=02_gmem_coalesce", "size=1024"])
    clock.now += 10
    progress.job_ended({"status": "failed_compile"})
    progress.job_started(["kernel=03_smem_blocking", "size=1024"])
    lines = out.getvalue().splitlines()
    assert lines[0] == "job 1 of 4: kernel=01_naive size=1024  (0:00 elapsed; 0 ok, 0 failed so far)"
    assert lines[1] == ("job 2 of 4: kernel=02_gmem_coalesce size=1024  "
                        "(0:30 elapsed, about 1:30 left; 1 ok, 0 failed so far)")
    # 40 s for 2 jobs: 20 s each, 2 to go
    assert lines[2] == ("job 3 of 4: kernel=03_smem_blocking size=1024  "
                        "(0:40 elapsed, about 0:40 left; 1 ok, 1 failed so far)")


def test_jobs_running_at_once_on_several_gpus_get_numbers_of_their_own():
    clock, out = Clock(), io.StringIO()
    progress = Progress(3, out, clock)
    progress.job_started(["kernel=01_naive"], gpu="0")
    progress.job_started(["kernel=02_gmem_coalesce"], gpu="1")
    clock.now += 10
    progress.job_ended({"status": "ok"})
    progress.job_started(["kernel=03_smem_blocking"], gpu="0")
    lines = out.getvalue().splitlines()
    assert lines[0] == "job 1 of 3: kernel=01_naive  [GPU 0]  (0:00 elapsed; 0 ok, 0 failed so far)"
    assert lines[1].startswith("job 2 of 3: kernel=02_gmem_coalesce  [GPU 1]  (0:00 elapsed;")
    assert lines[2] == ("job 3 of 3: kernel=03_smem_blocking  [GPU 0]  "
                        "(0:10 elapsed, about 0:20 left; 1 ok, 0 failed so far)")


def test_a_job_that_raised_counts_as_failed_and_reused_ones_as_ok():
    progress = Progress(None, io.StringIO(), Clock())
    progress.add_total(3)
    progress.reused(1)
    progress.job_ended(None)
    assert (progress.total, progress.done, progress.ok, progress.failed) == (3, 2, 1, 1)


def test_a_terminal_gets_tqdms_meter():
    clock, out = Clock(), Terminal()
    progress = Progress(96, out, clock)
    for _ in range(12):
        progress.job_ended({"status": "ok"})
    clock.now += 60
    progress.job_started(["kernel=22_ffma_warp_specialized", "size=4096"])
    text = out.getvalue()
    assert text.startswith("[13/96] kernel=22_ffma_warp_specialized size=4096\n")
    assert "12/96" in text and "01:00<07:00" in text and "12 ok, 0 failed" in text


def test_the_total_is_what_hydras_basic_sweeper_makes_of_the_overrides():
    config = compose_config(return_hydra_config=True)
    kernels = len(list((CONF_DIR / "kernel").glob("*.yaml")))
    assert sweep_size(config, ["kernel=glob(*)", "size=1024,4096"]) == 2 * kernels
    assert sweep_size(config, ["kernel=06_vectorize", "kernel.params.bk=8,16",
                               "kernel.params.bm=64,128,256"]) == 6
    assert sweep_size(config, ["size=1024"]) == 1


def test_a_long_override_is_shown_brief_and_a_short_one_whole():
    """A tuning sweep's candidate list (thousands of characters a job) is shown as its count of
    items; other long values are cut; short overrides stay as typed."""
    from src.sweep.progress import BRIEF_CHARS, brief

    candidates = ",".join(f"{{bm:{64 * (i % 4 + 1)},bn:64,stages:{i % 5 + 3},split_k:8}}"
                          for i in range(70))
    out = io.StringIO()
    Progress(2, out, Clock()).job_started(
        ["+tune=gemm_tf32", "shape=26x20x1125", f"++tune.candidates=[{candidates}]",
         "kernel.params.bm=128"], gpu="1")
    assert out.getvalue().splitlines()[0] == (
        "job 1 of 2: +tune=gemm_tf32 shape=26x20x1125 ++tune.candidates=[70 items] "
        "kernel.params.bm=128  [GPU 1]  (0:00 elapsed; 0 ok, 0 failed so far)")
    nested = "x=[[" + ",".join(["1"] * 60) + "],[2,3],{a:[4,5]}]"
    assert brief(nested) == "x=[3 items]"
    quoted = "names=['a,b', \"c,d,e\", '" + "f" * 80 + "']"
    assert brief(quoted) == "names=[3 items]"  # commas inside quotes do not separate items
    long_text = "note=" + "y" * 200
    assert brief(long_text) == long_text[:BRIEF_CHARS - 3] + "..."
    assert brief("shape=" + "1" * 60) == "shape=" + "1" * 60


def test_a_long_override_loses_its_password_before_it_is_cut():
    """A tracking URI longer than the brief width, its password before the cut and its `@` after:
    shortened first, the password would lose the mark that shows it is one and stay on the line."""
    from src.sweep.progress import BRIEF_CHARS

    secret = "s3cret-" + "x" * 60
    uri = f"tracking.uri=postgresql://lab:{secret}@" + "db-host.example" * 4 + "/mlflow"
    assert uri.index("@") > BRIEF_CHARS  # the cut would fall inside the password
    out = io.StringIO()
    Progress(1, out, Clock()).job_started(["kernel=01_naive", uri])
    line = out.getvalue()
    assert "s3cret" not in line and "postgresql://***@db-host" in line
