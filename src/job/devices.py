"""Which GPUs a sweep spreads its jobs over, found without a CUDA context in the launching process.

The GPUs are those CUDA_VISIBLE_DEVICES names (its entries as given: indices, GPU-/MIG- UUIDs),
else every GPU NVML counts (nvidia-ml-py: it asks the driver, no CUDA context is made), counted
in PCI bus order, the order NVML numbers them in (each slot gets CUDA_DEVICE_ORDER=PCI_BUS_ID,
so that index i is NVML's GPU i there). `hydra.launcher.devices=[0,2]` picks some of them by
position. Each GPU comes with the environment that pins a process to it alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from src.errors import ConfigError


@dataclass(frozen=True)
class Gpu:
    """One GPU of the sweep: its name in CUDA_VISIBLE_DEVICES, and the environment of a process
    that sees it alone (as its device 0)."""

    label: str
    env: dict[str, str] = field(default_factory=dict)


def _nvml_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no driver, no NVML: no GPU to spread over
        return 0


def visible() -> tuple[list[str], dict[str, str]]:
    """(the visible GPUs' labels, the environment their labels assume)."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is not None:
        labels = []
        for entry in (e.strip() for e in text.split(",")):
            if not entry or entry.startswith("-"):  # CUDA stops at an invalid entry ("-1": none)
                break
            if entry not in labels:
                labels.append(entry)
        return labels, {}
    return [str(i) for i in range(_nvml_count())], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def sweep_gpus(requested=None) -> list[Gpu]:
    """The GPUs a sweep runs on: every visible one (`requested` None), or those at the positions
    `requested` lists (hydra.launcher.devices)."""
    labels, env = visible()
    if requested is not None:
        where = (f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}"
                 if "CUDA_VISIBLE_DEVICES" in os.environ else "NVML's count")
        try:  # a list, or Hydra's ListConfig of one
            picks = None if isinstance(requested, str) else list(requested)
        except TypeError:
            picks = None
        valid = (picks is not None and picks
                 and all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < len(labels)
                         for p in picks) and len(set(picks)) == len(picks))
        if not valid:
            raise ConfigError(
                f"hydra.launcher.devices must list distinct positions of visible GPUs, 0 to "
                f"{len(labels) - 1} ({len(labels)} visible, from {where}), or be null for all of "
                f"them; got {requested!r} (rule: one job at a time on each GPU, each GPU named "
                f"once).")
        labels = [labels[p] for p in picks]
    return [Gpu(label, {**env, "CUDA_VISIBLE_DEVICES": label}) for label in labels]
