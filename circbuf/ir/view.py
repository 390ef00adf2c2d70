"""Reshape analysis: which input axes become which output axes.

A row-major reshape always factors into groups: consecutive input axes and
consecutive output axes with equal products. Within a group the input axes
are merged and the result split into the output axes; all of it exact.

>>> reshape_groups([6, 4], [2, 3, 4])
[((0,), (0, 1)), ((1,), (2,))]
>>> reshape_groups([4, 6], [6, 4])      # one group: merge to 24, split to 6 x 4
[((0, 1), (0, 1))]
"""

from __future__ import annotations

import math

from .errors import CircbufError
from .iterdomain import ParallelType, exact_merge, exact_split
from .scalar import Const, evaluate


def reshape_groups(in_sizes, out_sizes) -> list[tuple[tuple, tuple]]:
    """Cut both shapes into groups of equal size, left to right; size-1 axes
    left over at the end join the last group. An empty tensor is one group.
    The sizes must have equal products (checked by the caller)."""
    n, m = len(in_sizes), len(out_sizes)
    if math.prod(in_sizes) == 0:
        return [(tuple(range(n)), tuple(range(m)))] if n or m else []
    groups = []
    i = j = 0
    while i < n and j < m:
        gi, go = [i], [j]
        pi, po = in_sizes[i], out_sizes[j]
        i, j = i + 1, j + 1
        while pi != po:
            if pi < po:
                gi.append(i)
                pi *= in_sizes[i]
                i += 1
            else:
                go.append(j)
                po *= out_sizes[j]
                j += 1
        groups.append((gi, go))
    rest_in, rest_out = list(range(i, n)), list(range(j, m))  # all of size 1
    if groups:
        groups[-1] = (groups[-1][0] + rest_in, groups[-1][1] + rest_out)
    elif rest_in or rest_out:
        groups.append((rest_in, rest_out))
    return [(tuple(a), tuple(b)) for a, b in groups]


def concretize(op, in_sizes, out_sizes) -> tuple:
    """Give reshape ``op``'s output its root domain and derive its logical
    axes (see :class:`circbuf.ir.nodes.ReshapeOp`) for these sizes (one per
    input, resp. output axis). Returns the groups, and the extent pairs they
    make equal (for the fusion to unify). Extents stay symbolic: a kernel
    built from the result is valid for any sizes with the same groups.

    Broadcast axes take no part in the splits and merges (a split would give
    a broadcast axis, later expanded, a place in the index math): the
    input's broadcast axes map to the output's, in order, as the same axis;
    others are left out of the transforms (unused root axes, or new
    broadcast axes of the output)."""
    src, out = op.inputs[0], op.out
    if math.prod(in_sizes) != math.prod(out_sizes):
        raise CircbufError(
            f"reshape {src.name} -> {out.name}: {src.name} has shape {list(in_sizes)} "
            f"({math.prod(in_sizes)} elements), the new shape {list(out_sizes)} has {math.prod(out_sizes)}"
        )
    ki, ko = _kept(op)
    # an input axis of size 1 (a symbolic extent that is 1 for these sizes) is
    # squeezed, as nvFuser's view analysis does, not merged into a neighbour:
    # merged, it makes the neighbour's class out of its own, and a broadcast
    # of the result meeting the input again ([8, 1, 1] -> reshape [8, 1, 1]
    # == x) puts one axis of the fusion on both sides of the merge
    some = math.prod(in_sizes) != 1  # axes other than ones: a tensor with no element too
    ones = [k for k in ki if in_sizes[k] == 1] if some else []
    ki = [k for k in ki if k not in ones]
    # likewise an output axis of size 1 (a -1 that is 1 for these sizes) is a
    # new axis, not split out of a neighbour (nvFuser makes it a broadcast):
    # split out, a squeeze of it leaves the neighbour's class underivable from
    # the input's (the input's axis is the split's whole, the squeezed
    # output's is one piece), so the squeeze's consumers go unscheduled
    new = [k for k in ko if out_sizes[k] == 1] if some else []
    ko = [k for k in ko if k not in new]
    groups = (
        [((k,), ()) for k in ones]
        + [((), (k,)) for k in new]
        + [
            (tuple(ki[a] for a in gi), tuple(ko[b] for b in go))
            for gi, go in reshape_groups([in_sizes[k] for k in ki], [out_sizes[k] for k in ko])
        ]
    )
    return build(op, sorted(groups))


def _kept(op):
    """Positions of the input and output axes that take part in the groups
    (all but broadcast ones)."""
    ins, logical = op.inputs[0].domain.no_reductions(), op.out.logical
    ki = [k for k, i in enumerate(ins) if i.concrete_extent is not None]
    ko = [k for k, i in enumerate(logical) if not i.is_broadcast]
    return ki, ko


def build(op, groups) -> tuple:
    """Concretize reshape ``op`` with these groups (input axes, output axes);
    see :func:`concretize`."""
    src, out = op.inputs[0], op.out
    ins, logical = src.domain.no_reductions(), out.logical
    ki, ko = _kept(op)
    bi = [k for k in range(len(ins)) if k not in ki]
    bo = [k for k in range(len(logical)) if k not in ko]
    root = [i.clone() for i in ins]
    for r in root:
        r.parallel_type = ParallelType.Serial
    for a, b in zip(bi, bo):
        root[a] = logical[b]
    equal = []
    for gi, go in groups:
        if len(gi) == 1 and len(go) == 1:  # the same axis: the logical axis is the root axis
            root[gi[0]] = logical[go[0]]
            equal.append((ins[gi[0]].loop_extent, logical[go[0]].extent))
            continue
        if not gi or not go:  # extent-1 axes on one side only: nothing to derive
            equal += [(ins[k].loop_extent, Const(1)) for k in gi] + [
                (logical[k].extent, Const(1)) for k in go
            ]
            continue
        cur = root[gi[0]]
        for k in gi[1:]:
            last = k == gi[-1] and len(go) == 1
            cur = exact_merge(cur, root[k], out=logical[go[0]] if last else None)
        for k in range(len(go) - 1):
            inner_ext = logical[go[-1]].extent
            for q in go[k + 1 : -1]:
                inner_ext = logical[q].extent * inner_ext
            inner = logical[go[-1]] if k == len(go) - 2 else None
            _, cur = exact_split(cur, logical[go[k]].extent, inner_ext, outer=logical[go[k]], inner=inner)
    out.domain.root = root
    op.groups = tuple(groups)
    return op.groups, equal


def concretize_reshapes(fusion, env) -> tuple:
    """Concretize every reshape of ``fusion`` not yet concrete, for the sizes
    ``env`` gives (extent and scalar names -> values). Returns the groups of
    every reshape (what a kernel compiled from the result is specialized
    for) and records the extents each group makes equal in
    ``fusion.extent_equalities``."""
    from .nodes import ReshapeOp

    sig = []
    for e in fusion.exprs():
        if not isinstance(e, ReshapeOp):
            continue
        if not e.concrete:
            fusion.extent_equalities += concretize_for(e, env)
        sig.append(e.groups)
    return tuple(sig)


def concretize_for(op, env) -> list:
    """Concretize reshape ``op`` for the sizes ``env`` gives; returns the
    extent pairs its groups make equal (see :func:`concretize`)."""
    ins = [evaluate(i.loop_extent, env) for i in op.inputs[0].domain.no_reductions()]
    outs = [evaluate(i.extent, env) for i in op.out.logical]
    return concretize(op, ins, outs)[1]
