"""Pass 2: allocate local and shared buffers.

A buffer holds the loop axes right of its compute-at position, less the axes
bound to threads/blocks (each thread owns its registers), broadcast axes and
reduction axes. It is declared at the top of the innermost loop it is shared
by (or of the kernel).

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

from ..ir import CircbufError, Const, MemoryType, TensorView, simplify
from .kir import Allocate, ExprStmt, ForLoop, Kernel, ReductionInit, walk


def allocation_axes(tv: TensorView) -> list:
    """Loop axes a buffer of ``tv`` holds, outer to inner."""
    out = []
    for ax in tv.loop[tv.compute_at_pos :]:
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
    axes = allocation_axes(tv)
    strides, s = [], 1
    for ax in reversed(axes):
        ext = simplify(ax.loop_extent)
        if not isinstance(ext, Const):
            raise CircbufError(
                f"{tv.name} ({tv.memory_type.name.lower()}) would need a buffer over axis {ax} "
                f"of symbolic extent {ext}; inline it further (raise its compute-at position)"
            )
        strides.append((ax, s))
        s *= ext.value
    return list(reversed(strides))


def allocation_size(tv: TensorView) -> int:
    size = 1
    for ax, _ in allocation_strides(tv):
        size *= simplify(ax.loop_extent).value
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
        placed[id(tv)] = (host, Allocate(tv, allocation_size(tv), tv.memory_type))

    walk(kernel.body, visit)
    per_host: dict = {}
    for host, alloc in placed.values():  # first-write order
        per_host.setdefault(id(host), (host, []))[1].append(alloc)
    for host, allocs in per_host.values():
        body = host.body if host is not None else kernel.body
        body[0:0] = allocs
    kernel.smem_bytes = sum(
        a.size * a.tv.dtype.size for _, a in placed.values() if a.memory == MemoryType.Shared
    )
    return kernel
