"""Shared fixtures. GPU tests carry @pytest.mark.gpu and skip cleanly when no GPU is visible."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
DATA_DIR = Path(__file__).resolve().parent / "data"


def _gpu_visible() -> str | None:
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() > 0:
            return None
        return "no CUDA device"
    except Exception as exc:  # no driver, no CuPy, ...
        return f"no usable CUDA GPU ({type(exc).__name__})"


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            if reason is None:
                reason = _gpu_visible() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def compose():
    """Compose the app's config exactly as `python -m src.run` would, with overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    def _compose(*overrides: str, return_hydra_config: bool = False):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides),
                                 return_hydra_config=return_hydra_config)

    return _compose
