"""Pointwise scheduler: flatten, vectorize 16 bytes when the inputs allow it,
unroll, one element group per thread.

Loop domain of every tensor after scheduling::

    [iblockIdx.x{ceilDiv(N, V*T*U)}, ithreadIdx.x{T}, iUR{U}, iV{V}]

Inputs with the reference's full shape are cached in registers (vectorized
loads when their strides and pointer allow), outputs are computed into a
register cache and stored vectorized; intermediates are inlined.
"""

from __future__ import annotations

from ..ir import (
    CircbufError,
    Fusion,
    ParallelType,
    ReductionOp,
    TensorView,
)
from .info import InputInfo
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
    unmapped_axis,
    vector_access,
)

OVERRIDES = ("vectorize", "unroll", "threads")
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
        if 0 in ranks:
            return "0-dim outputs"
        return unmapped_axis(fusion, [PointwiseScheduler.reference(fusion)])

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
            vec = overrides["vectorize"]
            if vec not in (1, 2, 4, 8, 16) or vec * max(sizes) > MAX_VECTOR_BYTES:
                raise CircbufError(
                    f"schedule(vectorize={vec}): must be a power of two with "
                    f"vectorize * itemsize <= {MAX_VECTOR_BYTES} bytes"
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
        if threads not in (32, 64, 128, 256, 512, 1024):
            raise CircbufError(f"schedule(threads={threads}): must be a power of two in [32, 1024]")
        n_vec = -(-numel // vec)
        unroll = overrides.get("unroll")
        if unroll is None:
            # Measured on H200 (benchmarks/pointwise.py --sweep): 2 vectors per
            # thread saturate memory for cheap math; erf/tanh-heavy math needs 4
            # to hide its issue time. Never unroll below ~8 CTAs per SM.
            want = 4 if _math_cost(fusion) >= 4 else 2
            unroll = 1
            while unroll < want and n_vec >= threads * unroll * 2 * 132 * 8:
                unroll *= 2
        if not isinstance(unroll, int) or unroll < 1 or unroll > 16:
            raise CircbufError(f"schedule(unroll={unroll}): must be an int in [1, 16]")
        return PointwiseParams(
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
        hoist_broadcasts(fusion)
        ref_index = PointwiseScheduler.reference_index(fusion)
        ref_out = fusion.outputs[ref_index]
        cands = set(_vector_candidates(fusion, ref_out, LogicalMap(fusion)))
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
        for _ in range(n - 1):
            ref.merge(0)
        ref.split(0, params.vectorize)  # [N/V, V]
        ref.split(0, params.threads)  # [N/V/T, T, V]
        ref.split(0, params.unroll)  # [B, U, T, V]
        ref.reorder([0, 2, 1, 3])  # [B, T, U, V]
        ref.axis(0).parallelize(ParallelType.BIDx)
        ref.axis(1).parallelize(ParallelType.TIDx)
        propagate(ref, fusion.used_tvs(), lmap)

        inline_intermediates(fusion)
        for c, vec in in_caches:
            c.inline_at(2)
            if vec and len(c.loop) == 4:
                c.axis(3).parallelize(ParallelType.Vectorize)
        for o, c, vec in out_caches:
            c.inline_at(2)
            if vec and len(o.loop) == 4:
                o.axis(3).parallelize(ParallelType.Vectorize)


_COST = {"gelu": 4, "tanh": 2, "sigmoid": 1, "silu": 1, "exp": 1, "log": 1}


def _math_cost(fusion) -> int:
    """Rough special-function cost of one element of the fusion."""
    from ..ir import UnaryOp

    return sum(_COST.get(e.op_name, 0) for e in fusion.exprs() if isinstance(e, UnaryOp))


def _vector_candidates(fusion, ref, lmap) -> list[int]:
    """Inputs with the reference's axes, in its order, none broadcast: a run
    of the reference's loop is a run of theirs (not through a view or permute)."""
    return [k for k, x in enumerate(fusion.inputs) if isinstance(x, TensorView) and aligned(lmap, x, ref)]
