"""Which path a matmul takes, and why: the tensor cores (wgmma, TMA or
cp.async fills), the FFMA kernel, or the SIMT sum of products.

- :func:`_mma_structure`: why the tensor-core path cannot take a fusion
  whatever its inputs (a :class:`Reason`, whose ``kind`` the segmenter's cut
  decision reads: :func:`_split_for_tensor_cores`);
- :func:`fixed_ones`: the broadcast M/N axes of extent 1 it turns into
  iteration axes (a batch-1 decode step under torch.compile);
- :func:`_mma_unsupported`: the same for these inputs (K = 0, an empty
  operand, TF32 off, strides a tensor map cannot take);
- :func:`_operand_layout` / :func:`_operand_fill`: how the producer fills an
  operand's ring (TMA where a tensor map describes it, else cp.async).

>>> import circbuf as cb
>>> with cb.FusionDefinition() as fd:
...     a = fd.define_tensor([-1, -1], dtype=cb.DataType.Double)
...     fd.add_output(fd.ops.matmul(a, a))
>>> from circbuf.scheduler.utils import contractions
>>> r = _mma_structure(fd.fusion, contractions(fd.fusion)[0])
>>> r.kind
'dtype'
"""

from __future__ import annotations

from ..ir import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    DataType,
    Fusion,
    LinearOp,
    LoadStoreOp,
    MatmulOp,
    TernaryOp,
    UnaryOp,
    evaluate,
)
from ..ir.scalar import is_const
from . import matmul_reduce
from .info import InputInfo
from .utils import LogicalMap


def _operands(e):
    if isinstance(e, MatmulOp):
        return e.inputs[0], e.inputs[1], None
    return e.inputs[0], e.inputs[1], (e.inputs[2] if len(e.inputs) > 2 else None)


def _split_for_tensor_cores(fusion: Fusion, e) -> str | None:
    """Why a 16-bit matmul that the SIMT path would take whole should be cut
    from its neighbours instead, else None: prologue math on an operand
    (``linear(rms_norm(x), w)``: the normalized operand, written by a segment
    of its own and read by TMA, costs one pass over it; the sum of products
    ran a Llama's MLP projection ~100x slower than the tensor cores, issue 19),
    or an output beside the matmul's of another shape."""
    a, b, _ = _operands(e)
    if a.dtype not in (DataType.BFloat16, DataType.Half) or b.dtype != a.dtype:
        return None
    # (an expanded operand, ``x[1, K].expand(M, K)``, is cut too: the segmenter writes a
    # matmul operand's expanded axes out in full, which a tensor map reads as any rows)
    math = [
        x for x in (a, b) if isinstance(x.definition, (UnaryOp, BinaryOp, TernaryOp, CastOp, BroadcastOp))
    ]
    why = _mma_structure(fusion, e)
    cut = why is not None and (
        math
        and why.kind in ("computed operand", "expanded operand")
        or why.kind == "output"
        # (a batch-1 decode step under torch.compile: mm of [1, K] then a reshape of the result)
        or why.kind == "fixed one"
    )
    if not cut:
        return None
    return f"{why}: a segment of its own keeps matmul {e.out.name} on the tensor cores"


class Reason(str):
    """A refusal: its text (a str: callers print it, prefix it, join it) and
    its ``kind``, which decisions read instead of the wording.

    >>> r = Reason("output", "output T4 does not have the matmul output's shape")
    >>> r.kind, r.startswith("output T4")
    ('output', True)
    """

    def __new__(cls, kind: str, text: str):
        r = super().__new__(cls, text)
        r.kind = kind
        return r


def _mma_structure(fusion: Fusion, e) -> Reason | None:
    """Why the tensor-core path cannot take this fusion whatever its inputs,
    else None (fp32 operands: on TF32 tensor cores when torch allows it, which
    :func:`_mma_unsupported` asks). Kinds: ``dtype``, ``vector``, ``weight``,
    ``computed operand``, ``expanded operand``, ``broadcast k``, ``fixed one`` (a consumer of
    the one row the segmenter can cut away), ``fixed one, one tensor``,
    ``output``."""
    a, b, _ = _operands(e)
    if a.dtype not in (DataType.BFloat16, DataType.Half, DataType.Float):
        return Reason(
            "dtype", f"{a.dtype.name} operands (the tensor-core path takes BFloat16, Half, and Float as TF32)"
        )
    if a.ndim < 2 or b.ndim < 2:
        return Reason("vector", "a 1-D operand (a matrix-vector product)")
    if isinstance(e, LinearOp) and b.ndim != 2:
        return Reason("weight", "a linear weight that is not 2-D")
    for x in (a, b):
        if not x.is_input:
            return Reason(
                "computed operand",
                f"operand {x.name} is computed in the fusion (prologue math is not staged by TMA)",
            )
        for d, i in enumerate(x.logical):
            # (a segment's input the segmenter hands over as the expand of a smaller tensor)
            if i.is_broadcast and i.expanded_extent is not None and not is_const(i.expanded_extent, 1):
                return Reason(
                    "expanded operand",
                    f"operand {x.name} is expanded along axis {d} (a broadcast a tensor map cannot step)",
                )
    for x in (a, b):
        if x.logical[tf32_k_axis(e, x)].is_broadcast:
            # (K fixed to 1, ``define_tensor([-1, 1])``: an outer product, no sum for the tensor
            # cores; its one-row operand tiles met a lowering check. A 16-bit one is defined
            # elementwise by the frontend: fp32 and fp64 ones reach here)
            return Reason(
                "broadcast k", f"operand {x.name}'s K axis is a broadcast (K fixed to 1: an outer product)"
            )
    c = e.out
    fixed = fixed_ones(fusion, e)
    if isinstance(fixed, str):
        kind = "fixed one" if fixed.kind == "consumer" else "fixed one, one tensor"
        return Reason(kind, f"an M or N extent of 1 fixed in the definition, {fixed}")
    lmap = LogicalMap(fusion)
    classes = {lmap.find(i) for i in c.logical}
    for o in matmul_reduce.tile_outputs(fusion):
        for d, i in enumerate(o.logical):
            if i.concrete_extent is not None and lmap.find(i) not in classes:
                return Reason("output", f"output {o.name} axis {d} is not an axis of the matmul's output")
        if o.ndim != c.ndim:
            return Reason("output", f"output {o.name} does not have the matmul output's shape")
    return None


_ELEMENTWISE_OPS = (UnaryOp, BinaryOp, TernaryOp, CastOp)


def fixed_ones(fusion: Fusion, e):
    """The broadcast axes, ``(tv, axis)``, that the tensor-core path turns into
    iteration axes of extent 1 where the definition fixes M or N to 1
    (``define_tensor([1, K])``, as torch.compile's static shapes define a
    batch-1 decode step's activations): the operand's own axis, the matmul
    output's, and those of the elementwise epilogue ops computed from it (a
    broadcast axis is not allocated: the operand's tile would have no rows).
    A :class:`Reason` says why not (kind ``consumer``: an op that is not
    elementwise reads it, or it broadcasts against rows; ``one tensor``); ``[]``:
    nothing fixed.

    >>> # x = define_tensor([1, K]); linear(x, w) -> [(x, 0), (linear's out, 0), ...]
    """
    a, b, _ = _operands(e)
    c = e.out
    if not any(i.is_broadcast for i in c.logical[-2:]):
        return []
    if a is b:
        return Reason("one tensor", "whose operands are one tensor (M and N would be one axis)")
    todo = []
    nd = isinstance(e, LinearOp)
    for x, d in ((a, a.ndim - 2), (b, b.ndim - 2 if nd else b.ndim - 1)):
        if x.ndim >= 2 and x.logical[d].is_broadcast:
            todo.append((x, d))
    done = {(id(c), d) for d in (c.ndim - 2, c.ndim - 1) if c.logical[d].is_broadcast}
    todo += [(c, d) for d in (c.ndim - 2, c.ndim - 1) if c.logical[d].is_broadcast]
    frontier = [c]
    while frontier:
        t = frontier.pop()
        dims = [d for (i, d) in done if i == id(t)]
        for use in t.uses:
            elementwise = isinstance(use, _ELEMENTWISE_OPS) or (
                isinstance(use, LoadStoreOp) and use.kind == "set"
            )
            if not elementwise or len(use.outputs) != 1 or use.out.ndim != t.ndim:
                return Reason(
                    "consumer", f"which {type(use).__name__} {use.out.name} reads (only elementwise ops may)"
                )
            out = use.out
            for d in dims:
                if not out.logical[d].is_broadcast:
                    # another input has rows (columns) there: the matmul's one row is broadcast
                    # to them (torch's semantics), which the tile's zero-filled rows are not
                    return Reason(
                        "consumer",
                        f"which {out.name} broadcasts along axis {d} against a tensor with extent there",
                    )
                if (id(out), d) not in done:
                    done.add((id(out), d))
                    todo.append((out, d))
                    frontier.append(out)
    return todo


def _mma_unsupported(fusion: Fusion, e, info: InputInfo) -> str | None:
    """None when the tensor-core path can take this fusion on these inputs,
    else why not (the SIMT path takes it)."""
    why = _mma_structure(fusion, e)
    if why:
        return why
    a, b, _ = _operands(e)
    k = evaluate(a.logical[-1].extent, info.extents)
    if k == 0:
        return "K = 0 (the sum of no products)"
    for x in (a, b):
        t = info.tensors[fusion.inputs.index(x)]
        if any(s == 0 for s in t.sizes):
            return f"{x.name} is empty"
    if a.dtype == DataType.Float:
        if not info.tf32:
            return (
                "Float operands while torch's fp32 matmuls are IEEE (TF32 tensor cores only where torch "
                "would use them: torch.backends.cuda.matmul.fp32_precision = 'tf32' or allow_tf32)"
            )
        for x in (a, b):
            why = tf32_layout(e, x, info.tensors[fusion.inputs.index(x)])
            if why:  # (the runtime copies such an operand K-major first: scheduler/realign.py)
                return f"operand {x.name}: {why}"
    # strides or a pointer a tensor map cannot describe: the runtime copies such an operand
    # into aligned rows before scheduling (scheduler/realign.py); one it may not copy (written
    # in place, realign=False) has its ring filled by the producer threads' cp.asyncs
    # (_operand_fill: 0.07-0.25 of the TMA path on an H100, slower than the copy, ~50x
    # faster than the SIMT sum of products)
    return None


def tf32_k_axis(e, x) -> int:
    """The axis of operand ``x`` of contraction ``e`` that is K: -1 for A
    [.., M, K] and linear's weight [N, K], -2 for matmul's B [.., K, N]."""
    return -2 if isinstance(e, MatmulOp) and x is e.inputs[1] else -1


def tf32_layout(e, x, t) -> str | None:
    """Why TF32 wgmmas cannot read operand ``x`` (TensorInfo ``t``) through a
    tensor map as it lies, else None: they read K-major tiles only (the
    transposed layouts are for 16-bit types)."""
    major, why = _operand_layout(t)
    if why is None and major != ("inner" if tf32_k_axis(e, x) == -1 else "outer"):
        why = "TF32 tensor cores read K-major tiles only, and its K axis is not contiguous"
    return why


def _operand_layout(t) -> tuple:
    """(major, reason): which of the last two axes is contiguous ("inner" or
    "outer") and whether a tensor map can describe the rest."""
    if t.align % 16:
        return None, "data pointer not 16-byte aligned"
    if any(n > 1 and st == 0 for n, st in zip(t.sizes, t.strides)):
        return None, "an expanded axis (stride 0; a tensor map steps through memory)"
    n = len(t.sizes)
    inner_c = t.sizes[-1] == 1 or t.strides[-1] == 1
    outer_c = t.sizes[-2] == 1 or t.strides[-2] == 1
    if inner_c and (t.sizes[-2] == 1 or t.strides[-2] * t.itemsize % 16 == 0):
        major = "inner"
    elif outer_c and t.sizes[-1] > 1 and t.strides[-1] * t.itemsize % 16 == 0:
        # (a last axis of size 1 is innermost in the kernel's memory order, compiler._layout_of)
        major = "outer"
    else:
        return None, f"strides {t.strides} (a tensor map needs one unit stride and 16-byte multiples)"
    for d in range(n - 2):
        if t.sizes[d] > 1 and (t.strides[d] * t.itemsize) % 16:
            return None, f"batch stride {t.strides[d]} not a multiple of 16 bytes"
    return major, None


# ------------------------------------------------- operand fill (cp.async)
FILLS = ("tma", "cp.async")


def _operand_fill(t, fill=None) -> tuple:
    """How the producer fills an operand's ring slots: ``(fill, major, vector)``.
    ``"tma"`` where a tensor map can describe the tensor (:func:`_operand_layout`),
    else (or when ``fill="cp.async"`` asks) ``"cp.async"``: the producer
    warpgroup's threads copy the box, ``vector`` elements per copy, the widest
    of 16, 8 and 4 bytes that the data pointer and every stride but the
    contiguous axis's allow; ``vector`` 1 (a 16-bit element whose rows are only
    2-byte aligned: an odd K, a pointer one element off) is a load and a
    shared store through registers, as cp.async copies 4 bytes at least.
    ``major`` as :func:`_operand_layout` (a tensor with no unit-stride axis is
    read element by element in its own order: "inner")."""
    major, why = _operand_layout(t)
    if fill == "tma" and why is not None:
        return None, why, None
    if why is None and fill != "cp.async":
        return "tma", major, None
    if t.sizes[-1] == 1 or t.strides[-1] == 1:
        major, unit = "inner", len(t.sizes) - 1
    elif t.sizes[-2] == 1 or t.strides[-2] == 1:
        major, unit = "outer", len(t.sizes) - 2
    else:
        return "cp.async", "inner", 1
    vector = 1
    for nbytes in (16, 8, 4):
        v = nbytes // t.itemsize
        if v < 1 or t.align % nbytes:
            continue
        if all(n == 1 or st % v == 0 for d, (n, st) in enumerate(zip(t.sizes, t.strides)) if d != unit):
            vector = v
            break
    return "cp.async", major, vector
