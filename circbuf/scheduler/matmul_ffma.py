"""The FFMA path: a register-tiled fp32 (and fp64) matmul on the CUDA cores.

Where the tensor cores cannot take a matmul for its operands' dtype (fp32
with TF32 not allowed, fp64), the fusion is decomposed into a sum of
products (``decompose``: ``cast(sum(a[.., M, K, 1] * b[.., 1, K, N], K))``)
and scheduled here instead of by the reduction scheduler: each CTA computes
a [bm x bn] tile of the output, each thread a [tm x tn] block of it in
registers (8 x 8, or 4 x 4 where [128 x 128] tiles would be fewer than the
SMs), walking K serially (no cross-thread reduction). Per step of ``ku``
values of K, every thread loads its [tm x ku] slice of A and its [ku x tn]
slice of B into registers (16-byte loads along whichever axis is contiguous
in memory, where extents, strides and pointers allow; a slice per k where
that axis is M or N) and runs ``tm * tn * ku`` FFMAs on them. Operands come
through L1; no shared memory. M, N and K are compiled in as constants where
they are whole tiles (k steps): the bounds checks simplify away.

The reduction after scheduling (matmul's product space [batch, M, K, N];
linear's [batch, M, N, K] is reordered alike; v = 4 fp32 values, 16 bytes)::

    red [iblockIdx.z{batch}, iblockIdx.y{M/bm}, iblockIdx.x{N/bn}, ithreadIdx.y{ty},
         ithreadIdx.x{tx}, rS{K/ku}, rUR{ku}, iUR{tm/v}, iUR{v}, iUR{tn/v}, iUR{v}]   ca_pos(4)

a thread's rows are ``tm/v`` runs of ``v`` rows, ``ty * v`` apart (its columns
likewise), so a warp's 16-byte loads of a B row and stores of a C row cover
contiguous bytes. The operand tiles (A's broadcast along N; B's along M)::

    ab  [.., iS{K/ku}, iUR{ku/v}, iUR{tm/v}, iUR{v}, bUR.., iV{v}]    ca_pos(5)  (A contiguous along K)
    bb  [.., iS{K/ku}, rUR{ku}, bUR.., iUR{tn/v}, iV{v}]               ca_pos(6)  (B contiguous along N)

and the epilogue (bias, activation, cast; the output) over [.., tm/v, v,
tn/v, v] per thread, the output stored 16 bytes at a time where its rows allow.

``schedule(ffma_smem=True)`` (``FfmaParams.smem``; the default for fp32 8 x 8 thread
tiles of fusion inputs) stages the
operand tiles in shared memory instead: ``xs = cp.async(a)`` shaped as the
operand's broadcast (``[.., M, K, bN]``), a ring of ``stages`` (2) slots over
the k loop, each slot A's [ku x bm] (M contiguous, whatever A's layout) and
B's [ku x bn] (N contiguous); every thread copies its chunks (16 bytes along a
contiguous M or N, else one element a copy, consecutive threads along K) and
arrives on the slot's full barrier; the k loop waits for this step's slot,
reads each k's [tm] of A and [tn] of B 16 bytes at a time (LDS.128), runs its
FFMAs while the next step's copies are in flight, and syncs the block once
(the slot it read is refilled next)::

    red [iblockIdx.z, iblockIdx.y{M/bm}, iblockIdx.x{N/bn}, rS{K/ku}, ithreadIdx.y, ithreadIdx.x,
         rUR{ku}, iUR{tm/v}, iUR{v}, iUR{tn/v}, iUR{v}]                       ca_pos(2)
    as  [.., iblockIdx.y, iblockIdx.x, iS{K/ku}, bS{bn}, iB{ku}, iB{bm}]  ca_pos(3) circular_buffer(2)
    ab  [.., iS{K/ku}, ithreadIdx.y, ithreadIdx.x, iUR{ku} | iUR{tm/v}, bUR.., iV{v}]   (registers)
"""

from __future__ import annotations

from ..ir import (
    CircbufError,
    DataType,
    Fusion,
    LinearOp,
    LoadStoreOp,
    MemoryType,
    ParallelType,
    ReductionOp,
    TensorView,
    evaluate,
)
from .info import InputInfo
from .matmul_path import _operands, tf32_k_axis
from .params import FfmaParams
from .utils import (
    LogicalMap,
    cache_output,
    concretize_broadcasts,
    contractions,
    hoist_broadcasts,
    output_vectorizable,
    propagate,
    recompute_multi_use,
    specialize_extent,
    vector_access,
)

OVERRIDES = ("thread_tile", "k_step", "blocks_per_sm", "ffma_smem")
VECTOR_BYTES = 16


def ffma_params(fusion: Fusion, info: InputInfo, overrides: dict | None = None) -> tuple:
    """(FfmaParams, None) for a matmul the FFMA path takes, else (None, why not).
    ``overrides``: ``thread_tile``, ``k_step``, ``blocks_per_sm`` (others are ignored here)."""
    ov = overrides or {}
    e = contractions(fusion)[0]
    a, b, _ = _operands(e)
    if a.dtype not in (DataType.Float, DataType.Double) or b.dtype != a.dtype:
        return None, f"{a.dtype.name} x {b.dtype.name} operands (the FFMA path takes Float or Double)"
    if any(i.is_broadcast for i in e.out.logical[-2:]):
        # (its tile would broadcast one row against an epilogue input's rows: the sum of
        # products takes it, as torch's broadcasting has it)
        return None, "an M or N extent of 1 fixed in the definition"
    if a.ndim < 2 or b.ndim < 2:
        return None, "a 1-D operand (a matrix-vector product)"
    if isinstance(e, LinearOp) and b.ndim != 2:
        return None, "a linear weight that is not 2-D"
    c = e.out
    env = info.extents
    m = evaluate(c.logical[-2].loop_extent, env)
    n = evaluate(c.logical[-1].loop_extent, env)
    k = evaluate(a.logical[-1].loop_extent, env)
    batch = 1
    for i in c.logical[:-2]:
        batch *= evaluate(i.loop_extent, env)
    if 0 in (m, n, k, batch):
        return None, "an empty operand or output"
    item = a.dtype.size
    vec = VECTOR_BYTES // item
    # 8 x 8 outputs a thread, [128 x 128] a CTA; where that makes fewer tiles than SMs,
    # 4 x 4 ([64 x 64]): four times the CTAs at about half the FFMA share of the k loop
    tm = tn = 8
    if -(-m // 128) * -(-n // 128) * batch < info.target.sm_count:
        tm = tn = 4
    tm = tn = ov.get("thread_tile", tm)
    ty, tx = 16, 16
    # a short M or N: fewer threads along it (never under a warp a CTA)
    while (ty // 2) * tm >= m and (ty // 2) * tx >= 32:
        ty //= 2
    while (tx // 2) * tn >= n and ty * (tx // 2) >= 32:
        tx //= 2
    bm, bn = ty * tm, tx * tn
    grid_yz = info.target.max_grid_yz
    if batch > grid_yz or -(-m // bm) > grid_yz:
        return None, f"a grid of {batch} x {-(-m // bm)} tiles (blockIdx.y and z reach {grid_yz})"
    # a k step of 4 (fp64: 2) values, one 16-byte load along K; 4 x 4 thread tiles take
    # four such loads a step where K allows, else two (less loop overhead per FFMA; at
    # 1024^3 on an H200 a step of 16 ran 16.7 TFLOP/s against 9.6 at 8: `--fp32 --variants`)
    # operand tiles staged in shared memory by default for fp32 8 x 8 thread tiles read from
    # fusion inputs: on an H200 at 2048^3 / 4096^3 (scripts/probe_ffma_smem.py) matmul ran
    # 0.72x cuBLAS against 0.59-0.60 without, linear 0.61 against 0.27 (W's loads along K);
    # 4 x 4 tiles (65% FFMA with it) and fp64 were not measured with it
    # (an operand whose K is a broadcast, K fixed to 1: the cp.async box would step that axis,
    # which lowering refuses; the register kernel takes it)
    k_broadcast = [w for x, w in ((a, "A"), (b, "B")) if x.logical[tf32_k_axis(e, x)].is_broadcast]
    smem = ov.get("ffma_smem", item == 4 and tm == 8 and a.is_input and b.is_input and not k_broadcast)
    if smem and k_broadcast:
        raise CircbufError(
            f"schedule(ffma_smem=True): operand {k_broadcast[0]}'s K axis is a broadcast (K fixed to 1); "
            "the shared-memory tiles copy whole k steps of it"
        )
    ku = vec
    if tm == 4:
        ku = next((f * vec for f in (4, 2) if k % (f * vec) == 0), vec)
    if smem:
        # staged tiles: a k step of four 16-byte loads' worth (one ring slot of A and B
        # is 2 x [16 x 128] fp32, 16 KB; two slots 32 KB), one block sync a step
        ku = 4 * vec
    ku = ov.get("k_step", ku)
    if ku % vec:
        raise CircbufError(
            f"schedule(k_step={ku}): a k step is whole 16-byte loads along K, a multiple of {vec} "
            f"for {a.dtype.name} operands"
        )
    va = _operand_vector(fusion, info, a, e, "A", vec, (m, k))
    vb = _operand_vector(fusion, info, b, e, "B", vec, (k, n))
    if smem:
        for x, which in ((a, "A"), (b, "B")):
            if not x.is_input:
                raise CircbufError(
                    f"schedule(ffma_smem=True): operand {which} ({x.name}) is computed in the fusion; the "
                    "shared-memory tiles are copied (cp.async) from fusion inputs only"
                )
    # fp32 with whole k steps: 128 registers a thread (64 accumulators, A's [8 x 4] values,
    # B's [4 x 8] or [8]) let two CTAs share an SM; both operands loaded along K (linear's
    # [N, K] weight) leave an epilogue no room at 128 (it spilled with bias and gelu): one
    # CTA, as fp64 (twice the registers) and ragged K (element loads, bounds checks)
    # (a k step of 8 at 128 registers spilled 24 bytes: one CTA there too)
    two = item == 4 and tm == 8 and ku == vec and k % ku == 0 and (va, vb) != ("K", "K")
    if smem:
        # the operands' registers are one k's 8 + 8 values (read from shared memory),
        # whatever their layout in global memory: two CTAs an SM, 128 registers, for fp32
        two = item == 4 and tm == 8
    return (
        FfmaParams(
            tile=(bm, bn, ku),
            thread_tile=(tm, tn),
            threads=(ty, tx),
            vectorize_a=va,
            vectorize_b=vb,
            # compiled for M, N (K) where they are whole tiles (k steps): the loads' and
            # stores' bounds checks simplify away (one kernel per such shape)
            extents=(m if m % bm == 0 else 0, n if n % bn == 0 else 0, k if k % ku == 0 else 0),
            blocks_per_sm=ov.get("blocks_per_sm", 2 if two else 0),
            vectorize_outputs=tuple(
                _output_vector(fusion, info, j, vec, n) for j in range(len(fusion.outputs))
            ),
            smem=smem,
        ),
        None,
    )


def _operand_vector(fusion, info, x, e, which, vec, extents) -> str:
    """The axis ("M", "N" or "K") along which operand ``x`` is loaded ``vec``
    elements at a time, or "" (one element per load): a fusion input,
    contiguous along that axis, whose extent there ``vec`` divides, other
    strides and pointer aligned to a vector (:func:`.utils.vector_access`)."""
    if not x.is_input:
        return ""
    t = info.tensors[fusion.inputs.index(x)]
    if t is None or len(t.sizes) < 2:
        return ""
    linear = isinstance(e, LinearOp)
    # the roles of x's last two axes
    if which == "A":
        roles = ("M", "K")
    else:
        roles = ("N", "K") if linear else ("K", "N")
    ext = {"M": extents[0], "K": extents[1]} if which == "A" else {"K": extents[0], "N": extents[1]}
    nd = len(t.sizes)
    for d, role in ((nd - 1, roles[1]), (nd - 2, roles[0])):
        if ext[role] % vec == 0 and vector_access(t, d, vec):
            return role
    return ""


def _output_vector(fusion, info, j, vec, n) -> bool:
    o = fusion.outputs[j]
    if o.ndim < 2 or n % vec:
        return False
    return output_vectorizable(fusion, info, j, o.ndim - 1, vec)


def schedule_ffma(fusion: Fusion, params: FfmaParams) -> None:
    """Schedule the decomposed fusion (``matmul.decompose``) with ``params``."""
    hoist_broadcasts(fusion)
    caches = [cache_output(fusion, o) for o in list(fusion.outputs)]
    red = next(e.out for e in fusion.exprs() if isinstance(e, ReductionOp))
    # M, N, K as constants where the params say (whole tiles): no bounds checks in the loops
    rows, cols = [i for i in red.logical if not i.is_reduction][-2:]
    kax = next(i for i in red.logical if i.is_reduction)
    for ax, value in zip((rows, cols, kax), params.extents):
        if value and hasattr(ax.extent, "name"):
            specialize_extent(fusion, ax.extent.name, value)
    prod = red.definition.inputs[0]
    ab, bb = prod.definition.inputs  # a[.., M, K, 1] * b[.., 1, K, N] (linear: [.., M, 1, K], [.., 1, N, K])
    staged = []
    if params.smem:  # the operand tiles through shared memory: a -> as (cp.async) -> ab (registers)
        ab, bb = (_stage(fusion, x, v) for x, v in ((ab, params.vectorize_a), (bb, params.vectorize_b)))
        staged = [x.definition.inputs[0] for x in (ab, bb)]
    chain = {id(t) for t in (red, prod, ab, bb, *staged)}
    lmap = LogicalMap(fusion)
    # an epilogue value read twice is computed once per reader (registers, inlined)
    recompute_multi_use(fusion, keep=lambda tv: id(tv) in chain, lmap=lmap)
    lmap = LogicalMap(fusion)
    concretize_broadcasts(fusion, lmap)

    bm, bn, ku = params.tile
    tm, tn = params.thread_tile
    vec = VECTOR_BYTES // red.dtype.size
    rank = len(red.logical)
    kpos = next(d for d, i in enumerate(red.logical) if i.is_reduction)
    nb = rank - 3
    mpos, npos = (nb, nb + 1) if kpos == rank - 1 else (nb, nb + 2)
    red.reorder([*range(nb), mpos, npos, kpos])  # [batch.., M, N, K]
    for _ in range(nb - 1):
        red.merge(0)
    p = 1 if nb else 0  # [B?, M, N, K]
    # M -> [M/bm, tm/v, ty, v] and N -> [N/bn, tn/v, tx, v]: a thread's rows (columns) are
    # runs of v, those of neighbouring threads adjacent (a warp's 16-byte loads of B's row
    # and stores of C's read and write 256 contiguous bytes)
    red.split(p + 2, ku)  # [B?, M, N, K/ku, ku]
    if params.smem:
        # the same axes split from the tile down ([M/bm, bm] first), as the staged
        # tiles' [M/bm, bm] are: a thread's rows index the tile's bm rows
        red.split(p + 1, bn)  # [B?, M, N/bn, bn, K/ku, ku]
        red.split(p + 2, bn // tn * vec)  # [B?, M, N/bn, tn/v, tx * v, K/ku, ku]
        red.split(p + 3, vec)  # [B?, M, N/bn, tn/v, tx, v, K/ku, ku]
        red.split(p, bm)  # [B?, M/bm, bm, ...]
        red.split(p + 1, bm // tm * vec)  # [B?, M/bm, tm/v, ty * v, ...]
        red.split(p + 2, vec)  # [B?, M/bm, tm/v, ty, v, N/bn, tn/v, tx, v, K/ku, ku]
    else:
        red.split(p + 1, vec)  # [B?, M, N/v, v, K/ku, ku]
        red.split(p + 1, bn // tn)  # [B?, M, N/v/tx, tx, v, K/ku, ku]
        red.split(p + 1, tn // vec)  # [B?, M, N/bn, tn/v, tx, v, K/ku, ku]
        red.split(p, vec)  # [B?, M/v, v, N/bn, tn/v, tx, v, K/ku, ku]
        red.split(p, bm // tm)  # [B?, M/v/ty, ty, v, ...]
        red.split(p, tm // vec)  # [B?, M/bm, tm/v, ty, v, N/bn, tn/v, tx, v, K/ku, ku]
    # -> [B?, M/bm, N/bn, ty, tx, K/ku, ku, tm/v, v, tn/v, v]; staged operand tiles:
    # [B?, M/bm, N/bn, K/ku, ty, tx, ku, ..] (the ring loop outside the thread axes)
    order = (0, 4, 8, 2, 6, 9, 1, 3, 5, 7) if params.smem else (0, 4, 2, 6, 8, 9, 1, 3, 5, 7)
    red.reorder([*range(p), *(p + d for d in order)])
    ty_pos = p + 3 if params.smem else p + 2
    if p:
        red.axis(0).parallelize(ParallelType.BIDz)
    red.axis(p).parallelize(ParallelType.BIDy)
    red.axis(p + 1).parallelize(ParallelType.BIDx)
    red.axis(ty_pos).parallelize(ParallelType.TIDy)
    red.axis(ty_pos + 1).parallelize(ParallelType.TIDx)
    for d in range(p + 5, p + 10):
        red.axis(d).parallelize(ParallelType.Unroll)
    propagate(red, [tv for tv in fusion.used_tvs() if tv not in staged], lmap)

    thread_pos = p + 4  # inside the thread axes (the outputs' loops)
    k_pos = p + 5  # inside the K/ku loop (staged: the K/ku loop and the thread axes)
    # the accumulators: inside the tile (staged: outside the ring loop, which holds the threads)
    red.inline_at(p + 2 if params.smem else thread_pos)
    fusion.launch_min_blocks = params.blocks_per_sm
    prod.inline_at(len(prod.loop))
    # the operand tiles: loaded along K, a [tm x ku] ([ku x tn]) tile per k step, else
    # a [tm] ([tn]) slice per k; the vectorized axis innermost
    reads = ((ab, "M"), (bb, "N")) if params.smem else ((ab, params.vectorize_a), (bb, params.vectorize_b))
    for x, axis in reads:
        if axis == "K":  # [.., K/ku | ku, tm/v, v, tn/v, v] -> [ku/v, tm/v, v, tn/v, v, v]
            x.inline_at(k_pos)
            x.split(k_pos, vec)
            x.reorder([*range(k_pos), k_pos, k_pos + 2, k_pos + 3, k_pos + 4, k_pos + 5, k_pos + 1])
        else:  # [.., K/ku, ku | tm/v, v, tn/v, v]
            x.inline_at(k_pos + 1)
            if axis == "M":  # -> [tm/v, tn/v, v, v]
                x.reorder([*range(k_pos + 1), k_pos + 1, k_pos + 3, k_pos + 4, k_pos + 2])
        if axis:
            x.axis(-1).parallelize(ParallelType.Vectorize)
    for tv in fusion.used_tvs():
        if not tv.is_input and tv not in staged:
            tv.memory_type = MemoryType.Global if tv.is_output else MemoryType.Local
    for xs in staged:
        _ring_tile(xs, params, nb, (mpos, npos, kpos), xs is staged[0])
    # the epilogue: [B?, M/bm, N/bn, ty, tx, tm/v, v, tn/v, v], inlined into the outputs' loops
    for tv in fusion.used_tvs():
        if tv.is_input or tv.is_output or id(tv) in chain:
            continue
        tv.inline_at(len(tv.loop))
    for j, (o, c) in enumerate(zip(fusion.outputs, caches)):
        if params.vectorize_outputs[j] and len(o.loop) == thread_pos + 4:
            c.inline_at(len(c.loop) - 1)
            o.axis(-1).parallelize(ParallelType.Vectorize)


def _stage(fusion, x, axis):
    """Operand tile ``x`` (``broadcast(a)``, registers) read from a shared-memory
    copy of ``a`` instead: ``xs = cp.async(a)`` shaped as ``x`` (its broadcast
    axes too, so that its loops line up with the tile's), ``x = set(xs)``;
    ``axis``: the operand's contiguous axis ("M" or "N": 16-byte copies, else
    one element per copy). Returns the new ``x``."""
    d = x.definition
    a = d.inputs[0]
    item = a.dtype.size
    vector = VECTOR_BYTES // item if axis in ("M", "N") else 1
    xs = fusion.register(TensorView([i.fresh() for i in x.logical], a.dtype, MemoryType.Shared))
    LoadStoreOp(xs, a, kind="cp.async", is_broadcast_dim=d.is_broadcast_dim, vector=vector)
    xr = fusion.register(TensorView([i.fresh() for i in x.logical], a.dtype, MemoryType.Local))
    LoadStoreOp(xr, xs)
    for e in list(x.uses):
        e.replace_input(x, xr)
    if d in a.uses:
        a.uses.remove(d)
    return xr


def _ring_tile(xs, params, nb, positions, is_a):
    """A staged operand tile's loops: [B?, M/bm, N/bn, K/ku | bcast, Bulk ku, Bulk bm]
    (A, its M contiguous in shared memory) or [.. | bcast, Bulk ku, Bulk bn] (B),
    computed in the ring loop K/ku, ``params.stages`` slots."""
    bm, bn, ku = params.tile
    xs.reorder([*range(nb), *positions])  # [batch.., M, N, K]
    for _ in range(nb - 1):
        xs.merge(0)
    p = 1 if nb else 0
    xs.split(p + 2, ku)  # [B?, M, N, K/ku, ku]
    xs.split(p + 1, bn)  # [B?, M, N/bn, bn, K/ku, ku]
    xs.split(p, bm)  # [B?, M/bm, bm, N/bn, bn, K/ku, ku]
    # A: [B?, M/bm, N/bn, K/ku, bn, ku, bm]; B: [.., bm, ku, bn]
    order = (0, 2, 4, 3, 5, 1) if is_a else (0, 2, 4, 1, 5, 3)
    xs.reorder([*range(p), *(p + d for d in order)])
    if p:
        xs.axis(0).parallelize(ParallelType.BIDz)
    xs.axis(p).parallelize(ParallelType.BIDy)
    xs.axis(p + 1).parallelize(ParallelType.BIDx)
    xs.axis(p + 4).parallelize(ParallelType.Bulk)
    xs.axis(p + 5).parallelize(ParallelType.Bulk)
    xs.inline_at(p + 3)
    xs.circular_buffer(params.stages, axis=p + 2)
