"""A matmul or linear whose K is 0 for these sizes: the sum of no products
is a fill, not a matmul (nvFuser's RemoveEmptyPass makes the same rewrite).
The compile driver segments such a fusion for the sizes where K is 0
(:func:`empty_k` in ``registry.compute_params``), and the segmenter cuts a
copy in which each such contraction is its fill (:func:`fill_empty_k`); the
pointwise scheduler writes it at the output's write bandwidth, where the
SIMT sum of products spent ~0.6 ms on an 8192 x 8192 output (issue 18):

    c = matmul(a[M, 0], b[0, N])        ->  c = full({M, N}, 0)
    c = linear(x[M, 0], w[N, 0], bias)  ->  z = full({M, N}, 0.0f)
                                            c = cast(z + cast(broadcast(bias), Float))

(torch's result: zeros, or the bias rounded once from fp32 as the tensor
cores' epilogue rounds it). The rest of the fusion (an epilogue, other
outputs) reads ``c`` as before. Sizes other than K = 0 keep their own split
(the compile driver keys splits by which sizes are 0). The matmul's
``schedule()`` overrides have no matmul to apply to there: for those sizes
they are ignored (:data:`IGNORED`), not given to the fill's kernel.

>>> import circbuf as cb
>>> with cb.FusionDefinition() as fd:
...     a = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
...     b = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
...     fd.add_output(fd.ops.matmul(a, b))
>>> empty_k(fd.fusion, {"i0": 4, "i1": 0, "i2": 0, "i3": 8})
'matmul T2: K = 0 for these sizes (the sum of no products is a fill)'
>>> [type(e).__name__ for e in fill_empty_k(fd.fusion, {"i0": 4, "i1": 0, "i2": 0, "i3": 8}).exprs()]
['FullOp']
"""

from __future__ import annotations

from ..ir import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    Const,
    DataType,
    FullOp,
    Fusion,
    IterDomain,
    IterType,
    TensorView,
    evaluate,
)
from .overrides import MATMUL
from .utils import contractions

# the overrides a filled matmul leaves without a kernel (the matmul scheduler's)
IGNORED = frozenset(MATMUL)


def _empty(fusion: Fusion, env) -> list:
    """The contractions of ``fusion`` whose K is 0 for the sizes in ``env``."""
    out = []
    for e in contractions(fusion):
        try:
            # (A's last axis is K, a vector's too; an expand along it has the expand's extent)
            k = evaluate(e.inputs[0].logical[-1].loop_extent, env)
        except KeyError:  # a size these inputs do not give
            continue
        if k == 0:
            out.append(e)
    return out


def empty_k(fusion: Fusion, env) -> str | None:
    """Why ``fusion`` is segmented for these sizes: a contraction whose K is 0."""
    if env is None or fusion.manual_schedule:
        return None
    hit = _empty(fusion, env)
    if not hit:
        return None
    return f"{hit[0].op_name} {hit[0].out.name}: K = 0 for these sizes (the sum of no products is a fill)"


def fill_empty_k(fusion: Fusion, env) -> Fusion | None:
    """A copy of ``fusion`` whose contractions with K = 0 in ``env`` are their
    fills (see the module's docstring); None when there are none."""
    if empty_k(fusion, env) is None:
        return None
    f = fusion.clone()
    for e in _empty(f, env):
        c = e.out
        for x in e.tv_inputs():
            while e in x.uses:
                x.uses.remove(e)
        c.definition = None
        bias = e.inputs[2] if len(e.inputs) > 2 else None
        if bias is None:
            FullOp(c, Const(0.0, c.dtype))
            continue
        flt = DataType.Float
        z = f.register(TensorView([i.fresh() for i in c.logical], flt))
        FullOp(z, Const(0.0, flt))
        flags = [True] * (c.ndim - bias.ndim) + [False] * bias.ndim
        src = iter(bias.logical)
        bb = f.register(
            TensorView(
                [IterDomain(Const(1), IterType.Broadcast) if b else next(src).fresh() for b in flags],
                bias.dtype,
            )
        )
        BroadcastOp(bb, bias, flags)
        if bias.dtype != flt:
            bf = f.register(TensorView([i.fresh() for i in bb.logical], flt))
            CastOp(bf, bb)
            bb = bf
        s = f.register(TensorView([i.fresh() for i in c.logical], flt))
        BinaryOp("add", s, z, bb)
        CastOp(c, s)
    return f
