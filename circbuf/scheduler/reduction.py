"""Reduction scheduler (simple and correct): one CTA per reduced row with a
warp-shuffle + shared-memory block reduction (inner), or one thread per output
element walking the reduced axes (outer). Runs sum/max/min/mean/var_mean and
the softmax, layer_norm and rms_norm composites.

Inner reduction, every tensor after scheduling (I = iteration axes merged,
R = reduced axes merged)::

    [iblockIdx.x{I}, rS{ceilDiv(R, T)}, rthreadIdx.x{T}]

Outer reduction::

    [iblockIdx.x{ceilDiv(I, T)}, ithreadIdx.x{T}, rS{R}]

Reduction results and what is broadcast from them are computed once per row
(inlined at the row position); other intermediates are inlined into their one
consumer, recomputed where they have several (input re-reads hit L1/L2).
"""

from __future__ import annotations

from ..ir import Fusion, ParallelType, ReductionOp, evaluate
from ..ir.scalar import is_const
from .info import InputInfo
from .overrides import REDUCTION, names
from .params import ReductionParams
from .utils import (
    LogicalMap,
    cache_output,
    concretize_broadcasts,
    contractions,
    hoist_broadcasts,
    inline_intermediates,
    once_per_row,
    propagate,
    recompute_multi_use,
    required_ones,
    view_self_mapping,
)

OVERRIDES = names(REDUCTION)


def _reductions(fusion):
    return [e.out for e in fusion.exprs() if isinstance(e, ReductionOp)]


class ReductionScheduler:
    name = "reduction"

    @staticmethod
    def can_schedule(fusion: Fusion) -> str | None:
        return _can_schedule(fusion)[0]

    @staticmethod
    def variant(params) -> str:
        return "plain"

    @staticmethod
    def compute_params(fusion: Fusion, info: InputInfo, overrides: dict) -> ReductionParams:
        ref = _reductions(fusion)[0]
        red = [i for i in ref.logical if i.is_reduction]
        rext = 1
        for i in red:
            rext *= evaluate(i.extent, info.extents)
        inner = _is_inner(fusion, ref)
        if inner:
            threads = 32
            while threads < 512 and threads * 4 < rext:
                threads *= 2
        else:
            threads = 128
        threads = overrides.get("threads", threads)
        return ReductionParams(inner=inner, threads=threads)

    @staticmethod
    def schedule(fusion: Fusion, params: ReductionParams):
        hoist_broadcasts(fusion)
        for o in list(fusion.outputs):
            if isinstance(o.definition, ReductionOp) or o.uses:
                cache_output(fusion, o)
        lmap = LogicalMap(fusion)
        ref = _reductions(fusion)[0]
        row_scalar = once_per_row(lmap, ref)

        recompute_multi_use(
            fusion, keep=lambda tv: isinstance(tv.definition, ReductionOp) or row_scalar(tv), lmap=lmap
        )
        lmap = LogicalMap(fusion)
        concretize_broadcasts(fusion, lmap)

        # axes of one element (extent 1: a squeezed or broadcast axis, a
        # reduction over one) are no rows and nothing to reduce: merged into
        # the real axes of their kind, or, where a kind has none, left
        # innermost and never split over threads (a tensor that a squeeze or
        # reshape leaves without them keeps the others' loop positions)
        one = _one_axes(fusion, ref, lmap)
        its = [k for k, i in enumerate(ref.logical) if not i.is_reduction]
        rs = [k for k, i in enumerate(ref.logical) if i.is_reduction]
        real_i = any(not one[k] for k in its)
        real_r = any(not one[k] for k in rs)
        if not real_i and not real_r:  # one element in all: one thread, no loop
            ref.reorder(its + rs)
            row_pos = 0
        elif params.inner and not real_i:  # every row axis has one element: [R/T, T, I...]
            ref.reorder(rs + its)
            for _ in range(len(rs) - 1):
                ref.merge(0)
            ref.split(0, params.threads)
            ref.axis(1).parallelize(ParallelType.TIDx)
            row_pos = 0
        else:
            ref.reorder(its + rs)
            n_it = len(its)
            for _ in range(n_it - 1):
                ref.merge(0)
            ni = 1 if n_it else 0
            for _ in range(len(rs) - 1):
                ref.merge(ni)
            if params.inner:
                ref.split(ni, params.threads)  # [I, R/T, T]
                if ni:
                    ref.axis(0).parallelize(ParallelType.BIDx)
                ref.axis(ni + 1).parallelize(ParallelType.TIDx)
                row_pos = ni
            else:  # [I/T, T, R] (R of one element: a reduction over one, per thread)
                if ni:
                    ref.split(0, params.threads)
                    ref.axis(0).parallelize(ParallelType.BIDx)
                    ref.axis(1).parallelize(ParallelType.TIDx)
                row_pos = 2 * ni
        propagate(ref, fusion.used_tvs(), lmap)

        inline_intermediates(fusion, row_pos, row_scalar)


def _can_schedule(fusion: Fusion) -> tuple:
    """(why the reduction schedulers cannot take ``fusion`` or None, the
    LogicalMap the answer was found with or None where none was needed): the
    normalization and outer-reduction schedulers ask it again with the map."""
    reds = _reductions(fusion)
    if not reds:
        return "fusion has no reduction", None
    for r in reds:
        if not any(i.is_reduction for i in r.logical):
            return f"{r.definition} reduces no axis", None
    if contractions(fusion):
        return "fusion has a matmul", None
    lmap = LogicalMap(fusion)
    why = view_self_mapping(fusion, lmap, empty=True)
    if why:
        return why, lmap
    ref = reds[0]
    key = _red_classes(ref, lmap)
    for r in reds[1:]:
        if _red_classes(r, lmap) != key or len(r.logical) != len(ref.logical):
            return f"reductions {ref.name} and {r.name} reduce different axes", lmap
    axes = lmap.derivable({lmap.find(i) for i in ref.logical})  # through reshapes too
    ones = required_ones(fusion)
    for tv in fusion.used_tvs():
        for d, i in enumerate(tv.logical):
            if is_const(i.loop_extent, 1) or str(i.loop_extent) in ones:
                continue
            if i.concrete_extent is not None and lmap.find(i) not in axes:
                why = (
                    f"axis {d} of {tv.name} is not an axis of the reduction {ref.name} "
                    "(its result is broadcast to a larger tensor: that needs a second kernel)"
                )
                return why, lmap
    return _output_lacks_a_row_axis(fusion, ref, lmap), lmap


def _output_lacks_a_row_axis(fusion, ref, lmap) -> str | None:
    """Why the grid over ``ref``'s rows cannot write every output, or None:
    an output with no axis (broadcast or not) of one of the row axes (a
    tensor later broadcast to [5, ...] and reduced, itself an output of the
    smaller shape) would be bound to a grid of another extent, each CTA
    writing elements of another row. A broadcast row axis that another
    tensor gives an extent (``x[n, 1]`` broadcast to ``[n, 1, 1, 1]`` and
    multiplied by a ``[n, a, b, c]``) is a row axis too: the scheduler
    concretizes it and the grid runs over it (:func:`_one_axes`). The
    segmenter gives such an output its own kernel."""
    one = _one_axes(fusion, ref, lmap)
    rows = {lmap.find(i) for i, o in zip(ref.logical, one) if not i.is_reduction and not o}
    for k, o in enumerate(fusion.outputs):
        have = lmap.derivable({lmap.find(i) for i in o.logical})
        for c in rows - have:
            d = next(d for d, i in enumerate(ref.logical) if lmap.find(i) == c)
            return (
                f"output {k} ({o.name}) has no axis of the reduction {ref.name}'s axis {d}: the grid over "
                "its rows cannot write it (a kernel of its own)"
            )
    return None


def _red_classes(tv, lmap) -> frozenset:
    return frozenset(lmap.find(i) for i in tv.logical if i.is_reduction)


def _one_axes(fusion, ref, lmap=None) -> list[bool]:
    """Per logical axis of ``ref``: True when it has one element, now and once
    broadcasts are given their class's extent (:func:`.utils.concretize_broadcasts`):
    an axis of extent 1 (a squeezed symbolic one, an input's 1, a reduction
    over a size-1 or plain broadcast axis), or a plain broadcast no other axis
    of its class gives an extent."""
    lmap = lmap if lmap is not None else LogicalMap(fusion)
    big = set()
    for tv in fusion.used_tvs():
        for i in tv.logical:
            e = i.concrete_extent
            if e is not None and not is_const(e, 1):
                big.add(lmap.find(i))
    return [
        is_const(i.loop_extent, 1)
        and not (i.is_broadcast and i.expanded_extent is None and lmap.find(i) in big)
        for i in ref.logical
    ]


def _is_inner(fusion, ref, lmap=None) -> bool:
    """True when the reduced axes are the innermost axes of the reduced input,
    axes of one element (:func:`_one_axes`) aside, wherever they are. False
    when only axes of one element are reduced: one element per row, nothing
    to reduce across threads (softmax over a size-1 axis)."""
    flags = [i.is_reduction for i, one in zip(ref.logical, _one_axes(fusion, ref, lmap)) if not one]
    if not any(flags):
        return False
    k = len(flags)
    while k and flags[k - 1]:
        k -= 1
    return not any(flags[:k])
