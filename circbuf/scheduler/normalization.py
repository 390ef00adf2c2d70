"""Normalization scheduler: inner-persistent softmax / layer_norm / rms_norm
(any fusion whose reductions reduce the innermost axes), the whole row in one CTA.

Every tensor after scheduling (I = rows, R = row length; G = grid)::

    [iS{ceilDiv(ceilDiv(I, Y), G)}, iblockIdx.x{G}, ithreadIdx.y{Y},      <- row loop, row position 3
     rS{ceilDiv(R, T*V)}, rthreadIdx.x{T}, rV{V}]                         <- a row pass

Two ways to bring the rows in (``NormalizationParams.staging``):

``registers`` (the default wherever a row fits in registers, <= 32 elements per
thread): each input row is read once from global memory with 16-byte loads into a
register copy that every pass reads (vectors of 16 bytes of the widest input dtype); G = ceilDiv(I, Y), one row block per CTA, and
the hardware overlaps the loads of the CTAs resident on an SM. __launch_bounds__ asks
for enough CTAs per SM to keep row_bytes_in_flight(target) of rows loading (48 KB on an H100)::

    x_l[iS{1}, iblockIdx.x{G}, ithreadIdx.y{Y}, iS{R/(T*V)}, ithreadIdx.x{T}, iV{V}] ca_pos(3)

``tma`` (longer rows, or asked for: staging="tma", stages=, prefetch=, war=,
warp_specialized=): a
persistent grid; the TMA buffer of each input row block (loaded once, read by every
pass)::

    Ts_s[iS{row loop}, iblockIdx.x{G}, iS{ceilDiv(R, B)}, iB{Y}, iB{B}] ca_pos(2)
        circular_buffer(stages)

so ``row loop`` is the circular-buffer loop: while a CTA reduces and writes
rows ``i``, the copies for rows ``i + prefetch`` are in flight. Each pass
reads the rows from shared memory with 16-byte vector loads (or once into
registers). Reductions are warp shuffles + a shared-memory step per row
(threadIdx.y). Inputs a tensor map cannot describe (16-byte loads could not
follow them either), rows too long for shared memory, and ``tma=False`` go to the
plain reduction scheduler.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import (
    BroadcastOp,
    CircbufError,
    Const,
    Fusion,
    LoadStoreOp,
    MemoryType,
    ParallelType,
    ReductionOp,
    ReshapeOp,
    SqueezeOp,
    Var,
    evaluate,
)
from ..target import H100, Target
from .info import InputInfo
from .overrides import NORMALIZATION, Declined, names, ring
from .params import NormalizationParams
from .reduction import _can_schedule, _is_inner, _one_axes, _reductions
from .utils import (
    LogicalMap,
    aligned,
    cache_output,
    concretize_broadcasts,
    full_shape_inputs,
    hoist_broadcasts,
    inline_intermediates,
    once_per_row,
    output_vectorizable,
    propagate,
    recompute_multi_use,
    specialize_extent,
    tma_describable,
    tma_ring,
)

OVERRIDES = names(NORMALIZATION)
MAX_REGISTER_ROW = 32  # row elements a thread keeps in registers (64 spilled at 512 threads)
SMEM_BUDGET = 200 * 1024  # leave room for reduction scratch and barriers
MAX_BOX = 256


class NormalizationScheduler:
    name = "normalization"
    # deprecated override names (one release): ``registers`` read like setmaxnreg counts
    renamed = {"registers": "rows_in_registers"}

    @staticmethod
    def can_schedule(fusion: Fusion) -> str | None:
        why, lmap = _can_schedule(fusion)
        if why:
            return why
        ref = _reductions(fusion)[0]
        # the row transforms take the last axis for the row ([I..., R]), even where
        # axes of one element after it would leave the reduction inner
        if not _is_inner(fusion, ref, lmap) or not ref.logical[-1].is_reduction:
            return "reductions are not over the innermost axes"
        return _rows_dropped(fusion, ref, lmap)

    @staticmethod
    def variant(params) -> str:
        return params.staging

    @staticmethod
    def if_spilled(params, overrides: dict, target: Target):
        """The params to compile instead when ptxas put some of the kernel of
        ``params`` in local memory, or None to keep it: a register-staged
        kernel capped below MIN_REGISTER_CAP for more CTAs per SM takes one CTA
        fewer (an asked ``blocks_per_sm`` is kept as asked).

        >>> # 5 CTAs of 256 threads (48 registers) spilled: 4 (64 registers)
        """
        b = params.blocks_per_sm
        if params.staging != "registers" or "blocks_per_sm" in overrides or b <= 1:
            return None
        if target.registers_at(params.threads * params.rows * b) >= MIN_REGISTER_CAP:
            return None
        return replace(params, blocks_per_sm=b - 1)

    @staticmethod
    def compute_params(fusion: Fusion, info: InputInfo, overrides: dict):
        """Params, or Declined to hand the fusion to the plain reduction scheduler (an error
        naming why instead when a ``staging`` was asked for). Values were checked against
        :data:`.overrides.NORMALIZATION`; the rules that depend on the inputs are here."""
        if overrides.get("tma", True) is False:
            return _decline(overrides, "tma=False asks for the plain reduction kernel")
        ref = _reductions(fusion)[0]
        n_red = sum(i.is_reduction for i in ref.logical)
        rows_dims = len(ref.logical) - n_red
        if rows_dims == 0 or n_red != 1:
            return _decline(overrides, "rows and one reduced innermost axis are needed")
        R = evaluate([i for i in ref.logical if i.is_reduction][0].extent, info.extents)
        rows = 1
        for i in ref.logical:
            if not i.is_reduction:
                rows *= evaluate(i.extent, info.extents)
        if R == 0:  # a TMA box of 0 columns, a register row of none: the plain kernel writes the init values
            return _decline(overrides, "nothing to stage (rows of no element)")
        lmap = LogicalMap(fusion)
        cands = full_shape_inputs(fusion, ref, lmap)
        if not cands:
            return _decline(overrides, "no input has the rows' full shape")
        item = max(fusion.inputs[k].dtype.size for k in cands)
        for k in cands:
            why = tma_describable(info.tensors[k], rows_dims)
            if why:  # both stagings read rows in 16-byte pieces: a tensor map's rules are theirs
                return _decline(overrides, f"input {k}: {why}")
        vec = 16 // item
        box = MAX_BOX if R >= MAX_BOX else R
        if (box * item) % 16:
            return _decline(overrides, f"a row of {R} x {item} bytes is not a multiple of 16 bytes")
        padded = -(-R // box) * box
        gpu = info.target
        max_cta = gpu.max_threads_per_block
        threads = overrides.get("threads")
        if threads is None:
            threads = 32
            # up to 1024 threads: a row of 32768 bf16 elements is 32 per thread, held in registers
            # (layer_norm there spills 16 bytes at the 64-register cap and still runs at 0.78 of
            # copy against 0.50 at 512 threads re-reading shared memory, H100); warp
            # specialization adds a producer row of as many threads, so it stops at 512
            most = max_cta // 2 if overrides.get("warp_specialized") else max_cta
            while threads < most and threads * vec * 4 < R:
                threads *= 2
        y = overrides.get("rows")
        if y is None:
            y = 1
            spare = threads if overrides.get("warp_specialized") else 0  # the producer row
            while (
                y * 2 * threads + spare <= max_cta
                and y * 2 * padded * item <= 16384
                and y * 2 <= 16
                and y < rows
            ):
                y *= 2
        producer = threads if overrides.get("warp_specialized") else 0
        if threads * y + producer > max_cta:
            raise CircbufError(
                f"schedule(rows={y}, threads={threads}): {threads * y + producer} threads per CTA "
                f"exceed {max_cta}"
            )
        per_thread = -(-R // (threads * vec)) * vec  # row elements each thread holds
        # a row kept in registers is compiled for its length: an extent the kernel
        # computes (a reshape's) cannot be specialized
        r_ext = [i for i in ref.logical if i.is_reduction][0].extent
        in_regs = overrides.get(
            "rows_in_registers", per_thread <= MAX_REGISTER_ROW and isinstance(r_ext, (Var, Const))
        )
        vin = []
        for t in info.tensors:
            ok = (
                t is not None
                and R % vec == 0
                and vec * t.itemsize <= 16  # an fp32 weight next to bf16 rows: 8 floats are 32 bytes
                and t.align % 16 == 0
                and t.sizes
                and t.strides[-1] == 1
            )
            vin.append(bool(ok))
        staging = overrides.get("staging")
        # the TMA ring's names, given a value other than their default, ask for the ring
        ring_defaults = {"war": "block_sync", "warp_specialized": False}
        asks_tma = [
            k
            for k in ("stages", "prefetch", "war", "warp_specialized")
            if k in overrides and (k not in ring_defaults or overrides[k] != ring_defaults[k])
        ]
        if staging is None:
            # a row held in registers is loaded straight into them: measured on H100 (issue 10,
            # benchmarks/normalization.py) 0.85-0.98 of copy on the 21 listed bf16 shapes, each
            # faster than through the TMA ring (0.78-0.93), whose persistent pipeline keeps
            # fewer bytes in flight per SM
            staging = "registers" if in_regs and not asks_tma and all(vin[k] for k in cands) else "tma"
        common = dict(  # the fields both stagings set alike
            threads=threads,
            vectorize=vec,
            vectorize_inputs=tuple(vin),
            vectorize_outputs=_vectorize_outputs(fusion, info, lmap, ref, R, vec),
        )
        if staging == "registers":
            why = None
            if not in_regs:
                why = f"a row of {R} is not held in registers ({per_thread} elements per thread)"
            elif asks_tma:
                why = f"{', '.join(asks_tma)} describe the TMA ring"
            elif not all(vin[k] for k in cands):
                why = "the rows cannot be read in vectors"
            if why:
                raise CircbufError(f"schedule(staging='registers'): {why}")
            if "rows" not in overrides:
                # CTAs of <= 256 threads: rows of 512 as 8 per CTA, not 16 (H100, --variants:
                # +0.2-2%, more CTAs per SM under the same 64-register cap)
                while y > 1 and y * threads > 256:
                    y //= 2
            blocks = -(-rows // y)  # one row block per CTA
            cta_bytes = y * R * sum(fusion.inputs[k].dtype.size for k in cands)
            return NormalizationParams(
                staging="registers",
                rows=y,
                stages=1,
                prefetch=0,
                grid=max(1, blocks),
                blocks_per_sm=_register_bound(overrides, threads * y, cta_bytes, gpu, blocks),
                row_length=R,
                **common,
            )
        # measured on H200 (benchmarks/normalization.py --sweep): a third stage pays
        # once a stage holds >= 16 KB when passes re-read the stage, >= 32 KB when
        # the row is copied to registers at once (the stage is freed early)
        stage_bytes = y * padded * item * len(cands)
        stages = overrides.get("stages", 3 if stage_bytes >= (32768 if in_regs else 16384) else 2)
        prefetch = overrides.get("prefetch", stages - 1)
        ring(stages, prefetch, overrides)
        if stages * stage_bytes > min(SMEM_BUDGET, gpu.smem_per_block - 8192):
            if "stages" in overrides:
                raise CircbufError(
                    f"schedule(stages={stages}): {stages} x {stage_bytes} bytes of row buffers exceed shared memory"
                )
            return _decline(overrides, f"{stages} x {stage_bytes} bytes of row buffers exceed shared memory")
        # CTAs per SM (measured on H100, issue 10, benchmarks/normalization.py --variants):
        # one CTA leaves its reduction barriers and row hand-offs unhidden (softmax 8192x16384
        # 0.70 of copy at 1, 0.91 at 2); CTAs of <= 256 threads run best at 3 (rows of 1024,
        # 4096, 5000 columns: +1-8% over 2), when the register cap of 3 (>= 80) leaves
        # ~40 registers beyond a row held in registers; 4 spill. __launch_bounds__ caps the
        # registers so that the whole grid is resident.
        cta = threads * y
        cap3 = gpu.registers_at(3 * cta)  # registers per thread at 3 CTAs per SM
        want = 3 if cta <= 256 and cap3 >= (per_thread if in_regs else 24) + 40 else 2
        fit = gpu.smem_per_sm // (stages * stage_bytes + 2048)  # CTAs whose row buffers fit an SM
        per_sm = max(1, min(want, fit, gpu.max_threads_per_sm // cta))
        bound = per_sm
        if "blocks_per_sm" in overrides:
            per_sm = bound = _blocks_override(overrides["blocks_per_sm"], threads * y, gpu)
            if per_sm * (stages * stage_bytes + 2048) > gpu.smem_per_sm:
                raise CircbufError(
                    f"schedule(blocks_per_sm={per_sm}): {per_sm} x {stages} x {stage_bytes} bytes of row buffers "
                    "exceed an SM's shared memory"
                )
        grid = max(1, min(-(-rows // y), gpu.sm_count * per_sm))
        if grid < gpu.sm_count * per_sm and "blocks_per_sm" not in overrides:
            bound = 0  # fewer row blocks than CTA slots: no register cap needed
        return NormalizationParams(
            staging="tma",
            rows=y,
            box_cols=box,
            stages=stages,
            prefetch=prefetch,
            grid=grid,
            blocks_per_sm=bound,
            war=overrides.get("war", "block_sync"),
            warp_specialized=bool(overrides.get("warp_specialized", False)),
            row_length=R if in_regs else 0,
            **common,
        )

    @staticmethod
    def schedule(fusion: Fusion, params: NormalizationParams):
        hoist_broadcasts(fusion)
        # __launch_bounds__(threads, blocks_per_sm): registers capped so that that many CTAs fit
        fusion.launch_min_blocks = 0 if params.warp_specialized else params.blocks_per_sm
        ref0 = _reductions(fusion)[0]
        if params.row_length:
            ext = [i for i in ref0.logical if i.is_reduction][0].extent
            if hasattr(ext, "name"):
                specialize_extent(fusion, ext.name, params.row_length)
        cands = full_shape_inputs(fusion, ref0, LogicalMap(fusion))
        smem = []
        for k in cands:
            x = fusion.inputs[k]
            if params.staging == "registers":
                smem.append((None, x.cache_after()))  # registers, 16-byte loads from global memory
                continue
            xs = x.cache_after(op="tma")
            xl = xs.cache_after()  # registers, 16-byte vector reads of shared memory
            smem.append((xs, xl))
        outs = []
        for k, o in enumerate(fusion.outputs):
            outs.append((o, cache_output(fusion, o), params.vectorize_outputs[k]))
        lmap = LogicalMap(fusion)
        ref = _reductions(fusion)[0]
        row_scalar = once_per_row(lmap, ref)

        shared = {id(xs) for xs, _ in smem if xs is not None}
        if params.row_length:  # the register copy of the row is made once and read by every pass
            shared |= {id(xl) for _, xl in smem}
        recompute_multi_use(
            fusion,
            keep=lambda tv: id(tv) in shared or isinstance(tv.definition, ReductionOp) or row_scalar(tv),
            lmap=lmap,
        )
        lmap = LogicalMap(fusion)
        concretize_broadcasts(fusion, lmap)

        _row_transforms(ref, params)
        ref.split(3, params.vectorize)  # [.., R/V, V]
        ref.split(3, params.threads)  # [.., R/V/T, T, V]
        ref.axis(1).parallelize(ParallelType.BIDx)
        ref.axis(2).parallelize(ParallelType.TIDy)
        ref.axis(4).parallelize(ParallelType.TIDx)
        propagate(ref, fusion.used_tvs(), lmap)

        inline_intermediates(fusion, 3, row_scalar)
        for xs, _ in smem:
            if xs is None:
                continue

            def box(t):
                _row_transforms(t, params)
                t.split(3, params.box_cols)  # [row_iter, G, Y, R/B, B]
                t.reorder([0, 1, 3, 2, 4])  # [row_iter, G, R/B, Y, B]

            tma_ring(xs, box, 1, params)
        # 16-byte register copies: shared -> registers, broadcast inputs, output stores
        for tv in fusion.used_tvs():
            d = tv.definition
            if tv.is_input or d is None or len(tv.loop) != 6:
                continue
            src = d.inputs[0] if d.inputs else None
            if isinstance(d, LoadStoreOp) and getattr(src, "memory_type", None) == MemoryType.Shared:
                tv.inline_at(5)
                tv.axis(5).parallelize(ParallelType.Vectorize)
            elif isinstance(d, BroadcastOp) and getattr(src, "is_input", False):
                k = fusion.inputs.index(src)
                # a weight along the row (its one axis is the row's last), read 16 bytes at a time
                if params.vectorize_inputs[k] and src.ndim == 1 and not tv.logical[-1].is_broadcast:
                    tv.inline_at(5)
                    tv.axis(5).parallelize(ParallelType.Vectorize)
        for o, c, vec in outs:
            # a full row, stored in vectors; a value per row kept at its row's
            # size-1 axis (sum(..., keepdim=True) / n) stays at the row loops
            if len(o.loop) == 6 and not isinstance(c.definition, ReductionOp) and not row_scalar(c):
                c.inline_at(5)
                if vec:
                    o.axis(5).parallelize(ParallelType.Vectorize)
        if params.row_length:  # one 16-byte read per chunk of the row into registers, kept for every pass
            for _, xl in smem:
                xl.inline_at(3)
                xl.axis(5).parallelize(ParallelType.Vectorize)


def _rows_dropped(fusion, ref, lmap) -> str | None:
    """Why the row loops cannot be every tensor's first loops, or None: each
    row axis has one element (a [1, R] softmax) and a squeeze or reshape
    leaves a tensor of full rows without any of them (its loops would start at
    the row pass, ``[row_iter, G, Y]`` missing). The plain reduction kernel
    puts such rows innermost."""
    row_axes = [(i, one) for i, one in zip(ref.logical, _one_axes(fusion, ref, lmap)) if not i.is_reduction]
    if any(not one for _, one in row_axes):
        return None
    rows = {lmap.find(i) for i, _ in row_axes}
    row_scalar = once_per_row(lmap, ref)
    for e in fusion.exprs():
        if not isinstance(e, (SqueezeOp, ReshapeOp)):
            continue
        had = any(lmap.find(i) in rows for i in e.inputs[0].logical)
        if had and not row_scalar(e.out) and not any(lmap.find(i) in rows for i in e.out.logical):
            return f"{e} drops every row axis (each of extent 1) from rows of {e.inputs[0].name}"
    return None


def _vectorize_outputs(fusion, info, lmap, ref, R, vec):
    """Per output: stored in 16-byte vectors (a full row, aligned, contiguous)."""
    return tuple(
        R % vec == 0
        and vec * o.dtype.size <= 16  # an fp32 output of bf16 rows cannot take 8-element (32-byte) stores
        and o.ndim == len(ref.logical)  # a full row, not a reduction's result
        and aligned(lmap, o, ref)
        and output_vectorizable(fusion, info, k, o.ndim - 1, vec)
        for k, o in enumerate(fusion.outputs)
    )


# Bytes of rows in flight per SM that hide HBM latency when each CTA loads its rows
# straight into registers (H100, issue 10 --variants, one row block per CTA): 30 KB ->
# 0.76 of copy (layer_norm 10000x5000, 3 CTAs of 10 KB), 32 KB -> 0.77 (layer_norm
# 8192x16384, 1 CTA), 48 KB -> 0.98 (layer_norm 32768x4096, 3 CTAs of 16 KB), 50 KB ->
# 0.92, 64 KB -> 0.97-0.98.
H100_ROW_BYTES_IN_FLIGHT = 48 * 1024
# Little's law: bytes in flight per SM = bandwidth per SM x latency. The H100's 48 KB at its
# measured 3.0 TB/s / 132 SMs (22.7 GB/s per SM) is an effective latency of 2.16 us (DRAM
# latency plus each CTA's issue and reduction time); another GPU needs its own bandwidth per
# SM x that latency: the H200 (4.2 TB/s, same SMs and latency) 67 KB.
ROW_LATENCY_S = H100_ROW_BYTES_IN_FLIGHT / H100.bandwidth_per_sm


def row_bytes_in_flight(target: Target) -> int:
    """Bytes of rows per SM the register-staged kernel keeps loading on ``target``
    (exactly H100_ROW_BYTES_IN_FLIGHT on the H100)."""
    return target.bytes_in_flight(ROW_LATENCY_S)


MIN_REGISTER_CAP = 64  # below it, layer_norm at 5000 columns spills 64+ bytes
# A register cap the scheduler may try for more CTAs per SM (5 of 256 threads: 48 registers),
# keeping it only where ptxas fits the kernel without local memory (``if_spilled``): measured
# on an H200 (--variants, 5 vs 4 CTAs), softmax 10000x5000 0.726 -> 0.795 of copy, layer_norm
# 16384x6144 0.865 -> 0.922, 131072x512 0.825 -> 0.883; layer_norm 10000x5000 spills there
# (0.693 -> 0.341) and keeps 4.
TRY_REGISTER_CAP = 48


def _decline(overrides, why):
    """Declined (the plain reduction kernel takes the fusion), or an error naming why when a
    staging was asked for: an override is never dropped silently (the registry raises for
    any other that the plain kernel does not use)."""
    if "staging" in overrides:
        raise CircbufError(f"schedule(staging={overrides['staging']!r}): {why}")
    return Declined(why)


def _blocks_override(b, cta, target):
    """The ``blocks_per_sm`` override, checked: CTAs per SM of ``cta`` threads."""
    most = target.max_threads_per_sm
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b * cta <= most:
        raise CircbufError(f"schedule(blocks_per_sm={b!r}): {cta} threads per CTA allow 1 to {most // cta}")
    return b


def _register_bound(overrides, cta, cta_bytes, target, grid):
    """CTAs per SM for __launch_bounds__ of the register-staged kernel: enough for
    row_bytes_in_flight(target), as many as a TRY_REGISTER_CAP cap allows (the compile
    driver takes one fewer where ptxas spills there: ``if_spilled``), no more than the
    grid fills, down to what a MIN_REGISTER_CAP cap allows; 0 (no cap) when the grid
    does not fill the SMs even then."""
    if "blocks_per_sm" in overrides:
        return _blocks_override(overrides["blocks_per_sm"], cta, target)
    want = -(-row_bytes_in_flight(target) // cta_bytes)
    most = min(want, target.max_threads_per_sm // cta)
    b = min(most, target.registers_per_sm // (TRY_REGISTER_CAP * cta))
    floor = min(most, target.registers_per_sm // (MIN_REGISTER_CAP * cta))
    while b > floor and grid < target.sm_count * b:  # the most CTAs the grid fills, down to the
        b -= 1  # count a 64-register cap gives (a grid of 4.5 SMs' worth of row blocks: 4)
    return b if b >= 1 and grid >= target.sm_count * b else 0


def _row_transforms(tv, params):
    """[I..., R] -> [row_iter, G, Y, R]: rows flattened, Y rows at a time,
    a grid-stride loop over row blocks."""
    n_rows = len(tv.loop) - 1
    for _ in range(n_rows - 1):
        tv.merge(0)
    tv.split(0, params.rows)  # [I/Y, Y, R]
    tv.split(0, params.grid)  # [I/Y/G, G, Y, R]
