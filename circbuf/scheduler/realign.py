"""Realign: a matmul operand a tensor map cannot describe (rows not a multiple
of 16 bytes apart, a data pointer off 16 bytes) is copied once into a buffer
whose rows are, and the tensor cores' TMA path reads the copy.

    a [2047, 2047] bf16, rows 4094 bytes apart      (no tensor map)
    a' = empty_strided([2047, 2047], [2048, 1])     rows 4096 bytes apart
    a'.copy_(a)                                     one copy at the copy bandwidth
    matmul(a', b)                                   TMA ring, wgmma, as for aligned inputs

Why a copy and not the cp.async fill (:func:`.matmul._operand_fill`): the copy
moves each element once at the copy bandwidth (2047^2 bf16: 16.8 MB read and
written, ~7 us on an H100), and the GEMM then runs at its aligned speed, while
the cp.async fill's producer threads re-read every tile of the operand at
every k step with 2-byte loads where rows are only 2-byte aligned: it measured
0.07-0.25 of the TMA path on an H100 (NOTES, issue 18). The cp.async fill
stays available: ``schedule(fill="cp.async")`` or ``CIRCBUF_CP_ASYNC=1``.
``schedule(realign=False)`` keeps such an operand on the SIMT path.

>>> realigned_strides((2047, 2047), (2047, 1), 2)
(2048, 1)
>>> realigned_strides((3, 128, 7), (7, 21, 1), 2)
(1024, 8, 1)
>>> realigned_strides((768, 50257), (1, 768), 2)   # column-major stays column-major
(1, 768)
"""

from __future__ import annotations

from .. import knobs
from ..ir import CircbufError, Fusion


def realigned_strides(sizes: tuple, strides: tuple, itemsize: int) -> tuple:
    """Strides of the copy: the unit-stride axis of the last two stays
    innermost (the last when neither is), the other is padded to 16 bytes,
    batch axes outermost and dense."""
    n = len(sizes)
    # (a last-but-one axis of size 1 is no reason for a column layout: the copy's rows
    # are then the last axis, dense, as torch would lay it out)
    col = n >= 2 and strides[-1] != 1 and sizes[-1] > 1 and strides[-2] == 1 and sizes[-2] > 1
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
    """Positions among the fusion's inputs of the matmul operands to copy
    into a realigned buffer for these inputs; () when none (a tensor map
    describes each operand, the fusion is no tensor-core matmul, an operand
    is written in place, returned (as is or as a view) or defined
    contiguous, or a fill was asked for)."""
    from .matmul import _mma_structure, _operand_layout, _operands
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
        if t is None or j in written or j in out or any(s == 0 for s in t.sizes):
            continue
        if _operand_layout(t)[1] is None:
            continue
        # an input defined contiguous (a segment's, dynamo's) keeps its rows dense: the
        # copy's padded rows would break that promise; the cp.async fill takes it instead
        if x.domain.broken_contiguity(t.sizes, realigned_strides(t.sizes, t.strides, t.itemsize)) is None:
            out.append(j)
    return tuple(out)
