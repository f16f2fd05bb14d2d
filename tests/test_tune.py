"""The tuning step (src/tune/space.py) and its sweeper (hydra_plugins/sgemm_lab/tune_sweeper.py):
search spaces as config, pruning by the kernel's own rules, the strategies, the summary and the
write-back into conf/tuned/. The GPU test runs a small tuning sweep twice."""

from __future__ import annotations

import json
import shutil

import pytest
from omegaconf import OmegaConf

from src.tune import space as tune
from src.job import tuned
from src.errors import InvalidParams
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.job.spec import KernelSpec
from tests.conftest import CONF_DIR
from tests.test_cli import run_cli, tracked_runs

H100 = limits_from_spec("h100_sxm")
P4096 = Problem(4096, 4096, 4096, 1.0, 0.0)


def kernel_cfg(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml"))


def tune_cfg(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "tune" / f"{name}.yaml"))["tune"]


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF_DIR / "tune").glob("*.yaml")))
def test_every_tune_config_names_a_tunable_kernel_and_its_parameters(name):
    settings = tune.Settings.from_cfg(tune_cfg(name))
    kernel = kernel_cfg(name)
    assert set(settings.space) == set(kernel["params"])  # the whole space, nothing unknown
    assert settings.strategy in ("grid", "tpe") and (settings.strategy == "grid" or settings.trials)


def test_pruning_counts_each_candidate_once_under_the_rule_it_breaks():
    settings = tune.Settings.from_cfg(tune_cfg("10_warptiling"))
    kernel = kernel_cfg("10_warptiling")
    candidates = tune.grid(settings.space)
    assert len(candidates) == tune.space_size(settings.space) >= 300  # "several hundred"
    pruning = tune.prune(kernel, candidates, P4096, H100)
    assert len(pruning.valid) + pruning.pruned_total == len(candidates)
    assert pruning.valid and pruning.pruned_total
    rules = {item["rule"] for item in kernel["constraints"] + kernel["size_constraints"]}
    assert set(pruning.pruned) <= rules
    for params, spec in pruning.valid[:50]:
        assert isinstance(spec, KernelSpec) and spec.params == {**kernel["params"], **params}
    # every pruned candidate really breaks the rule it is counted under
    valid = {tune.params_key(p) for p, _ in pruning.valid}
    broken = [c for c in candidates if tune.params_key(c) not in valid]
    for params in broken[::97]:
        assert tune.check(kernel, params, P4096, H100) in pruning.pruned
    # the committed tuned choice is a candidate that survives
    choice = tuned.lookup("10_warptiling", "h100_sxm", P4096).params
    assert tune.params_key(choice) in valid


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (67, 3579, 2991), (1536, 1536, 1536),
                                   (16, 8192, 8192)])
def test_the_pruner_gives_prunes_verdict_and_asks_each_candidate_once(shape, monkeypatch):
    # the tuning plan's pruner (its verdicts kept for the run) against prune itself: the same
    # candidates kept in the same order, the same twins, the same counts under each rule
    kernel = {**kernel_cfg("gemm_tf32"), "precision": "tf32"}
    candidates = tune.grid(tune.Settings.from_cfg(tune_cfg("gemm_tf32")).space)
    problem = Problem(*shape, 0.5, 3.0)
    pruning = tune.prune(kernel, candidates, problem, H100)
    monkeypatch.setattr(tune.Pruner, "_memo", {})
    asked = []
    real_check = tune.check
    monkeypatch.setattr(tune, "check", lambda *a: asked.append(a[1]) or real_check(*a))
    pruner = tune.Pruner(kernel, candidates, H100)
    outline = pruner.at(problem)
    assert [pruner.keys[i] for i in outline.valid] == [tune.params_key(p) for p, _ in pruning.valid]
    assert pruner.same_as(outline) == pruning.same_as
    assert outline.pruned == pruning.pruned
    assert outline.pruned.most_common(1) == pruning.pruned.most_common(1)
    assert len(asked) == len(candidates)
    # a second plan of the same sweep, and a sweep of a subset (the screen's survivors), ask none
    again = tune.Pruner(kernel, candidates, H100).at(problem)
    survivors = [candidates[i] for i in outline.valid[::3]]
    subset = tune.Pruner(kernel, survivors, H100)
    assert again == outline and len(asked) == len(candidates)
    assert [subset.keys[i] for i in subset.at(problem).valid] == [tune.params_key(p) for p in survivors]
    assert len(asked) == len(candidates)
    # an edited config (a tighter shared-memory rule) or other limits (fewer SMs) are asked again
    tighter = {**kernel, "constraints": kernel["constraints"] + [
        {"rule": "smem_bytes <= 100000", "why": "a test's tighter ring"}]}
    edited = tune.Pruner(tighter, candidates, H100).at(problem)
    assert len(asked) == 2 * len(candidates)
    assert "smem_bytes <= 100000" in edited.pruned
    tune.Pruner(kernel, candidates, {**H100, "sms": 100}).at(problem)
    assert len(asked) == 3 * len(candidates)


@pytest.mark.parametrize("block,needle", [
    ({}, "needs tune.space"),
    ({"space": {"bm": []}}, "needs tune.space"),
    ({"space": {"bm": [64]}, "strategy": "anneal"}, "tune.strategy must be one of grid, tpe"),
    ({"space": {"bm": [64]}, "strategy": "tpe"}, "needs tune.trials"),
    ({"space": {"bm": [64], "bn": [64]}, "candidates": [{"bm": 64}]}, "tune.candidates must"),
    ({"space": {"bm": [64]}, "candidates": []}, "tune.candidates must"),
])
def test_bad_tuning_settings_name_the_rule(block, needle):
    with pytest.raises(InvalidParams, match=needle):
        tune.Settings.from_cfg(block)


def test_the_verdicts_computed_on_other_cores_are_the_pruners_own(monkeypatch):
    """src/tune/prefill.py: the plan's verdicts, split by shape over two worker processes, are
    the ones each sweep's Pruner computes itself, kept under the same keys; with the work too
    small to split, or one core, nothing is computed and nothing kept."""
    from src.tune import distribution, prefill
    from src.tune import plan as plan_mod

    settings = plan_mod.load_settings()
    shapes = distribution.stratified(distribution.training(), 6)
    monkeypatch.setattr(tune.Pruner, "_memo", {})
    assert prefill.prefill(settings, shapes, H100, workers=2) == 0  # under MIN_VERDICTS
    assert prefill.prefill(settings, shapes, H100, workers=1) == 0 and not tune.Pruner._memo
    monkeypatch.setattr(prefill, "MIN_VERDICTS", 0)
    total = prefill.prefill(settings, shapes, H100, workers=2)
    parallel = dict(tune.Pruner._memo)
    work = prefill.tasks(settings, shapes, H100)
    assert total == len(parallel) == sum(len(c) * len(d) for _, c, d in work) > 0
    monkeypatch.setattr(tune.Pruner, "_memo", {})
    for cfg, candidates, dims in work:
        pruner = tune.Pruner(cfg, candidates, H100)
        for d in dims:
            pruner.at(Problem(*d, settings["alpha"], settings["beta"]))
    assert tune.Pruner._memo == parallel
    assert any(isinstance(v, bytes) for v in parallel.values())  # built launches
    assert any(isinstance(v, str) for v in parallel.values())    # and broken rules
    # what the process holds is not computed again: all of it, nothing; one shape's dropped, it
    monkeypatch.setattr(tune.Pruner, "_memo", dict(parallel))
    assert prefill.prefill(settings, shapes, H100, workers=2) == 0
    dropped = tuple(shapes[0].dims)  # a memo key: (config and limits, m, n, k, alpha, beta, params)
    monkeypatch.setattr(tune.Pruner, "_memo", {k: v for k, v in parallel.items() if k[1:4] != dropped})
    again = prefill.prefill(settings, shapes, H100, workers=2)
    assert 0 < again == sum(len(c) for _, c, d in work if shapes[0].dims in d) < total
    assert tune.Pruner._memo == parallel


def test_tpe_asks_within_the_space_and_learns_from_what_it_is_told():
    """A synthetic objective (no GPU): peaked at one corner of a 3 x 3 x 3 x 3 space; after
    asks and tells, TPE's best is the peak and it asked only values from the space."""
    pytest.importorskip("optuna")
    space = {"a": [1, 2, 3], "b": [1, 2, 3], "c": [1, 2, 3], "d": [1, 2, 3]}
    from src.tune.tpe import TpeSearch

    search = TpeSearch(space, seed=0, startup=8)
    best = 0.0
    for _ in range(40):
        trial, params = search.ask()
        assert all(params[k] in space[k] for k in space)
        if params["d"] == 1:  # a "constraint": never measured
            search.tell(trial, None, pruned=True)
            continue
        value = 100.0 - sum((params[k] - 3) ** 2 for k in "abc") - params["d"]
        best = max(best, value)
        search.tell(trial, value)
    assert best == 100.0 - 2  # a=b=c=3, d=2
    pruned = [t for t in search.study.trials if t.state.name == "PRUNED"]
    assert pruned and all(t.params["d"] == 1 for t in pruned)


def test_write_back_replaces_its_size_class_and_keeps_the_rest(tmp_path):
    path = tmp_path / "h100_sxm.yaml"
    shutil.copy(CONF_DIR / "tuned" / "h100_sxm.yaml", path)
    before = path.read_text()
    new = {"bm": 64, "bn": 128, "bk": 16, "wm": 32, "wn": 64, "wniter": 2, "tm": 4, "tn": 4,
           "threads": 128}
    tune.write_back(path, "10_warptiling", "True", new, "1 GFLOP/s at 4096; test")
    after = path.read_text()
    assert after.count("  10_warptiling:") == 1 and "1 GFLOP/s at 4096; test" in after
    # everything but the 10_warptiling entry is as it was, comments included
    strip = [l for l in before.splitlines() if "10_warptiling" not in l]
    for line in strip:
        if line.strip().startswith("#"):
            assert line in after
    data = OmegaConf.to_container(OmegaConf.load(path))["kernels"]
    original = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "tuned" / "h100_sxm.yaml"))["kernels"]
    assert data["10_warptiling"] == [{"when": "True", "params": new,
                                      "why": "1 GFLOP/s at 4096; test"}]
    assert {k: v for k, v in data.items() if k != "10_warptiling"} == \
        {k: v for k, v in original.items() if k != "10_warptiling"}
    # a new size class goes before the catch-all, and the lookup finds it for its sizes
    small = dict(new, bm=32)
    tune.write_back(path, "10_warptiling", "m * n <= 1024 * 1024", small, "small")
    classes = OmegaConf.to_container(OmegaConf.load(path))["kernels"]["10_warptiling"]
    assert [c["when"] for c in classes] == ["m * n <= 1024 * 1024", "True"]


def test_write_back_creates_a_file_for_a_new_gpu(tmp_path):
    path = tmp_path / "h200.yaml"
    tune.write_back(path, "10_warptiling", "True", {"bm": 128}, "x")
    assert OmegaConf.to_container(OmegaConf.load(path)) == {
        "kernels": {"10_warptiling": [{"when": "True", "params": {"bm": 128}, "why": "x"}]}}
    assert path.read_text().startswith("# Tuned tile parameters for gpu spec h200")


SMALL_SPACE = ["tune.space.bm=[128]", "tune.space.bn=[64,128]", "tune.space.bk=[16]",
               "tune.space.wniter=[2]", "tune.space.tn=[4]", "tune.space.threads=[128]"]


def run_on_fake_gpu(tmp_path, *args, **env):
    """The runner as run_cli runs it, on a pretend H100 with stand-in workers (tests/fault_jobs)."""
    import subprocess
    import sys

    from tests.fault_jobs import FAKE_GPU_RUN
    from tests.test_cli import ROOT, cli_env

    return subprocess.run([sys.executable, "-c", FAKE_GPU_RUN, *args,
                           f"hydra.sweep.dir={tmp_path}/sweep"], cwd=ROOT, env=cli_env(**env),
                          capture_output=True, text=True, timeout=300)


def test_a_tuning_sweep_prunes_runs_and_summarizes(tmp_path, tracking_uri):
    """The sweeper end to end (on a pretend H100, stand-in workers): pruned candidates never
    become jobs; every other one is a job; the summary counts them; MLflow has the sweep's run
    with a child per job, the trials table and the counts."""
    proc = run_on_fake_gpu(tmp_path, "-m", "+tune=10_warptiling", "size=256", *SMALL_SPACE,
                           "bench=quick", f"cache_dir={tmp_path}/cache",
                           MLFLOW_TRACKING_URI=tracking_uri)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = tmp_path / "sweep"
    data = json.loads((sweep / "tune_summary.json").read_text())[0]
    records = [json.loads(p.read_text()) for p in sweep.glob("*/record.json")]
    assert data["space_size"] == data["candidates_considered"] == 2 * 3 * 3 * 2  # bn wm wn tm
    assert data["pruned"] + data["measured"] == 36 and data["measured"] == len(records) > 0
    assert data["pruned"] == sum(data["pruned_by_rule"].values()) > 0
    assert data["ok"] == data["measured"] and data["gpu_spec"] == "h100_sxm"
    assert "# Tuning 10_warptiling at 256" in proc.stdout
    assert (sweep / "tune_summary.md").read_text() in proc.stdout
    parents, jobs = tracked_runs(tracking_uri)
    assert len(parents) == 1 and len(jobs) == len(records)
    tags = parents[0].data.tags
    assert tags["tune_measured"] == str(len(records)) and tags["tune_pruned"] == str(data["pruned"])
    assert tags["tune_strategy"] == "grid"


@pytest.mark.parametrize("in_file", [False, True])
def test_a_tuning_sweep_over_listed_candidates_measures_only_those(tmp_path, in_file):
    """`++tune.candidates=[...]`, or the same list in `++tune.candidates_file` (as the stages of
    `sgemm-lab tune` pass it), on a pretend H100 with stand-in workers: the listed candidates
    that build are the jobs, one that breaks a rule is pruned, and nothing else of the space is
    measured."""
    settings = tune.Settings.from_cfg(tune_cfg("10_warptiling"))
    kernel = kernel_cfg("10_warptiling")
    pruning = tune.prune(kernel, tune.grid(settings.space), Problem(256, 256, 256, 1.0, 0.0), H100)
    valid = [p for p, _ in pruning.valid[:2]]
    broken = next(c for c in tune.grid(settings.space)
                  if isinstance(tune.check(kernel, c, Problem(256, 256, 256, 1.0, 0.0), H100), str))
    listed = "[" + ",".join("{" + ",".join(f"{k}:{v}" for k, v in c.items()) + "}"
                            for c in valid + [broken]) + "]"
    given = f"++tune.candidates={listed}"
    if in_file:
        (tmp_path / "listed.json").write_text(json.dumps(valid + [broken]))
        given = f"++tune.candidates_file={tmp_path / 'listed.json'}"
    proc = run_on_fake_gpu(tmp_path, "-m", "+tune=10_warptiling", "size=256", "bench=quick",
                           given, f"cache_dir={tmp_path}/cache", "mlflow.enabled=false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "sweep" / "tune_summary.json").read_text())[0]
    records = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/record.json")]
    assert data["candidates_considered"] == 3 and data["pruned"] == 1
    assert data["measured"] == len(records) == 2  # the space builds hundreds here


def test_a_tuning_sweep_without_a_gpu_stops_before_any_candidate(tmp_path):
    """No GPU: one clear error and exit status 1 at once, not hundreds of no_gpu jobs."""
    from src.job import gpu

    try:
        gpu.detect()
        pytest.skip("a GPU is visible")
    except Exception:
        pass
    proc = run_cli(tmp_path, "-m", "+tune=10_warptiling", "size=256", "mlflow.enabled=false")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [no_gpu]" in output and "none was started" in output
    assert not list((tmp_path / "sweep").glob("*/record.json")) and "Traceback" not in output


def test_a_bad_tuning_config_is_one_clear_error(tmp_path):
    proc = run_cli(tmp_path, "-m", "+tune=10_warptiling", "tune.strategy=tpe", "mlflow.enabled=false")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [invalid_params]" in output and "tune.trials" in output
    assert "Traceback" not in output


@pytest.mark.gpu
def test_a_tuning_sweep_run_again_reuses_every_measurement(tmp_path, tracking_uri):
    common = ["-m", "+tune=10_warptiling", "size=512", *SMALL_SPACE, "bench=quick",
              f"cache_dir={tmp_path}/cache"]
    first = run_cli(tmp_path / "a", *common, MLFLOW_TRACKING_URI=tracking_uri)
    again = run_cli(tmp_path / "b", *common, MLFLOW_TRACKING_URI=tracking_uri)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    a = json.loads((tmp_path / "a" / "sweep" / "tune_summary.json").read_text())[0]
    b = json.loads((tmp_path / "b" / "sweep" / "tune_summary.json").read_text())[0]
    assert a["ok"] == a["measured"] > 0 and a["from_cache"] == 0
    assert b["from_cache"] == b["measured"] == a["measured"]
    assert b["best"] == a["best"] and b["top"] == a["top"]
    parents, jobs = tracked_runs(tracking_uri)
    assert len(parents) == 2 and len(jobs) == a["measured"]  # reused trials are not re-logged
    cached = [json.loads(p.read_text()) for p in (tmp_path / "b" / "sweep").glob("*/record.json")]
    assert {r["mlflow_run_id"] for r in cached} == {job.info.run_id for job in jobs}


def test_a_written_class_says_why_in_one_short_line():
    """The sweeper's write-back gives the class a `why` that a tuned file allows: one line of at
    most 100 characters naming the best figure, its size and the search."""
    data = {"best": {"gflops": 44306.2, "pct_of_cublas_fp32": 85.37}, "m": 4096, "n": 4096,
            "k": 4096, "strategy": "grid", "ok": 404}
    note = tune.why_note(data, "True")
    assert "\n" not in note and len(note) <= 100
    assert "44,306 GFLOP/s at 4096" in note and "85% of cuBLAS FP32" in note and "404" in note
    wide = dict(data, m=12345, n=67890, k=11111, strategy="tpe" * 30)
    assert len(tune.why_note(wide, "True")) <= 100


@pytest.mark.parametrize("name", ["gemm_tf32", "gemm_3xtf32", "gemm_ffma_skinny", "gemm_ffma"])
def test_library_spaces_prune_by_the_rules_and_measure_each_kernel_once(name):
    """The dispatch's candidate kernels' grids: at a shape, every candidate is valid, pruned under
    the rule it breaks, or the same kernel and launch as an earlier valid one (measured once);
    the kept ones are pairwise different kernels or launches."""
    settings = tune.Settings.from_cfg(tune_cfg(name))
    kernel = kernel_cfg(name)
    rules = {item["rule"] for item in kernel["constraints"] + kernel["size_constraints"]}
    for shape in [(4096, 4096, 4096), (8, 4096, 4096), (4096, 1, 4096), (511, 513, 8191),
                  (4095, 4097, 333)]:
        problem = Problem(*shape, 0.5, 3.0)
        candidates = tune.grid(settings.space)
        pruning = tune.prune(kernel, candidates, problem, H100)
        assert len(pruning.valid) + pruning.pruned_total == len(candidates)
        assert set(pruning.pruned) <= rules | {tune.SAME_KERNEL}
        identities = [tune.kernel_identity(spec) for _, spec in pruning.valid]
        assert len(identities) == len(set(identities))
        valid = {tune.params_key(p): spec for p, spec in pruning.valid}
        assert pruning.pruned[tune.SAME_KERNEL] == len(pruning.same_as)
        for dup, first in pruning.same_as.items():
            spec = tune.check(kernel, json.loads(dup), problem, H100)
            assert tune.kernel_identity(spec) == tune.kernel_identity(valid[first])
    # the skinny kernel is pruned whole where C has more than 32 rows and columns
    if name == "gemm_ffma_skinny":
        wide = tune.prune(kernel, tune.grid(settings.space), Problem(64, 64, 64, 1, 0), H100)
        assert not wide.valid and "min(m, n) <= 32" in wide.pruned
    else:  # the grid holds the committed H100 choices' values, so it can find what they found
        for entry in OmegaConf.to_container(OmegaConf.load(
                CONF_DIR / "tuned" / "h100_sxm.yaml"))["kernels"].get(name, []):
            for key, value in (entry.get("params") or {}).items():
                assert value in settings.space[key], (entry, key)


def test_a_grid_over_several_problems_launches_their_candidates_together(tmp_path):
    """size=256,512 on two pretend GPUs (stand-in workers): each problem keeps its own pruning,
    records and summary, and both problems' candidates go out in one launch (the first progress
    line already counts them all), so no GPU idles at the first problem's end."""
    import re

    from tests.test_gpu_launcher import STAND_IN

    proc = run_on_fake_gpu(tmp_path, "-m", "+tune=10_warptiling", "size=256,512", *SMALL_SPACE,
                           "bench=quick", f"cache_dir={tmp_path}/cache", "mlflow.enabled=false",
                           STAND_IN, FAKE_GPUS="0,1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summaries = json.loads((tmp_path / "sweep" / "tune_summary.json").read_text())
    assert [[o for o in s["overrides"] if o.startswith("size=")] for s in summaries] == [
        ["size=256"], ["size=512"]]
    records = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/record.json")]
    by_size = {m: sum(r["m"] == m for r in records) for m in (256, 512)}
    assert [s["measured"] for s in summaries] == [by_size[256], by_size[512]] and min(by_size.values()) > 0
    assert all(s["ok"] == s["measured"] for s in summaries)
    first = re.search(r"^job 1 of (\d+)", proc.stdout, re.MULTILINE)
    assert first and int(first[1]) == len(records), proc.stdout[:2000]
