"""Sweep step on several GPUs, beside the hand-out: the builds that some of a batch's jobs need before
their first launch (the CUTLASS peer's nvcc build, about 14 s), done on the launching process's CPU
while the GPUs run the batch's other jobs (issue 38). A job that needs a build is handed out once
the build is done, or earlier when nothing else is left to hand out (it then waits on the build's
lock in its worker, as every job did before). Without this, the job that built the library held a
GPU for the build, and a job whose peer it is held a second GPU waiting on the lock.

Which builds, as data: the launcher's `prebuild` (conf/hydra/launcher/gpus.yaml) maps a kernel
backend to the function that builds for it; a job needs the build of its own kernel's backend and
of each of its kernel's `peers` (conf/kernel/<peer>.yaml). The architecture is the kernel's own
`arch`, else the sweep's GPUs' as NVML reports them (no CUDA context in the launching process),
else the composed `gpu` spec's compute_capability; with none of these known, nothing is built
ahead. A build that fails is logged and its jobs are handed out: each job builds again in its
worker and records that error as its status, as it would have without the build ahead.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
from dataclasses import dataclass
from multiprocessing import Pipe
from pathlib import Path
from typing import Callable, Sequence

from src.errors import ConfigError

log = logging.getLogger("sgemm")


@dataclass(frozen=True)
class Build:
    """One build ahead: `builder` (a dotted function name) called with the config of the kernel
    that builds (`kernel`, a dict), the architecture and the cache directory."""

    builder: str
    kernel_name: str
    arch: str
    cache_dir: str


def prebuild_rule(section) -> dict[str, str]:
    """The launcher's `prebuild`: {backend: dotted name of its build function}; null: none."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(section) if OmegaConf.is_config(section) else section
    data = {} if data is None else data
    if not (isinstance(data, dict) and all(isinstance(k, str) and isinstance(v, str) and "." in v
                                           for k, v in data.items())):
        raise ConfigError(
            f"hydra.launcher.prebuild must map a kernel backend to the dotted name of its build "
            f"function (e.g. {{cutlass: src.job.cutlass_build.build_for}}), or be null, got "
            f"{data!r} (rule: it names the builds done on the launching process's CPU before "
            f"the jobs that need them are handed out).")
    return data


def nvml_archs() -> list[str]:
    """The architectures ("sm_90") of the node's GPUs, as NVML reports them (it asks the driver;
    no CUDA context is made); [] without NVML or a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        archs = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
            if f"sm_{major}{minor}" not in archs:
                archs.append(f"sm_{major}{minor}")
        return archs
    except Exception:  # no driver, no NVML: the gpu spec may still say
        return []


def _archs(config, kernel: dict, device_archs: Callable[[], list[str]]) -> list[str]:
    """What a job's worker would build for: the kernel's own arch, else its device's
    (src/job/gpu.py device_arch: sm_ + compute capability), here from NVML or the gpu spec."""
    if kernel.get("arch"):
        return [str(kernel["arch"])]
    found = device_archs()
    if found:
        return found
    capability = (config.get("gpu") or {}).get("compute_capability")
    return [f"sm_{str(capability).replace('.', '')}"] if capability else []


def _kernels(config, peer_config: Callable[[str], dict]) -> list[dict]:
    """The kernel configs a job builds: its own kernel and each of its peers."""
    from omegaconf import OmegaConf

    kernel = OmegaConf.to_container(config.kernel, resolve=True)
    found = [kernel]
    for name in kernel.get("peers") or ():
        try:
            found.append(peer_config(str(name)))
        except Exception:  # a peer that does not compose: the job records it when it runs
            continue
    return found


def plan(configs: Sequence, rule: dict[str, str], device_archs: Callable[[], list[str]] = nvml_archs,
         peer_config: Callable[[str], dict] | None = None) -> tuple[dict[Build, dict], list[set[Build]]]:
    """(each build with the kernel config it builds, each job's builds in job order)."""
    if peer_config is None:
        from src.job.config import kernel_config as peer_config
    builds: dict[Build, dict] = {}
    needs: list[set[Build]] = []
    archs_once = functools.cache(device_archs)  # NVML asked once a batch
    for config in configs:
        wanted: set[Build] = set()
        try:
            chdir = bool(config.hydra.job.get("chdir"))
            kernels = [] if chdir or not rule else _kernels(config, peer_config)
            cache_dir = Path(str(config.cache_dir))
        except Exception:  # no kernel or cache_dir: the job's own error, recorded when it runs
            kernels = []
        for kernel in kernels:  # why not with chdir: a relative cache_dir is then each job's own
            builder = rule.get(str(kernel.get("backend")))
            if builder is None:
                continue
            for arch in _archs(config, kernel, archs_once):
                build = Build(builder, str(kernel.get("name")), arch, str(cache_dir.absolute()))
                builds.setdefault(build, kernel)
                wanted.add(build)
        needs.append(wanted)
    return builds, needs


class Prebuilds:
    """The builds of a batch, each on a thread of the launching process (nvcc runs as a
    subprocess: the thread only waits). `held(position)`: whether the job at `position` still
    waits for a build; `wake` becomes readable each time a build ends."""

    def __init__(self, builds: dict[Build, dict], needs: list[set[Build]]) -> None:
        self.needs = needs
        self.failed: dict[Build, str] = {}
        self._done: set[Build] = set()
        self._lock = threading.Lock()
        self.wake, self._wake_writer = Pipe(duplex=False) if builds else (None, None)
        self._threads = [threading.Thread(target=self._build, args=(build, kernel), daemon=True,
                                          name=f"sgemm-prebuild-{build.kernel_name}-{build.arch}")
                         for build, kernel in builds.items()]
        for build, _kernel in builds.items():
            waiting = sum(build in wanted for wanted in needs)
            log.info("building %s for %s on the CPU (%s) while the GPUs run the other jobs; %d "
                     "job(s) wait for it", build.kernel_name, build.arch, build.builder, waiting)
        for thread in self._threads:
            thread.start()

    def held(self, position: int) -> bool:
        with self._lock:
            return bool(self.needs[position] - self._done)

    def _build(self, build: Build, kernel: dict) -> None:
        started = time.perf_counter()
        try:
            module, function = build.builder.rsplit(".", 1)
            getattr(importlib.import_module(module), function)(kernel, build.arch, build.cache_dir)
        except Exception as exc:  # each job that needs it builds again and records the error
            self.failed[build] = f"{type(exc).__name__}: {exc}"
            log.warning("building %s for %s ahead failed (%s: %s); its jobs are handed out and "
                        "each records the build's error as its status", build.kernel_name,
                        build.arch, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        else:
            log.info("built %s for %s ahead in %.1f s", build.kernel_name, build.arch,
                     time.perf_counter() - started)
        finally:
            with self._lock:
                self._done.add(build)
            try:
                self._wake_writer.send(build.kernel_name)
            except OSError:  # the sweep has ended meanwhile: nobody waits
                pass

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    def close(self) -> None:
        """The hand-out is over: a build still running finishes for later jobs and sweeps."""
        if self.wake is not None:
            self.wake.close()
        if self._wake_writer is not None and not any(t.is_alive() for t in self._threads):
            self._wake_writer.close()


def started(configs: Sequence, rule: dict[str, str], device_archs: Callable[[], list[str]] = nvml_archs
            ) -> Prebuilds:
    """The batch's builds, planned and started."""
    return Prebuilds(*plan(configs, rule, device_archs))

