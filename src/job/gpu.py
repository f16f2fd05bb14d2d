"""The GPU: which device this is, which spec (conf/gpu/*.yaml) describes it, its limits and clocks."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from functools import lru_cache

from omegaconf import OmegaConf

from src.paths import CONF_DIR
from src.errors import ConfigError, NoGPU

GPU_CONF_DIR = CONF_DIR / "gpu"


@dataclass(frozen=True)
class Device:
    """What the driver says about the device in use (None fields: not known without a GPU)."""

    name: str
    compute_capability: str
    sms: int
    max_threads_per_block: int
    max_smem_per_block: int          # bytes, with opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize)
    l2_bytes: int
    pci_bus_id: str | None = None
    driver: str | None = None
    cuda_runtime: str | None = None
    nvrtc: str | None = None
    cupy: str | None = None
    max_sm_clock_mhz: int | None = None
    host: str | None = None          # with pci_bus_id, which card of which machine: replicates
                                     # of a row show whether they ran on different machines
    uuid: str | None = None          # the card's own id (GPU-...): lent VMs share host names and
                                     # bus ids, so this is what tells two cards apart


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures for a named GPU, or `unknown` when the detected device has none."""

    name: str
    sms: int | None = None
    fp32_tflops: float | None = None
    tf32_tflops: float | None = None
    mem_bandwidth_gbs: float | None = None
    match: tuple[str, ...] = field(default_factory=tuple)

    def peak_tflops(self, precision: str) -> float | None:
        return {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops}.get(precision)


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


@lru_cache(maxsize=None)
def driver_loadable() -> bool:
    """Whether the NVIDIA driver's CUDA library (libcuda) can be loaded on this machine."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def no_gpu_message(exc: BaseException | None, count: int | None = None) -> str:
    """One paragraph saying which of the three it is: no NVIDIA driver, a driver but no CUDA
    device visible, or something else (CuPy missing, a driver older than the runtime)."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    tail = (" The runner compiles and times kernels on an NVIDIA GPU; the published results need "
            "none (sgemm-lab results).")
    if isinstance(exc, ImportError):
        return (f"CuPy cannot be imported ({exc}): install it for the driver's CUDA major version "
                f"(pip install -e '.[cuda13]', or '.[cuda12]' for a CUDA 12 driver).{tail}")
    if not driver_loadable():
        return f"no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded).{tail}"
    text = f"{type(exc).__name__}: {exc}" if exc is not None else ""
    if count == 0 or "NoDevice" in text or "no CUDA-capable device" in text:
        return (f"no CUDA device is visible to this process{where}: the NVIDIA driver is "
                f"installed, check nvidia-smi and CUDA_VISIBLE_DEVICES.{tail}")
    if "InsufficientDriver" in text:
        return (f"the NVIDIA driver is older than the CUDA runtime CuPy was built for ({text}): "
                f"update the driver, or install CuPy for its CUDA major version (pip install -e "
                f"'.[cuda12]' for a CUDA 12 driver).{tail}")
    return f"no usable CUDA GPU ({text}); check nvidia-smi and CUDA_VISIBLE_DEVICES.{tail}"


def detect() -> Device:
    """The current CUDA device. Raises NoGPU with a clear message when none is visible."""
    try:
        import cupy as cp

        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, CUDARuntimeError (no driver), ...
        raise NoGPU(no_gpu_message(exc)) from exc
    if count == 0:
        raise NoGPU(no_gpu_message(None, count))
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    attrs = dev.attributes
    return Device(
        name=props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        compute_capability=f"{props['major']}.{props['minor']}",
        sms=int(attrs["MultiProcessorCount"]),
        max_threads_per_block=int(attrs["MaxThreadsPerBlock"]),
        max_smem_per_block=int(attrs["MaxSharedMemoryPerBlockOptin"]),
        l2_bytes=int(attrs["L2CacheSize"]),
        pci_bus_id=dev.pci_bus_id,
        driver=_version(cp.cuda.runtime.driverGetVersion()),
        cuda_runtime=_version(cp.cuda.runtime.runtimeGetVersion()),
        nvrtc="%d.%d" % cp.cuda.nvrtc.getVersion(),
        cupy=cp.__version__,
        max_sm_clock_mhz=_nvml_max_sm_clock(dev.pci_bus_id),
        host=socket.gethostname(),
        uuid=format_uuid(props.get("uuid")) or _nvml_uuid(dev.pci_bus_id),
    )


def format_uuid(raw) -> str | None:
    """The card's UUID as nvidia-smi prints it (GPU-8-4-4-4-12 hex), from the 16 raw bytes."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 16:
        return None
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def known_specs() -> dict[str, dict]:
    """Every named spec in conf/gpu/ (auto excluded), as plain dicts (a copy: callers may change
    it). Read again only when a file there changes (name, size, modification time): every job
    asks, and reading them was about 40 ms of each tuning job (profiled on the H100 box)."""
    import copy

    stats = [(path, path.stat()) for path in sorted(GPU_CONF_DIR.glob("*.yaml"))]
    return copy.deepcopy(_specs_read(tuple((str(p), st.st_size, st.st_mtime_ns) for p, st in stats)))


@lru_cache(maxsize=4)
def _specs_read(stamps: tuple) -> dict[str, dict]:
    specs = {}
    for path, _size, _mtime in stamps:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        if data.get("name") != "auto":
            specs[data["name"]] = data
    return specs


def _spec_from_dict(data: dict) -> GpuSpec:
    return GpuSpec(
        name=data["name"],
        sms=data.get("sms"),
        fp32_tflops=data.get("fp32_tflops"),
        tf32_tflops=data.get("tf32_tflops"),
        mem_bandwidth_gbs=data.get("mem_bandwidth_gbs"),
        match=tuple(data.get("match", ())),
    )


def spec_for_device_name(device_name: str) -> GpuSpec | None:
    for data in known_specs().values():
        if any(re.search(pattern, device_name, re.IGNORECASE) for pattern in data.get("match", ())):
            return _spec_from_dict(data)
    return None


def resolve_spec(gpu_cfg, device: Device | None) -> GpuSpec:
    """`gpu=auto` picks the spec matching the detected device; a named spec is used as given."""
    data = OmegaConf.to_container(gpu_cfg, resolve=True) if not isinstance(gpu_cfg, dict) else gpu_cfg
    if data.get("name") != "auto":
        if "fp32_tflops" not in data:
            raise ConfigError(f"GPU spec {data.get('name')!r} has no fp32_tflops (conf/gpu/).")
        return _spec_from_dict(data)
    if device is None:
        return GpuSpec(name="unknown")
    found = spec_for_device_name(device.name)
    return found if found is not None else GpuSpec(name="unknown", sms=device.sms)


def device_limits(device: Device) -> dict[str, int]:
    """Names the kernel constraints may use (conf/kernel/*.yaml)."""
    return {
        "max_threads_per_block": device.max_threads_per_block,
        "max_smem_per_block": device.max_smem_per_block,
        "sms": device.sms,
        "compute_capability": _cc(device.compute_capability),
    }


def _cc(text: str) -> int:
    """"9.0" -> 90, as kernel constraints compare it (sm_90a code runs on 9.0 only)."""
    major, minor = str(text).split(".")
    return int(major) * 10 + int(minor)


def limits_from_spec(spec_name: str) -> dict[str, int]:
    """The same limits for a named GPU, without a GPU (constraint checks on a CPU machine)."""
    data = known_specs()[spec_name]
    return {
        "max_threads_per_block": 1024,
        "max_smem_per_block": int(data["max_smem_per_block_kb"]) * 1024,
        "sms": int(data["sms"]),
        "compute_capability": _cc(data["compute_capability"]),
    }


def cluster_blocks(spec_name: str) -> dict[int, int]:
    """{cluster size: blocks that clusters of that size place at once, one block an SM} from the
    datasheet's optional `cluster_blocks` (cuOccupancyMaxActiveClusters x size: a cluster's blocks
    share one GPC, so uneven GPCs hold fewer than SMs); {} where it names none. A size that is not
    a power of two up to 16, or a count not between 1 and the SMs, is a ConfigError naming the rule."""
    data = known_specs().get(spec_name) or {}
    given = data.get("cluster_blocks") or {}
    out = {}
    for size, blocks in dict(given).items():
        ok_size = isinstance(size, int) and not isinstance(size, bool) and size in (2, 4, 8, 16)
        ok_blocks = isinstance(blocks, int) and not isinstance(blocks, bool) and 1 <= blocks <= int(data["sms"])
        if not (ok_size and ok_blocks):
            raise ConfigError(f"conf/gpu/{spec_name}.yaml: cluster_blocks {size!r}: {blocks!r} is not a "
                              f"cluster size (2, 4, 8 or 16) with the blocks it places at once, 1 to "
                              f"sms ({data['sms']}) (rule: measured as cuOccupancyMaxActiveClusters "
                              f"times the size, one block an SM).")
        out[size] = blocks
    return out


# --- clocks (NVML) --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def nvml_handle(pci_bus_id: str | None):
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id) if pci_bus_id else None
    except Exception:
        return None  # NVML absent or refused: clocks are recorded as unknown, not guessed


def _nvml_max_sm_clock(pci_bus_id: str | None) -> int | None:
    handle = nvml_handle(pci_bus_id)
    if handle is None:
        return None
    import pynvml

    try:
        return int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except pynvml.NVMLError:
        return None


def _nvml_uuid(pci_bus_id: str | None) -> str | None:
    """The card's UUID from NVML: CuPy hands the 16 raw bytes over as a C string, so a UUID with a
    zero byte arrives cut short (an H100 of 2026-11-26, GPU-9b7cd6fa-81cc-00d8-..., recorded none)."""
    handle = nvml_handle(pci_bus_id)
    if handle is None:
        return None
    import pynvml

    try:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
    except pynvml.NVMLError:
        return None
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def sm_clock_mhz(device: Device) -> int | None:
    """The SM clock right now, in MHz (None when NVML cannot tell)."""
    handle = nvml_handle(device.pci_bus_id)
    if handle is None:
        return None
    import pynvml

    try:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except pynvml.NVMLError:
        return None


def device_arch() -> str:
    """The current device's architecture, as NVRTC names it (sm_90 for Hopper)."""
    import cupy as cp

    return "sm_" + cp.cuda.Device().compute_capability
