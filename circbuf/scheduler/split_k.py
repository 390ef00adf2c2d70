"""Split-K: a matmul with few output tiles (a small M, a large K) run as
partial products over chunks of K, then one reduction.

The plan runs up to three kernels, each an ordinary fusion compiled by the
ordinary schedulers::

    partial  ws[s, m, n]  = sum_{k in chunk s} a[m, k] * b[k, n]      (fp32; S' = S or S - 1 chunks of kc)
    tail     wt[m, n]     = sum_{k in the last chunk} a[m, k] * b[k, n] (fp32; only when S kc != K)
    reduce   c            = cast(sum_s ws[s] (+ wt) (+ bias)); the fusion's epilogue on c

``partial`` is a batched matmul over views of the operands (``a`` [M, K]
seen as [S', M, kc], a stride of kc between batches: no copy); the tensor
cores and their TMA maps read it as they read any batched matmul. ``kc`` is
a whole number of 64-wide k steps (so every view is 16-byte aligned where
the operand is); when S kc != K (S does not divide the k steps, or K is no
multiple of 64), the last split takes the rest (``tail``, a 2-D matmul over
the operand's last columns; with S = 2 the one chunk before it is a 2-D
matmul too). The
workspace is the partial kernels' output: allocated per call through
torch's caching allocator, which hands the same block back call after call.

Deterministic: each element of ``c`` is the sum over s in a fixed order
(the reduction scheduler's own order, the same for every run), so two runs
give the same bits; no atomics anywhere.

The heuristic (:func:`choose`) compares a bandwidth model of the busiest SM
with and without splits: a [64 x bn] tile (M <= 64) or the cooperative
[128 x 256] tile streams ``(rows + bn) x kc`` operand elements; the grid
takes ``ceil(tiles / SMs)`` of them in turn, each SM at the lesser of its
share of the copy bandwidth and its ring's bytes in flight over a loaded
latency (few CTAs each draw more), after a fixed cost per kernel (launch,
the ring's fill, the epilogue: a split must save 15% of the whole); a split adds the workspace
(written and read once, at the copy bandwidth) and a launch. For M <= 64
only B counts: the few rows of A that every CTA reads stay in L2. Only
splits without a tail are chosen (a tail is a second partial launch after
the chunks', not beside them).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import (
    BinaryOp,
    CircbufError,
    DataType,
    Fusion,
    IterDomain,
    IterType,
    ReductionOp,
    TensorView,
    evaluate,
    reduction_init,
)
from ..ir.scalar import free_vars
from .waves import SMALL_M, SMALL_M_STAGES, ceil_div, small_m_bn, tile_count

K_STEP = 64  # elements of K per k step (one 128-byte swizzled row of a 16-bit operand)
MAX_SPLITS = 16  # the heuristic's largest split (the workspace grows with it)
MIN_STEPS = 4  # k steps per split the heuristic keeps (the ring's prologue and drain)
MIN_GAIN = 0.85  # a split must cut the modeled time by 15%: it costs a launch and the workspace
# summed in the kernel, its costs are in the model (FIXUP_S): 5% (H100, 1x4096x4096: 27.7 us
# unsplit, 23.7 split 2 in the kernel, a gain the model puts at 5.5%; 64x4096x4096 23.2 / 23.6)
MIN_GAIN_KERNEL = 0.95
TIE = 0.02  # splits whose modeled times are this close count as equal (the fewest wins)
LAUNCH_S = 3e-6  # the reduction kernel's launch and ramp, seconds
# the in-kernel fix-up on a tile's critical path: the partial's store, the flag's atomic, the
# last CTA reading every chunk back (H200: a one-tile 128x256x512 GEMM took 11.5 us unsplit,
# 14.5 split 2; 1x4096x4096 26.4 unsplit, 20.6 split 2; scripts/probe_split_k.py)
FIXUP_S = 3e-6
# Fit to the unsplit decode kernels (M = 1, N = 4096, 64 CTAs of 64x64 with 96 KB of B in
# flight each) at K = 4096 and 14336 on an H100 and an H200 (`matmul.py --decode --variants`,
# NOTES 2026-11-26): 27.7 and 72 us, i.e. a fixed ~10 us (launch, the ring's fill, the
# epilogue) plus the weight streamed at ~30 GB/s per CTA: 96 KB / 30 GB/s = 3.2 us. (The first
# fit, 2.4 us and no fixed cost, from 16 CTAs of 128x256 on an H200, split no decode shape on an
# H100, where split 2 measured 14% faster at 1x4096x14336.)
LOADED_LATENCY_S = 3.2e-6
KERNEL_FIXED_S = 10e-6
RING_RESERVED = 1024 + 32768  # shared memory beside the ring: barriers, the output staging


@dataclass(frozen=True)
class SplitK:
    """How one call splits K: ``splits`` chunks; the first ``batched`` of
    ``chunk`` elements each run as one batched matmul, the rest (``tail``
    elements, 0 when none) as a second one. ``kind``: the contraction
    ("matmul": b is [K, N]; "linear": b is [N, K]); ``a``, ``b``: the
    operands' positions among the fusion's inputs."""

    splits: int
    chunk: int
    tail: int
    kind: str
    a: int
    b: int
    in_kernel: bool = False  # summed by the GEMM kernel's last CTA per tile (no reduction launch)

    @property
    def batched(self) -> int:
        return self.splits - (1 if self.tail else 0)

    def __str__(self):
        if self.in_kernel:
            return f"split-K {self.splits} in the kernel: the last CTA of a tile sums the partials in chunk order"
        tail = f" + a tail of {self.tail}" if self.tail else ""
        return f"split-K {self.splits}: {self.batched} chunks of {self.chunk}{tail}, deterministic fp32 reduction"


def _kernel_why_not(fusion: Fusion, info, overrides: dict) -> str | None:
    """Why the GEMM kernel cannot sum this fusion's split-K partials itself
    (None: it can). It needs the persistent TMA-fed kernel with its epilogue
    inline (each CTA's tile loop holds the fix-up) and outputs stored only
    by that epilogue."""
    from .. import knobs
    from .matmul_path import _operand_fill, _operands
    from .utils import contractions

    if overrides.get("split_k_sum") == "reduction":
        return "split_k_sum='reduction' asks for a reduction kernel"
    if overrides.get("persistent", True) is not True:
        return "a non-persistent grid"
    if overrides.get("epilogue", "inline") != "inline":
        return "an epilogue role"
    if tuple(overrides.get("cluster", knobs.matmul_cluster())) != (1, 1):
        return "a thread-block cluster"
    if overrides.get("fill") == "cp.async":
        return "a cp.async operand fill"
    a, b, _ = _operands(contractions(fusion)[0])
    for x in (a, b):
        if x not in fusion.inputs:
            return f"operand {x.name} is computed in the fusion"
        if _operand_fill(info.tensors[fusion.inputs.index(x)])[0] != "tma":
            return f"operand {x.name} is not filled by TMA"
    if any(o.peer_store is not None for o in fusion.outputs):
        return "an output stored to peer GPUs"
    return None


def _why_not(fusion: Fusion, info) -> str | None:
    """Why this fusion's K cannot be split at all (None: it can)."""
    from .matmul import MatmulScheduler
    from .matmul_path import _mma_unsupported
    from .matmul_reduce import tile_outputs
    from .utils import contractions

    why = MatmulScheduler.can_schedule(fusion)
    if why is not None:
        return why
    why = _mma_unsupported(fusion, contractions(fusion)[0], info)
    if why is not None:
        return f"the matmul runs on the SIMT path ({why})"
    if len(tile_outputs(fusion)) < len(fusion.outputs):
        return "a row reduction's partials are computed in the epilogue (each K chunk would hold only a part)"
    return None


def _reduction_why_not(fusion: Fusion) -> str | None:
    """Why the partials cannot go through a reduction kernel (None: they can):
    its steps take views of 2-D operands read by the matmul alone, and the
    fusion's outputs as the reduction writes them."""
    from .matmul_path import _operands
    from .utils import contractions

    e = contractions(fusion)[0]
    a, b, _ = _operands(e)
    if a.ndim != 2 or b.ndim != 2:
        return (
            f"operands {a.name} and {b.name} are {a.ndim}-D and {b.ndim}-D (split-K through a reduction "
            "kernel takes 2-D operands)"
        )
    for x in (a, b):
        if any(u is not e for u in x.uses) or x in fusion.outputs:
            return f"operand {x.name} is read by more than the matmul"
    if fusion.aliases or fusion.input_views or fusion.derived_extents:
        return "the fusion writes an input in place, returns a view or derives sizes"
    if any(kind != "output" for kind, _ in fusion.returns):
        return "the fusion returns an input"
    return None


def _model(
    m: int, n: int, k: int, splits: int, itemsize: int, target, in_kernel: bool = False, batch: int = 1
) -> float:
    """Modeled seconds of the busiest SM streaming its tiles' operands, plus
    the workspace and the launch a split adds (``in_kernel``: no launch; the
    partials are whole tiles, padded rows too). An SM streams at the lesser of
    its share of the copy bandwidth among the CTAs running and what its ring
    keeps in flight over LOADED_LATENCY."""
    sms = target.sm_count
    small = m <= SMALL_M
    if small:
        bm, bn = 64, small_m_bn(m, n, batch * splits, sms)
    else:
        bm, bn = 128, (256 if n > 128 else 128)
    tiles = tile_count(m, n, batch * splits, bm, bn)
    kc = ceil_div(ceil_div(k, K_STEP), splits) * K_STEP
    # a small M's A (every CTA reads the same few rows) comes from L2: B alone is streamed
    rows = 0 if small else bm
    stage = (bm + bn) * K_STEP * itemsize
    stages = min((target.smem_per_block - RING_RESERVED) // stage, SMALL_M_STAGES if small else 7)
    in_flight = stages * (rows + bn) * K_STEP * itemsize
    rate = min(target.copy_bandwidth / min(tiles, sms), in_flight / LOADED_LATENCY_S)
    t = KERNEL_FIXED_S + ceil_div(tiles, sms) * (rows + bn) * kc * itemsize / rate
    if splits > 1 and in_kernel:
        ws = tiles * bm * bn * 4  # every chunk's partial tile, written once and read once
        t += 2 * ws / target.copy_bandwidth + FIXUP_S
    elif splits > 1:
        ws = splits * m * n * 4
        t += (2 * ws + m * n * itemsize) / target.copy_bandwidth + LAUNCH_S
    return t


def heuristic_splits(
    m: int, n: int, k: int, itemsize: int, target, in_kernel: bool = False, batch: int = 1
) -> int:
    """The heuristic's number of K splits for ``batch`` [m x n x k] matmuls (1:
    none); ``in_kernel``: the GEMM kernel sums the partials (no reduction launch)."""
    times = {1: _model(m, n, k, 1, itemsize, target, batch=batch)}
    steps = ceil_div(k, K_STEP)
    for s in range(2, MAX_SPLITS + 1):
        # the reduction kernel's splits have no tail (a tail is a second launch after the
        # chunks'); in the kernel, chunks of ceil(steps / S) k steps, the last ones shorter
        whole = k % (s * K_STEP) == 0
        if (whole or in_kernel) and steps // s >= MIN_STEPS:
            times[s] = _model(m, n, k, s, itemsize, target, in_kernel, batch)
    fastest = min(times.values())
    # the fewest splits within TIE of the fastest: a smaller workspace, longer k loops
    splits = min(s for s, t in times.items() if t <= fastest * (1 + TIE))
    if splits == 1 or times[splits] > (MIN_GAIN_KERNEL if in_kernel else MIN_GAIN) * times[1]:
        return 1
    return splits


def choose(fusion: Fusion, info, overrides: dict) -> SplitK | None:
    """The split of K for these inputs: ``overrides["split_k"]`` (validated:
    a CircbufError names what rules it out) or the heuristic's; None: no split."""
    from .matmul_path import _operands
    from .utils import contractions

    asked = overrides.get("split_k")
    if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
        raise CircbufError(f"schedule(split_k={asked!r}): must be an int >= 1")
    if asked == 1:
        return None
    cs = contractions(fusion)
    if len(cs) != 1:
        return None
    from .matmul import MatmulScheduler

    if MatmulScheduler.can_schedule(fusion) is not None:
        return None  # segmented: the matmul's segment takes split_k (and names why it cannot)
    # what rules out any split first (the SIMT path, a row reduction's partials), then
    # whether the kernel can sum them, else what the reduction kernel's split needs
    why = _why_not(fusion, info)
    why_kernel = None if why is not None else _kernel_why_not(fusion, info, overrides)
    if why_kernel is not None:
        why = _reduction_why_not(fusion)
    if why is not None:
        if asked is not None and not why.startswith("the matmul runs on the SIMT path"):
            # (on the SIMT path the matmul scheduler names every override it cannot take)
            raise CircbufError(f"schedule(split_k={asked}): {why}")
        return None
    e = cs[0]
    a, b, _ = _operands(e)
    env = info.extents
    m = evaluate(e.out.logical[-2].extent, env)
    n = evaluate(e.out.logical[-1].extent, env)
    k = evaluate(a.logical[-1].extent, env)
    batch = 1
    for i in e.out.logical[:-2]:
        batch *= evaluate(i.loop_extent, env)
    steps = ceil_div(k, K_STEP)
    kind = "matmul" if type(e).__name__ == "MatmulOp" else "linear"
    if asked is not None:
        if asked > steps:
            raise CircbufError(
                f"schedule(split_k={asked}): K = {k} is {steps} k step{'s' * (steps > 1)} of {K_STEP}; "
                f"split_k must be at most {steps} (each split takes at least one step)"
            )
        splits = asked
    if asked is None:
        splits = heuristic_splits(
            m, n, k, a.dtype.size, info.target, in_kernel=why_kernel is None, batch=batch
        )
        if splits == 1:
            return None
    ins = fusion.inputs
    if why_kernel is None:  # chunks of ceil(steps / S) k steps, the last one zero-filled past K
        chunk = ceil_div(steps, splits) * K_STEP
        return SplitK(splits, chunk, 0, kind, ins.index(a), ins.index(b), in_kernel=True)
    if overrides.get("split_k_sum") == "kernel":
        raise CircbufError(
            f"schedule(split_k_sum='kernel'): the GEMM kernel cannot sum the partials here ({why_kernel})"
        )
    chunk = steps // splits * K_STEP
    rest = k - (splits - 1) * chunk
    tail = 0 if rest == chunk else rest
    return SplitK(splits, chunk, tail, kind, ins.index(a), ins.index(b))


def reduce_fusion(fusion: Fusion, tail: bool) -> tuple[Fusion, list]:
    """The fusion with its matmul replaced by the sum of the partial
    products: ``c = cast(sum(ws, 0) (+ wt) (+ bias))``, then the epilogue
    as defined. Returns it and, per its input, where that comes from:
    ``("ws",)``, ``("tail",)`` or ``("input", j)`` (the original's input j).
    ``ws`` [S', *c's shape] and (with ``tail``) ``wt`` [*c's shape] are fp32 inputs."""
    from .matmul import _add_bias, _detach, _finish_fp32, _new
    from .matmul_path import _operands
    from .utils import contractions

    f = fusion.clone()
    f.schedule_overrides = {}
    f.check_overrides = None
    e = contractions(f)[0]
    a, b, bias = _operands(e)
    c = e.out
    _detach(e)
    shape = c.domain.no_reductions()

    def fp32_input(lead):
        ids = ([IterDomain(f.new_extent())] if lead else []) + [IterDomain(i.extent) for i in shape]
        t = f.register(TensorView(ids, DataType.Float))
        t.is_input = True
        return t

    ws = fp32_input(True)
    red = _new(f, [IterDomain(i.extent) for i in ws.logical], DataType.Float)
    red.logical[0].iter_type = IterType.Reduction
    red.domain.loop = list(red.logical)
    ReductionOp("sum", red, ws, reduction_init("sum", DataType.Float))
    val, sources = red, [ws]
    if tail:  # added after the batched chunks' sum: one order for every run
        wt = fp32_input(False)
        val = _new(f, [IterDomain(i.extent) for i in shape], DataType.Float)
        BinaryOp("add", val, red, wt)
        sources.append(wt)
    if bias is not None:
        val = _add_bias(f, val, bias, DataType.Float)
    _finish_fp32(f, c, val)  # as the MMA path's epilogue: math on the fp32 sum, not on c rounded
    where = {id(ws): ("ws",)}
    if tail:
        where[id(sources[1])] = ("tail",)
    for j, x in enumerate(f.inputs):
        where[id(x)] = ("input", j)
    f.inputs = sources + [x for x in f.inputs if x is not a and x is not b]
    for x in (a, b):
        if x in f.tvs:
            f.tvs.remove(x)
    bound = {x.name for x in f.inputs if not isinstance(x, TensorView)}
    for x in f.inputs:
        if isinstance(x, TensorView):
            for i in x.logical:
                bound |= set(free_vars(i.extent))
    # (a's K = b's K went with them)
    f.extent_equalities = [
        (p, q) for p, q in f.extent_equalities if set(free_vars(p)) | set(free_vars(q)) <= bound
    ]
    return f, [where[id(x)] for x in f.inputs]
