"""Pointwise scheduler, TMA variant: persistent CTAs stream [rows x cols]
tiles of every full-shape input through a circular buffer in shared memory.

Chosen when asked for (``fd.fusion.schedule(stages=N)``, ``prefetch=``, ``tile_rows=``,
``war="mbarrier"``, ``warp_specialized=True``, ``tma_store=True`` or ``tma=True``) and the
inputs can be described by tensor maps (else the plain kernel, its params'
``tma_declined`` saying why); the plain pointwise kernel already runs at copy
bandwidth on Hopper, so the heuristics do not pick this one on their own. Every tensor after scheduling
(I = rows flattened, C = innermost axis, G = persistent grid)::

    [iS{ceilDiv(ceilDiv(I, TR) * ceilDiv(C, TC), G)}, iblockIdx.x{G},
     iS{TR / TY}, ithreadIdx.y{TY}, ithreadIdx.x{TC / V}, iV{V}]

and each TMA buffer::

    Ts_s[iS{tile loop}, iblockIdx.x{G}, iB{TR}, iB{TC}] ca_pos(2) circular_buffer(stages)
"""

from __future__ import annotations

import dataclasses
import math

from ..ir import (
    CircbufError,
    Fusion,
    MemoryType,
    ParallelType,
    evaluate,
)
from .info import InputInfo
from .overrides import POINTWISE_TMA, Declined, names, ring
from .params import PointwiseParams, PointwiseTmaParams
from .pointwise import PointwiseScheduler, _vector_candidates
from .utils import (
    LogicalMap,
    aligned,
    cache_output,
    concretize_broadcasts,
    hoist_broadcasts,
    inline_intermediates,
    output_vectorizable,
    propagate,
    tma_describable,
    tma_ring,
)

OVERRIDES = names(POINTWISE_TMA)


class PointwiseTmaScheduler:
    name = "pointwise_tma"

    @staticmethod
    def can_schedule(fusion: Fusion) -> str | None:
        return PointwiseScheduler.can_schedule(fusion)

    @staticmethod
    def variant(params) -> str:
        return "declined" if isinstance(params, PointwiseParams) else "tma ring"

    @staticmethod
    def compute_params(fusion: Fusion, info: InputInfo, overrides: dict):
        """Params; None (not asked for: the plain pointwise kernel); or, where these
        inputs cannot take the TMA variant asked for, the plain kernel's params with
        ``tma_declined`` saying why (never a silent fallback). Any of the variant's names
        asks for it, but a default-valued war, warp_specialized or tma_store (they
        describe the plain kernel too)."""
        asked = (
            any(k in overrides for k in ("stages", "prefetch", "tile_rows"))
            or overrides.get("war") == "mbarrier"
            or overrides.get("warp_specialized")
            or overrides.get("tma") is True
            or overrides.get("tma_store")
        )
        if not asked or overrides.get("tma") is False:
            return None
        params = _tma_params(fusion, info, overrides)
        if isinstance(params, Declined):
            # the plain kernel (already at copy bandwidth), with params that say why
            plain = PointwiseScheduler.compute_params(fusion, info, {})
            return dataclasses.replace(plain, tma_declined=f"{params.why}: plain pointwise kernel")
        return params

    @staticmethod
    def schedule(fusion: Fusion, params: PointwiseTmaParams):
        if isinstance(params, PointwiseParams):  # declined (``tma_declined`` says why)
            return PointwiseScheduler.schedule(fusion, params)
        hoist_broadcasts(fusion)
        ref_index = PointwiseScheduler.reference_index(fusion)
        ref_out = fusion.outputs[ref_index]
        smem = []
        for k in _vector_candidates(fusion, ref_out, LogicalMap(fusion)):
            x = fusion.inputs[k]
            if fusion.consumers(x):
                xs = x.cache_after(op="tma")
                smem.append((xs, xs.cache_after()))
        outs = [(o, cache_output(fusion, o), v) for o, v in zip(fusion.outputs, params.vectorize_outputs)]
        if params.tma_store:
            for o, _, _ in outs:
                o.cache_before(op="tma")
        ref = outs[ref_index][1]
        lmap = LogicalMap(fusion)
        concretize_broadcasts(fusion, lmap)

        _tiles(ref, params)  # [tile_iter, G, TR, TC]
        ref.split(3, params.vectorize)  # [.., TR, TC/V, V]
        ref.split(2, params.threads_y)  # [tile_iter, G, TR/TY, TY, TC/V, V]
        ref.axis(1).parallelize(ParallelType.BIDx)
        ref.axis(3).parallelize(ParallelType.TIDy)
        ref.axis(4).parallelize(ParallelType.TIDx)
        propagate(ref, fusion.used_tvs(), lmap)
        inline_intermediates(fusion)
        for xs, xl in smem:
            tma_ring(xs, lambda t: _tiles(t, params), 1, params)
            xl.inline_at(5)
            xl.axis(5).parallelize(ParallelType.Vectorize)
        for o, c, vec in outs:
            c.inline_at(5)
            if params.tma_store:
                # registers -> shared tile (16-byte writes) -> one TMA store per tile
                os_ = o.definition.inputs[0]
                os_.memory_type = MemoryType.Shared
                os_.inline_at(2)
                os_.axis(5).parallelize(ParallelType.Vectorize)
                o.domain.loop = list(o.logical)
                _tiles(o, params)
                o.axis(1).parallelize(ParallelType.BIDx)
                o.axis(2).parallelize(ParallelType.Bulk)
                o.axis(3).parallelize(ParallelType.Bulk)
            elif vec:
                o.axis(5).parallelize(ParallelType.Vectorize)


def _tiles(tv, params):
    """[..., C] -> [tile_iter, G, TR, TC]: rows flattened, cut into TR x TC
    tiles, tiles numbered row-major and dealt to G persistent CTAs."""
    for _ in range(len(tv.loop) - 2):
        tv.merge(0)
    tv.split(1, params.tile_cols)  # [I, C/TC, TC]
    tv.split(0, params.tile_rows)  # [I/TR, TR, C/TC, TC]
    tv.reorder([0, 2, 1, 3])  # [I/TR, C/TC, TR, TC]
    tv.merge(0)  # [tiles, TR, TC]
    tv.split(0, params.grid)  # [tile_iter, G, TR, TC]


def _tma_params(fusion: Fusion, info: InputInfo, overrides: dict):
    """The TMA variant's params, or Declined (why these inputs cannot take it)."""
    ref = PointwiseScheduler.reference(fusion)
    if ref.ndim < 2:
        # tiles are [rows x cols] boxes of a tensor map over the logical axes
        return Declined(
            f"a {ref.ndim}-D fusion has no rows for [tile_rows x tile_cols] TMA tiles "
            "(reshape it to 2-D for the TMA variant)"
        )
    row_major = list(range(ref.ndim))
    if any(o.domain.allocation_order() != row_major for o in fusion.outputs):
        return Declined("tiles are row-major: an output is allocated in another order")
    shape = [evaluate(i.extent, info.extents) for i in ref.logical]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    C = shape[-1]
    lmap = LogicalMap(fusion)
    cands = _vector_candidates(fusion, ref, lmap)
    if not cands:
        return Declined("no input has the output's full shape")
    if rows == 0 or C == 0:
        return Declined("the tensors are empty")
    for k in cands:
        why = tma_describable(info.tensors[k], ref.ndim - 1)
        if why:
            return Declined(f"input {k}: {why}")
    item = max(fusion.inputs[k].dtype.size for k in cands)
    item = max([item] + [o.dtype.size for o in fusion.outputs])
    vec = 16 // item
    tc = 256 if C >= 256 else C
    if (tc * min(fusion.inputs[k].dtype.size for k in cands)) % 16 or tc % vec:
        return Declined(f"a tile row of {tc} elements is not a multiple of 16 bytes")
    tx = tc // vec
    ty = max(1, min(128 // tx, 16))
    if (tx * ty) % 32:  # whole warps: warp-specialized consumers sync on named barriers
        ty = 32 // math.gcd(tx, 32)
    tr = overrides.get("tile_rows", -(-16 // ty) * ty)
    if tr % ty:
        raise CircbufError(
            f"schedule(tile_rows={tr}): tile_rows must be a multiple of the {ty} rows of threads "
            f"({tx} threads span a {tc}-column tile row)"
        )
    stages = overrides.get("stages", 3)
    prefetch = overrides.get("prefetch", stages - 1)
    ring(stages, prefetch, overrides)
    stage_bytes = sum(tr * tc * fusion.inputs[k].dtype.size for k in cands)
    store = bool(overrides.get("tma_store", False))
    if store and (C * min(o.dtype.size for o in fusion.outputs)) % 16:
        return Declined("tma_store: an output row stride is not a multiple of 16 bytes")
    if store and fusion.aliases:  # an output written into an input has that input's layout
        return Declined("tma_store: an output is written into an input")
    out_bytes = sum(tr * tc * o.dtype.size for o in fusion.outputs) if store else 0
    if stages * stage_bytes + out_bytes > info.target.smem_per_block - 8192:
        raise CircbufError(
            f"schedule(stages={stages}): {stages} x {stage_bytes} bytes"
            + (f" + {out_bytes} bytes of output tiles" if out_bytes else "")
            + " exceed shared memory"
        )
    threads = tx * ty + (tx * ty if overrides.get("warp_specialized") else 0)
    gpu = info.target
    fit = gpu.smem_per_sm // (stages * stage_bytes + out_bytes + 1024)  # CTAs whose ring fits an SM
    per_sm = max(1, min(fit, gpu.max_threads_per_sm // threads))
    tiles = -(-rows // tr) * -(-C // tc)
    grid = max(1, min(tiles, gpu.sm_count * per_sm))
    vout = tuple(
        C % vec == 0
        and aligned(lmap, o, ref, broadcast=True)
        and output_vectorizable(fusion, info, k, ref.ndim - 1, vec)
        for k, o in enumerate(fusion.outputs)
    )
    return PointwiseTmaParams(
        tile_rows=tr,
        tile_cols=tc,
        vectorize=vec,
        threads_x=tx,
        threads_y=ty,
        stages=stages,
        prefetch=prefetch,
        grid=grid,
        war=overrides.get("war", "block_sync"),
        warp_specialized=bool(overrides.get("warp_specialized", False)),
        vectorize_outputs=vout,
        tma_store=store,
    )
