"""Kernel spec: a kernel config (conf/kernel/*.yaml) made concrete for one problem and GPU.

The tunable parameters, the launch geometry and the constraints are data in the config, as in
Kernel Tuner: expressions over the parameters, the derived values, the problem size (m, n, k)
and the device limits. Every constraint is checked here, before anything is compiled, and a
violation names the rule, the values it saw and why the rule exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from src.paths import kernel_file
from src.errors import ConfigError, InvalidParams, UnsupportedSize
from src.job.expression import MAX_BITS, evaluate, names_in
from src.job.problem import Problem
from src.job.tensor_maps import TensorMapSpec, check as check_tensor_maps


BACKENDS = ("nvrtc", "cublas", "triton", "cutlass")
# tl.dot's input_precision for a Triton peer: ieee (FP32 FMA), tf32, tf32x3 (FP32-accurate)
INPUT_PRECISIONS = ("ieee", "tf32", "tf32x3")
PRECISIONS = ("fp32", "tf32")


@dataclass(frozen=True)
class KernelSpec:
    name: str
    backend: str                      # "nvrtc" (a kernels/*.cu chapter), "cublas" (a baseline), "triton" or "cutlass" (a peer)
    precision: str                    # "fp32" or "tf32": picks the verification tolerance and peak
    params: dict[str, int] = field(default_factory=dict)
    derived: dict[str, int] = field(default_factory=dict)
    source: Path | None = None        # kernels/NN_name.cu
    entry: str | None = None          # C++ name expression, e.g. sgemm_vectorize<128, 128, 8, 8, 8>
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    dynamic_smem_bytes: int = 0
    workspace_bytes: int | None = None  # None: the kernel takes no workspace argument
    compute_type: str | None = None   # cuBLAS baselines only
    arch: str | None = None           # a fixed target (e.g. sm_90a for wgmma); None: the device's
    tensor_maps: tuple[TensorMapSpec, ...] = ()  # TMA descriptors passed after C (tensor_maps.py)
    prepass: "Prepass | None" = None  # a kernel launched before the entry, on the same arguments
    tail: "Tail | None" = None        # a kernel launched after the entry, on the same arguments (a split tail)
    input_precision: str | None = None  # Triton peers only: tl.dot's input_precision
    resident_ctas: int = 1            # blocks an SM holds at once (launch.resident_ctas): the dispatch's wave fill
    cluster: int = 1                  # blocks a cluster holds (launch.cluster): clusters place fewer blocks at once

    def launch_identity(self) -> str:
        """What one launch runs: its compiled entry and every launch setting (the measurement
        cache's key holds the same, src/job/cache.py); not the parameters' names, so two
        parameter sets that build this are one kernel (the tuner's twins, src/tune/space.py)."""
        return repr((self.entry, self.grid, self.block, self.dynamic_smem_bytes, self.workspace_bytes,
                     self.arch, self.tensor_maps, self.prepass) + ((self.tail,) if self.tail else ()))

    @property
    def threads(self) -> int:
        total = 1
        for b in self.block:
            total *= b
        return total


@dataclass(frozen=True)
class Prepass:
    """launch.prepass: a second entry of the same source (e.g. one that fills the workspace),
    launched before the main one with the main one's arguments up to the workspace. A pre-pass
    whose grid evaluates to 0 blocks at a shape has nothing to do there and is not launched
    (the spec's `prepass` is None)."""

    entry: str
    grid: tuple[int, ...]
    block: tuple[int, ...]


@dataclass(frozen=True)
class Tail:
    """launch.tail: a second entry of the same source launched after the main one, with its
    block, dynamic shared memory and arguments (a split tail: the tiles past the main launch's
    last full wave, K sliced across a cluster: `slices` blocks a tile). A tail whose grid
    evaluates to 0 blocks at a shape is not launched (the spec's `tail` is None)."""

    entry: str
    grid: tuple[int, ...]
    slices: int = 1


def _names_in(expr: str) -> list[str]:
    try:
        return list(names_in(expr))
    except SyntaxError as exc:
        raise ConfigError(f"malformed expression {expr!r} in a kernel config: {exc.msg}") from exc


@lru_cache(maxsize=4096)
def _name_set(expr: str) -> frozenset[str]:
    return frozenset(_names_in(expr))


def _evaluate(expr: Any, names: dict[str, Any], kernel: str) -> Any:
    if isinstance(expr, (int, float, bool)):
        return expr
    # every name must be known, on whichever branch of an `if` the values take
    if not names.keys() >= _name_set(str(expr)):
        missing = [n for n in _names_in(str(expr)) if n not in names]
        raise ConfigError(
            f"kernel {kernel}: expression {expr!r} uses {', '.join(missing)}, which is neither a "
            f"parameter, a derived value, m/n/k nor a device limit ({', '.join(sorted(names))})."
        )
    try:
        return evaluate(str(expr), names)
    except ZeroDivisionError:
        raise InvalidParams(
            f"invalid tile parameters for kernel {kernel}: `{expr}` divides by zero with "
            f"{_values(expr, names)}.") from None
    except Exception as exc:  # a config that cannot be evaluated: a bug in conf/, not in the values
        raise ConfigError(
            f"kernel {kernel}: expression `{expr}` cannot be evaluated with {_values(expr, names)} "
            f"({type(exc).__name__}: {exc}) (rule: every expression in conf/kernel/{kernel}.yaml "
            f"is arithmetic on numbers, with integers below 2**{MAX_BITS}).") from None


def _values(expr: Any, names: dict[str, Any]) -> str:
    return ", ".join(f"{n}={names[n]}" for n in _names_in(str(expr)) if n in names) or "no names"


def _check(rules, names: dict[str, Any], kernel: str, error_cls, what: str, hint: str) -> None:
    for item in rules or ():
        rule, why = (item["rule"], item.get("why", "")) if isinstance(item, dict) else (item, "")
        if not _evaluate(rule, names, kernel):
            values = ", ".join(f"{n}={names[n]}" for n in _names_in(str(rule)))
            error = error_cls(
                f"{what} for kernel {kernel}: rule `{rule}` is false with {values}"
                + (f" ({why})" if why else "")
                + f". {hint}"
            )
            error.rule = str(rule)  # which rule: a tuning sweep counts its pruned candidates by it
            raise error


def build_spec(kernel_cfg: DictConfig | dict, problem: Problem, limits: dict[str, int]) -> KernelSpec:
    cfg = OmegaConf.to_container(kernel_cfg, resolve=True) if not isinstance(kernel_cfg, dict) else kernel_cfg
    name = cfg.get("name", "?")
    backend = cfg.get("backend")
    precision = cfg.get("precision")
    if backend not in BACKENDS:
        raise ConfigError(f"kernel {name}: backend must be one of {BACKENDS}, got {backend!r}.")
    if precision not in PRECISIONS:
        raise ConfigError(f"kernel {name}: precision must be one of {PRECISIONS}, got {precision!r}.")

    if backend == "cublas":
        return KernelSpec(name=name, backend=backend, precision=precision,
                          compute_type=cfg["compute_type"])
    if backend == "triton":
        return _triton_spec(cfg, name, precision)
    if backend == "cutlass":  # a peer with its own source and tile rule (src/job/cutlass_3xtf32.cu)
        return KernelSpec(name=name, backend=backend, precision=precision, arch=cfg.get("arch"),
                          entry="cutlass_3xtf32_gemm (device::Gemm, OpMultiplyAddFastF32)")

    params = dict(cfg.get("params") or {})
    zero_means = cfg.get("zero_means") or {}  # a count where 0 names a mode, said in the config
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
                value == 0 and key not in zero_means):
            raise InvalidParams(
                f"invalid tile parameters for kernel {name}: {key}={value!r}, but every tile "
                f"parameter must be a positive integer (rule: kernel.params.{key} > 0 and integer"
                + (f", or 0: {zero_means[key]}" if key in zero_means else "") + ")."
            )
    names: dict[str, Any] = {**limits, "m": problem.m, "n": problem.n, "k": problem.k, **params}
    derived: dict[str, int] = {}
    for key, expr in (cfg.get("derived") or {}).items():
        names[key] = derived[key] = _evaluate(expr, names, name)  # derived value `key`

    _check(cfg.get("constraints"), names, name, InvalidParams, "invalid tile parameters",
           "Choose other values for kernel.params.* (defaults are in conf/kernel/"
           f"{name}.yaml).")
    _check(cfg.get("size_constraints"), names, name, UnsupportedSize, "unsupported problem size",
           f"Choose sizes the kernel supports or a kernel that handles any size (m={problem.m}, "
           f"n={problem.n}, k={problem.k}).")

    launch = cfg.get("launch") or {}
    grid = tuple(int(_evaluate(e, names, name)) for e in launch.get("grid", ()))
    block = tuple(int(_evaluate(e, names, name)) for e in launch.get("block", ()))
    if not grid or not block:
        raise ConfigError(f"kernel {name}: launch.grid and launch.block must be given.")
    source = kernel_file(str(cfg.get("source")), name)
    try:
        entry = cfg["entry"].format(**params, **derived)
    except KeyError as exc:
        raise ConfigError(f"kernel {name}: entry {cfg['entry']!r} names {exc}, neither a parameter "
                          f"nor a derived value.") from None
    workspace = launch.get("workspace_bytes")
    tensor_maps = tuple(_tensor_map(tm, names, name) for tm in launch.get("tensor_maps") or ())
    if any(len(tm.box) != 2 for tm in tensor_maps):
        raise ConfigError(f"kernel {name}: every launch.tensor_maps entry needs a 2-element box "
                          f"[inner, outer].")
    check_tensor_maps(tensor_maps, name)
    if workspace is None and (launch.get("prepass") or any(tm.region for tm in tensor_maps)):
        raise ConfigError(f"kernel {name}: launch.prepass and workspace tensor maps need "
                          f"launch.workspace_bytes (rule: a pre-pass writes to the workspace).")
    return KernelSpec(
        name=name,
        backend=backend,
        precision=precision,
        params=params,
        derived=derived,
        source=source,
        entry=entry,
        grid=grid,
        block=block,
        dynamic_smem_bytes=int(_evaluate(launch.get("dynamic_smem_bytes", 0), names, name)),
        workspace_bytes=None if workspace is None else int(_evaluate(workspace, names, name)),
        arch=cfg.get("arch"),
        tensor_maps=tensor_maps,
        prepass=_prepass(launch.get("prepass"), names, name, {**params, **derived}),
        tail=_tail(launch.get("tail"), names, name, {**params, **derived}),
        resident_ctas=max(1, int(_evaluate(launch.get("resident_ctas", 1), names, name))),
        cluster=max(1, int(_evaluate(launch.get("cluster", 1), names, name))),
    )


def candidate_spec(kernel_cfg: dict, params: dict, problem: Problem,
                   limits: dict[str, int]) -> KernelSpec | str:
    """The spec of a candidate (`params` over the kernel config's own) at `problem`, or the rule
    it breaks there: what the tuner prunes and the dispatch passes over."""
    cfg = {**kernel_cfg, "params": {**(kernel_cfg.get("params") or {}), **params}}
    try:
        return build_spec(cfg, problem, limits)
    except (InvalidParams, UnsupportedSize) as exc:
        return getattr(exc, "rule", None) or str(exc).split(":", 1)[0]


def _triton_spec(cfg: dict, name: str, precision: str) -> KernelSpec:
    """A Triton peer: no launch geometry of its own (Triton's autotune picks the tiles per shape)."""
    input_precision = cfg.get("input_precision")
    if input_precision not in INPUT_PRECISIONS:
        raise ConfigError(f"kernel {name}: input_precision must be one of {INPUT_PRECISIONS} "
                          f"(tl.dot's input_precision), got {input_precision!r}.")
    return KernelSpec(name=name, backend="triton", precision=precision,
                      entry=f"triton matmul_kernel(input_precision={input_precision!r})",
                      input_precision=input_precision)


def _tensor_map(tm: dict, names: dict, name: str) -> TensorMapSpec:
    matrix = str(tm.get("matrix"))
    if matrix not in ("a", "b", "workspace"):
        matrix = str(_evaluate(matrix, names, name))  # an expression that picks one
    region = tm.get("region") if matrix == "workspace" else None
    return TensorMapSpec(
        matrix=matrix, box=tuple(int(_evaluate(e, names, name)) for e in tm.get("box", ())),
        swizzle=int(tm.get("swizzle", 0)), element=str(tm.get("element", "f32")),
        region=None if region is None else tuple(int(_evaluate(e, names, name)) for e in region))


def _prepass(cfg: dict | None, names: dict, name: str, values: dict) -> Prepass | None:
    if not cfg:
        return None
    grid = tuple(int(_evaluate(e, names, name)) for e in cfg.get("grid", ()))
    block = tuple(int(_evaluate(e, names, name)) for e in cfg.get("block", ()))
    if not grid or not block or "entry" not in cfg:
        raise ConfigError(f"kernel {name}: launch.prepass needs an entry, a grid and a block.")
    if 0 in grid:
        return None  # a pre-pass with nothing to do at this shape (25: rows already aligned)
    return Prepass(entry=str(cfg["entry"]).format(**values), grid=grid, block=block)


def _tail(cfg: dict | None, names: dict, name: str, values: dict) -> Tail | None:
    if not cfg:
        return None
    grid = tuple(int(_evaluate(e, names, name)) for e in cfg.get("grid", ()))
    if not grid or "entry" not in cfg:
        raise ConfigError(f"kernel {name}: launch.tail needs an entry and a grid.")
    if 0 in grid:
        return None  # no tail at this shape (the tiles fill whole waves, or it is not split)
    slices = int(_evaluate(cfg.get("slices", 1), names, name))
    if slices < 1:
        raise ConfigError(f"kernel {name}: launch.tail.slices is {slices} at this shape (rule: the "
                          f"tail's blocks per tile, at least 1).")
    return Tail(entry=str(cfg["entry"]).format(**values), grid=grid, slices=slices)
