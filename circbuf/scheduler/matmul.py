"""Matmul scheduler: a fusion with one ``matmul`` / ``linear`` and a
pointwise epilogue on its output, run on Hopper's tensor cores.

The ``matmul`` expr is translated to MMA form: the operands are staged in
shared memory by TMA copies (with a broadcast axis for the other operand's
tile loop), ``acc = mma(As, Bs)`` accumulates in fp32 registers, and the
epilogue (bias, activation, residual, the cast) runs on ``acc`` before the
final cast. The schedule, for a cooperative persistent kernel with
[bm x bn x bk] tiles (T = tiles, G = CTAs, W = 2 consumer warpgroups)::

    acc  [iS{T/G} (tile loop), iblockIdx.x{G}, ithreadIdx.y{W}, rS{K/bk} (k loop),
          ithreadIdx.x{128}, iMMA{bn/8}, iMMA{2}, iMMA{2}, rS{bk/16}, rMMA{16}]   ca_pos(3)
    As   [iS{T/G}, iblockIdx.x{G}, iS{K/bk} (ring loop), iB{bm}, bS{bn}, iB{bk}]
         swizzle(128B) circular_buffer(stages, WarpSpecialized(TIDy))
    out  [iS{T/G}, iblockIdx.x{G}, ithreadIdx.y{W}, ithreadIdx.x{128}, iS{bn/8}, iS{2}, iV{2}]

The tile index walks bands of ``group`` tiles along ``raster`` (split,
reorder and merge of the tile axes); ``threadIdx.x`` is the merge of the
warp, row-in-warp and column-pair axes of the wgmma accumulator layout, so
the fragment registers are ``iMMA`` axes and the epilogue reads them by
constant index. The operand tiles form a loop nest of their own (the
producer's), which the circular-buffer pass turns into the copy loop of a
producer warp. Ping-pong splits the tile loop over the warpgroups instead
of splitting the tile's rows.

Values of the epilogue's inputs alone (a bias along N or M, its cast) are
computed outside the loops over their broadcast axes, once per value of a
sub-tile (a bias along N once per fragment column, along M once per tile),
and an input contiguous along an even N is read an accumulator pair at a
time: one 4-byte load of two bf16 (``_hoist_epilogue_inputs``).

An operand whose strides or data pointer a tensor map cannot describe is
staged by the producer warpgroup's threads instead (the ring's fill kind
``cp.async``, :func:`_operand_fill`): same tiles, same swizzled stages, same
wgmma consumers. Fusions the tensor cores cannot take are translated to a
sum of products: fp32 and fp64 operands of 2-D and batched matmuls run it
as a register-tiled GEMM on the CUDA cores (:mod:`.matmul_ffma`); the rest
(1-D operands, K = 0, prologue math on 16-bit operands) by the plain
reduction scheduler: correct, not fast.
"""

from __future__ import annotations

from .. import knobs
from ..ir import (
    ELEMENTWISE,
    BinaryOp,
    BroadcastOp,
    CastOp,
    CircbufError,
    Const,
    DataType,
    Fusion,
    IterDomain,
    IterType,
    LinearOp,
    LoadStoreOp,
    MatmulOp,
    MemoryType,
    MmaOp,
    ParallelType,
    ReductionOp,
    TensorView,
    WarpSpecialized,
    broadcast_ids,
    evaluate,
    reduction_init,
)
from ..ir.circular import REGISTERS_RULE
from ..ir.scalar import is_const, simplify
from . import matmul_ffma, matmul_reduce, split_k
from .info import InputInfo
from .matmul_path import (
    FILLS,
    _mma_structure,
    _mma_unsupported,
    _operand_fill,
    _operands,
    _split_for_tensor_cores,
    fixed_ones,
)
from .matmul_store import choose_store, rows_layout, staging_bytes
from .overrides import MATMUL, names
from .params import FfmaParams, MatmulParams
from .utils import (
    LogicalMap,
    cache_output,
    concretize_broadcasts,
    contractions,
    hoist_broadcasts,
    output_vectorizable,
    tma_describable,
    unmapped_axis,
    vector_access,
)
from .waves import SMALL_M, SMALL_M_STAGES, small_m_bn

OVERRIDES = names(MATMUL)
_EPILOGUE = (*ELEMENTWISE, BroadcastOp)
SMEM_RESERVED = 1024  # of the opt-in shared memory per block: barriers and alignment
WARPGROUP = 128
SWIZZLE_ROW = 128  # bytes of K in one swizzled row of an operand tile (the 128-byte swizzle)
MIN_STAGES = 3  # operand stages the heuristic keeps before it gives up output staging buffers
WGMMA_K = 32  # bytes of K one wgmma takes (k16 of bf16/fp16, k8 of tf32)


def cta_threads(epilogue_role: bool) -> int:
    """A producer warpgroup, two consumer warpgroups (and an epilogue warpgroup)."""
    return WARPGROUP * (4 if epilogue_role else 3)


class MatmulScheduler:
    name = "matmul"

    @staticmethod
    def can_schedule(fusion: Fusion) -> str | None:
        cs = contractions(fusion)
        if not cs:
            return "fusion has no matmul"
        if len(cs) > 1:
            return f"{len(cs)} matmuls in one fusion (each runs in a kernel of its own)"
        for e in fusion.exprs():
            if isinstance(e, ReductionOp) and not matmul_reduce.is_partial(e):
                return f"a reduction ({e.out.name}) next to a matmul needs a kernel of its own"
            if matmul_reduce.is_partial(e):
                continue  # a row reduction's partials, in the epilogue (scheduler/matmul_reduce.py)
            if not isinstance(e, (*_EPILOGUE, MatmulOp, LinearOp)):
                return f"{type(e).__name__} {e.out.name} cannot be part of a matmul's epilogue"
        out = cs[0].out
        lmap = LogicalMap(fusion)
        tile = lmap.derivable({lmap.find(i) for i in out.logical})
        k_axis = cs[0].inputs[0].logical[-1]  # a: [.., K] for matmul and linear
        if lmap.find(k_axis) in {lmap.find(i) for i in out.logical}:
            # x @ W.T + x with a square W: K is one axis of the fusion with N or M
            return f"the epilogue reads an operand of {out.name} along its K axis (a kernel of its own)"
        for o in matmul_reduce.tile_outputs(
            fusion
        ):  # written by the epilogue: along the output's tile, never along K
            for d, i in enumerate(o.logical):
                if not (i.is_broadcast or is_const(i.loop_extent, 1)) and lmap.find(i) not in tile:
                    return f"output {o.name}'s axis {d} is no axis of the matmul's {out.name} (a kernel of its own)"
        if len(matmul_reduce.tile_outputs(fusion)) < len(fusion.outputs):
            # partials run on the tensor cores only (the segmenter splits them where those take the matmul)
            return unmapped_axis(fusion, [out, *cs[0].tv_inputs()], lmap)
        return (
            unmapped_axis(fusion, [out, *cs[0].tv_inputs()], lmap)
            or _split_for_tensor_cores(fusion, cs[0])
            or _simt_refuses(fusion)
        )

    @staticmethod
    def variant(params) -> str:
        if isinstance(params.simt, FfmaParams):
            return "ffma"
        return "simt" if params.simt is not None else "tensor cores"

    # ------------------------------------------------------------ params
    @staticmethod
    def compute_params(fusion: Fusion, info: InputInfo, overrides: dict) -> MatmulParams:
        e = contractions(fusion)[0]
        why = _mma_unsupported(fusion, e, info)
        if why is None:
            params = _mma_params(fusion, e, info, overrides)
            if params is not None:
                matmul_reduce.check_params(fusion, params)
                return params
        if len(matmul_reduce.tile_outputs(fusion)) < len(fusion.outputs):
            raise CircbufError(
                f"a row reduction computed in the matmul's epilogue needs the tensor-core path, which "
                f"cannot take these inputs ({why or 'the tensor-core path cannot take it'})"
            )
        asked = sorted(k for k in overrides if k != "realign")  # (realign=False: fp32 reads any strides here)
        ffma, _ = matmul_ffma.ffma_params(fusion, info, overrides)
        other = [k for k in asked if ffma is None or k not in matmul_ffma.OVERRIDES]
        if other:
            takes = ", ".join(matmul_ffma.OVERRIDES) if ffma is not None else "no matmul overrides"
            raise CircbufError(
                f"schedule({', '.join(other)}): this matmul runs on the SIMT path "
                f"({why or 'the tensor-core path cannot take it'}"
                f"{'; the FFMA kernel' if ffma is not None else ''}), which takes {takes}"
            )
        if ffma is not None:
            return MatmulParams(simt=ffma)
        from .reduction import ReductionScheduler

        f2 = fusion.clone()
        decompose(f2)
        why2 = ReductionScheduler.can_schedule(f2)
        assert why2 is None, why2  # can_schedule refused what the SIMT path cannot take (_simt_refuses)
        return MatmulParams(simt=ReductionScheduler.compute_params(f2, info, {}))

    # ---------------------------------------------------------- schedule
    @staticmethod
    def schedule(fusion: Fusion, params: MatmulParams):
        if isinstance(params.simt, FfmaParams):
            decompose(fusion)
            matmul_ffma.schedule_ffma(fusion, params.simt)
            return
        if params.simt is not None:
            from .reduction import ReductionScheduler

            decompose(fusion)
            ReductionScheduler.schedule(fusion, params.simt)
            return
        _schedule_mma(fusion, params)


# ---------------------------------------------------------------- checks
def _simt_refuses(fusion: Fusion) -> str | None:
    """Why the SIMT path (the matmul decomposed into a sum of products, run
    by the reduction scheduler) cannot take ``fusion``, else None. The
    tensor-core path falls back to it on grounds of the fusion's structure
    (:func:`_mma_structure`) and of the inputs' sizes (an empty operand),
    known only at compile (strides and alignment no longer: a cp.async fill
    takes what a tensor map cannot describe; nor K = 0: scheduler/empty_k.py);
    so a fusion the SIMT path cannot take is
    refused here, where the segmenter can still split it (an output of the
    bias's shape beside the matmul's, say, gets a kernel of its own)."""
    from .reduction import ReductionScheduler

    f2 = fusion.clone()
    decompose(f2)
    why = ReductionScheduler.can_schedule(f2)
    if why is None:
        return None
    e = contractions(fusion)[0]
    when = _mma_structure(fusion, e) or "inputs the tensor cores cannot take (an empty operand)"
    return f"matmul {e.out.name} runs on the SIMT path for {when}, which cannot take this fusion: {why}"


def _mma_params(fusion, e, info, ov) -> MatmulParams:
    """Heuristics and the validation of every override (a CircbufError names
    the rule a value breaks)."""
    a, b, _ = _operands(e)
    env = info.extents
    c = e.out
    m = evaluate(c.logical[-2].extent, env)
    n = evaluate(c.logical[-1].extent, env)
    batch = 1
    for i in c.logical[:-2]:
        batch *= evaluate(i.loop_extent, env)
    ta = info.tensors[fusion.inputs.index(a)]
    tb = info.tensors[fusion.inputs.index(b)]
    fill = ov.get("fill")
    if fill is not None and fill not in FILLS:
        raise CircbufError(f"schedule(fill={fill!r}): must be one of 'tma', 'cp.async'")
    tf32 = a.dtype == DataType.Float
    if tf32 and fill == "cp.async":
        raise CircbufError("schedule(fill='cp.async'): TF32 operands are filled by TMA only (K-major tiles)")
    fa, la, va = _operand_fill(ta, fill)
    fb, lb, vb = _operand_fill(tb, fill)
    for x, f, why in ((a, fa, la), (b, fb, lb)):
        if f is None:
            raise CircbufError(
                f"schedule(fill='tma'): TMA cannot describe operand {x.name} ({why}); "
                "use fill='cp.async' or leave fill unset"
            )
    a_major = "K" if la == "inner" else "M"
    if isinstance(e, LinearOp):
        b_major = "K" if lb == "inner" else "N"
    else:
        b_major = "N" if lb == "inner" else "K"
    persistent = ov.get("persistent", True)
    # split-K summed in this kernel (scheduler/split_k.py decides; the reduction-kernel
    # variant never reaches here: the compile driver runs its steps instead)
    sk = split_k.choose(fusion, info, ov)
    splits = sk.splits if sk is not None and sk.in_kernel else 1
    # M <= 64 (decode): [64 x bn] tiles, one warpgroup each (ping-pong), bn by waves
    small = m <= SMALL_M and "tile" not in ov and persistent is True and ov.get("epilogue") != "role"
    pingpong = ov.get("pingpong", small)
    for name, v in (("persistent", persistent), ("pingpong", pingpong)):
        if not isinstance(v, bool):
            raise CircbufError(f"schedule({name}={v!r}): must be True or False")
    epilogue = ov.get("epilogue", "inline")
    role = epilogue == "role"
    if role and pingpong:
        raise CircbufError(
            "schedule(epilogue='role', pingpong=True): an epilogue role is built for the cooperative "
            "kernel only (ping-pong warpgroups run their own epilogues)"
        )
    # an epilogue role holds a whole [128 x 128] fp32 tile in flight: two [128 x 64] stages
    bm_d, bn_d = (128, 128) if pingpong or role else (128, 256)
    if n <= 128 and not pingpong:
        bn_d = 128
    if small and pingpong:
        bm_d, bn_d = 64, small_m_bn(m, n, batch * splits, info.target.sm_count)
    row = SWIZZLE_ROW // a.dtype.size  # K elements in one 128-byte swizzled row
    tile = ov.get("tile", (bm_d, bn_d, row))
    if not (isinstance(tile, (tuple, list)) and len(tile) == 3 and all(isinstance(x, int) for x in tile)):
        raise CircbufError(f"schedule(tile={tile!r}): must be (bm, bn, bk), three ints")
    bm, bn, bk = tile
    warpgroups = 1 if pingpong else 2
    if bm % (64 * warpgroups) or not 64 <= bm <= 256:
        rule = "a multiple of 64 per warpgroup" + (
            "" if pingpong else " (two warpgroups split it: 128 or 256)"
        )
        raise CircbufError(f"schedule(tile={tuple(tile)}): bm = {bm} must be {rule}, at most 256")
    if bn % 16 or not 16 <= bn <= 256:
        raise CircbufError(
            f"schedule(tile={tuple(tile)}): bn = {bn} must be a multiple of 16 in [16, 256] (the wgmma N)"
        )
    if bk not in (row, 2 * row):
        raise CircbufError(
            f"schedule(tile={tuple(tile)}): bk = {bk} must be {row} or {2 * row} "
            f"(128-byte swizzled rows of {a.dtype.size}-byte K)"
        )
    if b_major == "N" and bn % 64:
        raise CircbufError(
            f"schedule(tile={tuple(tile)}): bn = {bn} must be a multiple of 64 for an N-major B (64-wide swizzle atoms)"
        )
    # sub-tiles of one 128-byte swizzled row of bf16; a bn that is no multiple
    # of 64 is one sub-tile (stored from registers: TMA boxes need the 128 bytes)
    # (fp32 outputs only: 32 columns, still one 128-byte swizzled row per sub-tile row; a
    # row reduction's partials take 64-column sub-tiles, and bf16 beside fp32 outputs keep 64)
    out_sizes = [o.dtype.size for o in matmul_reduce.tile_outputs(fusion)]
    partials = len(out_sizes) < len(fusion.outputs)
    cols = SWIZZLE_ROW // 4 if set(out_sizes) == {4} and not partials else 64
    epi = ov.get("epilogue_tile", (64, cols if bn % cols == 0 else bn))
    if not (
        isinstance(epi, (tuple, list)) and len(epi) == 2 and all(isinstance(x, int) and x > 0 for x in epi)
    ):
        raise CircbufError(f"schedule(epilogue_tile={epi!r}): must be (rows, cols), two positive ints")
    if epi[0] != 64 or bn % epi[1] or epi[1] % 8:
        raise CircbufError(
            f"schedule(epilogue_tile={tuple(epi)}): a sub-tile is 64 rows (one wgmma's) by a multiple of 8 "
            f"columns that divides bn = {bn}"
        )
    # outputs staged in shared memory and stored by TMA: 128-byte swizzled
    # rows of a 16-bit type, 16-byte row strides (an output the epilogue reads
    # again is read from the registers its staging copy is made from)
    # (an output allocated in another order, by stride_order or inherited from an
    # epilogue input's layout, or written into an input, whose layout and address
    # are the caller's, is stored through its strides)
    tma_ok = all(
        o.dtype.size in (2, 4)
        and _row_major(o)
        and k not in fusion.aliases
        and epi[1] * o.dtype.size == 128
        and (n * o.dtype.size) % 16 == 0
        for k, o in enumerate(fusion.outputs)
        if matmul_reduce.partial_source(o) is None  # (a row reduction's partials: their own stores)
    )
    store, epi = choose_store(fusion, ov, n, bn, epi, tma_ok, role, info)
    _check_peer_store(fusion, store, persistent, pingpong, role)
    # two staging buffers per warpgroup when a tile has an even number of
    # sub-tiles: a sub-tile is written while the last one's TMA store still reads
    # epilogue inputs the producer loads by TMA (TMA-stored outputs; not the role's): a
    # stage per sub-tile of a tile, so the producer never waits on the epilogue for them
    # (a cp.async operand fill is the producer's only ring: its threads run the copy nest)
    # (not with split-K: a CTA whose partial is not the tile's last skips the epilogue, and
    # the producer would load its inputs all the same)
    simple = not (role or "cp.async" in (fa, fb)) and store == "tma" and splits == 1
    loaded = _tma_inputs(fusion, e, info, epi[1]) if simple else ()
    input_bytes = sum(loaded) * input_stages(bn, epi[1]) * bm * epi[1] * 2
    # (their rings take the shared memory of the second staging buffer)
    buffers = 2 if store == "tma" and (bn // epi[1]) % 2 == 0 and not loaded else 1
    staging = staging_bytes(store, buffers, epi[1], out_sizes)
    # the epilogue role's ring: fp32 [bm x en] sub-tiles, a tile's worth when it fits in two
    handoff = 2 if role else 0  # a [128 x 128] tile's two sub-tiles; half a 128x256 tile
    handoff_bytes = handoff * bm * epi[1] * 4
    stage_bytes = (bm + bn) * bk * a.dtype.size

    def left(staging, input_bytes):  # shared memory the operand stages may take
        return info.target.smem_per_block - SMEM_RESERVED - staging - handoff_bytes - input_bytes

    budget = left(staging, input_bytes)
    fit = budget // stage_bytes
    if "store" not in ov and "stages" not in ov and fit < MIN_STAGES and staging:
        # several outputs' staging tiles leave too few operand stages (five fp32 outputs:
        # 160 KB): one staging buffer, else stores from registers (no staging at all)
        buffers = 1
        staging = staging_bytes(store, 1, epi[1], out_sizes)
        budget = left(staging, input_bytes)
        fit = budget // stage_bytes
        peers = any(o.peer_store is not None for o in fusion.outputs)  # (TMA stores only)
        if fit < MIN_STAGES and not role and not peers:
            store, staging, loaded, input_bytes = "direct", 0, (), 0
            budget = left(0, 0)
            fit = budget // stage_bytes
    if "stages" not in ov and fit < 2:
        raise CircbufError(
            f"schedule(tile={tuple(tile)}{', epilogue=' + repr(epilogue) if role else ''}): two operand "
            f"stages of {stage_bytes} bytes do not fit in the {budget} bytes of shared memory left beside "
            f"the {staging}-byte output staging"
            + (f" and the {handoff_bytes}-byte hand-off ring" if role else "")
        )
    # a memory-bound small-M tile keeps more of B in flight (bytes in flight per SM)
    stages = ov.get("stages", min(fit, SMALL_M_STAGES if small and pingpong else 7))
    if not isinstance(stages, int) or stages < 2:
        raise CircbufError(f"schedule(stages={stages!r}): must be an int >= 2")
    if stages * stage_bytes > budget:
        beside = f"the {staging}-byte output staging" + (
            f" and the epilogue role's {handoff_bytes}-byte hand-off ring" if role else ""
        )
        raise CircbufError(
            f"schedule(stages={stages}, tile={tuple(tile)}{', epilogue=' + repr(epilogue) if role else ''}): "
            f"{stages} stages of {stage_bytes} bytes exceed the {budget} bytes of shared memory left beside "
            f"{beside} (at most {fit} stages of this tile)"
        )
    prefetch = ov.get("prefetch", stages - 1)
    if not isinstance(prefetch, int) or not 0 < prefetch < stages:
        raise CircbufError(f"schedule(prefetch={prefetch!r}): must satisfy 0 < prefetch < stages ({stages})")
    raster = ov.get("raster", "M" if n >= m else "N")
    if raster not in ("M", "N"):
        raise CircbufError(f"schedule(raster={raster!r}): must be 'M' or 'N'")
    tiles_m, tiles_n = -(-m // bm), -(-n // bn)
    # the heuristic's cluster: CIRCBUF_MATMUL_CLUSTER (default 1x1 until clusters are measured)
    asked = "cluster" in ov
    cluster = ov["cluster"] if asked else knobs.matmul_cluster()
    if not (
        isinstance(cluster, (tuple, list))
        and len(cluster) == 2
        and all(isinstance(x, int) and x >= 1 for x in cluster)
    ):
        raise CircbufError(f"schedule(cluster={cluster!r}): must be (cx, cy), two ints >= 1")
    cluster = tuple(cluster)
    if cluster != (1, 1):
        try:
            _check_cluster(cluster, tiles_m, tiles_n, tile, a_major, b_major, ov, fa, fb, info.target)
            if not persistent:
                # on an H100 a non-persistent 2x1 cluster kernel (1500x2500x200) gave two launches
                # different bits (within tolerance of torch: a race not found yet); persistent
                # cluster kernels gave the same bits every time (tests/test_gpu_cluster.py)
                raise CircbufError(
                    f"schedule(cluster={cluster}, persistent=False): clusters run on a persistent grid "
                    "only (a non-persistent cluster kernel was not deterministic on an H100)"
                )
        except CircbufError:
            if asked:
                raise
            cluster = (1, 1)  # the knob's cluster does not fit this fusion: none
    # bands of cluster tiles (a cluster's CTAs take a [cx x cy] block of neighbouring tiles)
    along = tiles_m // cluster[0] if raster == "M" else tiles_n // cluster[1]
    group = ov.get("group", _default_group(along))
    if not isinstance(group, int) or group < 1:
        raise CircbufError(f"schedule(group={group!r}): must be an int >= 1")
    threads = cta_threads(role)
    entry = info.target.registers_at(threads)  # what each thread starts with (launch bounds of 1 CTA)
    if role:
        # ptxas compiles every role under __launch_bounds__(512): 128 registers a thread,
        # which setmaxnreg cannot raise for it; so no role asks for more (or less)
        if "registers" in ov:
            raise CircbufError(
                f"schedule(registers={ov['registers']!r}, epilogue='role'): the epilogue role's "
                f"{threads} threads compile at {entry} registers each (ptxas holds every role to "
                "__launch_bounds__), which setmaxnreg cannot raise; leave registers out"
            )
        registers = None
        budget_regs = entry
    else:
        # a producer whose threads compute the addresses of cp.async copies needs more than
        # the 40 registers of one issuing TMA: 40 spilled a 16-byte cp.async fill's loop
        # (SASS, NVRTC for sm_90a). The roles share the CTA's registers of the launch
        # (168 x 384): 56 + 2 x 224 fills them exactly; 48 + 2 x 232 is 1024 over, and
        # the second consumer's setmaxnreg.inc waited forever on an H100 (fuzz 784:30)
        registers = ov.get("registers", (56, 224) if "cp.async" in (fa, fb) else (40, 232))
        try:  # the operand rings are warp specialized with these: WarpSpecialized's rule
            WarpSpecialized(on=ParallelType.TIDy, registers=registers)
        except CircbufError:
            raise CircbufError(f"schedule(registers={registers!r}): {REGISTERS_RULE}") from None
        if not registers[0] <= entry <= registers[1]:
            raise CircbufError(
                f"schedule(registers={tuple(registers)}): the producer gives registers back and the "
                f"consumers take them: producer <= {entry} <= consumers ({threads} threads start with "
                f"{entry} each)"
            )
        if (registers[0] + 2 * registers[1]) * 128 > entry * threads:
            raise CircbufError(
                f"schedule(registers={tuple(registers)}): producer + 2 x consumer registers x 128 threads "
                f"= {(registers[0] + 2 * registers[1]) * 128} exceed the CTA's {entry * threads} "
                f"({threads} threads x {entry} at launch): setmaxnreg.inc takes registers only from "
                "the CTA's pool and would wait forever"
            )
        budget_regs = registers[1]
    acc_regs = (bm // warpgroups) * bn // 128
    if acc_regs + 24 > budget_regs:
        why = f"registers={tuple(registers)}" if registers else "epilogue='role'"
        raise CircbufError(
            f"schedule(tile={tuple(tile)}, {why}): a warpgroup's {acc_regs} "
            f"accumulator registers per thread do not fit in {budget_regs}"
        )
    tiles = batch * tiles_m * tiles_n
    # (split-K: grid x splits CTAs, blockIdx.y the chunk of K; one wave of them)
    grid = min(tiles, max(info.target.sm_count // splits, 1)) if persistent else tiles
    csize = cluster[0] * cluster[1]
    if persistent and csize > 1:
        # whole clusters, all resident at once: every CTA of one walks the same tile
        # slots (t % csize is its rank)
        grid = max(min(tiles, info.target.cluster_slots(csize)) // csize, 1) * csize
    vec = _pair_loads(fusion, e, info, n)
    if loaded:  # read from shared memory, not in pairs from global
        vec = tuple(v and not t for v, t in zip(vec, loaded)) if vec else ()
        vec = vec if any(vec) else ()
    return MatmulParams(
        tile=tuple(tile),
        stages=stages,
        prefetch=prefetch,
        persistent=persistent,
        pingpong=pingpong,
        cluster=tuple(cluster),
        raster=raster,
        group=group,
        registers=tuple(registers) if registers else None,
        epilogue=epilogue,
        handoff_stages=handoff,
        epilogue_tile=tuple(epi),
        store=store,
        store_buffers=buffers,
        # stored from registers (rows not 16-byte aligned, or no TMA box): an accumulator
        # pair (two adjacent columns of a thread's fragment) per store where N is even, as
        # the plan allocates the outputs contiguous: their rows are then pair-aligned
        # (an output written into an input, or laid out with N outer: its own strides)
        store_vector=2
        if store == "direct"
        and n % 2 == 0
        and all(
            output_vectorizable(fusion, info, k, o.ndim - 1, 2)
            for k, o in enumerate(fusion.outputs)
            if matmul_reduce.partial_source(o) is None
        )
        else 1,
        grid=max(grid, 1),
        a_major=a_major,
        b_major=b_major,
        vectorize_inputs=vec,
        tma_inputs=loaded,
        fill=(fa, fb),
        copy_vector=(va or 0, vb or 0),
        tf32=tf32,
        split_k=splits,
    )


def _check_cluster(cluster, tiles_m, tiles_n, tile, a_major, b_major, ov, fa, fb, target):
    """The rules a thread-block cluster (TMA multicast of the operand tiles) must
    keep, each broken one named: cx CTAs along M share B's tile, cy along N share
    A's; each CTA loads a slice of each shared tile and multicasts it."""
    cx, cy = cluster
    bm, bn, _ = tile
    where = f"schedule(cluster={cluster})"
    if cx * cy > target.max_cluster_size:
        raise CircbufError(
            f"{where}: {cx * cy} CTAs exceed the {target.max_cluster_size} of a portable cluster on {target.name}"
        )
    if tiles_m % cx or tiles_n % cy:
        # ragged clusters are not built: a cluster's CTAs run one protocol, tile for tile
        raise CircbufError(
            f"{where}: the cluster must divide the tile grid ({tiles_m} x {tiles_n} tiles of {bm}x{bn}); "
            "ragged clusters are not built"
        )
    for name, what, why in (
        ("epilogue", "role", "clusters are built for the inline epilogue only"),
        ("fill", "cp.async", "a multicast fill is a TMA copy (fill='tma')"),
    ):
        if ov.get(name) == what:
            raise CircbufError(f"schedule(cluster={cluster}, {name}={what!r}): {why}")
    if "cp.async" in (fa, fb):
        raise CircbufError(f"{where}: an operand TMA cannot describe (cp.async fill) cannot be multicast")
    for op, ext, major, c in (("A", bm, a_major, cy), ("B", bn, b_major, cx)):
        if c == 1:
            continue
        if major in ("K",) and (ext // c) % 8:
            raise CircbufError(
                f"{where}: {op}'s {ext}-row tile splits into {c} slices of {ext // c} rows, not a multiple "
                "of 8 (one 1024-byte swizzle atom)"
            )
        if major not in ("K",) and ((ext // 64) % c or ext % 64):
            raise CircbufError(
                f"{where}: {op}'s tile of {ext // 64} 64-wide column boxes does not split into {c} slices"
            )


def _row_major(o) -> bool:
    """``o`` is allocated row-major (its stride order, given or inherited)."""
    return o.domain.allocation_order() == list(range(o.ndim))


def _check_peer_store(fusion, store, persistent, pingpong, role):
    """An output stored into peer GPUs' buffers (``TensorView.peer_store``,
    issue 22): the lowering ships each TMA-stored sub-tile to every peer and
    signals a tile after its persistent loop iteration, so it needs the
    cooperative persistent kernel with the TMA-store epilogue."""
    peers = [o for o in fusion.outputs if o.peer_store is not None]
    if not peers:
        return
    rules = [
        (
            store != "tma",
            "its output is not stored by TMA (16-bit, rows a multiple of 16 bytes, read by nothing else)",
        ),
        (not persistent, "persistent=False"),
        (pingpong, "pingpong=True"),
        (role, "epilogue='role'"),
        (len(fusion.outputs) > 1, "it has more than one output"),
    ]
    why = next((text for broken, text in rules if broken), None)
    if why is not None:
        raise CircbufError(
            f"{peers[0].name} is stored to peer GPUs ({peers[0].peer_store.kind}), which needs the "
            f"cooperative persistent kernel with a TMA-stored output; here {why}"
        )


def input_stages(bn: int, en: int) -> int:
    """Stages of the ring that brings an epilogue input's [bm x en] sub-tiles in
    by TMA: a tile's worth (the producer loads a tile's sub-tiles after its
    operands; were it to wait for the epilogue to free a slot, the next tile's
    operand loads would wait too), at most 4."""
    return max(2, min(bn // en, 4))


def _tma_inputs(fusion, e, info, epi_cols) -> tuple:
    """Per fusion input, whether the producer loads it by TMA a [bm x en]
    sub-tile at a time (a residual: an input of the output's [M, N] shape,
    16-bit, rows of 128 bytes per sub-tile, one a tensor map describes); ()
    when none is. Kernels with a TMA store, cooperative (both warpgroups'
    halves of a sub-tile in one stage) or ping-pong (the producer walks every
    tile; a warpgroup reads its own tiles' stages); not the epilogue role."""
    a, b, _ = _operands(e)
    out = e.out
    if out.ndim != 2:
        return ()
    lmap = LogicalMap(fusion)
    mn = [lmap.find(i) for i in out.logical]
    flags = []
    for x, t in zip(fusion.inputs, info.tensors):
        ok = (
            isinstance(x, TensorView)
            and x not in (a, b)
            and t is not None
            and x.ndim == 2
            and x.dtype.size == 2
            and epi_cols * x.dtype.size == 128
            and [lmap.find(i) for i in x.logical] == mn
            and not any(i.is_broadcast for i in x.logical)
            and list(t.sizes) == [evaluate(i.extent, info.extents) for i in out.logical]
            and tma_describable(t, 1) is None
        )
        flags.append(ok)
    return tuple(flags) if any(flags) else ()


def _pair_loads(fusion, e, info, n) -> tuple:
    """Per fusion input, whether the epilogue reads it an accumulator pair at a
    time (the fragment's two elements adjacent along N, ``e`` below): one axis
    of it is the output's N, contiguous, every other stride and the pointer
    aligned to a pair, and N even, so a pair whose first element is in range
    is whole (a vector access is predicated on its first element). () when
    none is."""
    a, b, _ = _operands(e)
    lmap = LogicalMap(fusion)
    n_class = lmap.find(e.out.logical[-1])
    out = []
    for x, t in zip(fusion.inputs, info.tensors):
        ok = False
        if isinstance(x, TensorView) and x not in (a, b) and t is not None and n % 2 == 0:
            d = [d for d, i in enumerate(x.logical) if lmap.find(i) == n_class]
            ok = len(d) == 1 and t.sizes[d[0]] == n and vector_access(t, d[0], 2)
        out.append(ok)
    return tuple(out) if any(out) else ()


def _default_group(along: int) -> int:
    """Tiles per band along the raster side: CUTLASS's 8/4/2 once the side
    has that many, but a band that does not divide the side leaves holes
    (tile slots past the edge that still run their k loop on zero-filled
    tiles), so the largest group whose holes stay under 5% of the tiles.
    Measured (H100, 3000x5000x4000): 16-tile bands over 24 M-tiles (33%
    holes) ran at 372 TFLOP/s, 8-tile bands (none) at 507."""
    for g in (8, 4, 2):
        if along >= g and (-(-along // g) * g - along) <= 0.05 * along:
            return g
    return 1


# ----------------------------------------------------------- rewriting
def _new(fusion, ids, dtype, mem=MemoryType.Local):
    return fusion.register(TensorView(ids, dtype, mem))


def _clone_axes(axes):
    return [i.fresh() for i in axes]


def _detach(e):
    for x in e.tv_inputs():
        if e in x.uses:
            x.uses.remove(e)


def decompose(fusion: Fusion) -> None:
    """Rewrite the matmul / linear as a sum of products (broadcast, multiply,
    sum over K in the accumulator type, cast): the SIMT path.

    >>> # decompose(f)   # c = matmul(a, b)  ->  c = cast(sum(a[.., M, K, 1] * b[.., 1, K, N], K))
    >>> # linear(x, w)   ->  cast(sum(x[.., M, 1, K] * w[1.., 1, N, K], K))  (an inner reduction)
    """
    e = contractions(fusion)[0]
    a, b, bias = _operands(e)
    c = e.out
    acc_t = DataType.Double if a.dtype == DataType.Double else DataType.Float
    _detach(e)
    af, bf = _cast(fusion, a, acc_t), _cast(fusion, b, acc_t)
    rank = c.ndim
    linear = isinstance(e, LinearOp)
    # the product space: matmul [batch.., M?, K, N?] (K between, as b [K, N]
    # lies); linear [batch.., M?, N?, K] (K last, as both x and w [N, K] lie)
    has_m = a.ndim > 1
    has_n = (b.ndim > 1) if not linear else (b.ndim == 2)
    nb = rank - int(has_m) - int(has_n)
    space = ["B"] * nb + (["M"] if has_m else [])
    space += ((["N"] if has_n else []) + ["K"]) if linear else (["K"] + (["N"] if has_n else []))
    kpos = space.index("K")
    prod_rank = rank + 1

    def place(x, xf, roles):
        # roles: per axis of x, "B"/"M"/"N"/"K" -> its position in the product space
        xb = roles.count("B")
        pos, seen_b = [], 0
        for r in roles:
            if r == "B":
                pos.append(nb - xb + seen_b)
                seen_b += 1
            else:
                pos.append(space.index(r))
        assert pos == sorted(pos), (roles, space)
        flags = [True] * prod_rank
        for p in pos:
            flags[p] = False
        out = _new(fusion, broadcast_ids(xf.domain.no_reductions(), flags), xf.dtype)
        BroadcastOp(out, xf, flags)
        return out

    ra = ["B"] * (a.ndim - 2) + ["M", "K"] if a.ndim > 1 else ["K"]
    if linear:
        rb = ["N", "K"] if b.ndim == 2 else ["K"]
    else:
        rb = ["B"] * (b.ndim - 2) + ["K", "N"] if b.ndim > 1 else ["K"]
    ab, bb = place(a, af, ra), place(b, bf, rb)
    ids = []
    for k in range(prod_rank):
        # the operands' extents were checked equal when the matmul was defined
        ext = next(
            (i.concrete_extent for i in (ab.logical[k], bb.logical[k]) if i.concrete_extent is not None), None
        )
        ids.append(IterDomain(Const(1), IterType.Broadcast) if ext is None else IterDomain(ext))
    prod = _new(fusion, ids, acc_t)
    BinaryOp("mul", prod, ab, bb)
    red = _new(fusion, _clone_axes(ids), acc_t)
    red.logical[kpos].iter_type = IterType.Reduction
    red.domain.loop = list(red.logical)
    ReductionOp("sum", red, prod, reduction_init("sum", acc_t))
    val = red
    if bias is not None:
        val = _add_bias(fusion, red, bias, acc_t)
    _finish(c, val)


def _cast(fusion, x, dt):
    if x.dtype == dt:
        return x
    out = _new(fusion, _clone_axes(x.domain.no_reductions()), dt)
    CastOp(out, x)
    return out


def _add_bias(fusion, val, bias, dt):
    """``val + bias`` with bias [N] broadcast over the other axes of val."""
    bf = _cast(fusion, bias, dt)
    shape = val.domain.no_reductions()
    if bf.ndim:
        bb = _new(
            fusion,
            [IterDomain(Const(1), IterType.Broadcast) for _ in shape[:-1]] + _clone_axes(shape[-1:]),
            dt,
        )
        BroadcastOp(bb, bf, [True] * (len(shape) - 1) + [False])
    else:
        bb = _new(fusion, [IterDomain(Const(1), IterType.Broadcast) for _ in shape], dt)
        BroadcastOp(bb, bf, [True] * len(shape))
    out = _new(fusion, _clone_axes(shape), dt)
    BinaryOp("add", out, val, bb)
    return out


def _finish(c, val):
    """``c`` (the matmul's output, in the inputs' dtype) becomes ``cast(val)``."""
    c.definition = None
    if val.dtype == c.dtype:
        LoadStoreOp(c, val)
    else:
        CastOp(c, val)


def _finish_fp32(fusion, c, val):
    """:func:`_finish`, then the epilogue's math reads the fp32 ``val``, not ``c``
    rounded: ``cast(cast(val, bf16), f32)`` -> ``val`` (an output keeps its cast)."""
    _finish(c, val)
    for u in list(c.uses):
        if isinstance(u, CastOp) and u.out.dtype == DataType.Float and u.out not in fusion.outputs:
            for v in list(u.out.uses):
                v.replace_input(u.out, val)


# ------------------------------------------------------------ MMA path
def translate(fusion: Fusion, params: MatmulParams):
    """The MMA form of the fusion's matmul: TMA-staged operand tiles with
    broadcast axes, ``acc = mma(As, Bs)`` in fp32, ``c = cast(acc (+ bias))``;
    epilogue casts of ``c`` back to fp32 read the fp32 value instead (the
    epilogue runs on the accumulator, before the final cast). Returns
    (acc, As, Bs)."""
    e = contractions(fusion)[0]
    a, b, bias = _operands(e)
    c = e.out
    linear = isinstance(e, LinearOp)
    _detach(e)
    cx = c.domain.no_reductions()
    nb = len(cx) - 2
    batch = cx[:nb]
    k_ext = a.logical[-1].extent

    def staged(x, roles, fill, vector):
        """x staged in shared memory as [batch.., M, N, K]-roled axes in x's
        own order, with broadcast axes for the roles x lacks."""
        flags = [True] * (nb - roles.count("B")) + [r == "-" for r in roles]
        xs = _new(fusion, broadcast_ids(x.domain.no_reductions(), flags), x.dtype, MemoryType.Shared)
        LoadStoreOp(xs, x, kind=fill, is_broadcast_dim=flags, vector=vector)
        return xs

    a_roles = ["B"] * (a.ndim - 2) + ["M", "-", "K"]  # [.., M, bN, K]
    if linear:
        b_roles = ["-", "N", "K"]  # [.., bM, N, K]
    else:
        b_roles = ["B"] * (b.ndim - 2) + ["-", "K", "N"]  # [.., bM, K, N]
    (fa, fb), (va, vb) = params.fill, params.copy_vector
    As, Bs = staged(a, a_roles, fa, va), staged(b, b_roles, fb, vb)
    ra = ["B"] * nb + ["M", "N", "K"]
    rb = ["B"] * nb + (["M", "N", "K"] if linear else ["M", "K", "N"])
    acc = _new(
        fusion,
        _clone_axes(batch) + _clone_axes(cx[nb:]) + [IterDomain(k_ext, IterType.Reduction)],
        DataType.Float,
    )
    MmaOp(acc, As, Bs, [ra, rb])
    val = acc
    if bias is not None:
        val = _add_bias(fusion, acc, bias, DataType.Float)
    _finish_fp32(fusion, c, val)
    return acc, As, Bs


def _roles(tv, lmap, classes) -> list:
    """The role ("B", "M", "N", "K") of each logical axis of ``tv``."""
    out = []
    for i in tv.logical:
        r = classes.get(lmap.find(i))
        out.append(r)
    return out


def _tile(tv, roles, params, pingpong_split: bool):
    """The tile loop: [.., M, N] -> [tiles / G (, W)] [G] [rest in role order].
    Returns the positions of the remaining M, N, K parts."""
    bm, bn, bk = params.tile
    order = [k for k, r in enumerate(roles) if r == "B"]
    order += [roles.index("M"), roles.index("N")]
    order += [k for k, r in enumerate(roles) if r not in ("B", "M", "N")]  # K, or a partial's column pieces
    tv.reorder(order)  # [B.., M, N, K?]
    nb = roles.count("B")
    tv.split(nb, bm)  # [B.., Mo, Mi, N, K?]
    tv.split(nb + 2, bn)  # [B.., Mo, Mi, No, Ni, K?]
    rest = len(tv.loop) - (nb + 4)
    # bring the tile axes together: [B.., Mo, No, Mi, Ni, K?]
    perm = list(range(nb)) + [nb, nb + 2, nb + 1, nb + 3] + list(range(nb + 4, nb + 4 + rest))
    tv.reorder(perm)
    cx, cy = params.cluster
    if (cx, cy) != (1, 1):
        # a cluster's CTAs take a [cx x cy] block of neighbouring tiles: the cluster's
        # tile coordinates run innermost of the tile index, so t % (cx * cy) is the rank
        tv.split(nb, cx)  # [B.., Mo/cx, cx, No, ..]
        tv.split(nb + 2, cy)  # [B.., Mo/cx, cx, No/cy, cy, ..]
        tv.reorder(list(range(nb)) + [nb, nb + 2, nb + 1, nb + 3] + list(range(nb + 4, len(tv.loop))))
    g = params.group
    if params.raster == "M":  # bands of g M-tiles: within a band M runs fastest
        tv.split(nb, g)  # [B.., Mog, Mg, No, ..]
        tv.reorder(
            list(range(nb)) + [nb, nb + 2, nb + 1] + list(range(nb + 3, len(tv.loop)))
        )  # [B.., Mog, No, Mg]
    else:
        tv.split(nb + 1, g)  # [B.., Mo, Nog, Ng, ..]
        tv.reorder(
            list(range(nb)) + [nb + 1, nb, nb + 2] + list(range(nb + 3, len(tv.loop)))
        )  # [B.., Nog, Mo, Ng]
    for _ in range(nb + 2 + (2 if (cx, cy) != (1, 1) else 0)):
        tv.merge(0)  # [T, Mi, Ni, K?]
    if params.persistent:
        tv.split(0, params.grid)  # [T/G, G, ...]
        if pingpong_split:
            tv.split(0, 2)  # [T/G/2, W, G, ...]
            tv.axis(1).parallelize(ParallelType.TIDy)
            tv.axis(2).parallelize(ParallelType.BIDx)
            return 3
        tv.axis(1).parallelize(ParallelType.BIDx)
        return 2
    tv.axis(0).parallelize(ParallelType.BIDx)
    if pingpong_split:
        raise CircbufError("ping-pong needs a persistent grid (each warpgroup takes every other tile)")
    return 1


def _fragment(tv, pos, params, kind, serial_w=False):
    """[.., Mi, Ni, K?] from ``pos`` -> the warpgroup split, the epilogue
    sub-tiles and the wgmma accumulator layout. ``kind``:

    - ``"acc"``: [(W), K/bk, bk/64, Mb, TIDx{128}, MMA j, MMA h, MMA e, 64/16, MMA 16]
    - ``"epilogue"``: [(W), Mb, Nc, TIDx{128}, j, h, e]: one [64 x en] sub-tile per (Mb, Nc)
    - ``"store"``: [(W), Mb, Nc, B{64}, B{en}]: the TMA store's box

    ``serial_w`` (the epilogue role's side, one warpgroup for both halves):
    W is a serial loop just outside the sub-tile's rows, [Mb, Nc, W, TIDx, ..].

    Returns {"tidy": the warpgroup axis or None, "m64", "n": the sub-tile's
    row and column axes, "inline": the loop position after Nc (and W)}."""
    bm, bn, bk = params.tile
    en = params.epilogue_tile[1]
    p = pos
    out = {"tidy": None}
    if not params.pingpong:
        tv.split(p, bm // 2)  # [W, Mw]
        if not serial_w:
            tv.axis(p).parallelize(ParallelType.TIDy)
        out["tidy"] = tv.axis(p)
        p += 1
    tv.split(p, 64)  # [Mb, M64, Ni, K?]
    if kind == "acc":
        lead = 1
    else:
        tv.split(p + 2, en)  # [Mb, M64, Nc, Nn]
        tv.reorder(list(range(p)) + [p, p + 2, p + 1, p + 3] + list(range(p + 4, len(tv.loop))))
        lead = 2  # [Mb, Nc, M64, Nn]
        if params.store_buffers > 1:  # [Mb, Nc/B, B, M64, Nn]: sub-tiles alternate between B staging buffers
            tv.split(p + 1, params.store_buffers)
            out["buffer"] = tv.axis(p + 2)
            lead = 3
    m64, n = p + lead, p + lead + 1
    if serial_w:  # [W, Mb, Nc.., M64] -> [Mb, Nc.., W, M64]
        w = p - 1
        tv.reorder(list(range(w)) + list(range(w + 1, m64)) + [w] + list(range(m64, len(tv.loop))))
    out["m64"], out["n"], out["inline"] = tv.axis(m64), tv.axis(n), m64
    if kind == "rows":
        rows_layout(tv, m64, n, en)
        return out
    if kind == "store":
        tv.axis(m64).parallelize(ParallelType.Bulk)
        tv.axis(n).parallelize(ParallelType.Bulk)
        return out
    tv.split(m64, 16)  # [w4, 16, N]
    tv.split(m64 + 1, 8)  # [w4, h2, r8, N]
    tv.split(m64 + 3, 8)  # [w4, h2, r8, j, 8]
    tv.split(m64 + 4, 2)  # [w4, h2, r8, j, c4, e2]
    frag = [m64, m64 + 2, m64 + 4, m64 + 3, m64 + 1, m64 + 5]  # w4, r8, c4, j, h2, e2
    head = list(range(m64))
    if kind == "acc":
        k = m64 + 6
        s = _k_loops(tv, k, bk, _operand_size(params), params.split_k)  # [(S), Ko, Kc, K64]
        tv.split(k + s + 2, WGMMA_K // _operand_size(params))  # [(S), Ko, Kc, Kw, K16]
        # the k loops outside the MMA tile: [.., (S), Ko, Kc, Mb, frag.., Kw, K16]
        order = head[:p] + list(range(k, k + s + 2)) + head[p:] + frag + [k + s + 2, k + s + 3]
        q = m64 + s + 2
    else:
        order = head + frag
        q = m64
    tv.reorder(order)
    tv.merge(q)  # w4 r8
    tv.merge(q)  # (w4 r8) c4: the 128 threads of the warpgroup
    tv.axis(q).parallelize(ParallelType.TIDx)
    if kind == "acc":  # [.., TIDx, j, h, e, Kw, K16]: one wgmma covers j, h, e and K16
        for k in (q + 1, q + 2, q + 3, q + 5):
            tv.axis(k).parallelize(ParallelType.Mma)
    return out


def _operand_size(params) -> int:
    """Bytes of an operand element: 4 for TF32 (fp32 in memory), else 2."""
    return 4 if params.tf32 else 2


def _k_loops(tv, k, bk, size, splits=1) -> int:
    """K -> [K/bk (the k loop), bk/row, row]: a row of 64 16-bit (32 fp32)
    elements is one 128-byte swizzled row of the operand tiles. With
    ``splits`` > 1 the k loop's steps are cut into that many chunks, one per
    ``blockIdx.y``: [S{BIDy}, K/bk/S, bk/row, row] (a chunk past K is TMA's
    zero fill). Returns the axes added before the k loop (0 or 1)."""
    tv.split(k, bk)
    tv.split(k + 1, SWIZZLE_ROW // size)
    if splits == 1:
        return 0
    tv.split(k, splits, inner_split=False)
    tv.axis(k).parallelize(ParallelType.BIDy)
    return 1


def _operand_tile(xs, roles, params, mn_role, major):
    """A staged operand: its tile loop (no warpgroup split: the producer
    walks every tile), the ring loop over K and the boxes one stage holds:
    K-major [Kc][MN][64 K] (boxes [MN x 64]), MN-major [Kc][MNc][64 K][64 MN]
    (boxes [64 x 64])."""
    pos = _tile(xs, roles, params, pingpong_split=False)
    # [T.., Mi, Ni, K] at pos
    s = _k_loops(
        xs, pos + 2, params.tile[2], _operand_size(params), params.split_k
    )  # [Mi, Ni, (S), Ko, Kc, K64]
    if s:  # the split's chunk index before the tile's axes: [(S), Mi, Ni, Ko, Kc, K64]
        xs.reorder(list(range(pos)) + [pos + 2, pos, pos + 1] + list(range(pos + 3, len(xs.loop))))
        pos += 1
    mn, other = (pos, pos + 1) if mn_role == "M" else (pos + 1, pos)
    ko, kc, k64 = pos + 2, pos + 3, pos + 4
    if major == "K":
        xs.reorder(list(range(pos)) + [ko, kc, mn, other, k64])  # [Ko, Kc, MN, other, K64]
        xs.axis(pos + 2).parallelize(ParallelType.Bulk)
        xs.axis(pos + 4).parallelize(ParallelType.Bulk)
    else:
        xs.split(mn, 64)  # MN -> [MNc, MN64]
        mnc, mn64 = mn, mn + 1
        other += 1 if other > mn else 0
        ko, kc, k64 = ko + 1, kc + 1, k64 + 1
        xs.reorder(list(range(pos)) + [ko, kc, mnc, other, k64, mn64])  # [Ko, Kc, MNc, other, K64, MN64]
        xs.axis(pos + 4).parallelize(ParallelType.Bulk)
        xs.axis(pos + 5).parallelize(ParallelType.Bulk)
    # a tile shared by the CTAs of a cluster along the other operand's side (A's by
    # the cy CTAs along N, B's by the cx along M): each loads one slice of its rows
    # (K-major) or column boxes (MN-major) and multicasts it to them
    cx, cy = params.cluster
    share, ptype = (cy, ParallelType.CIDy) if mn_role == "M" else (cx, ParallelType.CIDx)
    if share > 1:
        mn = pos + 2  # K-major: the box's MN rows; MN-major: the loop over 64-wide boxes
        ext = simplify(xs.axis(mn).loop_extent)
        bulk = xs.axis(mn).parallel_type
        xs.split(mn, ext.value // share)  # [slice{share}, MN / share]
        xs.axis(mn).parallelize(ptype)
        xs.axis(mn + 1).parallelize(bulk)
    xs.swizzle(128)
    kind = WarpSpecialized(on=ParallelType.TIDy, registers=params.registers)
    xs.circular_buffer(params.stages, params.prefetch, kind, axis=pos)  # (the ring loop: Ko)


def _schedule_mma(fusion: Fusion, params: MatmulParams):
    for tv, d in fixed_ones(fusion, contractions(fusion)[0]):
        tv.logical[d].iter_type = IterType.Iteration  # (the operand tile's rows: TMA zero-fills past 1)
    acc, As, Bs = translate(fusion, params)
    # epilogue inputs the producer brings in by TMA, a ring of sub-tiles beside the operands'
    loaded = [
        x.cache_after(op="tma")
        for k, x in enumerate(list(fusion.inputs))
        if k < len(params.tma_inputs) and params.tma_inputs[k]
    ]
    # read back an accumulator pair at a time (one 4-byte shared load: a 128-byte
    # swizzle moves 16-byte pieces, so a pair stays side by side)
    pairs = {id(rs.cache_after()) for rs in loaded}
    hoist_broadcasts(fusion)
    _pair_caches(fusion, params, acc.ndim)
    # an output the epilogue reads again (``b = exp(y)`` stored, ``sin(b)`` too) is
    # computed into registers that its store and its readers share: read back
    # from global memory it was a loop nest of its own after every tile's,
    # which no loop order could run before a reader inlined beside its producers
    for o in matmul_reduce.tile_outputs(fusion):
        if fusion.consumers(o):
            cache_output(fusion, o)
    e = acc.definition
    # the epilogue role reads the accumulator from a ring of shared-memory sub-tiles
    handoff = None
    if params.epilogue == "role":
        handoff = acc.cache_after()
        handoff.memory_type = MemoryType.Shared
    # outputs staged in shared memory and stored by TMA a [64 x en] box at a time
    staged = {}
    if params.store in ("tma", "rows"):  # (rows: the threads store the staging tile by rows)
        for o in matmul_reduce.tile_outputs(fusion):
            cs = o.cache_before(op=params.store)
            cr = cs.cache_before()  # the epilogue's last value, in registers
            staged[id(cs)] = (o, cs, cr)
    # outputs stored from registers a pair at a time: o = set(vec2 cr)
    paired = {}
    if params.store == "direct" and params.store_vector > 1:
        for o in matmul_reduce.tile_outputs(fusion):
            cr = o.cache_before()
            paired[id(o)] = cr
    lmap = LogicalMap(fusion)
    concretize_broadcasts(fusion, lmap)
    classes = {}
    for r, ax in zip(e.roles[0], As.logical):
        classes[lmap.find(ax)] = r
    for r, ax in zip(e.roles[1], Bs.logical):
        classes.setdefault(lmap.find(ax), r)
    # operands: loop nests of their own (the producer's copy loops)
    _operand_tile(As, _roles(As, lmap, classes), params, "M", "K" if params.a_major == "K" else "MN")
    _operand_tile(Bs, _roles(Bs, lmap, classes), params, "N", "K" if params.b_major == "K" else "MN")
    # the accumulator and the epilogue: one tile loop
    stores = {id(o) for o, _, _ in staged.values()}
    # a row reduction's partials: loop nests in the epilogue's sub-tile loop
    partials = matmul_reduce.schedule_partials(
        fusion, params, lambda tv, roles, p: _tile(tv, roles, p, p.pingpong)
    )
    for tv in fusion.used_tvs():
        if tv.is_input or tv in (As, Bs) or id(tv) in partials:
            continue
        roles = _roles(tv, lmap, classes)
        if None in roles:
            raise CircbufError(f"{tv.name}: an axis that is not an axis of the matmul's output")
        # (an epilogue input the producer loads walks every tile, as the operands do)
        pos = _tile(tv, roles, params, pingpong_split=params.pingpong and tv not in loaded)
        kind = "acc" if tv is acc else "store" if id(tv) in stores or tv in loaded else "epilogue"
        kind = "rows" if kind == "store" and params.store == "rows" and tv not in loaded else kind
        # the epilogue role's values, and the producer's loads, walk both warpgroups' halves
        side = (handoff is not None and tv not in (acc, handoff)) or (tv in loaded and not params.pingpong)
        axes = _fragment(tv, pos, params, kind, serial_w=side)
        if tv is handoff:
            _handoff_ring(tv, axes, params)
        elif tv in loaded:
            _input_ring(tv, axes, params)
        elif id(tv) in staged:  # [W][64][en], swizzled like the store's box
            tidy = axes["tidy"] or next(a for a in tv.loop if a.parallel_type == ParallelType.TIDy)
            buf = [axes["buffer"]] if "buffer" in axes else []
            tv.set_allocation(buf + [tidy, axes["m64"], axes["n"]])
            tv.swizzle(params.epilogue_tile[1] * tv.dtype.size)
            tv.inline_at(axes["inline"])
            tv.axis(-1).parallelize(ParallelType.Vectorize)  # e: a bf16 pair per store
        elif id(tv) in paired:
            tv.axis(-1).parallelize(ParallelType.Vectorize)  # e: an accumulator pair per store
        elif not tv.is_output:
            tv.memory_type = MemoryType.Local
    acc.inline_at(3 if params.persistent else 2)  # the tile loop, the grid, the warpgroup
    if params.pingpong:
        acc.take_turns(ParallelType.TIDy)
    last = {id(cr) for _, _, cr in staged.values()} | {id(cr) for cr in paired.values()}
    for tv in fusion.used_tvs():
        if (
            not (tv.is_input or tv.is_output or tv in (As, Bs, acc, handoff, *loaded))
            and id(tv) not in staged
            and id(tv) not in partials
        ):
            # the epilogue's last value holds a pair for one vector store; a pair of
            # an input loaded by TMA is one vector load
            tv.inline_at(len(tv.loop) - (1 if id(tv) in last or id(tv) in pairs else 0))
            if id(tv) in pairs:
                tv.loop[-1].parallelize(ParallelType.Vectorize)
    done = {id(t) for t in (As, Bs, acc, handoff, *loaded) if t is not None}
    _hoist_epilogue_inputs(fusion, params, done | set(staged) | last | partials)


def _input_ring(rs, axes, params):
    """An epilogue input the producer loads by TMA: [.., Mb, Nc, W, B{64}, B{en}],
    one stage per epilogue sub-tile (both warpgroups' [64 x en] boxes), swizzled
    as the output's staging tile, ringed over the sub-tile loop."""
    rs.swizzle(128)
    # the ring loop: the sub-tile loop (Nc), just outside W (cooperative: both warpgroups'
    # boxes) or the sub-tile's rows (ping-pong: one warpgroup's tile at a time)
    ring = rs.loop.index(axes["tidy"]) - 1 if axes["tidy"] is not None else rs.loop.index(axes["m64"]) - 1
    kind = WarpSpecialized(on=ParallelType.TIDy, registers=params.registers)
    S = input_stages(params.tile[1], params.epilogue_tile[1])
    rs.circular_buffer(S, S - 1, kind, axis=ring)


def _handoff_ring(h, axes, params):
    """The epilogue role's ring: the consumers write each finished [bm x en]
    fp32 sub-tile of the accumulator (both warpgroups' halves) into a stage,
    thread-major ([W][j][h][TIDx][e]: a warp's 8-byte pairs side by side, no
    bank conflicts on either side, since the epilogue warpgroup reads with the
    same fragment layout), and the epilogue warpgroup reads it back."""
    x = next(k for k, a in enumerate(h.loop) if a.parallel_type == ParallelType.TIDx)
    j, hh, e = h.loop[x + 1 : x + 4]
    h.set_allocation([axes["tidy"], j, hh, h.loop[x], e])
    e.parallelize(ParallelType.Vectorize)  # an accumulator pair per 8-byte store
    kind = WarpSpecialized(on=ParallelType.TIDy, fill="threads", readers="epilogue")
    S = params.handoff_stages
    h.circular_buffer(S, S - 1, kind, axis=x - 1)


# Elements of one epilogue input a thread may hold in registers for the loops it is
# hoisted out of: a bias along N hoisted out of the fragment's row loop (h) holds 2 per
# 64-column sub-tile; out of a 128-row warpgroup tile's two row blocks (ping-pong
# 128x128) it would hold the 32 of a 128-column tile beside the 64-128 accumulator
# registers, so it is loaded once per row block instead.
EPILOGUE_HOIST_ELEMENTS = 8


def _copy_of_input(tv):
    """The fusion input ``tv`` is a register copy of (a set or a broadcast), or None."""
    d = tv.definition
    if isinstance(d, BroadcastOp) or (isinstance(d, LoadStoreOp) and d.kind == "set"):
        x = d.inputs[0]
        return x if isinstance(x, TensorView) and x.is_input else None
    return None


def _pair_caches(fusion, params, rank):
    """An input read a pair at a time (params.vectorize_inputs) by an op that is
    no copy (a residual tile added to the accumulator) is read through a
    register copy, whose pair loop becomes one vector load."""
    vec = params.vectorize_inputs
    for k, x in enumerate(fusion.inputs):
        if k < len(vec) and vec[k] and len(x.logical) == rank:
            if any(_copy_of_input(u.out) is None for u in x.uses):
                x.cache_after()


def _hoist_position(tv) -> int:
    """The loop position to compute ``tv`` (a value of the epilogue's inputs
    alone) at: outside the outermost loop over one of its broadcast axes
    (a bias along N is the same in every row of the fragment), where the
    values it holds for the loops inside stay within EPILOGUE_HOIST_ELEMENTS,
    else outside the next such loop; its full loop depth when it has none."""
    serial = (ParallelType.Serial, ParallelType.Unroll)
    for k, ax in enumerate(tv.loop):
        if ax.parallel_type not in serial or not ax.is_broadcast or is_const(simplify(ax.loop_extent), 1):
            continue
        held = 1
        for a in tv.loop[k:]:
            if a.parallel_type in serial and not a.is_broadcast:
                ext = simplify(a.loop_extent)
                held = held * ext.value if isinstance(ext, Const) else None
                if held is None:
                    break
        if held is not None and held <= EPILOGUE_HOIST_ELEMENTS:
            return k
    return len(tv.loop)


def _hoist_epilogue_inputs(fusion, params, skip):
    """Values computed from the epilogue's inputs alone (a bias, its broadcast,
    its cast to fp32) are computed once per value, not per accumulator element:
    each at :func:`_hoist_position`, its loop axes from there reordered to hold
    its own (non-broadcast) axes first and its broadcast axes last, which get no
    loop (no one shares them). A copy of an input that params.vectorize_inputs
    marks reads its accumulator pair (the innermost axis, ``e``) as one vector.

    A bias along N, per 64-column sub-tile of the cooperative kernel (the
    fragment: j columns of 8, h the row half, e the pair)::

        before: FOR j { FOR h { FOR e { b = T2[col]; y = acc[j, h, e] + cast(b) } } }
        after:  FOR j { b[0:2] = vec2 T2[col]; bf = cast(b)
                        FOR h { FOR e { y = acc[j, h, e] + bf[e] } } }
    """
    vec = params.vectorize_inputs
    inputs = []  # topological order
    pure = set()
    for e in fusion.exprs():
        o = e.out
        if o.is_input or o.is_output or id(o) in skip:
            continue
        if all(x.is_input or id(x) in pure for x in e.tv_inputs()):
            pure.add(id(o))
            inputs.append(o)
    pos = {}
    for tv in reversed(inputs):  # consumers first: a producer is placed at or outside its readers
        p = _hoist_position(tv)
        src = _copy_of_input(tv)
        pair = tv.loop[-1]
        wide = src is not None and vec and vec[fusion.inputs.index(src)] and not pair.is_broadcast
        if wide:
            p = min(p, len(tv.loop) - 1)
        for u in tv.uses:
            if id(u.out) in pos:
                p = min(p, pos[id(u.out)])
        pos[id(tv)] = p
        own = [k for k in range(p, len(tv.loop)) if not tv.loop[k].is_broadcast]
        tv.reorder(list(range(p)) + own + [k for k in range(p, len(tv.loop)) if k not in own])
        tv.inline_at(p)
        if wide and tv.loop[p + len(own) - 1] is pair:
            pair.parallelize(ParallelType.Vectorize)
