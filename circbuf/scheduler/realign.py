"""Realign: a matmul operand a tensor map cannot describe (rows not a multiple
of 16 bytes apart, a data pointer off 16 bytes) is copied once into a buffer
whose rows are, and the tensor cores' TMA path reads the copy.

    a [2047, 2047] bf16, rows 4094 bytes apart      (no tensor map)
    a' = empty_strided([2047, 2047], [2048, 1])     rows 4096 bytes apart
    a'.copy_(a)                                     one copy at the copy bandwidth
    matmul(a', b)                                   TMA ring, wgmma, as for aligned inputs

Why a copy and not the cp.async fill (:func:`.matmul_path._operand_fill`): the copy
moves each element once at the copy bandwidth (2047^2 bf16: 16.8 MB read and
written, ~7 us on an H100), and the GEMM then runs at its aligned speed, while
the cp.async fill's producer threads re-read every tile of the operand at
every k step with 2-byte loads where rows are only 2-byte aligned: it measured
0.07-0.25 of the TMA path on an H100 (NOTES, issue 18). The cp.async fill
stays available: ``schedule(fill="cp.async")`` or ``CIRCBUF_CP_ASYNC=1``;
``schedule(realign=False)`` copies nothing, and the cp.async fill takes such
an operand.

>>> realigned_strides((2047, 2047), (2047, 1), 2)
(2048, 1)
>>> realigned_strides((3, 128, 7), (7, 21, 1), 2)
(1024, 8, 1)
>>> realigned_strides((768, 50257), (1, 768), 2)   # column-major stays column-major
(1, 768)
>>> realigned_strides((4096, 512), (512, 1), 4, unit=-2)   # a TF32 B [K, N] made K-major
(1, 4096)
"""

from __future__ import annotations

from .. import knobs
from ..ir import CircbufError, DataType, Fusion


def realigned_strides(sizes: tuple, strides: tuple, itemsize: int, unit: int | None = None) -> tuple:
    """Strides of the copy: the unit-stride axis of the last two stays
    innermost (the last when neither is; ``unit``, -1 or -2, when given: a TF32
    operand's K), the other is padded to 16 bytes, batch axes outermost and dense."""
    n = len(sizes)
    # (a last-but-one axis of size 1 is no reason for a column layout: the copy's rows
    # are then the last axis, dense, as torch would lay it out)
    col = n >= 2 and strides[-1] != 1 and sizes[-1] > 1 and strides[-2] == 1 and sizes[-2] > 1
    if unit is not None:
        col = n >= 2 and unit == -2
    unit, other = (n - 2, n - 1) if col else (n - 1, n - 2)
    per16 = 16 // itemsize
    out = [0] * n
    out[unit] = 1
    span = sizes[unit]
    if n >= 2:
        pitch = -(-max(sizes[unit], 1) // per16) * per16
        out[other] = pitch
        span = pitch * sizes[other]
    for d in range(n - 3, -1, -1):
        out[d] = span
        span *= sizes[d]
    return tuple(out)


def choose(fusion: Fusion, info, overrides: dict) -> tuple:
    """The matmul operands to copy into a realigned buffer for these inputs:
    ``(position among the fusion's inputs, unit)`` pairs (``unit``: the axis,
    -1 or -2, the copy makes contiguous; None keeps the operand's own); ()
    when none (a tensor map describes each operand, the fusion is no
    tensor-core matmul, an operand is written in place, returned (as is or
    as a view) or defined contiguous, or a fill was asked for). An fp32
    operand that TF32 tensor cores will read is copied K-major when it is not
    (wgmma reads tf32 tiles K-major only)."""
    from .info import TensorInfo
    from .matmul_path import _mma_structure, _operand_layout, _operands, tf32_k_axis, tf32_layout
    from .utils import contractions

    asked = overrides.get("realign")
    if asked is not None and not isinstance(asked, bool):
        raise CircbufError(f"schedule(realign={asked!r}): must be True or False")
    if asked is False or overrides.get("fill") is not None or knobs.cp_async():
        return ()
    cs = contractions(fusion)
    if len(cs) != 1 or _mma_structure(fusion, cs[0]):
        return ()
    # inputs written in place, or returned as they are or as views: the caller's tensor
    # itself must be what is written or returned, not a copy of it
    written = set(fusion.aliases.values())
    written |= {k for kind, k in fusion.returns if kind == "input"}
    written |= {j for j, _ in fusion.input_views}
    out = []
    for x in _operands(cs[0])[:2]:
        if x not in fusion.inputs:
            continue
        j = fusion.inputs.index(x)
        t = info.tensors[j]
        if t is None or j in written or j in [k for k, _ in out] or any(s == 0 for s in t.sizes):
            continue
        if x.dtype == DataType.Float and not info.tf32:
            continue  # (fp32 without TF32 runs on the CUDA cores: FFMA, which reads any strides)
        unit = tf32_k_axis(cs[0], x) if x.dtype == DataType.Float else None
        major, why = _operand_layout(t)
        if why is None and (unit is None or major == ("inner" if unit == -1 else "outer")):
            continue
        strides = realigned_strides(t.sizes, t.strides, t.itemsize, unit)
        if unit is not None and tf32_layout(cs[0], x, TensorInfo(t.sizes, strides, t.itemsize, 16)):
            continue  # (no copy TF32 reads either: a B of one column; the fp32 path takes it)
        # an input defined contiguous (a segment's, dynamo's) keeps its rows dense: the
        # copy's padded rows would break that promise; the cp.async fill takes it instead
        if x.domain.broken_contiguity(t.sizes, strides) is None:
            out.append((j, unit))
    return tuple(out)
