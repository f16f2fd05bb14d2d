"""Per-shape dispatch: `kernel=best_fp32` and `kernel=best_tf32` choose, per problem, the chapter
that runs it, from the GPU's dispatch table (conf/tuned/<gpu>.yaml, `dispatch:`). Rules are data
with a `why`, tried in order; the first whose `when` (over m, n, k) holds names the kernel and,
optionally, parameters over that chapter's own tuned size classes. A shape no rule covers (or a
GPU with no table) runs the dispatching config's `default`, a chapter that runs any M, N, K on
any GPU the lab supports. The record says which rule chose what (`dispatch_rule`).

    dispatch:
      best_fp32:
        - when: "m <= 64 or n <= 64"
          kernel: 22_ffma_warp_specialized
          params: {bm: 64}            # optional
          why: "..."
"""

from __future__ import annotations

from dataclasses import dataclass, field

from src.errors import ConfigError
from src.job.config import tuned_config
from src.job.problem import Problem
from src.job.rules import first_rule, when_text


@dataclass(frozen=True)
class DispatchChoice:
    kernel: str                                 # the chapter (conf/kernel/<kernel>.yaml) that runs
    params: dict = field(default_factory=dict)  # the rule's parameters over the chapter's tuned ones
    rule: str = ""                              # which rule chose it, and why
    when: str | None = None                     # that rule's `when` (None: no rule held, the default)


def is_dispatcher(kernel_cfg: dict) -> bool:
    return bool(kernel_cfg.get("dispatch"))


def rules(kernel_cfg: dict, gpu_spec: str) -> list[dict]:
    """The dispatch rules of a dispatching kernel config on `gpu_spec`, in order (none: [])."""
    return list(((tuned_config(gpu_spec) or {}).get("dispatch") or {}).get(str(kernel_cfg["name"])) or [])


def choose(kernel_cfg: dict, gpu_spec: str, problem: Problem) -> DispatchChoice:
    """The chapter a dispatching kernel config (`dispatch: true`, `default: <chapter>`) runs at
    `problem` on `gpu_spec`."""
    name = str(kernel_cfg["name"])
    rules_here = rules(kernel_cfg, gpu_spec)
    names = {"m": problem.m, "n": problem.n, "k": problem.k}

    def names_a_kernel(index: int, rule: dict) -> None:
        if not rule.get("kernel"):
            raise ConfigError(f"conf/tuned/{gpu_spec}.yaml: dispatch rule {name}[{index}] names "
                              f"no kernel (rule: every dispatch rule has `kernel:`).")

    found = first_rule(rules_here, names, f"conf/tuned/{gpu_spec}.yaml: dispatch rule {name}",
                       check=names_a_kernel)
    if found is not None:
        index, rule = found
        why = str(rule.get("why", "")).strip()
        return DispatchChoice(str(rule["kernel"]), dict(rule.get("params") or {}),
                              f"conf/tuned/{gpu_spec}.yaml: {name}[{index}] (when {when_text(rule)})"
                              + (f": {why}" if why else ""), when_text(rule))
    default = kernel_cfg.get("default")
    if not default:
        raise ConfigError(f"kernel {name} dispatches per shape but has no `default` chapter "
                          f"(rule: a dispatching kernel config names the chapter that runs a "
                          f"shape no rule covers).")
    return DispatchChoice(str(default), {}, f"{name} default (no dispatch rule for "
                          f"{problem.m}x{problem.n}x{problem.k} on {gpu_spec}): "
                          f"{str(kernel_cfg.get('why', '')).strip()}".rstrip(": "))
