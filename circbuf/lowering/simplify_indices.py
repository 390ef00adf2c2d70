"""Pass: simplify every index and condition in the kernel.

Requires: indexed, predicated, turns, tma_stores_synced, pipelined, mbarriers_allocated,
one_trip_dropped; provides: simplified.

Before::  T2[((((j0 * 128) + threadIdx.x) * 8) / 8) % 128]
After::   T2[threadIdx.x]

A condition inside a loop drops the loop's own bound (``j6 < T`` inside
``for (j6 = ..; j6 < T; ..)`` holds in its body)::

    FOR j6 in blockIdx.x..T step 132: IF (x < i2) && (j6 < T): ...
    ->  FOR j6 in blockIdx.x..T step 132: IF (x < i2): ...
"""

from __future__ import annotations

from ..ir import Bin, Const, simplify
from .kir import (
    Assign,
    BlockReduce,
    ForLoop,
    IfThenElse,
    Kernel,
    MBarrierArriveExpectTx,
    MBarrierWait,
    TensorRef,
    TmaLoad,
    Wgmma,
    walk,
)


def _drop_loop_bounds(cond, bounds):
    """``cond`` with each conjunct that is an enclosing loop's own bound made true."""
    if isinstance(cond, Bin) and cond.op == "&&":
        return Bin("&&", _drop_loop_bounds(cond.a, bounds), _drop_loop_bounds(cond.b, bounds), cond.dtype)
    return Const(True) if cond in bounds else cond


def simplify_indices(kernel: Kernel) -> Kernel:
    """Entry: simplify indices, conditions and loop extents in place."""

    def ref(r):
        if isinstance(r, TensorRef):
            r.index = simplify(r.index)

    def fn(node, stack):
        if isinstance(node, Assign):
            ref(node.lhs)
            for o in node.operands:
                ref(o)
            if node.row is not None:
                ref(node.row.prev)
                node.row.col, node.row.left = simplify(node.row.col), simplify(node.row.left)
        elif isinstance(node, BlockReduce):
            ref(node.ref)
        elif isinstance(node, IfThenElse):
            bounds = [lp.index.lt(simplify(lp.extent)) for lp in stack if isinstance(lp, ForLoop)]
            node.cond = simplify(_drop_loop_bounds(simplify(node.cond), bounds))
        elif isinstance(node, ForLoop):
            node.extent = simplify(node.extent)
            node.start, node.step = simplify(node.start), simplify(node.step)
        elif isinstance(node, Wgmma):
            ref(node.acc)
            node.scale_d = simplify(node.scale_d)
            for op in (node.a, node.b):
                op.offset = simplify(op.offset)
        elif isinstance(node, TmaLoad):
            ref(node.dst)
            node.coords = [simplify(c) for c in node.coords]
        elif isinstance(node, MBarrierWait):
            node.parity = simplify(node.parity)
        elif isinstance(node, MBarrierArriveExpectTx):
            node.bytes = simplify(node.bytes)

    walk(kernel.body, fn)
    return kernel
