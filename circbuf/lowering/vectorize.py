"""Pass: collapse vectorized loops into one wide access.

Requires: indexed; provides: vectorized.

A loop over an axis parallelized ``Vectorize`` must hold exactly one copy;
it becomes a single access of ``extent`` elements at the index of element 0.
The scheduler only vectorizes where extent, strides and pointer allow it.

Before::

    FOR j1 in 0..8 (V)
      T2[j0 * 8 + j1] = set(T0[(... * 8) + j1])

After::

    T2[j0 * 8] = vec8 T0[(... * 8)]
"""

from __future__ import annotations

from ..ir import BroadcastOp, CircbufError, LoadStoreOp, ParallelType, simplify
from ..ir.scalar import Const, substitute
from .kir import Assign, ForLoop, Kernel, RowPiece, TensorRef, rewrite


def vectorize_loops(kernel: Kernel) -> Kernel:
    """Entry: ForLoop(Vectorize){single copy} -> one vector Assign."""

    def fn(node):
        if not isinstance(node, ForLoop) or node.ptype != ParallelType.Vectorize:
            return None
        body = node.body
        copy = (LoadStoreOp, BroadcastOp)
        if len(body) != 1 or not isinstance(body[0], Assign) or not isinstance(body[0].expr, copy):
            what = ", ".join(type(b).__name__ for b in body)
            raise CircbufError(f"a vectorized loop must hold exactly one copy (set), found: {what}")
        ext = simplify(node.extent)
        if not isinstance(ext, Const):
            raise CircbufError(f"vectorized loop {node.index} has a symbolic extent {ext}")
        a = body[0]
        zero = {node.index.name: Const(0)}
        width = ext.value
        for r in [a.lhs] + [o for o in a.operands if isinstance(o, TensorRef)]:
            if width * r.tv.dtype.size > 16:
                raise CircbufError(f"vectorizing {r.tv.name} by {width} exceeds 16 bytes per access")
        lhs = TensorRef(a.lhs.tv, substitute(a.lhs.index, zero), width)
        ops = [TensorRef(o.tv, substitute(o.index, zero), width) for o in a.operands]
        pred = [substitute(p, zero) for p in a.pred]
        row = a.row
        if row is not None:  # a row store: the pair's facts at its first element
            prev = TensorRef(row.prev.tv, substitute(row.prev.index, zero))
            row = RowPiece(prev, substitute(row.col, zero), row.width, substitute(row.left, zero))
            assert width == 2 and a.lhs.tv.dtype.size == 2, (
                f"a row store of {a.lhs.tv.name} moves 16-bit pairs"
            )
        return Assign(lhs, a.expr, ops, pred=pred, touches_global=a.touches_global, row=row)

    kernel.body = rewrite(kernel.body, fn)
    return kernel
