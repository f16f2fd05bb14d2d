"""The DVC pipeline (dvc.yaml + params.yaml), on a CPU machine: each test works in a temporary
git repository holding a copy of the pipeline's files and drives the `dvc` command line.

The GPU half of `bench` (ceilings, timings) is the GPU box's; here its sweep runs with no GPU
visible, which still expands and checks every job, and `table`, `plots`, `suite_table` and
`compare` run through `dvc repro` on the recorded H100 runs. The per-GPU stages are `foreach`
stages over params.yaml's published.gpus (bench@h100_sxm, ...).
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

import pandas as pd
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


def _substitute(node, item: str):
    if isinstance(node, str):
        return node.replace("${item}", item)
    if isinstance(node, list):
        return [_substitute(x, item) for x in node]
    if isinstance(node, dict):
        return {_substitute(k, item): _substitute(v, item) for k, v in node.items()}
    return node


def stages() -> dict:
    """dvc.yaml's stages as DVC names them, a `foreach` stage once per GPU (`bench@h100_sxm`),
    with ${item} filled in (the other ${...} left as written)."""
    out = {}
    for name, stage in dvc_yaml()["stages"].items():
        if "foreach" in stage:
            assert stage["foreach"] == "${published.gpus}", name
            for gpu in params()["published"]["gpus"]:
                out[f"{name}@{gpu}"] = _substitute(stage["do"], gpu)
        else:
            out[name] = stage
    return out


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
    bench = stages()["bench@h100_sxm"]
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
    for name, stage in stages().items():
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


def test_each_measuring_stage_depends_on_its_gpus_tuning_evidence():
    """best_fp32 and best_tf32 choose their kernel from results/tuning/<gpu>.csv at run time (the
    nearest-neighbour dispatch), so a new tune's evidence makes every stage that runs them stale."""
    for name, stage in stages().items():
        cmds = stage["cmd"] if isinstance(stage["cmd"], list) else [stage["cmd"]]
        if any("python -m src.run " in cmd for cmd in cmds):
            gpu = name.partition("@")[2]
            assert f"results/tuning/{gpu}.csv" in stage["deps"], (name, stage["deps"])


def test_outputs_are_in_git_not_in_the_dvc_cache():
    for name, stage in stages().items():
        for entry in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            (path, options), = entry.items()
            assert path.startswith("results/") and options.get("cache") is False, (name, path)
            # every output persists: DVC must not delete a published file before a run that
            # may fail (a GPU stage without a GPU, a table or plots run with a broken
            # interpreter); the suite's per-GPU files also because one GPU's run must not
            # delete another's
            assert options.get("persist") is True, (name, path)
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/h200/progression.csv"], cwd=ROOT)
    assert ignored.returncode == 1  # results/ is not ignored
    staging = subprocess.run(["git", "check-ignore", "-q", "results/h200/.runs.csv.new"], cwd=ROOT)
    assert staging.returncode == 0  # a stage's half-written files are not
    swept = subprocess.run(["git", "check-ignore", "-q", "sweeps/progression/x"], cwd=ROOT)
    assert swept.returncode == 0  # the bench sweep's job dirs are


# --- the dvc command line, in a temporary repository ----------------------------------------

@pytest.fixture
def repo(tmp_path):
    """A fresh git repository with the pipeline's files, committed, and a `python` on PATH that
    is this interpreter (the stages run `python -m src.…`)."""
    work = tmp_path / "repo"
    # and each published GPU's tuning evidence, a dependency of the stages that run the dispatch
    for name in PIPELINE_FILES + [f"results/tuning/{gpu}.csv" for gpu in params()["published"]["gpus"]]:
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


def test_every_dependency_exists_or_is_another_stages_output():
    """DVC refuses to run a stage whose dependency is missing, so every dep is in the repository
    or made by a stage before it; and every output lies in its GPU's set or in results/compare/."""
    all_stages = stages()
    made = {path for stage in all_stages.values()
            for entry in stage.get("outs", []) + stage.get("metrics", []) for path in entry}
    for name, stage in all_stages.items():
        for dep in stage["deps"]:
            assert (ROOT / dep).exists() or dep in made, (name, dep)
        gpu = name.partition("@")[2]
        for entry in stage.get("outs", []) + stage.get("metrics", []):
            (path,) = entry
            assert path.startswith(f"results/{gpu}/" if gpu else "results/compare/"), (name, path)


def test_compare_depends_on_the_tables_of_every_published_gpu():
    """compare's data dependencies are exactly the progression and suite tables of the GPUs of
    published.gpus that have a published set: a GPU's first set makes this fail until its two
    lines are added to dvc.yaml (DVC cannot depend on a file that does not exist yet)."""
    gpus = params()["published"]["gpus"]
    assert len(gpus) == len(set(gpus)) >= 2
    assert all((CONF_DIR / "gpu" / f"{gpu}.yaml").is_file() for gpu in gpus)
    published = [gpu for gpu in gpus if (ROOT / "results" / gpu / "runs.csv").is_file()]
    assert "h100_sxm" in published
    data = {d for d in stages()["compare"]["deps"] if d.startswith("results/")}
    assert data == {f"results/{gpu}/{name}" for gpu in published
                    for name in ("progression.csv", "suite.csv")}
    assert "${published}" in stages()["compare"]["cmd"] and stages()["compare"]["params"] == ["published"]


def test_every_measuring_stage_is_guarded_to_its_gpu():
    """A stage that times (runs src.run) starts with the guard of its own GPU and checks the
    collected runs with it before moving them into its set."""
    for name, stage in stages().items():
        cmds = stage["cmd"] if isinstance(stage["cmd"], list) else [stage["cmd"]]
        if not any("python -m src.run " in cmd for cmd in cmds):
            continue
        gpu = name.partition("@")[2]
        assert gpu and cmds[0] == f"python -m src.job.gpu_guard {gpu}", name
        moves = [i for i, cmd in enumerate(cmds) if cmd.startswith("mv ")]
        checks = [i for i, cmd in enumerate(cmds)
                  if cmd.startswith(f"python -m src.job.gpu_guard {gpu} --runs results/{gpu}/.")]
        assert moves and checks and max(checks) < min(moves), name
        collected = [c for c in cmds if "src.records.collect" in c]
        assert all(f"results/{gpu}/." in c for c in collected), collected


H100 = "results/h100_sxm"


@pytest.mark.integration  # the dvc command line runs the stages
def test_dag_and_status_are_valid(repo):
    work, dvc, _ = repo
    dot = dvc("dag", "--dot").stdout
    edges = set(re.findall(r'"([\w@]+)"\s*->\s*"([\w@]+)"', dot))
    gpus = params()["published"]["gpus"]
    assert edges == {edge for gpu in gpus for edge in (
        (f"bench@{gpu}", f"table@{gpu}"), (f"bench@{gpu}", f"plots@{gpu}"),
        (f"suite@{gpu}", f"suite_table@{gpu}"))} | {
        (f"{stage}@{gpu}", "compare") for gpu in gpus for stage in ("table", "suite_table")
        if (ROOT / "results" / gpu / "progression.csv").is_file()}  # compare: published GPUs
    status = dvc("status").stdout
    for gpu in gpus:
        for stage in ("bench", "table", "plots", "suite", "suite_table", "heldout"):
            assert f"{stage}@{gpu}:" in status  # never run here: every stage is out of date
    assert "compare:" in status


@pytest.mark.integration  # the dvc command line runs the stages
def test_bench_sweeps_every_kernel_and_size_through_the_runner(repo):
    """The bench stage's commands after the guard and the ceilings (which need a GPU), exactly
    as DVC renders them, run here with no GPU: every kernel x size job is composed, its
    parameters and size recorded: the first no_gpu, the rest not_run (a sweep stops at the first
    job that finds no GPU); runs.csv has one row each.
    (The sweep is tracked, as every sweep is: into a store of this test's own.)"""
    work, dvc, run = repo
    proc = run(sys.executable, "-c", "from dvc.repo import Repo\n"
               "import json\n"
               "stage = Repo('.').stage.collect('bench@h100_sxm')[0]\n"
               "print(json.dumps(stage.cmd))")
    cmds = json.loads(proc.stdout)
    assert cmds[0] == "python -m src.job.gpu_guard h100_sxm"
    assert cmds[1].startswith(f"python -m src.job.ceilings -o {H100}/.ceilings.json.new ")
    assert cmds[2:] == [
        "rm -rf sweeps/progression/h100_sxm",
        "python -m src.run -m 'kernel=" + params()["progression"]["kernels"] + "' 'size="
        + str(params()["progression"]["sizes"]) + "' bench=default bench.best_cublas=true "
        "hydra.sweep.dir=sweeps/progression/h100_sxm",
        "python -m src.sweep.replicate sweeps/progression/h100_sxm --runs "
        + str(params()["progression"]["replicate"]["runs"]) + " --headline '"
        + params()["progression"]["replicate"]["headline"] + "' --within "
        + str(params()["progression"]["replicate"]["within_pct"]) + " --baseline-drift "
        + str(params()["progression"]["replicate"]["baseline_drift_pct"])
        + " -- bench=default bench.best_cublas=true",
        f"python -m src.records.collect sweeps/progression/h100_sxm -o {H100}/.runs.csv.new",
        f"python -m src.records.cards {H100}/.runs.csv.new --earlier {H100}/runs.csv",
        f"python -m src.job.gpu_guard h100_sxm --runs {H100}/.runs.csv.new",
        f"mv {H100}/.ceilings.json.new {H100}/ceilings.json",
        f"mv {H100}/.runs.csv.new {H100}/runs.csv",
    ]
    stale = work / "sweeps" / "progression" / "h100_sxm" / "99_stale_job"
    stale.mkdir(parents=True)
    (stale / "record.json").write_text("{}")
    run("bash", "-c", cmds[2])
    swept = run("bash", "-c", cmds[3], check=False)  # no GPU: no job succeeds, exit status 1
    assert swept.returncode == 1 and "no_job_succeeded" in swept.stdout + swept.stderr
    replicated = run("bash", "-c", cmds[4])  # no ok row: nothing to replicate
    assert "replicating 0 rows" in replicated.stdout
    run("bash", "-c", cmds[5])
    runs = read_runs(work / H100 / ".runs.csv.new")
    kernels = params()["progression"]["kernels"].split(",")
    sizes = [int(s) for s in str(params()["progression"]["sizes"]).split(",")]
    assert sorted(zip(runs.kernel, runs.m)) == sorted((k, s) for k in kernels for s in sizes)
    assert list(runs.status).count("no_gpu") == 1, runs[["kernel", "m", "status"]]
    assert set(runs.status) == {"no_gpu", "not_run"}, runs[["kernel", "m", "error"]]
    assert (runs.m == runs.n).all() and (runs.n == runs.k).all()


@pytest.mark.integration  # the dvc command line runs the stages
def test_bench_without_a_gpu_leaves_the_published_results_alone(repo):
    """`dvc repro bench@h100_sxm` where no GPU is visible is refused by its guard and the
    published runs.csv and ceilings.json are exactly as they were: DVC does not delete them
    first (persist), and the stage writes its new ones beside them, moved in only at the end."""
    work, dvc, run = repo
    results = work / H100
    results.mkdir(parents=True)
    shutil.copy2(RUNS_FIXTURE, results / "runs.csv")
    shutil.copy2(DATA_DIR / "ceilings_fixture_not_measured.json", results / "ceilings.json")
    before = {name: (results / name).read_bytes() for name in ("runs.csv", "ceilings.json")}
    proc = dvc("repro", "bench@h100_sxm", check=False)
    assert proc.returncode != 0, proc.stdout
    assert "refusing to measure results/h100_sxm/ without a h100_sxm GPU" in proc.stdout + proc.stderr
    assert {name: (results / name).read_bytes() for name in before} == before
    assert not (results / ".runs.csv.new").exists()


FAKE_DEVICE = """# the device query of CuPy, answering as the recorded runs' GPU did (a test double)
import types
runtime = types.SimpleNamespace(getDeviceCount=lambda: 1,
                                getDeviceProperties=lambda index: {{"name": {name!r}}})
cuda = types.SimpleNamespace(runtime=runtime)
"""


@pytest.mark.integration  # the dvc command line runs the stages
def test_a_gpus_stages_refuse_to_measure_on_another_gpu(repo):
    """On a machine whose GPU is an H100 (the recorded runs' device name, through a stand-in
    for CuPy's device query), `dvc repro bench@h200` and `suite@h200` are refused by the guard
    before anything is timed or written under results/h200/; the H100's own guard passes."""
    work, dvc, run = repo
    h100 = read_runs(RUNS_FIXTURE).gpu.dropna().unique()[0]
    (work / "cupy").mkdir()
    (work / "cupy" / "__init__.py").write_text(FAKE_DEVICE.format(name=h100.encode()))
    for stage in ("bench@h200", "suite@h200"):
        proc = dvc("repro", stage, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "refusing to measure results/h200/" in out, out
        assert f"{h100!r} (spec h100_sxm)" in out and "ceilings" not in out.split("refusing")[0]
    assert not (work / "results" / "h200").exists()
    assert not (work / "sweeps").exists()  # no sweep started
    assert run("python", "-m", "src.job.gpu_guard", "h100_sxm").returncode == 0


@pytest.mark.integration  # the dvc command line runs the stages
def test_a_failed_table_or_plots_run_leaves_the_published_files(repo, tmp_path):
    """`dvc repro -f -s table@h100_sxm` (and plots) with an interpreter that cannot start (the
    README's CPU-only path): both stages fail and every published file is byte for byte as it was."""
    work, dvc, run = repo
    results = work / H100
    results.mkdir(parents=True)
    shutil.copy2(RUNS_FIXTURE, results / "runs.csv")
    shutil.copy2(DATA_DIR / "ceilings_fixture_not_measured.json", results / "ceilings.json")
    dvc("commit", "-f", "bench@h100_sxm")
    dvc("repro", "table@h100_sxm", "plots@h100_sxm")
    published = sorted(p for p in results.rglob("*") if p.is_file())
    assert len(published) == 2 + 4 + 6, published  # inputs, table (with the wide table), plots
    before = {p: p.read_bytes() for p in published}
    (tmp_path / "bin" / "python").write_text("#!/bin/sh\necho 'python: broken' >&2\nexit 1\n")
    for stage in ("table@h100_sxm", "plots@h100_sxm"):
        failed = dvc("repro", "-f", "-s", stage, check=False)  # this stage alone
        assert failed.returncode != 0 and "python: broken" in failed.stderr + failed.stdout
    assert sorted(p for p in results.rglob("*") if p.is_file()) == published
    assert {p: p.read_bytes() for p in published} == before


@pytest.mark.integration  # the dvc command line runs the stages
def test_publishing_stages_and_compare_run_on_recorded_runs(repo):
    """With the H100's measured outputs in place (the recorded H100 runs and the stand-in
    ceilings, and the recorded suite runs, marked as bench's and suite's by `dvc commit`) and
    the published H200 set's, `dvc repro compare` on this CPU machine runs each GPU's table and
    suite_table and compare, and never a measuring stage; a GPU added to published.gpus without
    a set (gh200 here) shows as not measured. Metrics, params and plots can be shown; a size
    change in params.yaml makes bench, and after it table and plots, out of date."""
    work, dvc, run = repo
    results = work / H100
    results.mkdir(parents=True)
    shutil.copy2(RUNS_FIXTURE, results / "runs.csv")
    shutil.copy2(DATA_DIR / "ceilings_fixture_not_measured.json", results / "ceilings.json")
    dvc("commit", "-f", "bench@h100_sxm")
    shutil.copy2(as_dispatched(work), results / "suite_runs.csv")  # recorded H100 suite runs
    dvc("commit", "-f", "suite@h100_sxm")
    from src.publish.heldout import publish as publish_heldout  # recorded rows, as the GPU stage would

    publish_heldout(as_dispatched(work), results, "h100_sxm")
    shutil.copy2(as_dispatched(work), results / "heldout_runs.csv")
    dvc("commit", "-f", "heldout@h100_sxm")
    h200 = work / "results" / "h200"
    h200.mkdir(parents=True)
    for name in ("runs.csv", "ceilings.json", "suite_runs.csv"):  # the published H200 set's
        shutil.copy2(ROOT / "results" / "h200" / name, h200 / name)
    dvc("commit", "-f", "bench@h200", "suite@h200")
    settings = yaml.safe_load((work / "params.yaml").read_text())
    settings["published"]["gpus"].append("gh200")  # a GPU with no published set
    (work / "params.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    out = dvc("repro", "compare").stdout
    ran = set(re.findall(r"Running stage '([\w@]+)'", out))
    assert ran == {"table@h100_sxm", "suite_table@h100_sxm", "table@h200", "suite_table@h200",
                   "compare"}, out
    out = dvc("repro", "plots@h100_sxm").stdout
    assert set(re.findall(r"Running stage '([\w@]+)'", out)) == {"plots@h100_sxm"}
    assert sorted(p.name for p in results.glob("suite*")) == \
        ["suite.csv", "suite.md", "suite.png", "suite_metrics.json", "suite_runs.csv", "suite_wide.md"]
    assert not (work / "results" / "gh200").exists()
    compared = pd.read_csv(work / "results" / "compare" / "progression.csv")
    assert set(compared.gpu_spec) == {"h100_sxm", "h200", "gh200"}
    assert set(compared[compared.gpu_spec == "gh200"].status) == {"not measured"}
    assert "ok" in set(compared[compared.gpu_spec == "h200"].status)  # rows it lacks: not measured
    assert "gh200 (not measured)" in (work / "results" / "compare" / "suite.md").read_text()
    status = dvc("status", "compare", "plots@h100_sxm", "--with-deps").stdout
    assert "up to date" in status, status
    for name in ("progression.csv", "progression.md", "metrics.json", "plots/gflops_vs_size.png",
                 "plots/pct_of_cublas.png", "plots/roofline.png"):
        assert (results / name).is_file(), name
    # the published outputs are for git (cache: false); whatever DVC keeps in .dvc/cache is not
    untracked = run("git", "status", "--porcelain", "--untracked-files=all").stdout
    assert f"{H100}/progression.csv" in untracked and f"{H100}/plots/roofline.png" in untracked
    assert "results/compare/progression.png" in untracked
    assert ".dvc/cache" not in untracked and "sweeps/" not in untracked
    lock = yaml.safe_load((work / "dvc.lock").read_text())
    assert set(lock["stages"]) == {f"{s}@h100_sxm" for s in ("bench", "table", "plots", "suite",
                                                             "suite_table", "heldout")} | {
        f"{s}@h200" for s in ("bench", "table", "suite", "suite_table")} | {"compare"}

    metrics = json.loads(dvc("metrics", "show", "--json").stdout)
    suite = metrics[""]["data"][f"{H100}/suite_metrics.json"]["data"]["h100_sxm"]
    assert suite["fp32"]["shapes"] == 48 and 0 < suite["fp32"]["vs_default"]["min"] < 1
    shown = metrics[""]["data"][f"{H100}/metrics.json"]["data"]
    assert shown["size_4096"]["best_kernel"] == "06_vectorize"
    assert shown["jobs"] == {"total": 18, "ok": 16, "failed": 2}
    plots = json.loads(dvc("plots", "show", "--json").stdout)
    assert not plots.get("errors")
    assert set(plots["data"]) == {f"{H100}/plots/gflops_vs_size.png", f"{H100}/plots/pct_of_cublas.png",
                                  f"{H100}/plots/roofline.png", "results/compare/progression.png",
                                  "results/compare/suite.png", "gflops_vs_size",
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
    assert "bench@h100_sxm:" in status and "table@h100_sxm:" not in status  # they follow bench's outputs
    assert "Running stage 'bench@h100_sxm'" in dvc("repro", "--dry", "bench@h100_sxm").stdout
    # what a bench rerun does to its output (one more size in runs.csv) puts both after it out of date
    with (results / "runs.csv").open("a") as f:
        f.write((results / "runs.csv").read_text().splitlines()[1] + "\n")
    status = dvc("status").stdout
    assert "table@h100_sxm:" in status and "plots@h100_sxm:" in status and f"{H100}/runs.csv" in status
    metrics_diff = dvc("metrics", "diff", "--json")
    assert metrics_diff.returncode == 0
