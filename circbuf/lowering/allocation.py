"""Pass: allocate local and shared buffers.

Requires: loop_nest; provides: allocated, smem_bytes.

A buffer holds the loop axes right of its compute-at position, less the axes
bound to blocks, broadcast and reduction axes, and (for registers) thread
axes: each thread owns its registers. Register buffers need constant sizes
and are declared at the top of the innermost loop they are shared by. Shared
buffers live in dynamic shared memory at 128-byte aligned offsets; their size
may depend on extents (the runtime evaluates it at launch); a circular buffer
holds ``stages`` copies.

Before::

    FOR j0 in 0..4
      T2 = set(T0)
    FOR j1 in 0..4
      T3 = exp(T2)

After::

    ALLOC T2_l_f32[4]
    FOR j0 in 0..4
      T2 = set(T0)
    ...
"""

from __future__ import annotations

from ..ir import CircbufError, Const, MemoryType, Scalar, TensorView, simplify
from .kir import Allocate, ExprStmt, ForLoop, Kernel, ReductionInit, walk

SMEM_ALIGN = 128  # TMA destinations need 128-byte alignment
SWIZZLE_ALIGN = 1024  # a swizzle pattern (8 rows of 128 bytes) starts on this boundary


def allocation_axes(tv: TensorView) -> list:
    """Loop axes a buffer of ``tv`` holds, outer to inner: those right of its
    compute-at position, or, for a circular buffer not inlined into its
    readers (a loop nest of its own), those right of its ring axis."""
    out = []
    start = tv.compute_at_pos
    if tv.circular is not None and start == 0:
        start = tv.circular_buffer_axis() + 1
    axes = tv.loop[start:]
    if tv.memory_type == MemoryType.Shared and tv.domain.allocation is not None:
        axes = tv.domain.allocation  # an explicit allocation domain
    for ax in axes:
        if ax.is_broadcast or ax.is_reduction:
            continue
        pt = ax.parallel_type
        if pt.is_block:
            continue
        if pt.is_thread and tv.memory_type == MemoryType.Local:
            continue
        out.append(ax)
    return out


def allocation_strides(tv: TensorView) -> list:
    """(axis, stride) for row-major storage over :func:`allocation_axes`."""
    strides, s = [], Const(1)
    for ax in reversed(allocation_axes(tv)):
        ext = simplify(ax.loop_extent)
        if not isinstance(ext, Const) and tv.memory_type == MemoryType.Local:
            raise CircbufError(
                f"{tv.name} (local) would need a buffer over axis {ax} "
                f"of symbolic extent {ext}; inline it further (raise its compute-at position)"
            )
        strides.append((ax, s))
        s = simplify(s * ext)
    return list(reversed(strides))


def allocation_size(tv: TensorView) -> Scalar:
    """Elements of one stage of the buffer."""
    size = Const(1)
    for ax, _ in allocation_strides(tv):
        size = simplify(size * ax.loop_extent)
    return size


def insert_allocations(kernel: Kernel) -> Kernel:
    """Entry: add an Allocate for each local/shared tensor written in the kernel."""
    placed = {}

    def visit(node, stack):
        if not isinstance(node, (ExprStmt, ReductionInit)):
            return
        tv = node.expr.out
        if tv.memory_type == MemoryType.Global or id(tv) in placed:
            return
        keys = {tv.loop[k].id for k in range(tv.compute_at_pos)}
        host = None
        for loop in stack:
            if isinstance(loop, ForLoop) and any(node.index.get(k) is loop.index for k in keys):
                host = loop
        size = allocation_size(tv)
        if tv.memory_type == MemoryType.Local:
            size = size.value
        stages = tv.circular[0] if tv.circular else 1
        if tv.memory_type == MemoryType.Shared:
            host = None  # dynamic shared memory is carved once, at the top
        placed[id(tv)] = (host, Allocate(tv, size, tv.memory_type, stages))

    walk(kernel.body, visit)
    offset = Const(0)
    for _, a in placed.values():
        if a.memory == MemoryType.Shared:
            # a swizzled buffer's pattern repeats every 1024 bytes from an
            # aligned address: each stage starts on such a boundary
            align = SWIZZLE_ALIGN if a.tv.swizzle_bytes else SMEM_ALIGN
            offset = simplify(((offset + (align - 1)) // align) * align)
            a.offset = offset
            stage = simplify(a.size * a.tv.dtype.size)
            if a.tv.swizzle_bytes and a.stages > 1:
                if not (isinstance(stage, Const) and stage.value % SWIZZLE_ALIGN == 0):
                    raise CircbufError(
                        f"{a.tv.name}: a swizzled circular buffer's stage ({stage} bytes) must be a "
                        f"multiple of {SWIZZLE_ALIGN} bytes"
                    )
            nbytes = simplify(stage * a.stages)
            offset = simplify(((offset + nbytes + (SMEM_ALIGN - 1)) // SMEM_ALIGN) * SMEM_ALIGN)
    kernel.smem_bytes = offset if not (isinstance(offset, Const) and offset.value == 0) else 0
    per_host: dict = {}
    for host, alloc in placed.values():  # first-write order
        per_host.setdefault(id(host), (host, []))[1].append(alloc)
    for host, allocs in per_host.values():
        body = host.body if host is not None else kernel.body
        body[0:0] = allocs
    return kernel
