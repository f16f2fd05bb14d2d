"""Shared fixtures. GPU tests carry @pytest.mark.gpu and skip cleanly when no GPU is visible."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A shell without job control starts a background command (`bash .ci/run &`, nohup) with SIGINT
# ignored, and every process it starts inherits that: the sweeps these tests interrupt with a
# real Ctrl-C would never see it. An ignored SIGINT is set back to Python's handler here, so the
# processes the tests start get the default disposition, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
CONF_DIR = ROOT / "conf"
DATA_DIR = Path(__file__).resolve().parent / "data"

# Chapters written for part of the shapes only, with the shapes the tests take for them in
# place of the published squares: 24 computes products with at most 32 rows or columns of C
# (its size constraint refuses squares), and so do its library copy gemm_ffma_skinny and the
# library's gemm_ffma_narrow. Both layouts, few columns and few rows.
SKINNY_SHAPES = [(4096, 8, 4096), (1, 4096, 4096), (16, 8192, 8192), (4096, 1, 4096)]
SHAPE_LIMITED = {"24_ffma_skinny": SKINNY_SHAPES, "gemm_ffma_skinny": SKINNY_SHAPES,
                 "gemm_ffma_narrow": SKINNY_SHAPES}


def chapter_shapes(name: str, sizes=(1024, 2048, 4096, 8192)) -> list[tuple[int, int, int]]:
    """The shapes a test runs chapter `name` at: the squares given, or its own shapes."""
    return SHAPE_LIMITED.get(name, [(s, s, s) for s in sizes])


def pin_xdist_worker_to_one_gpu() -> None:
    """`pytest -n N` (pytest-xdist) spreads the GPU tests over the node's GPUs: worker gwK sees GPU
    K mod their count alone (CUDA_VISIBLE_DEVICES, set before anything starts CUDA), so with N
    the number of GPUs each GPU runs one test at a time. Nothing changes without xdist or GPUs."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        return
    from src.job.devices import sweep_gpus  # no CUDA: the environment or NVML

    gpus = sweep_gpus()
    if gpus:
        os.environ.update(gpus[int(worker[2:]) % len(gpus)].env)


@pytest.fixture(autouse=True)
def one_gpu_test_at_a_time(request):
    """Two pytest processes may share a GPU (`-n 8` on 4 GPUs, or four `--shard`s on one): a GPU
    test holds its GPU's lock file while it runs, so two tests never time kernels on one GPU at
    once (cuBLAS against an event loop failed by 3% under xdist, by 65% with four shards on one
    H100 without the lock)."""
    if "gpu" not in request.keywords:
        yield
        return
    import fcntl
    import re
    import tempfile

    device = re.sub(r"[^A-Za-z0-9_-]", "_", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
    with open(Path(tempfile.gettempdir()) / f"sgemm-lab-gpu-test-{device}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pytest_configure(config):
    pin_xdist_worker_to_one_gpu()


def _gpu_visible() -> str | None:
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() > 0:
            return None
        return "no CUDA device"
    except Exception as exc:  # no driver, no CuPy, ...
        return f"no usable CUDA GPU ({type(exc).__name__})"


@pytest.hookimpl(tryfirst=True)  # before -k deselects: the chapter names are keywords to it
def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        for mark in item.iter_markers("chapter"):
            item.extra_keyword_matches.update(mark.args)
        if "gpu" in item.keywords:
            if reason is None:
                reason = _gpu_visible() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th of N shards of the selected tests (1 <= K <= N): every "
                          "N-th test in collection order, so each shard gets a share of every "
                          "file's cases (the GPU suite in sittings of minutes; docs/testing.md)")


class Shards:
    """`--shard K/N`: after -m and -k have deselected (trylast), keep every N-th test from the K-th."""

    def __init__(self, index: int, count: int) -> None:
        self.index, self.count = index, count

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        kept = items[self.index - 1::self.count]
        config.hook.pytest_deselected(items=[item for item in items if item not in set(kept)])
        items[:] = kept


def pytest_configure(config):
    shard = config.getoption("--shard")
    if not shard:
        return
    try:
        index, count = (int(part) for part in shard.split("/"))
        if not 1 <= index <= count:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"--shard={shard!r}: expected K/N with 1 <= K <= N, e.g. --shard=2/4")
    config.pluginmanager.register(Shards(index, count), "shards")


def compose_config(*overrides: str, return_hydra_config: bool = False):
    """Compose the app's config exactly as `python -m src.run` would, with overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides),
                             return_hydra_config=return_hydra_config)


@pytest.fixture
def compose():
    return compose_config


def load_jsonl(name: str):
    """Records from tests/data/ (real H100 runs, written by the retired issue-2 acceptance script)."""
    from src.records.record import Record

    lines = (DATA_DIR / name).read_text().splitlines()
    return [Record.from_dict(json.loads(line)) for line in lines if line.strip()]


@pytest.fixture
def progression():
    """The progression sweep: every kernel and baseline at 1024 and 4096, all ok."""
    return load_jsonl("records_h100_progression.jsonl")


@pytest.fixture
def mixed():
    """A sweep with failing jobs (invalid tile parameters, unsupported sizes) next to good ones."""
    return load_jsonl("records_h100_mixed.jsonl")


@pytest.fixture(autouse=True)
def _no_stray_tracking(monkeypatch):
    """A test that tracks without choosing a store fails loudly instead of writing to the
    project's mlflow.db (tests that track pass a tmp store, tests that do not disable it)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "no-store-chosen-in-this-test://")


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store, made once: creating one runs MLflow's database migrations
    (seconds); a copy of it is a store of the same schema at once."""
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_uri(tmp_path, mlflow_template) -> str:
    """A fresh sqlite MLflow store in this test's tmp_path (artifacts go to mlruns/ beside it)."""
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(mlflow_template, store / "mlflow.db")
    return f"sqlite:///{store / 'mlflow.db'}"
