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
)

OVERRIDES = names(REDUCTION)


def _reductions(fusion):
    return [e.out for e in fusion.exprs() if isinstance(e, ReductionOp)]


class ReductionScheduler:
    name = "reduction"

    @staticmethod
    def can_schedule(fusion: Fusion) -> str | None:
        reds = _reductions(fusion)
        if not reds:
            return "fusion has no reduction"
        for r in reds:
            if not any(i.is_reduction for i in r.logical):
                return f"{r.definition} reduces no axis"
        if contractions(fusion):
            return "fusion has a matmul"
        lmap = LogicalMap(fusion)
        ref = reds[0]
        key = _red_classes(ref, lmap)
        for r in reds[1:]:
            if _red_classes(r, lmap) != key or len(r.logical) != len(ref.logical):
                return f"reductions {ref.name} and {r.name} reduce different axes"
        axes = lmap.derivable({lmap.find(i) for i in ref.logical})  # through reshapes too
        for tv in fusion.used_tvs():
            for d, i in enumerate(tv.logical):
                if is_const(i.loop_extent, 1):
                    continue
                if i.concrete_extent is not None and lmap.find(i) not in axes:
                    return (
                        f"axis {d} of {tv.name} is not an axis of the reduction {ref.name} "
                        "(its result is broadcast to a larger tensor: that needs a second kernel)"
                    )
        return _output_lacks_a_row_axis(fusion, ref, lmap)

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

        its = [k for k, i in enumerate(ref.logical) if not i.is_reduction]
        rs = [k for k, i in enumerate(ref.logical) if i.is_reduction]
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
        else:
            if ni:
                ref.split(0, params.threads)  # [I/T, T, R]
                ref.axis(0).parallelize(ParallelType.BIDx)
                ref.axis(1).parallelize(ParallelType.TIDx)
            row_pos = 2 * ni
        propagate(ref, fusion.used_tvs(), lmap)

        inline_intermediates(fusion, row_pos, row_scalar)


def _output_lacks_a_row_axis(fusion, ref, lmap) -> str | None:
    """Why the grid over ``ref``'s rows cannot write every output, or None:
    an output with no axis (broadcast or not) of one of the row axes (a
    tensor later broadcast to [5, ...] and reduced, itself an output of the
    smaller shape) would be bound to a grid of another extent, each CTA
    writing elements of another row. The segmenter gives it its own kernel."""
    rows = {lmap.find(i) for i in ref.logical if not i.is_reduction and not _one(i)}
    for k, o in enumerate(fusion.outputs):
        have = lmap.derivable({lmap.find(i) for i in o.logical})
        for c in rows - have:
            d = next(d for d, i in enumerate(ref.logical) if lmap.find(i) == c)
            return (
                f"output {k} ({o.name}) has no axis of the reduction {ref.name}'s axis {d}: the grid over "
                "its rows cannot write it (a kernel of its own)"
            )
    return None


def _one(i) -> bool:
    """One element: no loop, no grid."""
    return is_const(i.loop_extent, 1) or (i.is_broadcast and i.concrete_extent is None)


def _red_classes(tv, lmap) -> frozenset:
    return frozenset(lmap.find(i) for i in tv.logical if i.is_reduction)


def _is_inner(fusion, ref) -> bool:
    """True when the reduced axes are the innermost axes of the reduced input."""
    flags = [i.is_reduction for i in ref.logical]
    k = len(flags)
    while k and flags[k - 1]:
        k -= 1
    return not any(flags[:k])
