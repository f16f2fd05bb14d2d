"""Rules on what Hydra composes, checked while it composes: before it writes a config to disk
(.hydra/, multirun.yaml), prints it, configures logging from it or instantiates a callback,
launcher or sweeper it names, in every process that composes (the runner, which also composes a
sweep's jobs). A config that breaks one is refused and nothing of the run starts.

No credentials in a config. Hydra writes the command line and the composed config to .hydra/ and
multirun.yaml, prints overrides in its errors, and the lab logs the config to MLflow; a stop at
any point (an abort, Ctrl-C, a crash) would leave a password there. So no override and no
composed value may hold a URI with a user or password (`invalid_config`): they come from the
environment, MLflow's MLFLOW_TRACKING_USERNAME/PASSWORD, or a whole URI in $MLFLOW_TRACKING_URI
(or any variable, as mlflow.tracking_uri='${oc.env:NAME}'), resolved only when the store is
opened (tracking/store.py). Hydra writes such a reference as written.

A kernel config is data (conf/kernel/, or a `kernel/` folder on hydra.searchpath): the `kernel`
node and nothing else. A `# @package _global_` header could set hydra.callbacks.<name>._target_
to any importable function, which Hydra calls before the job starts; a defaults list could place
a config anywhere; `${oc.env:...}` could copy a secret into a logged value. So a kernel config
has no @package header but its own group's, no defaults list, no `_target_` and no `${...}`
(`invalid_config`).

Hydra has no hook between reading a config and acting on it, so `install` wraps its config
loader's load_configuration (the overrides, and the composed config) and its repository's
load_config (each config file as read).
"""

from __future__ import annotations

import warnings

from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

KERNEL_GROUP = "kernel"
SWEEPER_SCHEMA_WARNING = r"\s*'hydra/sweeper/basic' is validated against ConfigStore schema"

CREDENTIALS_RULE = (
    "rule: no credentials in the config or on the command line, where Hydra writes them to "
    ".hydra/ and multirun.yaml and the shell keeps them. Give them through the environment: "
    "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD for a tracking server, or the whole URI "
    "in $MLFLOW_TRACKING_URI (or any variable: mlflow.tracking_uri='${oc.env:NAME}'), and the URI "
    "here without them")

KERNEL_RULE = ("rule: a kernel config is data, the `kernel` node alone: no @package header "
               "(but _group_ or kernel), no defaults list, no _target_, no ${...} interpolation")


class ConfigRefused(ConfigCompositionException):
    """A config that breaks a rule. Hydra prints a ConfigCompositionException as its message
    alone (no traceback) and exits 1."""

    def __init__(self, status: str, message: str):
        super().__init__(f"error [{status}]: {message}")
        self.status = status


def install() -> None:
    """Check every config Hydra composes from now on in this process (once per process)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_repository import ConfigRepository

    from src.compose import cache

    if getattr(ConfigRepository.load_config, "checks_rules", False):
        return
    cache.install()  # config files read once per process (checked below on every compose)
    # conf/hydra/sweeper/basic.yaml (the lab's sweeper under Hydra's default name) is meant to be
    # checked against Hydra's own schema of that name; Hydra warns of that matching on every
    # compose, which would print 4 lines before every command's own output.
    warnings.filterwarnings("ignore", message=SWEEPER_SCHEMA_WARNING, category=UserWarning)
    load = ConfigRepository.load_config
    compose = ConfigLoaderImpl.load_configuration

    def load_configuration(self, config_name, overrides, *args, **kwargs):
        check_no_credentials(overrides, None)
        cfg = compose(self, config_name, overrides, *args, **kwargs)
        check_no_credentials([], cfg)
        return cfg

    def load_config(self, config_path: str):
        result = load(self, config_path)
        if result is not None and config_path.startswith(KERNEL_GROUP + "/"):
            check_kernel_config(config_path, result.path, result.header.get("package"),
                                bool(result.defaults_list), result.config)
        return result

    load_config.checks_rules = True
    ConfigRepository.load_config = load_config
    ConfigLoaderImpl.load_configuration = load_configuration


def check_no_credentials(overrides: list[str], cfg) -> None:
    """ConfigRefused if an override, or a value of `cfg` as written (unresolved: a reference to
    an environment variable is not read), holds a URI with a user or password."""
    from src.compose.uris import has_credentials, redact

    for override in overrides:
        if has_credentials(override):
            raise ConfigRefused("invalid_config", f"the override {redact(override)!r} puts a user "
                                                  f"or password in a URI ({CREDENTIALS_RULE}).")
    if cfg is not None:
        for where, value in _strings(OmegaConf.to_container(cfg, resolve=False)):
            if has_credentials(value):
                raise ConfigRefused("invalid_config", f"{where} = {redact(value)!r} puts a user "
                                                      f"or password in a URI ({CREDENTIALS_RULE}).")


def _strings(value, where: str = ""):
    """(path, string) of every string in a config's values."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{where}[{index}]")
    elif isinstance(value, str):
        yield where, value


def check_kernel_config(config_path: str, source: str, package: str | None, has_defaults: bool,
                        config) -> None:
    """ConfigRefused unless the kernel config at `config_path` (read from `source`, with its
    header's `package`, a defaults list or not) is data for the `kernel` node alone."""
    broken = None
    if package not in (None, "_group_", KERNEL_GROUP):
        broken = f"its header `# @package {package}` places it outside the kernel node"
    elif has_defaults:
        broken = "it has a defaults list"
    else:
        broken = _code_in(OmegaConf.to_container(config, resolve=False))
    if broken:
        raise ConfigRefused(
            "invalid_config",
            f"the kernel config {config_path}.yaml (in {source}) is refused: {broken} "
            f"({KERNEL_RULE}). Put only the kernel's values in it.")


def _code_in(value, where: str = "") -> str | None:
    """What in a kernel config's values would make Hydra or OmegaConf run something: a
    `_target_` key or a `${...}` interpolation (its path), else None."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            if key == "_target_":
                return f"{name} names a function to call"
            found = _code_in(item, name)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _code_in(item, f"{where}[{index}]")
            if found:
                return found
    elif isinstance(value, str) and "${" in value:
        return f"{where} is an interpolation ({value!r})"
    return None
