"""Tensor maps: the descriptors Hopper's tensor memory accelerator (TMA) copies tiles with.

A kernel config may list `launch.tensor_maps`, one entry per operand the kernel loads with
`cp.async.bulk.tensor`:

    tensor_maps:
      - {matrix: a, box: [32, bm], swizzle: 128, element: f32}

`matrix` is `a`, `b` or `workspace`: a region of the kernel's workspace (launch.workspace_bytes)
that a pre-pass (launch.prepass) has written, given as `region: [byte offset, rows, cols, row
stride in elements]`; `matrix` may also be an expression of the sizes that picks one of the
three (the spec step evaluates it, and the region only where it picks the workspace).
`box` is the tile one copy moves, innermost (contiguous) dimension first, in elements; `swizzle`
the shared-memory swizzle in bytes (0, 32, 64 or 128); `element` the TMA element type, `f32` or
`tf32` (the TMA's TF32 type). The spec step evaluates the box against the parameters and checks
the TMA's rules (`check`); the launch encodes one map per matrix with the driver's
cuTensorMapEncodeTiled (through cuda-bindings) for the arrays being multiplied, and passes each
by value (a 128-byte CUtensorMap, `const __grid_constant__` in the kernel) after C.
"""

from __future__ import annotations

from dataclasses import dataclass

from src.errors import ConfigError, LaunchFailed

MATRICES = ("a", "b", "workspace")
ELEMENT_BYTES = {"f32": 4, "tf32": 4}
SWIZZLES = (0, 32, 64, 128)
MAX_BOX = 256            # elements per box dimension
MAP_BYTES = 128          # sizeof(CUtensorMap)


@dataclass(frozen=True)
class TensorMapSpec:
    matrix: str                 # "a" (M x K), "b" (K x N), both row-major, or "workspace"
    box: tuple[int, int]        # (inner, outer) elements
    swizzle: int                # bytes
    element: str = "f32"
    region: tuple[int, int, int, int] | None = None  # workspace only: offset B, rows, cols, stride


def check(maps: tuple[TensorMapSpec, ...], kernel: str) -> None:
    """The TMA's own rules for a box, before anything is compiled or launched."""
    for tm in maps:
        where = f"kernel {kernel}: tensor map of {tm.matrix!r}"
        if tm.matrix not in MATRICES:
            raise ConfigError(f"{where}: matrix must be one of {MATRICES} (rule: tensor_maps[].matrix "
                              f"names an input).")
        if tm.element not in ELEMENT_BYTES:
            raise ConfigError(f"{where}: element must be one of {tuple(ELEMENT_BYTES)}, got "
                              f"{tm.element!r} (rule: tensor_maps[].element is a TMA element type).")
        if tm.swizzle not in SWIZZLES:
            raise ConfigError(f"{where}: swizzle must be one of {SWIZZLES} bytes, got {tm.swizzle} "
                              f"(rule: the TMA swizzles 32, 64 or 128 bytes, or none).")
        _check_region(tm, where)
        inner_bytes = tm.box[0] * ELEMENT_BYTES[tm.element]
        if not all(1 <= b <= MAX_BOX for b in tm.box):
            raise ConfigError(f"{where}: box {list(tm.box)} has a dimension outside 1..{MAX_BOX} "
                              f"(rule: a TMA box has at most {MAX_BOX} elements per dimension).")
        if inner_bytes % 16:
            raise ConfigError(f"{where}: the box's inner dimension is {inner_bytes} bytes, not a "
                              f"multiple of 16 (rule: TMA boxes are whole 16-byte chunks wide).")
        if tm.swizzle and inner_bytes > tm.swizzle:
            raise ConfigError(f"{where}: the box's inner dimension is {inner_bytes} bytes, wider than "
                              f"its {tm.swizzle}-byte swizzle (rule: inner box bytes <= swizzle "
                              f"bytes).")


def _check_region(tm: TensorMapSpec, where: str) -> None:
    if (tm.matrix == "workspace") != (tm.region is not None):
        raise ConfigError(f"{where}: a workspace map needs a region and only a workspace map has "
                          f"one (rule: region = [offset bytes, rows, cols, row stride] exactly "
                          f"when matrix is workspace).")
    if tm.region is not None:
        offset, rows, cols, stride = tm.region
        if offset % 16 or (stride * 4) % 16 or rows < 1 or not 1 <= cols <= stride:
            raise ConfigError(f"{where}: region {list(tm.region)} is not a TMA tensor (rule: a "
                              f"16-byte aligned offset, a row stride of whole 16-byte chunks and "
                              f"at least one row of 1..stride columns).")


def operand(tm: TensorMapSpec, arrays: dict):
    """The 2-D device array `tm` describes: A or B itself, or its region of the workspace (a
    strided view: rows x cols of a rows x stride float32 block)."""
    if tm.region is None:
        return arrays[tm.matrix]
    import cupy as cp

    offset, rows, cols, stride = tm.region
    block = arrays["workspace"][offset:offset + 4 * rows * stride].view(cp.float32)
    return block.reshape(rows, stride)[:, :cols]


def encode(tm: TensorMapSpec, array):
    """The CUtensorMap of `tm` over the row-major 2-D device array `array`, as a one-element
    NumPy array of 128 bytes (CuPy passes a size-one NumPy array to a kernel by value)."""
    import numpy as np
    from cuda.bindings import driver as cu

    rows, cols = array.shape
    element = {"f32": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
               "tf32": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_TFLOAT32}[tm.element]
    swizzle = {0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
               32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
               64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
               128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}[tm.swizzle]
    u32, u64 = cu.cuuint32_t, cu.cuuint64_t
    err, tensor_map = cu.cuTensorMapEncodeTiled(
        element, u32(2), array.data.ptr,
        [u64(cols), u64(rows)],       # sizes, innermost first
        [u64(array.strides[0])],      # byte stride of the outer dimension (a multiple of 16)
        [u32(tm.box[0]), u32(tm.box[1])], [u32(1), u32(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)  # outside the matrix: zeros
    if err != cu.CUresult.CUDA_SUCCESS:
        raise LaunchFailed(
            f"the driver could not encode a tensor map of {tm.matrix.upper()} ({rows} x {cols}, row "
            f"stride {array.strides[0]} B, box {list(tm.box)}, swizzle {tm.swizzle} B): {err.name} "
            f"(rule: the TMA needs a 16-byte aligned base and a row stride that is a multiple of "
            f"16 bytes).")
    words = np.array([int(w) for w in tensor_map.opaque], dtype=np.uint64)
    if words.nbytes != MAP_BYTES:
        raise LaunchFailed(f"cuda-bindings returned a {words.nbytes}-byte CUtensorMap, not {MAP_BYTES}.")
    return words.view(np.dtype((np.void, MAP_BYTES)))
