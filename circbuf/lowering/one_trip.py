"""Pass: a loop of one trip becomes its body, its index replaced by 0.

Requires: pipelined, mbarriers_allocated; provides: one_trip_dropped.

The loop nest keeps serial loops of one trip where a ring needs them (the
circular-buffer pass matches a ring's producer and consumer loops level by
level: a TMA copy loop over one box, a wgmma loop over one k chunk). Once
the rings are lowered they are only text: this pass removes them, so the
CUDA reads as a person writes it. A ring's own loop stays (its stage and
phase move once per trip, and later passes find it by its key), as does a
strided loop (a persistent grid's: one trip for some CTAs, none for others).

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

from ..ir import Const, Scalar, simplify
from ..ir.scalar import free_vars, substitute
from .kir import ForLoop, Kernel, Let, Node, children, rewrite, walk


def _map_scalars(x, fn):
    """``x`` with ``fn`` applied to every Scalar it holds: in place through
    lists, dicts and dataclass fields (a TensorRef's index, a barrier's stage, a
    wgmma operand's offset), rebuilt for tuples; tensors and exprs are left."""
    if isinstance(x, Scalar):
        return fn(x)
    if isinstance(x, list):
        x[:] = [_map_scalars(v, fn) for v in x]
        return x
    if isinstance(x, tuple):
        return tuple(_map_scalars(v, fn) for v in x)
    if isinstance(x, dict):
        for k in list(x):
            x[k] = _map_scalars(x[k], fn)
        return x
    if dataclasses.is_dataclass(x) and not isinstance(x, type) and not x.__dataclass_params__.frozen:
        for f in dataclasses.fields(x):
            v = getattr(x, f.name)
            if isinstance(x, Node) and isinstance(v, list) and any(v is c for c in children(x)):
                continue  # a nested body: its nodes are visited by the walk
            setattr(x, f.name, _map_scalars(v, fn))
    return x


def _substitute(nodes: list, mapping: dict) -> None:
    def sub(e):
        s = substitute(e, mapping)
        return e if s is e else simplify(s)

    walk(nodes, lambda n, _: _map_scalars(n, sub))


def _uses(nodes: list, name: str) -> bool:
    found = []

    def look(e):
        if name in free_vars(e):
            found.append(e)
        return e

    walk(nodes, lambda n, _: _map_scalars(n, look))
    return bool(found)


def drop_one_trip_loops(kernel: Kernel) -> Kernel:
    """Entry: replace each one-trip loop that no ring rotates over by its body."""
    rings = set(kernel.circular_loops.values())

    def fn(n):
        if not isinstance(n, ForLoop) or n.key in rings or n.strided:
            return None
        if not (isinstance(n.extent, Const) and n.extent.value == 1):
            return None
        body = n.body
        _substitute(body, {n.index.name: Const(0)})
        # (every index is a Scalar the substitution reaches; should one not be, the
        # name stays defined rather than the kernel failing to compile)
        return ([Let(n.index, Const(0))] if _uses(body, n.index.name) else []) + body

    kernel.body = rewrite(kernel.body, fn)
    return kernel
