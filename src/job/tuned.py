"""Tuned parameters: per-GPU tile parameters (conf/tuned/<gpu>.yaml) merged into a kernel config.

A kernel config with `tuned: true` reads its parameters from the tuned file of the GPU the job
runs on (the spec `gpu=auto` detects, or the one named). The file lists, per kernel, size classes
in order; the first whose `when` expression (over m, n, k) holds supplies the parameters. Values
set explicitly on the command line (kernel.params.*=...) always win, and `use_tuned=false` turns
the lookup off. Without a tuned file or class the kernel config's own defaults stand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from src.paths import CONF_DIR
from src.job.config import tuned_config
from src.job.problem import Problem
from src.job.rules import first_rule, when_text

TUNED_DIR = CONF_DIR / "tuned"


@dataclass(frozen=True)
class TunedChoice:
    params: dict = field(default_factory=dict)   # the parameters to apply (explicit ones removed)
    source: str | None = None                    # e.g. "conf/tuned/h100_sxm.yaml: 17_flagship[1]"


def applies(cfg) -> bool:
    """Whether this job's kernel takes tuned parameters: its config says `tuned: true` and the
    run has not turned the lookup off (`use_tuned=false`)."""
    return bool(cfg.kernel.get("tuned")) and bool(cfg.get("use_tuned", True))


def tuned_file(gpu_spec: str) -> Path:
    return TUNED_DIR / f"{gpu_spec}.yaml"


def dispatch_borrowed_from(gpu_spec: str) -> str | None:
    """The GPU spec whose dispatch rules this GPU's tuned file takes unmeasured: the file has no
    `dispatch:` of its own and names another file in its `defaults` (conf/tuned/gh200.yaml takes
    h100_sxm's). None where the file has its own rules, or there is no file."""
    import yaml

    path = tuned_file(gpu_spec)
    if not path.is_file():
        return None
    raw = yaml.safe_load(path.read_text()) or {}
    if "dispatch" in raw:
        return None
    parents = [d for d in raw.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
    return parents[0] if parents else None


def lookup(kernel: str, gpu_spec: str, problem: Problem, explicit: set[str] = frozenset()) -> TunedChoice:
    """The tuned parameters for `kernel` on `gpu_spec` at this problem size (empty: none)."""
    path = tuned_file(gpu_spec)
    data = tuned_config(gpu_spec)
    if data is None:
        return TunedChoice()
    classes = (data.get("kernels") or {}).get(kernel)
    if not classes:
        return TunedChoice()
    names = {"m": problem.m, "n": problem.n, "k": problem.k}
    found = first_rule(classes, names, f"{path.name}: size class {kernel}")
    if found is not None:
        index, entry = found
        params = {k: v for k, v in (entry.get("params") or {}).items() if k not in explicit}
        return TunedChoice(params, f"conf/tuned/{path.name}: {kernel}[{index}] (when {when_text(entry)})")
    return TunedChoice()


def apply(kernel_cfg: dict, gpu_spec: str, problem: Problem,
          explicit: set[str] = frozenset()) -> TunedChoice:
    """Merge the tuned parameters into a kernel config (a plain dict, changed in place) when the
    config says `tuned: true`; return the choice (empty for an untuned kernel)."""
    if not kernel_cfg.get("tuned"):
        return TunedChoice()
    choice = lookup(kernel_cfg["name"], gpu_spec, problem, explicit)
    kernel_cfg["params"] = {**(kernel_cfg.get("params") or {}), **choice.params}
    return choice


def explicit_params(overrides: list[str]) -> set[str]:
    """Names of kernel.params.* set on the command line (Hydra's task overrides)."""
    found = set()
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if key.startswith("kernel.params."):
            found.add(key[len("kernel.params."):])
    return found
