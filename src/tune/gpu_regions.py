"""Which `measured_where` regions of conf/tuning/dispatch.yaml hold on one GPU.

A region that names the kernels it was drawn around (`beside`: a candidate measured only where it
can beat them) holds only on a GPU where one of those builds. Where none does (the sm_90a kernels
on an A100 or an RTX 4090), the region is dropped and the candidate is measured, and may be
chosen, wherever it builds: there `gemm_mma_tf32` is the TF32 tensor-core kernel at every shape,
not only the narrow and unaligned ones it serves beside `gemm_tf32` on a Hopper GPU.
"""

from __future__ import annotations

from src.errors import ConfigError

SHAPE = (4096, 4096, 4096)  # a shape every `beside` kernel builds at where its GPU can run it


def runs_on(kernel: str, limits: dict[str, int]) -> bool:
    """Whether `kernel` builds at its own parameters at 4096^3 on a device of `limits` (its
    constraints: compute capability, shared memory)."""
    from src.job import dispatch, training
    from src.job.config import kernel_config
    from src.job.problem import Problem

    return dispatch.builds(training.Candidate(kernel, "{}"), str(kernel_config(kernel)["precision"]),
                           Problem(*SHAPE, 0.5, 3.0), limits)


def on_gpu(settings: dict, gpu_spec: str) -> dict:
    """The settings with every `measured_where` region whose `beside` kernels none builds on
    `gpu_spec` (its datasheet limits) left out; the settings themselves where all hold."""
    from src.job.gpu import known_specs, limits_from_spec

    where = settings.get("measured_where") or {}
    if gpu_spec not in known_specs() or not any(v.get("beside") for v in where.values()):
        return settings
    limits = limits_from_spec(gpu_spec)
    kept = {}
    for kernel, region in where.items():
        beside = region.get("beside") or []
        if not isinstance(beside, list) or not all(isinstance(b, str) for b in beside):
            raise ConfigError(f"conf/tuning/dispatch.yaml: measured_where.{kernel}.beside = "
                              f"{beside!r} (rule: `beside` lists the kernels the region was drawn "
                              f"around, by name).")
        if not beside or any(runs_on(b, limits) for b in beside):
            kept[kernel] = region
    return settings if len(kept) == len(where) else {**settings, "measured_where": kept}
