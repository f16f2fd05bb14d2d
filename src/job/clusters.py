"""What clusters of blocks place at once on this GPU, against what its datasheet says.

A cluster's blocks all sit in one GPC, and a chip's SMs are spread unevenly over its GPCs (the
ones floor-sweeping left), so fewer clusters fit at once than SMs / cluster size: on an H100 80GB
HBM3, 66 clusters of 2, 30 of 4 and 15 of 8 at one block an SM (132, 120 and 120 blocks). The
dispatch's wave fill counts rounds of that many blocks for a cluster launch where the datasheet
gives `cluster_blocks` (conf/gpu/<spec>.yaml; src/job/gpu.cluster_blocks). This module asks the
driver (`cuOccupancyMaxActiveClusters`) for the launch the fill is about: `gemm_tf32`'s cluster
entry, one block an SM, sliced into 2, 4 and 8 blocks a cluster.

    python -m src.job.clusters h100_sxm   # measured here, the datasheet's, and whether they agree

`sgemm-lab tune` runs it before it measures, so a card whose GPCs hold other counts is said, not
silently fitted with another card's figure.
"""

from __future__ import annotations

import argparse
import sys

from src.errors import LabError

SIZES = (2, 4, 8)
# A launch of one block an SM (108,624 B of shared memory): 16 tiles of 40 x 128, K sliced per cluster.
PROBE_SHAPE = (40, 2048, 1664)
PROBE_PARAMS = {"bm": 128, "bn": 128, "fit": 2, "stages": 5, "min_slice_k": 32}


def probe_spec(gpu_spec: str, size: int):
    """The launch the driver is asked about: gemm_tf32's cluster entry at PROBE_SHAPE in clusters
    of `size` K slices, one block an SM (a KernelSpec), or the rule it breaks on `gpu_spec`."""
    from src.job import gpu as gpu_mod
    from src.job.config import kernel_config
    from src.job.problem import Problem
    from src.job.spec import candidate_spec

    return candidate_spec({**kernel_config("gemm_tf32"), "precision": "tf32"},
                          {**PROBE_PARAMS, "split_k": size, "min_slices": size},
                          Problem(*PROBE_SHAPE, 1.0, 1.0), gpu_mod.limits_from_spec(gpu_spec))


def measured(gpu_spec: str, sizes=SIZES) -> dict[int, int]:
    """{cluster size: blocks that clusters of that size place at once} on the current device,
    for gemm_tf32's cluster launch at PROBE_SHAPE (cuOccupancyMaxActiveClusters x size). Needs a
    GPU that builds sm_90a."""
    import cupy as cp
    from cuda.bindings import driver

    from src.job.compile import DEFAULT_CACHE_DIR, build_cubin, expand_source
    from src.job.spec import KernelSpec

    cp.zeros(1)  # the device's primary context, current for the driver calls below
    out = {}
    for size in sizes:
        spec = probe_spec(gpu_spec, size)
        if not isinstance(spec, KernelSpec) or spec.cluster != size:
            raise LabError(f"the cluster probe does not build clusters of {size} on {gpu_spec}: "
                           f"{spec if isinstance(spec, str) else spec.cluster}")
        cubin = build_cubin(expand_source(spec.source), spec.entry, spec.arch, DEFAULT_CACHE_DIR,
                            spec.name)
        module = _check(*driver.cuModuleLoad(str(cubin.path).encode()))
        function = _check(*driver.cuModuleGetFunction(module, cubin.lowered_name.encode()))
        _check(*driver.cuFuncSetAttribute(
            function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            spec.dynamic_smem_bytes))
        launch = driver.CUlaunchConfig()
        launch.gridDimX, launch.gridDimY, launch.gridDimZ = (*spec.grid, 1, 1)[:3]
        launch.blockDimX, launch.blockDimY, launch.blockDimZ = (*spec.block, 1, 1)[:3]
        launch.sharedMemBytes = spec.dynamic_smem_bytes
        launch.numAttrs = 0  # the cluster's size is the entry's own (__cluster_dims__)
        out[size] = _check(*driver.cuOccupancyMaxActiveClusters(function, launch)) * size
    return out


def _check(err, *values):
    """The call's value, or a LabError naming the driver call's error."""
    if getattr(err, "value", err) != 0:  # a CUresult (an enum), CUDA_SUCCESS 0
        raise LabError(f"the CUDA driver refused the cluster probe: {err}")
    return values[0] if values else None


def disagreement(gpu_spec: str, datasheet: dict[int, int], found: dict[int, int],
                 sms: int) -> str | None:
    """None where the datasheet gives each measured size the measured count (a size placing all
    `sms` blocks may go unsaid: the fill counts that anyway); else one paragraph naming the rule
    and the line to write."""
    if all(datasheet.get(size, sms) == blocks for size, blocks in found.items()):
        return None
    line = "{" + ", ".join(f"{size}: {blocks}" for size, blocks in sorted(found.items())) + "}"
    said = "{" + ", ".join(f"{s}: {b}" for s, b in sorted(datasheet.items())) + "}" if datasheet else "nothing"
    return (f"conf/gpu/{gpu_spec}.yaml: cluster_blocks says {said}, but this card places "
            f"{line} blocks at once in clusters of those sizes (cuOccupancyMaxActiveClusters, one "
            f"block an SM). The dispatch's wave fill counts the datasheet's figure (rule: "
            f"cluster_blocks is what clusters of each size place at once on this GPU); write "
            f"`cluster_blocks: {line}` there if every card of this spec measures so, and refit "
            f"(`sgemm-lab tune --fit-only`).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.job.clusters", description=__doc__.split("\n\n")[0])
    parser.add_argument("gpu_spec", help="the conf/gpu/ spec whose datasheet to check")
    args = parser.parse_args(argv)
    from src.job import gpu as gpu_mod

    try:
        sms = int(gpu_mod.limits_from_spec(args.gpu_spec)["sms"])
        datasheet = gpu_mod.cluster_blocks(args.gpu_spec)
        found = measured(args.gpu_spec)
    except LabError as exc:
        print(f"cluster capacity not measured: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # no CuPy, no driver, no device: said as the runner says it
        print(f"cluster capacity not measured: {gpu_mod.no_gpu_message(exc)}", file=sys.stderr)
        return 1
    print(f"{args.gpu_spec}: clusters place " + ", ".join(
        f"{blocks} blocks in clusters of {size} ({blocks // size} clusters)"
        for size, blocks in sorted(found.items())) + " at once (one block an SM)")
    problem = disagreement(args.gpu_spec, datasheet, found, sms)
    print(problem or f"conf/gpu/{args.gpu_spec}.yaml's cluster_blocks agrees.")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
