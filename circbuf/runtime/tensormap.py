"""Tensor maps for TMA copies, encoded on the host with cuTensorMapEncodeTiled.

Every documented constraint is checked here first and named in the error;
the driver itself only answers CUDA_ERROR_INVALID_VALUE. The scheduler only
asks for TMA on inputs that pass these checks (others take the non-TMA path),
so a CircbufError from here means a hand-written schedule asked for a map
its tensor cannot have.
"""

from __future__ import annotations

import ctypes

from ..ir import CircbufError

_DTYPES = {
    "torch.bfloat16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
    "torch.float16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    "torch.float32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
    "torch.float64": "CU_TENSOR_MAP_DATA_TYPE_FLOAT64",
    "torch.int32": "CU_TENSOR_MAP_DATA_TYPE_INT32",
    "torch.int64": "CU_TENSOR_MAP_DATA_TYPE_INT64",
    "torch.bool": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
}


_SWIZZLE = {
    0: "CU_TENSOR_MAP_SWIZZLE_NONE",
    32: "CU_TENSOR_MAP_SWIZZLE_32B",
    64: "CU_TENSOR_MAP_SWIZZLE_64B",
    128: "CU_TENSOR_MAP_SWIZZLE_128B",
}


def map_geometry(spec, shape, strides, itemsize):
    """(globalDim, globalStrides in bytes, boxDim), innermost first."""
    dims, gstrides, box = [], [], []
    for axes, b in spec.dims:
        ext = 1
        for a in axes:
            ext *= shape[a]
        stride = strides[axes[-1]] * itemsize
        if ext == 1:  # never stepped along: torch's stride of a size-1 axis is arbitrary (a [1, K] view
            # of a [K, 1] tensor has stride 1 there); give it the dense one, a multiple of 16 bytes
            stride = itemsize if not gstrides else -(-(gstrides[-1] * dims[-1]) // 16) * 16
        dims.append(ext)
        gstrides.append(stride)
        box.append(b)
    return dims, gstrides, box


def check_map(name, ptr, dims, gstrides, box, itemsize):
    """Raise a CircbufError naming the first TMA rule the map breaks."""
    rank = len(dims)
    if not 1 <= rank <= 5:
        raise CircbufError(f"tensor map for {name}: rank {rank} not in [1, 5]")
    if ptr % 16:
        raise CircbufError(f"tensor map for {name}: global address {ptr:#x} is not 16-byte aligned")
    for d, n in enumerate(dims):
        if not 1 <= n <= 1 << 32:
            raise CircbufError(f"tensor map for {name}: globalDim[{d}] = {n} not in [1, 2^32]")
    for d in range(1, rank):
        s = gstrides[d]
        if s % 16:
            raise CircbufError(
                f"tensor map for {name}: globalStride[{d}] = {s} bytes is not a multiple of 16"
            )
        if s >= 1 << 40:
            raise CircbufError(f"tensor map for {name}: globalStride[{d}] = {s} bytes is not below 2^40")
    for d, b in enumerate(box):
        if not 1 <= b <= 256:
            raise CircbufError(f"tensor map for {name}: boxDim[{d}] = {b} not in [1, 256]")
    if (box[0] * itemsize) % 16:
        raise CircbufError(
            f"tensor map for {name}: boxDim[0] x element size = {box[0] * itemsize} bytes is not a multiple of 16"
        )
    if gstrides[0] != itemsize:
        raise CircbufError(f"tensor map for {name}: the innermost dimension must be contiguous")


def check_coords(name, coords):
    """Raise a CircbufError if a bulk tensor copy's coordinates (innermost
    first) start its box before the tensor. They are the instruction's
    operands, not the map's parameters, so no encoder sees them.

    Boxes that run past a tensor's end, partly or wholly, are clipped (not
    written, or read as zero): every ragged GEMM's last tile does that on the
    H100. A box that starts at a negative coordinate is never issued: issue
    22's reduce-scatter stored each box to every peer at row ``r - p * M/world``
    and relied on the clipping of the rows before peer ``p``'s block; its GEMM
    died with CUDA_ERROR_ILLEGAL_INSTRUCTION on an H100 where the all-gather
    kernel, identical but for those coordinates and the tile order, ran.
    """
    for d, c in enumerate(coords):
        if c < 0:
            raise CircbufError(
                f"tensor map for {name}: coordinate {d} of a bulk tensor copy is {c}: no box may "
                "start before the tensor (a reduce-scatter's negative TMA store rows died with "
                "CUDA_ERROR_ILLEGAL_INSTRUCTION on an H100)"
            )


def encode(spec, tensor, name: str) -> bytes:
    """The 128 opaque bytes of a tensor map for ``tensor`` (tiled, with the
    shared side's swizzle, out-of-range elements read as zero)."""
    from cuda.bindings import driver as drv

    from .driver import check

    item = tensor.element_size()
    dims, gstrides, box = map_geometry(spec, tensor.shape, tensor.stride(), item)
    ptr = tensor.data_ptr()
    check_map(name, ptr, dims, gstrides, box, item)
    dtype = getattr(drv.CUtensorMapDataType, _DTYPES[str(tensor.dtype)])
    rank = len(dims)
    tmap = check(
        drv.cuTensorMapEncodeTiled(
            dtype,
            rank,
            ptr,
            [drv.cuuint64_t(d) for d in dims],
            [drv.cuuint64_t(s) for s in gstrides[1:]],
            [drv.cuuint32_t(b) for b in box],
            [drv.cuuint32_t(1)] * rank,
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(drv.CUtensorMapSwizzle, _SWIZZLE[spec.swizzle]),
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        f"cuTensorMapEncodeTiled({name})",
    )
    return ctypes.string_at(tmap.getPtr(), 128)
