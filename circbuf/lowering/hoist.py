"""Pass: compute each loop's index arithmetic once per iteration, as named values.

Requires: simplified; provides: hoisted.

Indexing writes every access's full index, so a tile's coordinates
(``((j6 / 8) % ceilDiv(i2, 256)) * 256``) appear in every load, store,
predicate and TMA coordinate of the tile's loops, recomputed (as the text
reads) at each. For each loop that runs at run time (not unrolled), this pass
finds the largest integer subexpressions that depend on its index but on no
loop or variable inside it (only on its index, the loops around it, thread
and block indices and the kernel's sizes), and that are more than an index
times a constant; each becomes a named value at the top of the loop's body
(``j6_0``, ``j6_1``, ...), defined in terms of the smaller ones, and every use
reads the name, in the loops inside it too (a producer's tile row in each
k step's TMA coordinate is named once per tile). The CUDA compiler would
hoist them too: this is for the reader, who sees the tile's coordinates once
per tile.

Before::

    FOR j6 in blockIdx.x..T step 132
      FOR j11 in 0..2 unroll
        IF ((((j6 / 8) % ceilDiv(i2, 256)) * 256) + j11 * 128) < i2: ...
        TMA_STORE tmap2{(((j6 / 8) % ceilDiv(i2, 256)) * 256) + j11 * 128, ...}

After::

    FOR j6 in blockIdx.x..T step 132
      LET j6_0 = (((j6 / 8) % ceilDiv(i2, 256)) * 256)
      FOR j11 in 0..2 unroll
        IF (j6_0 + j11 * 128) < i2: ...
        TMA_STORE tmap2{j6_0 + j11 * 128, ...}
"""

from __future__ import annotations

from ..ir import DataType, Var
from ..ir.scalar import Bin, Const, Un, free_vars
from .kir import (
    Assign,
    BlockReduce,
    ForLoop,
    IfThenElse,
    Kernel,
    Let,
    TensorRef,
    TmaLoad,
    TmaStore,
    children,
)

_COMPARE = {"<", "<=", ">", ">=", "==", "!=", "&&", "||", "!"}
_THREAD = ("threadIdx.", "blockIdx.", "gridDim.", "blockDim.")


def _runtime_loop(n) -> bool:
    """A loop the CUDA text keeps as a loop (codegen unrolls the others). One
    unrolled a few iterations at a time (``unroll_by``) counts as unrolled: its
    values are named at the loop around it, their per-iteration rest left inline."""
    return isinstance(n, ForLoop) and not (
        isinstance(n.extent, Const) and not n.strided and (n.extent.value <= 32 or n.unroll)
    )


def _slots(node):
    """(getter, setter) of each scalar of ``node`` that holds an index or condition."""
    out = []

    def ref(r):
        if isinstance(r, TensorRef):
            out.append((lambda r=r: r.index, lambda v, r=r: setattr(r, "index", v)))

    if isinstance(node, Assign):
        ref(node.lhs)
        for o in node.operands:
            ref(o)
        if node.row is not None:  # a row store's column and elements left (not prev: no CUDA reads it)
            for k in ("col", "left"):
                out.append(
                    (lambda r=node.row, k=k: getattr(r, k), lambda v, r=node.row, k=k: setattr(r, k, v))
                )
    elif isinstance(node, BlockReduce):
        ref(node.ref)
    elif isinstance(node, IfThenElse):
        out.append((lambda n=node: n.cond, lambda v, n=node: setattr(n, "cond", v)))
    elif isinstance(node, (TmaLoad, TmaStore)):
        ref(node.dst if isinstance(node, TmaLoad) else node.src)
        for k in range(len(node.coords)):
            out.append((lambda n=node, k=k: n.coords[k], lambda v, n=node, k=k: n.coords.__setitem__(k, v)))
    return out


def _size(e) -> int:
    return 1 + sum(_size(c) for c in e.children())


def _costly(e) -> bool:
    """More than ``index`` times or plus a constant: a division, a remainder,
    a ceilDiv, or a product of two non-constants."""
    if not isinstance(e, Bin):
        return False
    if e.op in ("/", "%", "ceilDiv") or (
        e.op == "*" and not isinstance(e.a, Const) and not isinstance(e.b, Const)
    ):
        return True
    return any(_costly(c) for c in e.children())


def _integer(e) -> bool:
    if isinstance(e, Bin) and e.op in _COMPARE:
        return False
    if isinstance(e, Un) and e.op in _COMPARE:
        return False
    return e.dtype in (DataType.Int64, DataType.Int32)


def _candidates(e, ok, index, found):
    """The largest subexpressions of ``e`` whose variables are all in ``ok``
    and that use ``index`` and are costly."""
    if isinstance(e, (Bin, Un)):
        names = set(free_vars(e))
        if names <= ok and index in names and _integer(e) and _costly(e):
            found.append(e)
            return
        for c in e.children():
            _candidates(c, ok, index, found)


def _replace(e, table):
    """``e`` with each subexpression found in ``table`` (expr -> Var) replaced."""
    if e in table:
        return table[e]
    if isinstance(e, Bin):
        a, b = _replace(e.a, table), _replace(e.b, table)
        return e if (a is e.a and b is e.b) else Bin(e.op, a, b, e.dtype)
    if isinstance(e, Un):
        a = _replace(e.a, table)
        return e if a is e.a else Un(e.op, a, e.dtype)
    return e


def _visit_body(nodes, fn):
    """``fn(node)`` on every node of a loop body, nested run-time loops too: a
    value of this loop's index alone is the same in every iteration of a loop
    inside (a producer's tile row in each k step's TMA coordinate), so it is
    named here, once per iteration of this loop."""
    for n in nodes:
        fn(n)
        for body in children(n):
            _visit_body(body, fn)


def _hoist(loop: ForLoop, ok: set) -> set:
    """Name ``loop``'s per-iteration values; returns the names it defined."""
    index = loop.index.name
    ok = ok | {index}
    found, uses = [], {}

    def collect(n):
        for get, _ in _slots(n):
            here = []
            _candidates(get(), ok, index, here)
            for e in here:
                if e not in uses:
                    found.append(e)
                uses[e] = uses.get(e, 0) + 1

    _visit_body(loop.body, collect)
    # a value used once directly in the loop's body gains nothing from a name
    top = []
    for n in loop.body:
        for get, _ in _slots(n):
            _candidates(get(), ok, index, top)
    chosen = [e for e in found if uses[e] > 1 or e not in top]
    if not chosen:
        return set()
    chosen.sort(key=_size)  # smaller first: the larger are defined in their terms
    table, lets = {}, []
    for k, e in enumerate(chosen):
        v = Var(f"{index}_{k}", e.dtype)
        lets.append(Let(v, _replace(e, table)))
        table[e] = v

    def rewrite(n):
        for get, put in _slots(n):
            put(_replace(get(), table))

    _visit_body(loop.body, rewrite)
    loop.body[:0] = lets
    return {let.var.name for let in lets}


def _walk_loops(nodes, ok):
    for n in nodes:
        if isinstance(n, ForLoop):
            named = _hoist(n, ok) if _runtime_loop(n) else set()
            _walk_loops(n.body, ok | named | {n.index.name})
        else:
            for body in children(n):
                _walk_loops(body, ok)


def hoist_indices(kernel: Kernel) -> Kernel:
    """Entry: name each run-time loop's per-iteration index arithmetic (see module doc)."""
    ok = set(kernel.extent_bindings) | {v.name for v in kernel.scalar_params}
    ok |= {f"threadIdx.{a}" for a in "xyz"} | {f"blockIdx.{a}" for a in "xyz"}
    ok |= {f"gridDim.{a}" for a in "xyz"} | {f"blockDim.{a}" for a in "xyz"}
    ok |= {str(s) for s in kernel.strides.values() if isinstance(s, Var)}
    _walk_loops(kernel.body, ok)
    return kernel
