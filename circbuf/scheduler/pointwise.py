"""Pointwise scheduler: flatten, vectorize 16 bytes when the inputs allow it,
unroll, one element group per thread.

Loop domain of every tensor after scheduling::

    [iblockIdx.x{ceilDiv(N, V*T*U)}, ithreadIdx.x{T}, iUR{U}, iV{V}]

Inputs with the reference's full shape are cached in registers (vectorized
loads when their strides and pointer allow), outputs are computed into a
register cache and stored vectorized; intermediates are inlined.

Where an input is broadcast against the output (a bias, a row scale
``[M, 1]``, an outer product), the flattened index costs a 64-bit division
and remainder per element to find its row and column (0.31-0.72 of the copy
bandwidth on an H200, 0.37-0.70x a static torch.compile): such fusions are
scheduled as rows and columns instead, the innermost axis in memory apart
from the others merged::

    [iblockIdx.x{ceilDiv(O, U*Ty)}, iblockIdx.y{ceilDiv(I, V*Tx)}, ithreadIdx.y{Ty},
     ithreadIdx.x{Tx}, iUR{U}, iV{V}]

a row's index and a column's come from the block and thread indices, an
input broadcast along the rows (defined ``[1, N]``) is cached and loaded in
vectors like a full one (a 1-D ``[N]`` broadcast in the fusion is read
element by element), and one broadcast along the columns once per row.
"""

from __future__ import annotations

from ..ir import (
    CircbufError,
    Fusion,
    ParallelType,
    ReductionOp,
    TensorView,
)
from ..ir.scalar import is_const
from .info import InputInfo
from .overrides import POINTWISE, names
from .params import PointwiseParams
from .utils import (
    LogicalMap,
    aligned,
    cache_output,
    concretize_broadcasts,
    contractions,
    hoist_broadcasts,
    inline_intermediates,
    output_vectorizable,
    propagate,
    required_ones,
    unmapped_axis,
    vector_access,
    view_self_mapping,
)

OVERRIDES = names(POINTWISE)
MAX_VECTOR_BYTES = 16


class PointwiseScheduler:
    name = "pointwise"

    @staticmethod
    def can_schedule(fusion: Fusion) -> str | None:
        """None when this scheduler applies, else the reason it does not."""
        if any(isinstance(e, ReductionOp) for e in fusion.exprs()):
            return "fusion has reductions"
        if contractions(fusion):
            return "fusion has a matmul"
        if not fusion.outputs:
            return "fusion has no outputs"
        ranks = {o.ndim for o in fusion.outputs}
        if len(ranks) != 1:
            return f"outputs have different ranks {sorted(ranks)}"
        if 0 in ranks:  # 0-dim math (``x + 1`` of a 0-dim x): one thread computes it
            return None
        lmap = LogicalMap(fusion)
        return (
            view_self_mapping(fusion, lmap)
            or unmapped_axis(fusion, [PointwiseScheduler.reference(fusion)], lmap)
            or _unrelated_output(fusion)
        )

    @staticmethod
    def variant(params) -> str:
        return "plain"

    @staticmethod
    def reference_index(fusion: Fusion) -> int:
        """The output with the fewest broadcast axes drives the loop structure."""
        bc = [sum(i.is_broadcast for i in o.logical) for o in fusion.outputs]
        return bc.index(min(bc))

    @staticmethod
    def reference(fusion: Fusion):
        return fusion.outputs[PointwiseScheduler.reference_index(fusion)]

    @staticmethod
    def compute_params(fusion: Fusion, info: InputInfo, overrides: dict) -> PointwiseParams:
        ref = PointwiseScheduler.reference(fusion)
        env = info.extents
        from ..ir import evaluate

        if ref.ndim == 0:  # one element: one thread, nothing to vectorize or unroll
            return PointwiseParams(
                vectorize=1,
                unroll=1,
                threads=1,
                vectorize_inputs=(False,) * len(info.tensors),
                vectorize_outputs=(False,) * len(fusion.outputs),
            )

        shape = [evaluate(i.extent, env) for i in ref.logical]
        numel = 1
        for s in shape:
            numel *= s
        # the loop walks the reference in its memory order: vectors run along
        # its innermost axis in memory
        axis = ref.domain.allocation_order()[-1]
        inner = shape[axis]
        lmap = LogicalMap(fusion)
        cands = _vector_candidates(fusion, ref, lmap)
        sizes = [fusion.inputs[k].dtype.size for k in cands] + [o.dtype.size for o in fusion.outputs]
        vec = MAX_VECTOR_BYTES // max(sizes)
        if "vectorize" in overrides:
            vec = overrides["vectorize"]  # a power of two in [1, 16] (the table's rule)
            if vec * max(sizes) > MAX_VECTOR_BYTES:
                raise CircbufError(
                    f"schedule(vectorize={vec}): vectorize x {max(sizes)}-byte items must be <= "
                    f"{MAX_VECTOR_BYTES} bytes"
                )
        while vec > 1 and inner % vec:
            vec //= 2
        vin = []
        for k, t in enumerate(info.tensors):
            ok = False
            if k in cands and t is not None and vec > 1:  # aligned with ref: its axis ``axis`` is ref's
                ok = vector_access(t, axis, vec)
            vin.append(ok)
        threads = overrides.get("threads", 128)
        n_vec = -(-numel // vec)
        inner_threads = _inner_threads(fusion, ref, cands, inner, vec, threads, info.target.max_grid_yz)
        if inner_threads:
            # inputs broadcast along the rows, their columns the reference's: vector loads too
            rows = _row_broadcasts(fusion, ref, lmap, axis)
            for k, t in enumerate(info.tensors):
                if k in rows and t is not None and vec > 1:
                    vin[k] = vector_access(t, axis, vec)
        unroll = overrides.get("unroll")
        if unroll is None:
            # Measured on H200 (benchmarks/pointwise.py --sweep): 2 vectors per
            # thread saturate memory for cheap math; erf/tanh-heavy math needs 4
            # to hide its issue time. Never unroll below ~8 CTAs per SM.
            want = 4 if _math_cost(fusion) >= 4 else 2
            unroll = 1
            while unroll < want and n_vec >= threads * unroll * 2 * info.target.sm_count * 8:
                unroll *= 2
        return PointwiseParams(
            inner_threads=inner_threads,
            vectorize=vec,
            unroll=unroll,
            threads=threads,
            vectorize_inputs=tuple(vin),
            vectorize_outputs=tuple(
                vec > 1
                and aligned(lmap, o, ref, broadcast=True)
                and output_vectorizable(fusion, info, k, axis, vec)
                for k, o in enumerate(fusion.outputs)
            ),
        )

    @staticmethod
    def schedule(fusion: Fusion, params: PointwiseParams):
        if PointwiseScheduler.reference(fusion).ndim == 0:  # no axes: the kernel's one thread
            for j in sorted(set(fusion.aliases.values())):  # an input written in place: read once,
                x = fusion.inputs[j]  # into a register, before the write (fuzz 910:6)
                if fusion.consumers(x):
                    x.cache_after()
            inline_intermediates(fusion)
            return
        hoist_broadcasts(fusion)
        ref_index = PointwiseScheduler.reference_index(fusion)
        ref_out = fusion.outputs[ref_index]
        cands = set(_vector_candidates(fusion, ref_out, LogicalMap(fusion)))
        if params.inner_threads:
            axis = ref_out.domain.allocation_order()[-1]
            cands |= set(_row_broadcasts(fusion, ref_out, LogicalMap(fusion), axis))
        in_caches = []
        for k, x in enumerate(fusion.inputs):
            if k in cands and fusion.consumers(x):
                c = x.cache_after()
                in_caches.append((c, params.vectorize_inputs[k]))
        out_caches = []
        for k, o in enumerate(fusion.outputs):
            out_caches.append((o, cache_output(fusion, o), params.vectorize_outputs[k]))
        ref = out_caches[ref_index][1]
        lmap = LogicalMap(fusion)
        concretize_broadcasts(fusion, lmap)

        ref.reorder(ref_out.domain.allocation_order())  # memory order: stores run contiguous
        n = len(ref.loop)
        if params.inner_threads:
            for _ in range(n - 2):
                ref.merge(0)  # [O, I]: the rows, the innermost axis
            tx = params.inner_threads
            ty = params.threads // tx
            ref.split(1, params.vectorize)  # [O, I/V, V]
            ref.split(1, tx)  # [O, I/V/Tx, Tx, V]
            # a thread's U rows are consecutive (row = (r * Ty + ty) * U + u): a register
            # array's index is then u alone
            ref.split(0, params.unroll)  # [O/U, U, I/V/Tx, Tx, V]
            if ty > 1:
                ref.split(0, ty)  # [O/U/Ty, Ty, U, I/V/Tx, Tx, V]
                ref.reorder([0, 3, 1, 4, 2, 5])  # [rows, columns, Ty, Tx, U, V]
                axes = (ParallelType.BIDx, ParallelType.BIDy, ParallelType.TIDy, ParallelType.TIDx)
            else:
                ref.reorder([0, 2, 3, 1, 4])  # [rows, columns, Tx, U, V]
                axes = (ParallelType.BIDx, ParallelType.BIDy, ParallelType.TIDx)
            for a, pt in enumerate(axes):
                ref.axis(a).parallelize(pt)
            at = len(axes)
        else:
            for _ in range(n - 1):
                ref.merge(0)
            ref.split(0, params.vectorize)  # [N/V, V]
            ref.split(0, params.threads)  # [N/V/T, T, V]
            ref.split(0, params.unroll)  # [B, U, T, V]
            ref.reorder([0, 2, 1, 3])  # [B, T, U, V]
            ref.axis(0).parallelize(ParallelType.BIDx)
            ref.axis(1).parallelize(ParallelType.TIDx)
            at = 2
        propagate(ref, fusion.used_tvs(), lmap)

        inline_intermediates(fusion)
        for c, vec in in_caches:
            c.inline_at(at)
            if vec and len(c.loop) == at + 2:
                c.axis(at + 1).parallelize(ParallelType.Vectorize)
        for o, c, vec in out_caches:
            c.inline_at(at)
            if vec and len(o.loop) == at + 2:
                o.axis(at + 1).parallelize(ParallelType.Vectorize)


_COST = {"gelu": 4, "tanh": 2, "sigmoid": 1, "silu": 1, "exp": 1, "log": 1}


def _math_cost(fusion) -> int:
    """Rough special-function cost of one element of the fusion."""
    from ..ir import UnaryOp

    return sum(_COST.get(e.op_name, 0) for e in fusion.exprs() if isinstance(e, UnaryOp))


def _unrelated_output(fusion: Fusion) -> str | None:
    """Why one loop over the reference output cannot cover every output:

    - an output with a (non-broadcast) axis that no axis of the reference is
      joined to (``[5] + 1`` next to ``[n] * 2``) has no loop to run on;
    - an output without an axis of the reference (nor one a view splits or
      merges it from): ``exp(x[5, 127])`` beside ``reshape(exp(x), [1, -1]) >
      y[n, 1]``, whose reference is [n, 635]. Its loops, replayed from the
      reference's, miss that axis: its grid covers 5 * 127 elements where the
      reference's covers n * 635, and one grid axis cannot have both extents.
      Written once per element of the missing axis, it would be written by
      several CTAs anyway (``outputs have different ranks`` catches this
      where no view keeps the ranks equal).

    The segmenter gives such an output a kernel of its own."""
    ref_k = PointwiseScheduler.reference_index(fusion)
    ref = fusion.outputs[ref_k]
    lmap = LogicalMap(fusion)
    have = lmap.derivable({lmap.find(i) for i in ref.logical if not i.is_broadcast})
    joined = lmap.derivable({lmap.find(i) for i in ref.logical})  # a broadcast axis only needs joining
    for k, o in enumerate(fusion.outputs):
        for a, i in enumerate(o.logical):
            if lmap.find(i) not in (joined if i.is_broadcast else have):
                return f"output {k}'s axis {a} is not an axis of output {ref_k} (no one loop covers both)"
    # the reference's axes the grid walks: of a class that some axis gives an
    # extent other than 1 (a broadcast one of such a class is given it)
    ones = required_ones(fusion)
    big = {
        lmap.find(i)
        for t in fusion.used_tvs()
        for i in t.logical
        if not i.is_broadcast and not is_const(i.extent, 1) and str(i.extent) not in ones
    }
    walked = [(a, lmap.find(i)) for a, i in enumerate(ref.logical) if lmap.find(i) in big]
    for k, o in enumerate(fusion.outputs):
        cover = lmap.derivable({lmap.find(i) for i in o.logical})
        for a, c in walked:
            if c not in cover:
                return (
                    f"output {k} has no axis {a} of output {ref_k}, nor one a view makes it from "
                    "(one grid cannot walk both)"
                )
    return None


def _inner_threads(fusion, ref, cands, inner: int, vec: int, threads: int, max_grid_y: int) -> int:
    """Threads along the innermost axis for the rows-and-columns schedule
    (see the module's docstring), or 0 for the flattened one: where an input
    is broadcast against the reference (not a vector candidate), with no
    reshape (whose splits and merges need the flattened axis), at least 8
    vectors per row and the column blocks within the grid's y limit."""
    from ..ir import ReshapeOp

    if ref.ndim < 2 or any(isinstance(e, ReshapeOp) for e in fusion.exprs()):
        return 0
    broadcast = any(
        isinstance(x, TensorView) and x.ndim > 0 and k not in cands and fusion.consumers(x)
        for k, x in enumerate(fusion.inputs)
    )
    n_vec = -(-inner // vec)
    if not broadcast or n_vec < 8:
        return 0
    tx = 8
    while tx < threads and tx < n_vec:
        tx *= 2
    if -(-n_vec // tx) > max_grid_y:
        return 0
    return tx


def _row_broadcasts(fusion, ref, lmap, axis: int) -> list[int]:
    """Inputs with the reference's axes in its order, broadcast along some but
    not its innermost axis in memory (a bias ``[1, N]``): a run of the
    columns is a run of theirs."""
    return [
        k
        for k, x in enumerate(fusion.inputs)
        if isinstance(x, TensorView)
        and any(i.is_broadcast for i in x.logical)
        and aligned(lmap, x, ref, broadcast=True)
        and not x.logical[axis].is_broadcast
    ]


def _vector_candidates(fusion, ref, lmap) -> list[int]:
    """Inputs with the reference's axes, in its order, none broadcast: a run
    of the reference's loop is a run of theirs (not through a view or permute)."""
    return [k for k, x in enumerate(fusion.inputs) if isinstance(x, TensorView) and aligned(lmap, x, ref)]
