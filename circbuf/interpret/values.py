"""Values of an interpreted kernel: scalar expressions compiled to closures,
the element operations of ``Assign`` nodes, and rounding to storage types.

Both the index arithmetic and the tensor operations take their C semantics
from :mod:`circbuf.ir.scalar` (``evaluate``'s own operator table): a
scalar tree is compiled once into nested closures over that table, and a
fusion op maps to the scalar operator of the same name (the frontend's
table). Only what the device does differently from a fusion scalar is
written here: NaN-propagating ``maximum``/``minimum`` (``cb::maximum``) and
IEEE results where Python's math raises (``1.0 / 0.0``, ``log(0.0)``).

>>> from circbuf.ir import Var
>>> f = compile_scalar((Var("i") * 3 - 7) // 2)   # C division truncates toward zero
>>> f({"i": 1})
-2
>>> to_storage(DataType.BFloat16)(1.0 + 2**-9), to_storage(DataType.Int32)(2**31)
(1.0, -2147483648)
"""

from __future__ import annotations

import math
import struct

import torch

from ..frontend import _SCALAR_BIN
from ..ir import DataType
from ..ir.scalar import Bin, Const, Un, Var, _eval_op, _eval_un

# ------------------------------------------------------------ scalars


_INLINE = ("+", "-", "*", "<", ">=", "==", "<=", ">", "!=", "&", "|", "^")  # _eval_op computes `x op y`


def compile_scalar(e):
    """A function ``env -> value`` computing scalar ``e`` as ``evaluate``
    does: one Python expression, the operators ``evaluate`` computes as
    Python's (``+``, ``<``, ...) written inline, every other one (C's
    truncating ``/`` and ``%``, ``ceilDiv``, ``min``, casts, math) a call of
    ``evaluate``'s own functions."""
    names: dict = {"_ev": _eval_op, "_un": _eval_un}

    def bind(v) -> str:
        key = f"_c{len(names)}"
        names[key] = v
        return key

    def text(x) -> str:
        if isinstance(x, Const):
            v = x.value
            return repr(v) if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)) else bind(v)
        if isinstance(x, Var):
            return f"env[{x.name!r}]"
        if isinstance(x, Un):
            return f"_un({x.op!r}, {text(x.a)}, {bind(x.dtype)})"
        if isinstance(x, Bin):
            a, b = text(x.a), text(x.b)
            if x.op in _INLINE:
                return f"({a} {x.op} {b})"
            if x.op in ("/", "%"):  # C's truncation; Python's floor agrees on non-negative integers
                t = f"_t{len(names)}"
                names[t] = None
                u = f"_t{len(names)}"
                names[u] = None
                py = "//" if x.op == "/" else "%"
                return (
                    f"({t} {py} {u} if (({t} := {a}) >= 0) & (({u} := {b}) > 0) and type({t}) is int "
                    f"and type({u}) is int else _ev({x.op!r}, {t}, {u}))"
                )
            if x.op == "&&":
                return f"(bool({a}) and bool({b}))"
            if x.op == "||":
                return f"(bool({a}) or bool({b}))"
            return f"_ev({x.op!r}, {a}, {b})"
        raise TypeError(f"not a scalar: {x!r}")

    return eval(f"lambda env: {text(e)}", names)  # noqa: S307 - text built from the IR above


class ScalarCache:
    """Compiled closures of the scalars of one kernel, by identity (the
    kernel's nodes hold them for the interpreter's lifetime)."""

    def __init__(self):
        self._fns: dict = {}
        self._keep: list = []  # the scalars compiled: each id stays its object's

    def __call__(self, e):
        f = self._fns.get(id(e))
        if f is None:
            f = compile_scalar(e) if not isinstance(e, (int, float, bool)) else (lambda env, v=e: v)
            self._fns[id(e)] = f
            self._keep.append(e)
        return f


# ------------------------------------------------------------ storage types

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F16 = struct.Struct("<e")


def _round_f32(v: float) -> float:
    try:
        return _F32.unpack(_F32.pack(v))[0]
    except OverflowError:  # beyond FLT_MAX: inf, as the device's rounding
        return (
            math.copysign(math.inf, v)
            if abs(v) >= 3.4028235677973366e38
            else math.copysign(3.4028234663852886e38, v)
        )


def _round_f16(v: float) -> float:
    try:
        return _F16.unpack(_F16.pack(v))[0]
    except OverflowError:
        return math.copysign(math.inf, v) if abs(v) >= 65520.0 else math.copysign(65504.0, v)


def _round_bf16(v: float) -> float:
    if v != v:
        return v
    bits = _U32.unpack(_F32.pack(_round_f32(v)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return _F32.unpack(_U32.pack(bits & 0xFFFFFFFF))[0]


def _wrap(bits: int):
    half, full = 1 << (bits - 1), 1 << bits

    def f(v):
        v = int(v)
        v &= full - 1
        return v - full if v >= half else v

    return f


def _to_float(v):
    return float(v)


def _to_bool(v):
    return bool(v)


_STORE = {
    DataType.Float: _round_f32,
    DataType.Half: _round_f16,
    DataType.BFloat16: _round_bf16,
    DataType.Double: _to_float,
    DataType.Int32: _wrap(32),
    DataType.Int64: _wrap(64),
    DataType.Bool: _to_bool,
}


def to_storage(dt: DataType):
    """``value -> value`` as a buffer of ``dt`` holds it (16-bit and fp32
    floats rounded to nearest even, integers wrapped)."""
    return _STORE[dt]


def _to_int(dt: DataType):
    wrap = _STORE[dt]
    top = (1 << (8 * dt.size - 1)) - 1

    def f(v):
        if isinstance(v, float):
            if not math.isfinite(v):  # undefined in C; the device gives the type's extreme
                return 0 if v != v else (top if v > 0 else -top - 1)
            v = math.trunc(v)
        return wrap(v)

    return f


_CONVERT = {
    DataType.Bool: _to_bool,
    DataType.Int32: _to_int(DataType.Int32),
    DataType.Int64: _to_int(DataType.Int64),
    DataType.Float: _round_f32,
    DataType.Half: _round_f16,
    DataType.BFloat16: _round_bf16,
    DataType.Double: _to_float,
}


def converter(dt: DataType):
    """``value -> value`` converted to type ``dt`` as ``cb::cast`` does (C
    conversions: floats truncated to integers, rounded to narrower floats)."""
    return _CONVERT[dt]


def convert(v, dt: DataType):
    """``v`` converted to type ``dt`` (:func:`converter`)."""
    return _CONVERT[dt](v)


# ------------------------------------------------------------ element operations

_TORCH_UN = {
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
    "relu": torch.relu,
    "exp2": torch.exp2,
    "erfcinv": lambda t: torch.erfinv(1.0 - t),
}


def _ieee_unary(op, x):
    """``op(x)`` in float64 where Python's math raises (a domain edge)."""
    fn = _TORCH_UN.get(op) or getattr(torch, op)
    return fn(torch.tensor(float(x), dtype=torch.float64)).item()


_TORCH_BIN = {"/": torch.true_divide, "fmod": torch.fmod, "remainder": torch.remainder, "pow": torch.pow}


def unary(op: str, dt: DataType):
    """The element function of UnaryOp ``op`` computing in type ``dt``."""

    def f(x):
        try:
            return _eval_un(op, x, dt)
        except (ValueError, OverflowError, ZeroDivisionError):
            if not isinstance(x, float):
                x = float(x)
            return _ieee_unary(op, x)

    return f


def _nan_max(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a > b else b


def _nan_min(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


def binary(op_name: str, dt: DataType):
    """The element function of BinaryOp ``op_name`` on operands of type ``dt``."""
    if op_name == "maximum":
        return _nan_max
    if op_name == "minimum":
        return _nan_min
    if op_name == "truediv":
        op = "/"
    elif op_name == "mod":
        op = "fmod"
    else:
        op = _SCALAR_BIN[op_name]
    floating = dt.is_float

    def f(a, b):
        try:
            return _eval_op(op, a, b)
        except (ValueError, OverflowError, ZeroDivisionError):
            if floating and op in _TORCH_BIN:
                t = torch.tensor
                return _TORCH_BIN[op](
                    t(float(a), dtype=torch.float64), t(float(b), dtype=torch.float64)
                ).item()
            if floating and op == "*":
                return math.inf if (a > 0) == (b > 0) else -math.inf
            return -1  # integer division by zero: undefined in C; the device gives all ones

    return f


def reduction(op_name: str, dt: DataType):
    """The combining function of ReductionOp ``op_name`` (its binary op)."""
    from ..ir import ReductionOp

    return binary(ReductionOp.OPS[op_name], dt)
