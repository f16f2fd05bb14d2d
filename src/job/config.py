"""Configs a job reads besides its own: a baseline kernel's config and a GPU's tuned file, both
composed through Hydra's compose API from conf/, as the runner composes the job's config. One
place, so that no module reads conf/ by file path."""

from __future__ import annotations

import copy
from functools import lru_cache

from omegaconf import OmegaConf

from src.job import shapes  # noqa: F401  (registers ${shape_dim:}, used for m, n and k)
from src.paths import CONF_DIR


def compose(*overrides: str):
    """The runner's whole config with these overrides (for tools that prepare jobs themselves)."""
    return _compose(tuple(overrides))


def _compose(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from src.compose import rules as compose_rules

    compose_rules.install()
    if GlobalHydra.instance().is_initialized():  # inside the Hydra app (inline jobs, tests)
        return compose(config_name="config", overrides=list(overrides))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@lru_cache(maxsize=None)
def _kernel_config(name: str) -> dict:
    return OmegaConf.to_container(_compose((f"kernel={name}",)).kernel, resolve=True)


def kernel_config(name: str) -> dict:
    """conf/kernel/<name>.yaml as the runner composes it (a fresh copy each call; a copy, not a
    parse: the dispatch's weighing reads a kernel's config for every candidate it ranks)."""
    return copy.deepcopy(_kernel_config(name))


@lru_cache(maxsize=None)
def _tuned_config(gpu_spec: str) -> dict | None:
    from hydra.errors import MissingConfigException

    path = CONF_DIR / "tuned" / f"{gpu_spec}.yaml"
    if not path.is_file():
        return None  # no tuned file for this GPU: the kernels' own defaults stand
    try:
        tuned = OmegaConf.to_container(_compose((f"+tuned={gpu_spec}",)).tuned)
    except MissingConfigException:
        return None
    # A GPU's own `nearest:` replaces the one its defaults list inherits, whole: Hydra merges
    # mappings key by key, and a key its fit left out (no `regions`, no `waves_cap`) means none.
    own = OmegaConf.to_container(OmegaConf.load(path))
    if isinstance(own, dict) and own.get("nearest"):
        tuned["nearest"] = own["nearest"]
    return tuned


def tuned_config(gpu_spec: str) -> dict | None:
    """conf/tuned/<gpu_spec>.yaml through the `tuned` config group, or None when it has none (a
    fresh copy each call; a copy, not a parse, as a sweep looks classes up for every shape)."""
    return copy.deepcopy(_tuned_config(gpu_spec))


def forget() -> None:
    """Drop what was composed (a tuning sweep that wrote a tuned file back reads it anew)."""
    _kernel_config.cache_clear()
    _tuned_config.cache_clear()
