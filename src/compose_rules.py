"""Rules on what Hydra composes, checked while it composes: before it writes a config to disk
(.hydra/, multirun.yaml), configures logging from it or instantiates a callback, launcher or
sweeper it names, in every process that composes (the runner, which also composes a sweep's jobs).

A kernel config is data (conf/kernel/, or a `kernel/` folder on hydra.searchpath): the `kernel`
node and nothing else. A `# @package _global_` header could set hydra.callbacks.<name>._target_
to any importable function, which Hydra calls before the job starts; a defaults list could
override another group; `${oc.env:...}` could copy a secret into a logged value. So a kernel
config has no @package header but its own group's, no defaults list, no `_target_` and no
`${...}`; one that has is refused (`invalid_config`) and nothing of the run starts.

Hydra has no hook between reading a config file and acting on it, so `install` wraps the config
repository's load_config, through which Hydra reads every config file.
"""

from __future__ import annotations

from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

KERNEL_GROUP = "kernel"

KERNEL_RULE = ("rule: a kernel config is data, the `kernel` node alone: no @package header "
               "(but _group_ or kernel), no defaults list, no _target_, no ${...} interpolation")


class ConfigRefused(ConfigCompositionException):
    """A config that breaks a rule. Hydra prints a ConfigCompositionException as its message
    alone (no traceback) and exits 1."""

    def __init__(self, status: str, message: str):
        super().__init__(f"error [{status}]: {message}")
        self.status = status


def install() -> None:
    """Check every config file Hydra reads from now on in this process (once per process)."""
    from hydra._internal.config_repository import ConfigRepository

    load = ConfigRepository.load_config
    if getattr(load, "checks_rules", False):
        return

    def load_config(self, config_path: str):
        result = load(self, config_path)
        if result is not None and config_path.startswith(KERNEL_GROUP + "/"):
            check_kernel_config(config_path, result.path, result.header.get("package"),
                                bool(result.defaults_list), result.config)
        return result

    load_config.checks_rules = True
    ConfigRepository.load_config = load_config


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
