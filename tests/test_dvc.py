"""The DVC pipeline (dvc.yaml + params.yaml), on a CPU machine: each test works in a temporary
git repository holding a copy of the pipeline's files and drives the `dvc` command line.

The GPU half of `bench` (ceilings, timings) is the GPU box's; here its sweep runs with no GPU
visible, which still expands and checks every job, and `table` and `plots` run through
`dvc repro` on the recorded H100 runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
import sys

import pytest
import yaml

from src.records.collect import read_runs
from tests.conftest import CONF_DIR, DATA_DIR, ROOT
from tests.runs_fixture import RUNS_FIXTURE, as_dispatched

PIPELINE_FILES = ["dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".dvc/config",
                  ".dvc/.gitignore", ".dvc/plots", "src", "conf", "kernels", "hydra_plugins"]
PUBLISHED_SIZES = {1024, 2048, 4096, 8192}
BASELINES = {"cublas_fp32", "cublas_tf32"}


def dvc_yaml() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())


def params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


# --- dvc.yaml and params.yaml as files --------------------------------------------------------

def test_params_are_the_published_set():
    p = params()["progression"]
    kernels = p["kernels"].split(",")
    assert all((CONF_DIR / "kernel" / f"{k}.yaml").is_file() for k in kernels), kernels
    assert BASELINES <= set(kernels) and len(kernels) == len(set(kernels))
    assert {int(s) for s in str(p["sizes"]).split(",")} >= PUBLISHED_SIZES
    assert (CONF_DIR / "bench" / f"{p['protocol']}.yaml").is_file()


def test_no_list_is_written_twice():
    """dvc.yaml takes kernels, sizes and protocol from params.yaml and repeats none of them."""
    text = (ROOT / "dvc.yaml").read_text()
    for name in params()["progression"]["kernels"].split(",") + str(params()["progression"]["sizes"]).split(","):
        assert not re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", text), name
    bench = dvc_yaml()["stages"]["bench"]
    assert set(bench["params"]) == {"progression", "ceilings"}
    run = next(c for c in bench["cmd"] if "src.run" in c)
    assert "kernel=${progression.kernels}" in run and "size=${progression.sizes}" in run
    assert "bench=${progression.protocol}" in run and run.startswith("python -m src.run -m ")


def _module_file(dotted: str) -> str:
    """src.job.spec -> src/job/spec.py; a package (src.job) -> its __init__.py."""
    path = ROOT / Path(*dotted.split("."))
    return str((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(ROOT))


def _src_imports(module: str) -> set[str]:
    """The files of `module` and of every src module it imports, at any depth (imports inside
    functions too), as paths relative to the repository root."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = ast.parse((ROOT / _module_file(name)).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("src"):
                assert node.level == 0, f"{name}: relative import"
                for alias in node.names:  # `from src.job import gpu` imports a module
                    candidate = f"{node.module}.{alias.name}"
                    is_module = (ROOT / Path(*candidate.split("."))).with_suffix(".py").is_file()
                    todo.append(candidate if is_module else node.module)
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names if alias.name.startswith("src.")]
    return {_module_file(name) for name in seen if name != "src"}


def _covered(path: str, deps: set[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def test_each_stage_depends_on_exactly_the_code_it_runs():
    """A change to any module a stage runs re-runs it; a change to another module does not: every
    imported file lies under a listed dependency, and every listed folder or file holds one."""
    hydra_targets = {t.rsplit(".", 1)[0] for t in
                     re.findall(r"_target_:\s*(src\.[\w.]+)", (CONF_DIR / "config.yaml").read_text())}
    for name, stage in dvc_yaml()["stages"].items():
        cmds = stage["cmd"] if isinstance(stage["cmd"], list) else [stage["cmd"]]
        entries = {m for cmd in cmds for m in re.findall(r"python -m (src\.[\w.]+)", cmd)}
        if "src.run" in entries:
            entries |= hydra_targets  # the sweep callbacks, loaded by Hydra from conf/config.yaml
        needed = {f for e in entries for f in _src_imports(e)}
        listed = {d for d in stage["deps"] if d.startswith("src")}
        assert all(_covered(f, listed) for f in needed), \
            f"stage {name}: not covered {sorted(f for f in needed if not _covered(f, listed))}"
        unused = {d for d in listed if not any(_covered(f, {d}) for f in needed)}
        assert not unused, f"stage {name}: depends on code it never runs: {unused}"
        if "src.run" in entries:  # the GPU stage: editing a table or a figure must not re-run it
            assert not _covered("src/publish/plots.py", listed), stage["deps"]
            assert not _covered("src/publish/table.py", listed), stage["deps"]


def test_outputs_are_in_git_not_in_the_dvc_cache():
    for name, stage in dvc_yaml()["stages"].items():
        for entry in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            (path, options), = entry.items()
            assert path.startswith("results/") and options.get("cache") is False, (name, path)
            # every output persists: DVC must not delete a published file before a run that
            # may fail (a GPU stage without a GPU, a table or plots run with a broken
            # interpreter); the suite's per-GPU files also because one GPU's run must not
            # delete another's
            assert options.get("persist") is True, (name, path)
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/progression.csv"], cwd=ROOT)
    assert ignored.returncode == 1  # results/ is not ignored
    swept = subprocess.run(["git", "check-ignore", "-q", "sweeps/progression/x"], cwd=ROOT)
    assert swept.returncode == 0  # the bench sweep's job dirs are


# --- the dvc command line, in a temporary repository ----------------------------------------

@pytest.fixture
def repo(tmp_path):
    """A fresh git repository with the pipeline's files, committed, and a `python` on PATH that
    is this interpreter (the stages run `python -m src.…`)."""
    work = tmp_path / "repo"
    for name in PIPELINE_FILES:
        src, dst = ROOT / name, work / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # A wrapper, not a symlink: a symlinked virtual-environment interpreter no longer finds its
    # pyvenv.cfg, and so loses the environment's packages.
    wrapper = bindir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
               DVC_NO_ANALYTICS="1", DVC_SITE_CACHE_DIR=str(tmp_path / "dvc-site-cache"),
               GIT_AUTHOR_NAME="test", GIT_AUTHOR_EMAIL="test@example.invalid",
               GIT_COMMITTER_NAME="test", GIT_COMMITTER_EMAIL="test@example.invalid",
               CUDA_VISIBLE_DEVICES="",  # never time anything here, even on a GPU machine
               # the runner tracks every sweep: into this test's own MLflow store
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    env.pop("PYTHONPATH", None)

    def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(cmd), cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        if check:
            assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def dvc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(sys.executable, "-m", "dvc", *args, check=check)

    run("git", "init", "-q")
    run("git", "add", "-A")
    run("git", "commit", "-qm", "pipeline")
    return work, dvc, run


@pytest.mark.integration  # the dvc command line runs the stages
def test_dag_and_status_are_valid(repo):
    work, dvc, _ = repo
    dot = dvc("dag", "--dot").stdout
    edges = set(re.findall(r'"(\w+)"\s*->\s*"(\w+)"', dot))
    assert edges == {("bench", "table"), ("bench", "plots"), ("suite", "suite_table")}
    status = dvc("status").stdout
    for stage in ("bench", "table", "plots", "suite", "suite_table", "heldout"):
        assert f"{stage}:" in status  # never run here: every stage is out of date


@pytest.mark.integration  # the dvc command line runs the stages
def test_bench_sweeps_every_kernel_and_size_through_the_runner(repo):
    """The bench stage's commands after the ceilings (which need a GPU), exactly as DVC renders
    them, run here with no GPU: every kernel x size job is composed, its parameters and size
    recorded: the first no_gpu, the rest not_run (a sweep stops at the first job that finds no
    GPU); runs.csv has one row each.
    (The sweep is tracked, as every sweep is: into a store of this test's own.)"""
    work, dvc, run = repo
    proc = run(sys.executable, "-c", "from dvc.repo import Repo\n"
               "import json\n"
               "stage = Repo('.').stage.collect('bench')[0]\n"
               "print(json.dumps(stage.cmd))")
    cmds = json.loads(proc.stdout)
    assert cmds[0].startswith("python -m src.job.ceilings -o results/.ceilings.json.new ")
    assert cmds[1:] == [
        "rm -rf sweeps/progression",
        "python -m src.run -m 'kernel=" + params()["progression"]["kernels"] + "' 'size="
        + str(params()["progression"]["sizes"]) + "' bench=default bench.best_cublas=true "
        "hydra.sweep.dir=sweeps/progression",
        "python -m src.sweep.replicate sweeps/progression --runs "
        + str(params()["progression"]["replicate"]["runs"]) + " --headline '"
        + params()["progression"]["replicate"]["headline"] + "' --within "
        + str(params()["progression"]["replicate"]["within_pct"])
        + " -- bench=default bench.best_cublas=true",
        "python -m src.records.collect sweeps/progression -o results/.runs.csv.new",
        "mv results/.ceilings.json.new results/ceilings.json",
        "mv results/.runs.csv.new results/runs.csv",
    ]
    stale = work / "sweeps" / "progression" / "99_stale_job"
    stale.mkdir(parents=True)
    (stale / "record.json").write_text("{}")
    run("bash", "-c", cmds[1])
    swept = run("bash", "-c", cmds[2], check=False)  # no GPU: no job succeeds, exit status 1
    assert swept.returncode == 1 and "no_job_succeeded" in swept.stdout + swept.stderr
    replicated = run("bash", "-c", cmds[3])  # no ok row: nothing to replicate
    assert "replicating 0 rows" in replicated.stdout
    run("bash", "-c", cmds[4])
    runs = read_runs(work / "results" / ".runs.csv.new")
    kernels = params()["progression"]["kernels"].split(",")
    sizes = [int(s) for s in str(params()["progression"]["sizes"]).split(",")]
    assert sorted(zip(runs.kernel, runs.m)) == sorted((k, s) for k in kernels for s in sizes)
    assert list(runs.status).count("no_gpu") == 1, runs[["kernel", "m", "status"]]
    assert set(runs.status) == {"no_gpu", "not_run"}, runs[["kernel", "m", "error"]]
    assert (runs.m == runs.n).all() and (runs.n == runs.k).all()


@pytest.mark.integration  # the dvc command line runs the stages
def test_bench_without_a_gpu_leaves_the_published_results_alone(repo):
    """`dvc repro bench` where no GPU is visible fails (its ceilings need one) and the
    published runs.csv and ceilings.json are exactly as they were: DVC does not delete them
    first (persist), and the stage writes its new ones beside them, moved in only at the end."""
    work, dvc, run = repo
    results = work / "results"
    results.mkdir()
    shutil.copy2(RUNS_FIXTURE, results / "runs.csv")
    shutil.copy2(DATA_DIR / "ceilings_fixture_not_measured.json", results / "ceilings.json")
    before = {name: (results / name).read_bytes() for name in ("runs.csv", "ceilings.json")}
    proc = dvc("repro", "bench", check=False)
    assert proc.returncode != 0, proc.stdout
    assert {name: (results / name).read_bytes() for name in before} == before
    assert not (results / ".runs.csv.new").exists()


@pytest.mark.integration  # the dvc command line runs the stages
def test_a_failed_table_or_plots_run_leaves_the_published_files(repo, tmp_path):
    """`dvc repro -f -s table` (and plots) with an interpreter that cannot start (the README's CPU-only
    path): both stages fail and every published file is byte for byte as it was."""
    work, dvc, run = repo
    results = work / "results"
    results.mkdir()
    shutil.copy2(RUNS_FIXTURE, results / "runs.csv")
    shutil.copy2(DATA_DIR / "ceilings_fixture_not_measured.json", results / "ceilings.json")
    dvc("commit", "-f", "bench")
    dvc("repro", "table", "plots")
    published = sorted(p for p in results.rglob("*") if p.is_file())
    assert len(published) == 2 + 4 + 6, published  # inputs, table (with the wide table), plots
    before = {p: p.read_bytes() for p in published}
    (tmp_path / "bin" / "python").write_text("#!/bin/sh\necho 'python: broken' >&2\nexit 1\n")
    for stage in ("table", "plots"):
        failed = dvc("repro", "-f", "-s", stage, check=False)  # this stage alone
        assert failed.returncode != 0 and "python: broken" in failed.stderr + failed.stdout
    assert sorted(p for p in results.rglob("*") if p.is_file()) == published
    assert {p: p.read_bytes() for p in published} == before


@pytest.mark.integration  # the dvc command line runs the stages
def test_table_and_plots_stages_run_on_recorded_runs(repo):
    """With bench's outputs in place (the recorded H100 runs and the stand-in ceilings, marked
    as bench's by `dvc commit`), `dvc repro` runs table and plots only; metrics, params and
    plots can be shown; a size change in params.yaml makes bench, and after it table and plots,
    out of date."""
    work, dvc, run = repo
    results = work / "results"
    results.mkdir()
    shutil.copy2(RUNS_FIXTURE, results / "runs.csv")
    shutil.copy2(DATA_DIR / "ceilings_fixture_not_measured.json", results / "ceilings.json")
    dvc("commit", "-f", "bench")
    shutil.copy2(as_dispatched(work), results / "suite_runs.csv")  # recorded H100 suite runs
    dvc("commit", "-f", "suite")
    from src.publish.heldout import publish as publish_heldout  # recorded rows, as the GPU stage would

    publish_heldout(as_dispatched(work), results / "heldout")
    dvc("commit", "-f", "heldout")
    out = dvc("repro").stdout
    assert "Running stage 'table'" in out and "Running stage 'plots'" in out
    assert "Running stage 'suite_table'" in out
    assert "Running stage 'bench'" not in out and "Running stage 'suite'" not in out
    assert sorted(p.name for p in (results / "suite").iterdir()) == \
        ["h100_sxm.csv", "h100_sxm.md", "h100_sxm.png", "h100_sxm_wide.md"]
    assert "up to date" in dvc("status").stdout
    for name in ("progression.csv", "progression.md", "metrics.json", "plots/gflops_vs_size.png",
                 "plots/pct_of_cublas.png", "plots/roofline.png"):
        assert (results / name).is_file(), name
    # the published outputs are for git (cache: false); whatever DVC keeps in .dvc/cache is not
    untracked = run("git", "status", "--porcelain", "--untracked-files=all").stdout
    assert "results/progression.csv" in untracked and "results/plots/roofline.png" in untracked
    assert ".dvc/cache" not in untracked and "sweeps/" not in untracked
    lock = yaml.safe_load((work / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"bench", "table", "plots", "suite", "suite_table", "heldout"}

    metrics = json.loads(dvc("metrics", "show", "--json").stdout)
    suite = metrics[""]["data"]["results/suite_metrics.json"]["data"]["h100_sxm"]
    assert suite["fp32"]["shapes"] == 48 and 0 < suite["fp32"]["vs_default"]["min"] < 1
    shown = metrics[""]["data"]["results/metrics.json"]["data"]
    assert shown["size_4096"]["best_kernel"] == "06_vectorize"
    assert shown["jobs"] == {"total": 18, "ok": 16, "failed": 2}
    plots = json.loads(dvc("plots", "show", "--json").stdout)
    assert not plots.get("errors")
    assert set(plots["data"]) == {"results/plots/gflops_vs_size.png", "results/plots/pct_of_cublas.png",
                                  "results/plots/roofline.png", "gflops_vs_size",
                                  "pct_of_cublas_fp32", "roofline"}
    points = plots["data"]["gflops_vs_size"][0]["content"]["data"]["values"]
    assert len(points) == 16 and not any(p["size"] == "1000" for p in points)  # failed: absent

    run("git", "add", "-A")
    run("git", "commit", "-qm", "results")
    (work / "params.yaml").write_text((work / "params.yaml").read_text().replace(
        "sizes: 1024,2048,4096,8192", "sizes: 1024,2048,4096,8192,16384"))
    diff = dvc("params", "diff").stdout
    assert "progression.sizes" in diff and "1024,2048,4096,8192,16384" in diff
    status = dvc("status").stdout
    assert "bench:" in status and "table:" not in status  # table and plots follow bench's outputs
    assert "Running stage 'bench'" in dvc("repro", "--dry", "bench").stdout
    # what a bench rerun does to its output (one more size in runs.csv) puts both after it out of date
    with (results / "runs.csv").open("a") as f:
        f.write((results / "runs.csv").read_text().splitlines()[1] + "\n")
    status = dvc("status").stdout
    assert "table:" in status and "plots:" in status and "results/runs.csv" in status
    metrics_diff = dvc("metrics", "diff", "--json")
    assert metrics_diff.returncode == 0
