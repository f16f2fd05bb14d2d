"""Prepare step: a job's config becomes everything the GPU steps need, and nothing runs yet.

    config -> problem -> target (device, limits, GPU spec) -> tuned parameters -> kernel spec
           -> source (the exact text handed to NVRTC)

`prepare(cfg)` does it for a Hydra job; `prepare_kernel` for a kernel config already in hand (the
tuning sweeper's candidates, the variants and SASS tools). Both work without a GPU: the target is
then the named GPU's datasheet limits (or an H100's, for gpu=auto), so a configuration is checked
on any machine, and `PreparedJob.require_device()` says NoGPU only when a GPU is needed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from src.errors import InvalidParams, NoGPU
from src.job import gpu as gpu_mod
from src.job.compile import expand_source
from src.job.config import kernel_config
from src.job.problem import Problem
from src.job.protocol import BenchProtocol
from src.job.spec import KernelSpec, build_spec
from src.job import dispatch, tuned

log = logging.getLogger(__name__)

# The GPU whose limits check a configuration on a machine without one, when gpu=auto.
NO_GPU_STAND_IN = "h100_sxm"


@dataclass(frozen=True)
class Target:
    """Where a job runs: the device (None without a GPU), the limits its constraints are checked
    against, and the GPU spec (datasheet peaks, tuned file) that describes it."""

    device: gpu_mod.Device | None
    limits: dict
    gpu_spec: gpu_mod.GpuSpec

    @property
    def gpu_spec_name(self) -> str:
        return self.gpu_spec.name


def target(gpu_cfg) -> Target:
    """The detected device and its spec (`gpu=auto` matches the device name; a named spec is
    taken as given, with a warning when the device is another); without a GPU, the named spec's
    limits, or the stand-in's."""
    try:
        device = gpu_mod.detect()
    except NoGPU:
        return datasheet_target(gpu_cfg)
    spec = gpu_mod.resolve_spec(gpu_cfg, device)
    if spec.match and not any(re.search(p, device.name, re.IGNORECASE) for p in spec.match):
        log.warning("gpu=%s was requested but the device is %r: pct_of_peak uses %s's datasheet.",
                    spec.name, device.name, spec.name)
    return Target(device, gpu_mod.device_limits(device), spec)


def datasheet_target(gpu_cfg) -> Target:
    """A target with no device: the named GPU's datasheet limits and spec (the stand-in's for
    gpu=auto), whether or not a GPU is here. For checking or building a configuration for a GPU
    that is not this one (the SASS tool builds for the named spec's architecture)."""
    data = OmegaConf.to_container(gpu_cfg, resolve=True) if not isinstance(gpu_cfg, dict) else gpu_cfg
    if data.get("name") == "auto":
        data = gpu_mod.known_specs()[NO_GPU_STAND_IN]
    return Target(None, gpu_mod.limits_from_spec(data["name"]), gpu_mod.resolve_spec(data, None))


@dataclass
class PreparedJob:
    """One kernel at one problem on one target, ready to compile, verify and time."""

    problem: Problem
    target: Target
    kernel_cfg: dict                  # the kernel's config with the tuned parameters applied
    spec: KernelSpec
    bench: BenchProtocol | None = None  # the timing protocol (None: a job that is not timed)
    tuned_from: str | None = None     # which tuned size class supplied parameters, if any
    source: str | None = None         # the exact text handed to NVRTC (None: a cuBLAS baseline)
    dispatched: dispatch.DispatchChoice | None = None  # best_*: the chapter chosen for the shape
    peers: tuple[str, ...] = ()       # best_*: the peer configs to time beside it (the strongest counts)
    peers_not_built: tuple[str, ...] = ()  # best_*: "name: why" of peers the lab does not build

    @property
    def device(self) -> gpu_mod.Device | None:
        return self.target.device

    @property
    def source_sha256(self) -> str | None:
        return None if self.source is None else hashlib.sha256(self.source.encode()).hexdigest()

    def require_device(self) -> gpu_mod.Device:
        if self.target.device is None:
            gpu_mod.detect()  # raises NoGPU with its message
        return self.target.device


def prepare_kernel(kernel_cfg: dict, problem: Problem, where: Target,
                   bench: BenchProtocol | None = None,
                   explicit_params: set[str] = frozenset(), use_tuned: bool = True,
                   overrides: dict | None = None) -> PreparedJob:
    """A kernel config (a plain dict) at one problem on `where`: this GPU's tuned parameters for
    the problem's size class first (unless `use_tuned` is off or the name is in
    `explicit_params`), then `overrides` (params by name) over them, then the spec and source.
    A dispatching config (kernel=best_fp32, best_tf32) first becomes the chapter its dispatch
    table names for this shape, in the dispatcher's precision (the baseline it is paired with)."""
    kcfg = OmegaConf.to_container(OmegaConf.create(kernel_cfg), resolve=True)
    dispatched = None
    peers = tuple(str(name) for name in kcfg.get("peers") or ())
    not_built = tuple(f"{p['name']}: {str(p['why']).strip()}" for p in kcfg.get("peers_not_built") or ())
    if dispatch.is_dispatcher(kcfg):
        if kcfg.get("params"):
            raise InvalidParams(
                f"{kcfg['name']} takes no tile parameters (got kernel.params "
                f"{json.dumps(kcfg['params'], sort_keys=True)}): it chooses a kernel and its "
                f"parameters per shape from conf/tuned/<gpu>.yaml (rule: tile parameters are set on "
                f"a kernel, e.g. kernel=gemm_3xtf32 kernel.params.bm=64; `sgemm-lab explain MxNxK` "
                f"says what {kcfg['name']} runs at a shape).")
        dispatched = dispatch.choose(kcfg, where.gpu_spec_name, problem, where.limits)
        kcfg = {**kernel_config(dispatched.kernel), "precision": kcfg["precision"]}
        overrides = {**dispatched.params, **(overrides or {})}
        explicit_params = frozenset()  # kernel.params.* named the dispatcher's, not the chapter's
    tuned_from = None
    if use_tuned and kcfg.get("tuned"):
        choice = tuned.apply(kcfg, where.gpu_spec_name, problem,
                             set(explicit_params) | set(overrides or {}))
        tuned_from = choice.source
    if overrides:
        kcfg["params"] = {**(kcfg.get("params") or {}), **overrides}
    spec = build_spec(kcfg, problem, where.limits)
    source = expand_source(spec.source) if spec.source is not None else None
    return PreparedJob(problem, where, kcfg, spec, bench, tuned_from, source,
                       dispatched, peers, not_built)


def check_inputs(cfg: DictConfig) -> None:
    """The job's own inputs, checked without a GPU, a compile or a tuned file: the problem (M, N,
    K, alpha, beta) and the timing protocol (bench.*). Raises the LabError that `prepare` would;
    the launcher calls it first, so such an error is answered before a worker or a tracking
    store is started."""
    Problem.from_cfg(cfg)
    BenchProtocol.from_config(OmegaConf.to_container(cfg.bench, resolve=True))


def prepare(cfg: DictConfig, explicit_params: set[str] = frozenset()) -> PreparedJob:
    """A Hydra job's config, prepared (see the module's docstring)."""
    problem = Problem.from_cfg(cfg)
    kernel_cfg = OmegaConf.to_container(cfg.kernel, resolve=True)
    # the protocol's counts and limits, checked before any GPU work
    bench = BenchProtocol.from_config(OmegaConf.to_container(cfg.bench, resolve=True))
    return prepare_kernel(kernel_cfg, problem, target(cfg.gpu), bench, explicit_params,
                          use_tuned=bool(cfg.get("use_tuned", True)))
