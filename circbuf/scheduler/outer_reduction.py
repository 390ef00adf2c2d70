"""Outer-reduction scheduler, TMA variant: column strips of the input stream
through a circular buffer while each thread accumulates its column.

Takes single-pass reductions over the outer axes ([R..., C...] reduced over
R, e.g. ``sum(x, 0)``, ``max(x * w, 0)``, ``mean``) whose inputs a tensor map
can describe; the rest goes to the plain reduction scheduler. One CTA per
strip of W columns (threadIdx.x); the reduced axis is cut into [TR x W]
tiles, one TMA copy each, and every tile is split over TY rows of threads
(threadIdx.y), which combine their partial results once, at the end.

The reduction after scheduling (R and C merged from the reduced and kept axes)::

    T_l[iblockIdx.x{ceilDiv(C, W)}, rS{ceilDiv(R, TR)}, ithreadIdx.x{W},
        rS{TR / TY}, rthreadIdx.y{TY}]

and each input's TMA buffer::

    X_s[iblockIdx.x, iS{ceilDiv(R, TR)}, iB{TR}, iB{W}] ca_pos(2) circular_buffer(stages)

No grid reduction: the parallelism is ceilDiv(C, W) CTAs, so W shrinks (to
32 bytes of columns) until there are about as many strips as SMs.
"""

from __future__ import annotations

from ..ir import (
    CircbufError,
    Fusion,
    ParallelType,
    ReductionOp,
    evaluate,
)
from .info import InputInfo
from .overrides import OUTER_REDUCTION, Declined, names, ring
from .params import OuterReductionParams
from .reduction import _can_schedule, _is_inner, _one_axes, _red_classes, _reductions
from .utils import (
    LogicalMap,
    cache_output,
    concretize_broadcasts,
    full_shape_inputs,
    hoist_broadcasts,
    inline_intermediates,
    once_per_row,
    propagate,
    tma_describable,
    tma_ring,
)

OVERRIDES = names(OUTER_REDUCTION)
SMEM_BUDGET = 192 * 1024


def _ancestors(tv) -> set:
    seen, todo = set(), [tv]
    while todo:
        t = todo.pop()
        d = t.definition
        if d is None:
            continue
        for x in d.tv_inputs():
            if id(x) not in seen:
                seen.add(id(x))
                todo.append(x)
    return seen


class OuterReductionScheduler:
    name = "outer_reduction"

    @staticmethod
    def can_schedule(fusion: Fusion) -> str | None:
        why, lmap = _can_schedule(fusion)
        if why:
            return why
        reds = _reductions(fusion)
        ref = reds[0]
        if _is_inner(fusion, ref, lmap):
            return "reductions are over the innermost axes"
        if all(one for i, one in zip(ref.logical, _one_axes(fusion, ref, lmap)) if i.is_reduction):
            # a squeeze of the reduced axis would leave a tensor without the ring's loops
            return "reduced axes have extent 1 (one element per column: nothing to stream)"
        flags = [i.is_reduction for i in ref.logical]
        n_red = sum(flags)
        if flags != [True] * n_red + [False] * (len(flags) - n_red):
            return "reduced axes are not the outermost axes"
        outs = {id(r) for r in reds}
        for r in reds:
            if _ancestors(r) & outs:
                return "a reduction reads another reduction's result (two passes)"
        # through a reshape too: an axis merged from (or split off) reduced
        # ones is reduced (an output of [R0 * R1, C] beside sum(x[R0, R1, C], [0, 1])
        # needs every column's result before its first element: two passes)
        comp = lmap.view_component()
        rc = {comp(c) for c in _red_classes(ref, lmap)}
        for o in fusion.outputs:
            if any(comp(lmap.find(i)) in rc and not i.is_broadcast and not i.is_reduction for i in o.logical):
                return f"output {o.name} keeps a reduced axis"
        return None

    @staticmethod
    def variant(params) -> str:
        return "tma ring"

    @staticmethod
    def compute_params(fusion: Fusion, info: InputInfo, overrides: dict):
        """Params, None (tma=False) or Declined for the plain reduction scheduler."""
        if overrides.get("tma", True) is False:
            return None
        ref = _reductions(fusion)[0]
        n_red = sum(i.is_reduction for i in ref.logical)
        R = C = 1
        for i in ref.logical:
            e = evaluate(i.extent, info.extents)
            if i.is_reduction:
                R *= e
            else:
                C *= e
        if n_red == len(ref.logical) or R == 0 or C == 0:
            return Declined("nothing to stage (every axis reduced, or empty)")
        cands = full_shape_inputs(fusion, ref, LogicalMap(fusion))
        if not cands:
            return Declined("no input has the reduction's full shape")
        for k in cands:
            why = tma_describable(info.tensors[k], n_red)
            if why:
                return Declined(f"input {k}: {why}")
        item = max(fusion.inputs[k].dtype.size for k in cands)
        small = min(fusion.inputs[k].dtype.size for k in cands)
        W = overrides.get("cols")
        if W is None:
            W = 128
            while W * item > 32 and -(-C // W) < info.target.sm_count:
                W //= 2
            while W > 16 // small and W // 2 >= C:
                W //= 2
        if (W * small) % 16:
            raise CircbufError(
                f"schedule(cols={W}): cols x {small} bytes must be a multiple of 16 bytes (a strip is a TMA box)"
            )
        ty = max(2, min(32, 256 // W))
        if (W * ty) % 32:
            ty = max(ty, 32)
        # warp specialization adds a producer row of W threads: the CTA stays within the limit
        rows_max = info.target.max_threads_per_block // W - (1 if overrides.get("warp_specialized") else 0)
        if ty > rows_max:
            ty = rows_max
        tile_bytes_row = sum(W * fusion.inputs[k].dtype.size for k in cands)
        tr = max(ty, min(256, (16384 // tile_bytes_row) // ty * ty))
        tr = min(tr, -(-R // ty) * ty)
        tile = tr * tile_bytes_row
        stages = overrides.get("stages")
        if stages is None:
            # measured on H100 (benchmarks/outer_reduction.py --sweep): with a strip
            # per SM or more, 2 stages beat deeper rings (0.77-0.88 vs 0.60-0.71 of
            # copy at 8 stages); with fewer strips than SMs a deeper ring helps a little
            strips = -(-C // W)
            stages = 2 if strips >= info.target.sm_count else max(2, min(4, SMEM_BUDGET // tile))
        prefetch = overrides.get("prefetch", stages - 1)
        ring(stages, prefetch, overrides)
        if stages * tile > min(SMEM_BUDGET, info.target.smem_per_block - 8192):
            raise CircbufError(
                f"schedule(stages={stages}): {stages} x {tile} bytes of tiles exceed shared memory"
            )
        return OuterReductionParams(
            cols=W,
            threads_y=ty,
            tile_rows=tr,
            stages=stages,
            prefetch=prefetch,
            war=overrides.get("war", "block_sync"),
            warp_specialized=bool(overrides.get("warp_specialized", False)),
        )

    @staticmethod
    def schedule(fusion: Fusion, params: OuterReductionParams):
        hoist_broadcasts(fusion)
        ref0 = _reductions(fusion)[0]
        smem = []
        for k in full_shape_inputs(fusion, ref0, LogicalMap(fusion)):
            xs = fusion.inputs[k].cache_after(op="tma")
            smem.append(xs)
        for o in list(fusion.outputs):
            if isinstance(o.definition, ReductionOp) or o.uses:
                cache_output(fusion, o)
        lmap = LogicalMap(fusion)
        ref = _reductions(fusion)[0]
        row_scalar = once_per_row(lmap, ref)

        concretize_broadcasts(fusion, lmap)
        n_red = sum(i.is_reduction for i in ref.logical)
        _strips(ref, params, n_red)  # [C/W, W, R/TR, TR]
        ref.split(3, params.threads_y)  # [C/W, W, R/TR, TR/TY, TY]
        ref.reorder([0, 2, 1, 3, 4])  # [C/W, R/TR, W, TR/TY, TY]
        ref.axis(0).parallelize(ParallelType.BIDx)
        ref.axis(2).parallelize(ParallelType.TIDx)
        ref.axis(4).parallelize(ParallelType.TIDy)
        propagate(ref, fusion.used_tvs(), lmap)
        inline_intermediates(fusion, 1, row_scalar)
        for xs in smem:

            def box(t):
                _strips(t, params, n_red)
                t.reorder([0, 2, 3, 1])  # [C/W, R/TR, TR, W]

            tma_ring(xs, box, 0, params)


def _strips(tv, params, n_red):
    """[R..., C...] -> [C/W, W, R/TR, TR]: the ``n_red`` reduced axes and the
    kept axes each merged."""
    n = len(tv.loop)
    for _ in range(n_red - 1):
        tv.merge(0)
    for _ in range(n - n_red - 1):
        tv.merge(1)
    tv.reorder([1, 0])  # [C, R]
    tv.split(0, params.cols)  # [C/W, W, R]
    tv.split(2, params.tile_rows)  # [C/W, W, R/TR, TR]
