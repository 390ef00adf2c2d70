"""Pass: fast approximate transcendentals where the output's rounding hides them.

Requires: indexed; provides: approximated.

An fp32 ``exp``, ``sigmoid``, ``silu``, ``gelu`` or ``tanh`` whose every
path to the kernel's outputs ends in a rounding to a 16-bit float (a cast to
bf16 or fp16) is computed by its fast variant in the prelude (``cb::fast_exp``
...: ``ex2.approx``, ``rcp.approx``, ``tanh.approx``) instead of CUDA's
accurate math (``expf``, IEEE division, ``erff``, ``tanhf``). The rounding
must hide the variant's error: at most 1/8 of an ulp of the rounded type
(:data:`REL_ERROR`, :func:`hides`), so the 16-bit result is at most 0.625 ulp
from the exact value where torch's, rounded once from fp32, is 0.5 ulp.
``CIRCBUF_FAST_MATH=0`` (``Kernel.fast_math`` False) turns the pass off.

A path may run through ops that keep a relative error relative (``mul``,
``div``, ``neg``, ``abs``, ``relu``, ``maximum``/``minimum``, the values of a
``where``, copies, broadcasts and views), each adding at most an fp32 rounding,
and through ``add``/``sub``, where a cancellation magnifies any fp32 error
relative to the result (the accurate functions' own few ulps too): each counts
as a magnification by 2^4 (:data:`ADDITIVE_BITS`), so a variant within 2^-15
passes one on its way to bf16 (``silu(x) + residual``), none on its way to
fp16, and ``tanh.approx`` none at all (the tanh form of gelu, ``1 + tanh(u)``,
cancels from x = -1 down: 0.4 bf16 ulp there, 48 at x = -3). Anything else
keeps the accurate math: the value is an output itself (in fp32), feeds a
reduction (a sum adds many errors, a max may pick another element), a
comparison or a predicate, an integer or fp64 cast, another transcendental, or
an op not listed; ``tanh.approx`` (2^-11) never reaches fp16 (an eighth of its
ulp is 2^-14).

Before (``cast(silu(x), bf16)``; ``e = exp(x)`` returned as bf16 and summed in fp32)::

    FOR j2 in 0..4
      FOR j3 in 0..8
        T2[((j2 * 8) + j3)] = silu(T1[((j2 * 8) + j3)])
    ...
    FOR j8 in 0..4
      FOR j9 in 0..8
        T5[((j8 * 8) + j9)] = exp(T4[((j8 * 8) + j9)])
    FOR j10 in 0..4
      FOR j11 in 0..8
        T6[((j10 * 8) + j11)] = cast(T5[((j10 * 8) + j11)])
    FOR j12 in 0..4
      T7[j12] = 0.0
      FOR j13 in 0..8
        T7[j12] = sum(T7[j12], T5[((j12 * 8) + j13)])

After (the silu only reaches a bf16 cast; the exp also feeds the sum)::

    FOR j2 in 0..4
      FOR j3 in 0..8
        T2[((j2 * 8) + j3)] = fast_silu(T1[((j2 * 8) + j3)])
    ...
    FOR j8 in 0..4
      FOR j9 in 0..8
        T5[((j8 * 8) + j9)] = exp(T4[((j8 * 8) + j9)])
"""

from __future__ import annotations

from ..ir import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    DataType,
    LoadStoreOp,
    TensorView,
    TernaryOp,
    UnaryOp,
    ViewExpr,
)
from .kir import Assign, Kernel, walk

# log2 of each fast variant's largest relative error, fp32 roundings inside it included
# (derivations in the prelude's comments)
REL_ERROR = {"exp": -15, "sigmoid": -15, "silu": -15, "gelu": -15, "tanh": -11}

# significand bits (the implicit one included) of the 16-bit types a value may be rounded to
_BITS = {DataType.BFloat16: 8, DataType.Half: 11}

# ops through which a relative error stays relative (one more rounding each)
_SCALING = {"mul", "div", "truediv", "maximum", "minimum"}
_SCALING_UNARY = {"neg", "abs", "relu"}
# ops where a cancellation magnifies it: counted as a magnification by 2^ADDITIVE_BITS
_ADDITIVE = {"add", "sub"}
ADDITIVE_BITS = 4


def hides(dtype: DataType, rel_error_log2: int) -> bool:
    """Whether rounding to ``dtype`` hides a relative error of 2^``rel_error_log2``:
    at most 1/8 of its ulp, which is at least 2^-bits of the value.

    >>> hides(DataType.BFloat16, -11), hides(DataType.Half, -11), hides(DataType.Half, -15)
    (True, False, True)
    """
    return dtype in _BITS and rel_error_log2 <= -_BITS[dtype] - 3


def use_fast_math(kernel: Kernel) -> Kernel:
    """Entry: mark ``Assign.fast`` on each fp32 transcendental whose error no output shows."""
    if not kernel.fast_math:
        return kernel
    outputs = {id(p.tv) for p in kernel.tensor_params if p.is_output}
    memo: dict = {}

    def visit(n, _stack):
        if isinstance(n, Assign) and _candidate(n):
            n.fast = _hidden(n.expr.out, REL_ERROR[n.expr.op_name], outputs, memo)

    walk(kernel.body, visit)
    return kernel


def _candidate(a: Assign) -> bool:
    e = a.expr
    return (
        isinstance(e, UnaryOp)
        and e.op_name in REL_ERROR
        and e.out.dtype == DataType.Float
        and a.lhs.vector == 1
        and not a.accumulate
    )


def _hidden(tv: TensorView, err: int, outputs: set, memo: dict) -> bool:
    """Whether every use of fp32 ``tv``, off by 2^``err`` relative, reaches the
    outputs only through ops that keep the error relative, ``add``/``sub``
    (each counted as magnifying it by 2^ADDITIVE_BITS) and a rounding that hides it."""
    key = (id(tv), err)
    if key not in memo:
        memo[key] = id(tv) not in outputs and all(_use_hides(use, tv, err, outputs, memo) for use in tv.uses)
    return memo[key]


def _use_hides(use, tv: TensorView, err: int, outputs: set, memo: dict) -> bool:
    if len(use.outputs) != 1:
        return False
    if isinstance(use, (CastOp, LoadStoreOp, BroadcastOp, ViewExpr)):
        pass
    elif isinstance(use, UnaryOp):
        if use.op_name not in _SCALING_UNARY:
            return False
    elif isinstance(use, BinaryOp):
        if use.op_name in _ADDITIVE:
            err += ADDITIVE_BITS
        elif use.op_name not in _SCALING:
            return False
    elif isinstance(use, TernaryOp):  # where(cond, a, b): the values, not the condition
        if use.inputs[0] is tv:
            return False
    else:
        return False
    out = use.out
    if out.dtype in _BITS:
        return hides(out.dtype, err)
    return out.dtype == DataType.Float and _hidden(out, err, outputs, memo)
