"""``fd.ops.matmul`` and ``fd.ops.linear``: torch.matmul's and
torch.nn.functional.linear's shapes, one contraction expr each.

A 16-bit matrix-vector product (an operand of one axis) is defined as the
2-D product of a one-row (one-column) view of the vector, with that axis
squeezed from the result, so it runs on the tensor cores as the M = 1
(N = 1) GEMM it is; the tensor-core path takes no 1-D operand, and the SIMT
sum of products read a 4096 x 4096 weight at half the bandwidth:

    matmul(a[K], b[K, N])  ->  squeeze(matmul(broadcast(a, [True, False]), b), [0])

A 16-bit product whose K is fixed to 1 in the definition (``define_tensor([-1, 1])``:
an outer product, no sum) is defined as the elementwise product it is, in
fp32 and cast back as the tensor cores would round it (the product of two
16-bit values is exact in fp32: torch's bits), and runs as a pointwise kernel
at the output's write bandwidth:

    matmul(a[M, 1], b[1, N])  ->  cast(mul(cast(a[M, 1]), cast(b[1, N])), bf16)

fp32 and fp64 vectors keep the one 1-D expr (the FFMA path and the sum of
products take it; whether fp32 runs on TF32 is known only per call).

>>> import circbuf as cb
>>> with cb.FusionDefinition() as fd:
...     a = fd.define_tensor([-1], dtype=cb.DataType.BFloat16)
...     b = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
...     fd.add_output(fd.ops.matmul(a, b))
>>> [type(e).__name__ for e in fd.fusion.exprs()]
['BroadcastOp', 'MatmulOp', 'SqueezeOp']
"""

from __future__ import annotations

from .ir import CircbufError, Const, DataType, LinearOp, MatmulOp
from .ir.scalar import is_const

# dtypes whose vector operands are defined as one-row / one-column matrices
VECTOR_AS_MATRIX = (DataType.BFloat16, DataType.Half)


def _is_tv(x):
    from .ir import TensorView

    return isinstance(x, TensorView)


class ContractionOps:
    """The contraction ops of ``fd.ops`` (a mixin of :class:`.frontend.Ops`)."""

    def _contraction_dtype(self, what, *xs):
        dts = {x.dtype for x in xs if x is not None}
        names = ", ".join(f"{x.name} {x.dtype.name}" for x in xs if x is not None)
        if len(dts) != 1:
            raise CircbufError(f"{what}: operands must have one dtype, got {names}")
        dt = dts.pop()
        if not dt.is_float:
            raise CircbufError(
                f"{what}: operands must be floating point (Half, BFloat16, Float, Double), got {names}"
            )
        return dt

    def _batch_axes(self, what, xs_batch, out_rank):
        """Broadcast the batch axes of the operands (right-aligned, as torch);
        returns the out axes and, per operand, its (axis, out axis) pairs."""
        ids, maps = [], [[] for _ in xs_batch]
        for j in range(out_rank):
            axes = []
            for k, axs in enumerate(xs_batch):
                i = j - (out_rank - len(axs))
                if i >= 0:
                    axes.append((k, i, axs[i]))
            ids.append(self._out_axis([a for _, _, a in axes], what, f"batch axis {j}"))
            for k, i, _ in axes:
                maps[k].append((i, j))
        return ids, maps

    def _require_same(self, x, y, differ, reason):
        """Extents ``x`` and ``y`` must be equal: two constants are compared
        now (``differ`` is the error), anything else at run time, where a
        mismatch names ``reason`` (``Fusion.require_equal``)."""
        if isinstance(x, Const) and isinstance(y, Const):
            if x.value != y.value:
                raise CircbufError(differ)
        elif x != y:
            self._f.require_equal(x, y, reason)

    def _equate_k(self, what, ka, kb, a, b):
        """The contracted extents of ``a`` and ``b`` must be equal."""
        self._require_same(
            ka,
            kb,
            f"{what}: K of {a.name} ({ka}) and {b.name} ({kb}) differ",
            f"{what}: K of {a.name} and {b.name}",
        )

    def _fixed_one_k(self, dt, *ks) -> bool:
        """K fixed to 1 in a 16-bit product's definition: a broadcast K axis,
        and none expanded (an expand along K is a sum over K rows, whatever
        the other side's K says: the matmul and its K check stay)."""
        bcast = [k for k in ks if k.is_broadcast]
        return (
            dt in VECTOR_AS_MATRIX
            and bool(bcast)
            and all(k.expanded_extent is None or is_const(k.expanded_extent, 1) for k in bcast)
        )

    def _outer(self, a, b, rank, bias, dt):
        """``a [..., M, 1]``-like operands already shaped to broadcast against
        each other (rank ``rank``): their product in fp32, ``+ bias``, cast to
        ``dt`` once (see the module's docstring)."""
        f = DataType.Float
        c = self.mul(self.cast(a, f), self.cast(b, f))
        if bias is not None:
            c = self.add(
                c, self.cast(self.broadcast(bias, [True] * (rank - bias.ndim) + [False] * bias.ndim), f)
            )
        return self.cast(c, dt)

    def matmul(self, a, b):
        """``a @ b`` with torch.matmul's shapes: a ``[..., M, K]`` or ``[K]``,
        b ``[..., K, N]`` or ``[K]``, batch axes broadcast. The result is in
        the inputs' dtype (bf16 in, bf16 out), accumulated in fp32; it is one
        ``matmul`` expr of the fusion, which the matmul scheduler runs on
        the tensor cores (a 16-bit vector operand: see the module's docstring).

        >>> # c = fd.ops.matmul(a, b)      # [M, K] @ [K, N] -> [M, N]
        """
        self._check(a, b)
        if not (_is_tv(a) and _is_tv(b)):
            raise CircbufError("matmul: both operands must be tensors")
        if a.ndim == 0 or b.ndim == 0:
            raise CircbufError(f"matmul: operands must have at least one axis, got {a.ndim}-D and {b.ndim}-D")
        dt = self._contraction_dtype("matmul", a, b)
        ax, bx = a.domain.no_reductions(), b.domain.no_reductions()
        ka, kb = ax[-1], bx[0] if b.ndim == 1 else bx[-2]
        self._equate_k("matmul", ka.loop_extent, kb.loop_extent, a, b)  # (named by the user's tensors)
        if dt in VECTOR_AS_MATRIX and (a.ndim == 1 or b.ndim == 1):
            a2 = self.broadcast(a, [True, False]) if a.ndim == 1 else a
            b2 = self.broadcast(b, [False, True]) if b.ndim == 1 else b
            c = self.matmul(a2, b2)
            return self.squeeze(
                c, ([c.ndim - 2] if a.ndim == 1 else []) + ([c.ndim - 1] if b.ndim == 1 else [])
            )
        if self._fixed_one_k(dt, ka, kb):
            # an outer product: a [..., M, 1] is already [..., M, 1 (N)], b [..., 1, N] already
            # [..., 1 (M), N]; a K the inputs must make 1 is squeezed and broadcast there
            r = max(a.ndim, b.ndim)
            if not ka.is_broadcast:
                a = self.broadcast(self.squeeze(a, [a.ndim - 1]), [False] * (a.ndim - 1) + [True])
            if not kb.is_broadcast:
                b = self.broadcast(self.squeeze(b, [b.ndim - 2]), [False] * (b.ndim - 2) + [True, False])
            a2 = a if a.ndim == r else self.broadcast(a, [True] * (r - a.ndim) + [False] * a.ndim)
            b2 = b if b.ndim == r else self.broadcast(b, [True] * (r - b.ndim) + [False] * b.ndim)
            return self._outer(a2, b2, r, None, dt)
        a_batch = ax[:-2] if a.ndim > 1 else []
        b_batch = bx[:-2] if b.ndim > 1 else []
        rank = max(len(a_batch), len(b_batch))
        ids, (ma, mb) = self._batch_axes("matmul", [a_batch, b_batch], rank)
        if a.ndim > 1:  # M
            ma.append((a.ndim - 2, len(ids)))
            ids.append(self._out_axis([ax[-2]]))
        if b.ndim > 1:  # N
            mb.append((b.ndim - 1, len(ids)))
            ids.append(self._out_axis([bx[-1]]))
        out = self._new(ids, dt)
        MatmulOp(out, a, b, [ma, mb], (a.ndim - 1, 0 if b.ndim == 1 else b.ndim - 2))
        return out

    def linear(self, a, w, bias=None):
        """``a @ w.T + bias`` as ``torch.nn.functional.linear``: a ``[..., K]``,
        w ``[N, K]`` (or ``[K]``), bias ``[N]``; one ``linear`` expr, in the
        inputs' dtype, accumulated in fp32.

        >>> # y = fd.ops.linear(x, w, b)   # [M, K], [N, K], [N] -> [M, N]
        """
        self._check(a, w, bias)
        if not (_is_tv(a) and _is_tv(w)) or (bias is not None and not _is_tv(bias)):
            raise CircbufError("linear: input, weight and bias must be tensors")
        if w.ndim not in (1, 2) or a.ndim == 0:
            raise CircbufError(
                f"linear: weight {w.name} must be [N, K] or [K], input at least 1-D; got {a.ndim}-D and {w.ndim}-D"
            )
        dt = self._contraction_dtype("linear", a, w, bias)
        ax, wx = a.domain.no_reductions(), w.domain.no_reductions()
        self._equate_k("linear", ax[-1].loop_extent, wx[-1].loop_extent, a, w)  # (the user's tensors)
        if dt in VECTOR_AS_MATRIX and (a.ndim == 1 or w.ndim == 1):
            a2 = self.broadcast(a, [True, False]) if a.ndim == 1 else a
            w2 = self.broadcast(w, [True, False]) if w.ndim == 1 else w
            if w.ndim == 1 and bias is not None:
                if not _is_tv(bias) or bias.ndim != 0:
                    raise CircbufError(
                        f"linear: bias {bias.name} must be 0-D for a 1-D weight, got {bias.ndim}-D"
                    )
                bias = self.broadcast(bias, [True])
            c = self.linear(a2, w2, bias)
            return self.squeeze(
                c, ([c.ndim - 2] if a.ndim == 1 else []) + ([c.ndim - 1] if w.ndim == 1 else [])
            )
        if self._fixed_one_k(dt, ax[-1], wx[-1]):
            self._linear_bias_shape(bias, w, wx)
            # an outer product: x [..., 1] is already [..., 1 (N)]; w [N, 1] is squeezed and
            # broadcast to [1, .., N] (as a K the inputs must make 1 is)
            a2 = a
            if not ax[-1].is_broadcast:
                a2 = self.broadcast(self.squeeze(a, [a.ndim - 1]), [False] * (a.ndim - 1) + [True])
            w2 = self.broadcast(self.squeeze(w, [1], squeeze_expanded=True), [True] * (a.ndim - 1) + [False])
            return self._outer(a2, w2, a.ndim, bias, dt)
        ids = [self._out_axis([i]) for i in ax[:-1]]
        ma = [(i, i) for i in range(a.ndim - 1)]
        mw = []
        if w.ndim == 2:
            mw.append((0, len(ids)))
            ids.append(self._out_axis([wx[0]]))
        maps = [ma, mw]
        if bias is not None:
            self._linear_bias_shape(bias, w, wx)
            maps.append([(0, len(ids) - 1)] if bias.ndim == 1 else [])
        out = self._new(ids, dt)
        LinearOp(out, a, w, bias, maps)
        return out

    def _linear_bias_shape(self, bias, w, wx):
        """linear's bias is ``[N]`` (or 0-D; 0-D only for a 1-D weight)."""
        if bias is None:
            return
        n = wx[0].loop_extent if w.ndim == 2 else Const(1)
        if bias.ndim > 1 or (bias.ndim == 1 and w.ndim == 1):
            raise CircbufError(
                f"linear: bias {bias.name} must be [N] (or 0-D for a 1-D weight), got {bias.ndim}-D"
            )
        if bias.ndim == 1:
            b0 = bias.domain.no_reductions()[0]
            if b0.concrete_extent is not None:
                self._require_same(
                    n,
                    b0.concrete_extent,
                    f"linear: bias {bias.name} has length {b0.concrete_extent}, N of {w.name} is {n}",
                    f"linear: bias length ({bias.name}) and N ({w.name})",
                )
