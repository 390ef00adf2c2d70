"""Scalar expressions: symbolic extents, loop indices, index math, scalar inputs.

Scalars are immutable trees compared structurally. Python operators build them
with light folding; :func:`simplify` does the real work (constant folding,
linear canonical form, ``(a*c + b) / c -> a`` when ``0 <= b < c`` is provable
from ranges, ``(x / c) * c + x % c -> x``).

>>> i = Var("i", hi=Const(4)); n = Var("n")
>>> str(simplify((n * 4 + i) // 4)), str(simplify((n * 4 + i) % 4))
('n', 'i')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .dtype import DataType

INF = math.inf


class Scalar:
    """Base of scalar expressions; operators build Bin nodes."""

    dtype: DataType = DataType.Int64

    # arithmetic builders -------------------------------------------------
    def __add__(self, o):
        return _bin("+", self, o)

    def __radd__(self, o):
        return _bin("+", o, self)

    def __sub__(self, o):
        return _bin("-", self, o)

    def __rsub__(self, o):
        return _bin("-", o, self)

    def __mul__(self, o):
        return _bin("*", self, o)

    def __rmul__(self, o):
        return _bin("*", o, self)

    def __floordiv__(self, o):
        return _bin("/", self, o)

    def __mod__(self, o):
        return _bin("%", self, o)

    def lt(self, o):
        return _bin("<", self, o)

    def ge(self, o):
        return _bin(">=", self, o)

    def eq(self, o):
        return _bin("==", self, o)

    def _bin_op(self, op: str, o):
        """``self op o`` for any binary scalar operator (``"<="``, ``"max"``, ...)."""
        return _bin(op, self, o)

    def children(self) -> tuple:
        return ()


@dataclass(frozen=True, eq=True)
class Const(Scalar):
    value: object
    dtype: DataType = DataType.Int64

    def __str__(self):
        if self.dtype == DataType.Bool:
            return "true" if self.value else "false"
        return repr(self.value) if self.dtype.is_float else str(int(self.value))


@dataclass(frozen=True, eq=True)
class Var(Scalar):
    """A named scalar: a symbolic extent (``i0``), a loop index, a thread index,
    or a fusion scalar input. ``lo``/``hi`` bound its range (hi exclusive)."""

    name: str
    dtype: DataType = DataType.Int64
    lo: object = field(default=0, compare=False)
    hi: object = field(default=None, compare=False)  # Scalar or None (unbounded)

    def __str__(self):
        return self.name


@dataclass(frozen=True, eq=True)
class Bin(Scalar):
    op: str
    a: Scalar
    b: Scalar
    dtype: DataType = DataType.Int64

    def children(self):
        return (self.a, self.b)

    def __str__(self):
        if self.op.isidentifier():  # ceilDiv, min, max, fmod, pow, gcd, ...
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True, eq=True)
class Un(Scalar):
    """A function of one scalar (fusion scalar math): ``neg``, ``abs``,
    ``reciprocal``, ``exp``, ... or ``cast`` to ``dtype``.

    >>> str(Un("cast", Var("s0", DataType.Double), DataType.Int32))
    'cast(s0, Int32)'
    """

    op: str
    a: Scalar
    dtype: DataType = DataType.Double

    def children(self):
        return (self.a,)

    def __str__(self):
        if self.op == "cast":
            return f"cast({self.a}, {self.dtype.name})"
        return f"{self.op}({self.a})"


def un(op: str, a, dtype: DataType) -> Scalar:
    """``op`` (one of :class:`Un`'s) of scalar ``a``, a ``dtype`` scalar. A
    constant folds, except a domain edge (``log(0.0)``), which the kernel
    computes as C does, and a cast whose value the device decides: rounding
    to Float or a 16-bit float, or an integer out of the target's range.

    >>> un("neg", Const(2), DataType.Int64) == Const(-2), un("cast", 2.5, DataType.Int32)
    (True, Const(value=2, dtype=DataType.Int32))
    >>> str(un("cast", Const(2.5, DataType.Double), DataType.BFloat16)), str(un("exp", Var("s"), DataType.Double))
    ('cast(2.5, BFloat16)', 'exp(s)')
    """
    a = as_scalar(a)
    if not isinstance(a, Const) or (op == "cast" and not _exact_cast(a.value, dtype)):
        return Un(op, a, dtype)
    try:
        v = _eval_un(op, a.value, dtype)
    except (ArithmeticError, ValueError):
        return Un(op, a, dtype)
    return Const(bool(v) if dtype == DataType.Bool else v, dtype)


def _exact_cast(x, dtype: DataType) -> bool:
    """True when casting the number ``x`` to ``dtype`` gives one value on the
    host and the device: to Double (rounded to nearest, as C) or Bool, or to
    an integer type it fits after truncation."""
    if dtype in (DataType.Double, DataType.Bool):
        return True
    if not dtype.is_int or isinstance(x, float) and not math.isfinite(x):
        return False
    half = 1 << (8 * dtype.size - 1)
    return -half <= math.trunc(x) < half


_CMP = ("<", ">=", "==", "&&", "<=", ">", "!=", "||")
# fusion scalar math beyond index arithmetic (nvFuser's scalar binary ops)
_BITWISE = ("&", "|", "^")  # Bool on two Bools, else Int64
_INT_FNS = ("gcd", "bitwise_left_shift", "bitwise_right_shift", "logical_right_shift")
_FLOAT_FNS = ("atan2", "nextafter")  # Double on any operands


def as_scalar(x) -> Scalar:
    if isinstance(x, Scalar):
        return x
    if isinstance(x, bool):
        return Const(x, DataType.Bool)
    if isinstance(x, int):
        return Const(x)
    if isinstance(x, float):
        return Const(x, DataType.Double)
    raise TypeError(f"not a scalar: {x!r}")


def _bin(op, a, b) -> Scalar:
    a, b = as_scalar(a), as_scalar(b)
    if op in _CMP or (op in _BITWISE and a.dtype == b.dtype == DataType.Bool):
        dt = DataType.Bool
    elif op in _FLOAT_FNS:
        dt = DataType.Double
    elif op in _BITWISE + _INT_FNS:
        dt = DataType.Int64
    elif a.dtype.is_float or b.dtype.is_float:
        dt = DataType.Double
    else:
        dt = DataType.Int64
    return _fold(Bin(op, a, b, dt))


def ceil_div(a, b) -> Scalar:
    return _bin("ceilDiv", a, b)


def is_const(x, value=None) -> bool:
    return isinstance(x, Const) and (value is None or x.value == value)


def _fold(e: Bin) -> Scalar:
    """Cheap local folding done at construction time."""
    a, b, op = e.a, e.b, e.op
    if isinstance(a, Const) and isinstance(b, Const):
        if op in ("/", "%", "ceilDiv") and b.value == 0 and not isinstance(b.value, float):
            # an index over an axis of extent 0 (a kernel specialized to an empty view): left to
            # run time, where no thread reaches it; folding would divide by zero here
            return e
        if op in _FNS:
            try:
                v = _eval_op(op, a.value, b.value)
            except (ArithmeticError, ValueError):
                return e  # a domain edge (fmod(x, 0.0), ...): the kernel computes it as C does
        else:
            v = _eval_op(op, a.value, b.value)
        return Const(v, e.dtype)
    if op == "+":
        if is_const(a, 0):
            return b
        if is_const(b, 0):
            return a
    elif op == "-":
        if is_const(b, 0):
            return a
        if a == b:
            return Const(0)
    elif op == "*":
        if is_const(a, 1):
            return b
        if is_const(b, 1):
            return a
        if (is_const(a, 0) or is_const(b, 0)) and not e.dtype.is_float:
            return Const(0)
    elif op in ("/", "ceilDiv"):
        if is_const(b, 1):
            return a
        if is_const(a, 0):
            return Const(0)
    elif op == "%":
        if is_const(b, 1) or is_const(a, 0):
            return Const(0)
    elif op == "&&":
        if is_const(a, True):
            return b
        if is_const(b, True):
            return a
    return e


def _eval_op(op, x, y):
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "/":
        if isinstance(x, float) or isinstance(y, float):
            return x / y
        q = abs(x) // abs(y)  # C truncation
        return q if (x >= 0) == (y >= 0) else -q
    if op == "%":
        return x - y * _eval_op("/", x, y)
    if op == "ceilDiv":
        return -(-x // y)
    if op == "min":
        return min(x, y)
    if op == "max":
        return max(x, y)
    if op == "<":
        return x < y
    if op == ">=":
        return x >= y
    if op == "==":
        return x == y
    if op == "&&":
        return bool(x) and bool(y)
    if op == "||":
        return bool(x) or bool(y)
    if op == "<=":
        return x <= y
    if op == ">":
        return x > y
    if op == "!=":
        return x != y
    if op == "&":
        return x & y
    if op == "|":
        return x | y
    if op == "^":  # two Bools give a Bool, as _bin types it; else integers
        return x ^ y
    return _FNS[op](x, y)


def _wrap64(v: int) -> int:
    """``v`` as a two's-complement 64-bit integer (the device's long long)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _is_float(*xs) -> bool:
    return any(isinstance(x, float) for x in xs)


def _fmod(x, y):
    """C ``fmod`` / integer ``%``: the sign of the dividend."""
    if _is_float(x, y):
        return math.fmod(x, y)
    if y == 0:
        raise ZeroDivisionError("integer fmod by zero")
    return x - y * _eval_op("/", x, y)


def _remainder(x, y):
    """Python's (and torch's) modulo: the sign of the divisor."""
    m = _fmod(x, y)
    if m != 0 and (y < 0) != (m < 0):
        m += y
    return m


def _pow(x, y):
    if _is_float(x, y):
        return math.pow(x, y)
    if y < 0:  # integer powers as nvFuser and torch compute them
        return 1 if x == 1 else ((-1 if -y % 2 else 1) if x == -1 else 0)
    return _wrap64(pow(x, y, 1 << 64))


def _shift_left(x, y):
    return 0 if not 0 <= y < 64 else _wrap64(x << y)


def _shift_right(x, y):
    return x >> (y if 0 <= y < 64 else 63)


def _logical_shift_right(x, y):
    return 0 if not 0 <= y < 64 else _wrap64((x & ((1 << 64) - 1)) >> y)


_FNS = {
    "fmod": _fmod,
    "remainder": _remainder,
    "pow": _pow,
    "atan2": lambda x, y: math.atan2(float(x), float(y)),
    "nextafter": lambda x, y: math.nextafter(float(x), float(y)),
    "gcd": math.gcd,
    "bitwise_left_shift": _shift_left,
    "bitwise_right_shift": _shift_right,
    "logical_right_shift": _logical_shift_right,
}


def _eval_un(op, x, dtype):
    if op == "cast":
        if dtype == DataType.Bool:
            return bool(x)
        return float(x) if dtype.is_float else int(x)
    if op == "neg":
        return -x
    if op == "abs":
        return abs(x)
    if op == "reciprocal":
        return 1.0 / x
    if op == "relu":
        return x if x > 0 else 0 * x
    if op == "bitwise_not":
        return (not x) if dtype == DataType.Bool else ~x
    if op in _ROUNDING and not isinstance(x, float):
        return x  # integers are already whole
    if op in _PREDICATES:
        return _PREDICATES[op](x)
    return _MATH[op](float(x))


_ROUNDING = ("floor", "ceil", "round", "trunc")
_PREDICATES = {
    "isnan": lambda v: math.isnan(v),
    "isinf": lambda v: math.isinf(v),
    "isfinite": lambda v: math.isfinite(v),
    "isposinf": lambda v: v == math.inf,
    "isneginf": lambda v: v == -math.inf,
    "isreal": lambda v: True,
    "signbit": lambda v: math.copysign(1.0, v) < 0 if isinstance(v, float) else v < 0,
}


def _erfinv(y: float) -> float:
    """Inverse of ``math.erf`` (Winitzki's estimate, then Newton steps)."""
    if not -1.0 < y < 1.0:
        if abs(y) == 1.0:
            return math.copysign(math.inf, y)
        raise ValueError("erfinv outside [-1, 1]")
    ln = math.log1p(-y * y)
    t = 2.0 / (math.pi * 0.147) + ln / 2.0
    x = math.copysign(math.sqrt(math.sqrt(t * t - ln / 0.147) - t), y)
    for _ in range(4):
        x -= (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


# the floating-point functions of _eval_un, on a float
_MATH = {
    "exp": math.exp,
    "exp2": lambda v: 2.0**v,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda v: 1 / math.sqrt(v),
    "tanh": math.tanh,
    "sigmoid": lambda v: 1 / (1 + math.exp(-v)),
    "silu": lambda v: v / (1 + math.exp(-v)),
    "gelu": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "asinh": math.asinh,
    "acosh": math.acosh,
    "atanh": math.atanh,
    "erf": math.erf,
    "erfc": math.erfc,
    "erfinv": _erfinv,
    "erfcinv": lambda v: _erfinv(1.0 - v),
    "lgamma": math.lgamma,
    "log1p": math.log1p,
    "expm1": math.expm1,
    "log2": math.log2,
    "log10": math.log10,
    "floor": lambda v: float(math.floor(v)),
    "ceil": lambda v: float(math.ceil(v)),
    "round": lambda v: float(round(v)),  # half to even, as rint and torch.round
    "trunc": lambda v: float(math.trunc(v)),
    "frac": lambda v: v - math.trunc(v),
}


def evaluate(e: Scalar, env: dict):
    """Evaluate with ``env`` mapping Var names to numbers.

    >>> evaluate(ceil_div(Var("n"), 4), {"n": 10})
    3
    """
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Un):
        return _eval_un(e.op, evaluate(e.a, env), e.dtype)
    return _eval_op(e.op, evaluate(e.a, env), evaluate(e.b, env))


def free_vars(e: Scalar, out=None) -> dict:
    out = {} if out is None else out
    if isinstance(e, Var):
        out[e.name] = e
    for c in e.children():
        free_vars(c, out)
    return out


def substitute(e: Scalar, mapping: dict) -> Scalar:
    """Replace Vars (by name) with scalars."""
    if isinstance(e, Var):
        return mapping.get(e.name, e)
    if isinstance(e, Bin):
        a, b = substitute(e.a, mapping), substitute(e.b, mapping)
        if a is e.a and b is e.b:
            return e
        return _bin(e.op, a, b)
    if isinstance(e, Un):
        a = substitute(e.a, mapping)
        return e if a is e.a else Un(e.op, a, e.dtype)
    return e


# ---------------------------------------------------------------- ranges
def value_range(e: Scalar) -> tuple:
    """Conservative [lo, hi] (inclusive) of an integer expression."""
    if isinstance(e, Const):
        return (e.value, e.value)
    if isinstance(e, Var):
        if e.hi is None:
            return (e.lo, INF)
        hi = value_range(as_scalar(e.hi))[1]
        return (e.lo, hi - 1)
    if isinstance(e, Un):
        return (-INF, INF)
    la, ha = value_range(e.a)
    lb, hb = value_range(e.b)
    op = e.op
    if op == "+":
        return (la + lb, ha + hb)
    if op == "-":
        return (la - hb, ha - lb)
    if op == "*":
        if la >= 0 and lb >= 0:
            return (la * lb, ha * hb)
        return (-INF, INF)
    if op in ("/", "ceilDiv"):
        if la >= 0 and lb > 0:
            if op == "/":
                return (la // hb if hb != INF else 0, ha // lb if ha != INF else INF)
            return (-(-la // lb), -(-ha // lb) if ha != INF else INF)
        return (-INF, INF)
    if op == "%":
        if la >= 0 and lb > 0:
            return (0, min(ha, hb - 1))
        return (-INF, INF)
    if op == "min":
        return (min(la, lb), min(ha, hb))
    if op == "max":
        return (max(la, lb), max(ha, hb))
    if op == "^":  # phase bits
        return (0, 1) if la >= 0 and lb >= 0 and ha <= 1 and hb <= 1 else (-INF, INF)
    if op in _CMP:
        return (0, 1)
    return (-INF, INF)


# ------------------------------------------------------------ simplifier
def simplify(e: Scalar) -> Scalar:
    """Simplify an index expression (see module docstring).

    >>> x = Var("x"); str(simplify((x // 8) * 8 + x % 8))
    'x'
    """
    if isinstance(e, Un):
        a = simplify(e.a)
        return e if a is e.a else Un(e.op, a, e.dtype)
    if not isinstance(e, Bin):
        return e
    a, b = simplify(e.a), simplify(e.b)
    if e.dtype.is_float or a.dtype.is_float or b.dtype.is_float:
        return _bin(e.op, a, b)
    op = e.op
    if op in ("+", "-", "*"):
        return _from_linear(_linear(_bin(op, a, b)))
    if op in ("/", "%") and isinstance(b, Const) and b.value > 0:
        c = b.value
        lo, hi = value_range(a)
        if lo >= 0 and hi < c:
            return Const(0) if op == "/" else a
        terms = _linear(a)
        if all(coef >= 0 for coef in terms.values()) and lo >= 0:
            div = {m: k // c for m, k in terms.items() if k % c == 0}
            rest = {m: k for m, k in terms.items() if k % c != 0}
            if div:
                r = _from_linear(rest)
                rlo, rhi = value_range(r)
                if rlo >= 0 and rhi < c:
                    return _from_linear(div) if op == "/" else r
                if op == "%":
                    return _bin("%", r, b)
    if (
        op == "ceilDiv"
        and isinstance(b, Const)
        and b.value > 0
        and isinstance(a, Bin)
        and a.op == "ceilDiv"
        and isinstance(a.b, Const)
        and a.b.value > 0
    ):
        # ceil(ceil(x / p) / q) = ceil(x / (p q)) for positive p, q: the 64-column groups
        # of a row, taken bn / 64 at a time, are its bn-column tiles
        return _bin("ceilDiv", a.a, Const(a.b.value * b.value))
    if op == "/" and isinstance(b, Bin) is False and not isinstance(b, Const):
        lo, hi = value_range(a)
        blo, _ = value_range(b)
        if lo >= 0 and hi < blo:
            return Const(0)
    if op == "%" and not isinstance(b, Const):
        lo, hi = value_range(a)
        blo, _ = value_range(b)
        if lo >= 0 and hi < blo:
            return a
    if op == "<":
        la, ha = value_range(a)
        lb, hb = value_range(b)
        if ha < lb:
            return Const(True, DataType.Bool)
    return _bin(op, a, b)


def _linear(e: Scalar) -> dict:
    """Sum of coeff * monomial; monomial is a sorted tuple of atom keys."""
    if isinstance(e, Const) and not e.dtype.is_float and e.dtype != DataType.Bool:
        return {(): e.value} if e.value else {}
    if isinstance(e, Bin) and e.op in ("+", "-"):
        x, y = _linear(e.a), _linear(e.b)
        s = -1 if e.op == "-" else 1
        for m, k in y.items():
            x[m] = x.get(m, 0) + s * k
        return {m: k for m, k in x.items() if k}
    if isinstance(e, Bin) and e.op == "*":
        x, y = _linear(e.a), _linear(e.b)
        if len(x) <= 1 or len(y) <= 1 or () in x and len(x) == 1 or () in y and len(y) == 1:
            out = {}
            for mx, kx in x.items():
                for my, ky in y.items():
                    m = tuple(sorted(mx + my, key=_atom_key))
                    out[m] = out.get(m, 0) + kx * ky
            return {m: k for m, k in out.items() if k}
    return {(e,): 1}


def _atom_key(a):
    return str(a)


def _from_linear(terms: dict) -> Scalar:
    # (x / c) * c + x % c  ->  x   (also with symbolic c)
    terms = dict(terms)
    changed = True
    while changed:
        changed = False
        for m, k in list(terms.items()):
            if len(m) != 1 or not isinstance(m[0], Bin) or m[0].op != "%":
                continue
            x, c = m[0].a, m[0].b
            div = Bin("/", x, c)
            if isinstance(c, Const):
                key, kd = (div,), terms.get((div,), 0)
                need = k * c.value
            else:
                key = tuple(sorted((div, c), key=_atom_key))
                kd, need = terms.get(key, 0), k
            if kd == need and kd:
                del terms[m], terms[key]
                for mm, kk in _linear(x).items():
                    terms[mm] = terms.get(mm, 0) + kk * k
                terms = {q: v for q, v in terms.items() if v}
                changed = True
                break
    out = None
    const = terms.pop((), 0)
    for m, k in sorted(terms.items(), key=lambda mk: [_atom_key(a) for a in mk[0]]):
        prod = None
        for atom in m:
            prod = atom if prod is None else _fold(Bin("*", prod, atom))
        if k != 1:
            prod = _fold(Bin("*", prod, Const(k))) if k > 0 else _fold(Bin("*", prod, Const(-k)))
            if k < 0:
                out = Const(0) if out is None else out
                out = _fold(Bin("-", out, prod))
                continue
        out = prod if out is None else _fold(Bin("+", out, prod))
    if const:
        out = Const(const) if out is None else _fold(Bin("+", out, Const(const)))
    return Const(0) if out is None else out
