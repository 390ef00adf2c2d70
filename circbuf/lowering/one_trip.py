"""Pass: a loop of one trip becomes its body, its index replaced by 0.

Requires: pipelined, mbarriers_allocated; provides: one_trip_dropped.

The loop nest keeps serial loops of one trip where a ring needs them (the
circular-buffer pass matches a ring's producer and consumer loops level by
level: a TMA copy loop over one box, a wgmma loop over one k chunk). Once
the rings are lowered they are only text: this pass removes them, so the
CUDA reads as a person writes it. The loop a ring's producer rotates over
stays (its key is ``Kernel.circular_loops``': its stage and phase move once
per trip); a consumer's loop of one trip goes, its ring advances still in
its body. A strided loop stays too (a persistent grid's: one trip for some
CTAs, none for others). A condition the index made constant (``j8 != 0``
of the loop's one trip: false) leaves the branch it chooses.

Before::

    FOR j1 in 0..ceilDiv(i1, 64)
      FOR j2 in 0..1 unroll
        TMA_LOAD a_stage[(stage * 8192) + (j2 * 8192)] <- {(j1 * 64) + (j2 * 64), tile_m}

After::

    FOR j1 in 0..ceilDiv(i1, 64)
      TMA_LOAD a_stage[stage * 8192] <- {j1 * 64, tile_m}
"""

from __future__ import annotations

import dataclasses
from enum import Enum

from ..ir import Const, Scalar, TensorView, simplify
from ..ir.nodes import Expr
from ..ir.scalar import substitute
from .kir import ForLoop, IfThenElse, Kernel, Let, Node, rewrite, walk

# what a node may hold that has no Scalar inside (the walk does not enter them)
_LEAVES = (str, bytes, int, float, bool, type(None), Enum, TensorView, Expr, type)


def _is_body(v) -> bool:
    """A node list, or a list of them (a role switch's bodies): the walk's own."""
    return isinstance(v, list) and any(
        isinstance(e, Node) or (isinstance(e, list) and any(isinstance(n, Node) for n in e)) for e in v
    )


def _map_scalars(x, fn, opaque: list):
    """``x`` with ``fn`` applied to every Scalar it holds: in place through
    lists, dicts and dataclass fields (a TensorRef's index, a barrier's stage, a
    wgmma operand's offset), rebuilt for tuples. An object it cannot rewrite
    (a frozen dataclass, a set, another class) goes on ``opaque``."""
    if isinstance(x, Scalar):
        return fn(x)
    if isinstance(x, _LEAVES):
        return x
    if isinstance(x, list):
        x[:] = [_map_scalars(v, fn, opaque) for v in x]
        return x
    if isinstance(x, tuple):
        return tuple(_map_scalars(v, fn, opaque) for v in x)
    if isinstance(x, dict):
        for k in list(x):
            x[k] = _map_scalars(x[k], fn, opaque)
        return x
    if dataclasses.is_dataclass(x) and not x.__dataclass_params__.frozen:
        for f in dataclasses.fields(x):
            v = getattr(x, f.name)
            if isinstance(x, Node) and _is_body(v):
                continue  # nested nodes: the walk visits each once
            new = _map_scalars(v, fn, opaque)
            if new is not v:
                setattr(x, f.name, new)
        return x
    opaque.append(x)
    return x


def _substitute(nodes: list, mapping: dict) -> bool:
    """Replace the loop indices in ``mapping`` in every node; False when some
    node holds an object the substitution could not look into."""
    opaque: list = []

    def sub(e):
        s = substitute(e, mapping)
        return e if s is e else simplify(s)

    walk(nodes, lambda n, _: _map_scalars(n, sub, opaque))
    return not opaque


def _fold(n):
    """A branch whose condition is a constant: the statements it chooses."""
    if isinstance(n, IfThenElse) and isinstance(n.cond, Const):
        return n.then if n.cond.value else n.else_
    return None


def drop_one_trip_loops(kernel: Kernel) -> Kernel:
    """Entry: replace each one-trip loop that no ring's producer rotates over
    (and no grid strides) by its body."""
    rings = set(kernel.circular_loops.values())

    def fn(n):
        if not isinstance(n, ForLoop) or n.key in rings or n.strided:
            return None
        if not (isinstance(n.extent, Const) and n.extent.value == 1):
            return None
        whole = _substitute(n.body, {n.index.name: Const(0)})
        body = rewrite(n.body, _fold)
        # an object the substitution could not look into may still name the index:
        # it stays defined (the CUDA compiler folds it)
        return body if whole else [Let(n.index, Const(0)), *body]

    kernel.body = rewrite(kernel.body, fn)
    return kernel
