"""FusionDefinition: the nvFuser-style Python frontend.

>>> import circbuf as cb
>>> with cb.FusionDefinition() as fd:
...     x = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
...     y = fd.ops.cast(fd.ops.silu(x), cb.DataType.BFloat16)
...     fd.add_output(y)
>>> print(fd.fusion.print_math().splitlines()[-3])
  T2 = silu(T1)
"""

from __future__ import annotations

import math

from .frontend_matmul import ContractionOps
from .ir import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    CircbufError,
    Const,
    DataType,
    FullOp,
    Fusion,
    IterDomain,
    IterType,
    LoadStoreOp,
    ReductionOp,
    Scalar,
    TensorView,
    TernaryOp,
    UnaryOp,
    Var,
    as_scalar,
    broadcast_ids,
    compute_type,
    promote,
    promote_with_scalar,
    reduction_init,
)
from .ir.scalar import is_const, un


class FusionDefinition:
    """Define a fusion inside ``with``; then ``execute`` or ``compile`` it."""

    def __init__(self):
        self.fusion = Fusion()
        self.fusion.check_overrides = _check_overrides
        self.ops = Ops(self)
        self._executor = None
        self._vectors: list[tuple[int, int]] = []  # define_vector(n) inputs: (first position, n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    # ------------------------------------------------------------ inputs
    def define_tensor(
        self, shape, contiguity=None, dtype=DataType.Float, is_cpu=False, stride_order=None
    ) -> TensorView:
        """A tensor input, with nvFuser's arguments. ``-1`` marks a symbolic
        extent, ``1`` a broadcast axis, other ints a fixed extent.
        ``stride_order[d]`` ranks axis ``d``'s stride (larger = larger
        stride; default row-major ``[n-1, ..., 0]``; channels-last NCHW is
        ``[3, 0, 2, 1]``). ``contiguity`` (True/False/None per axis, in
        stride order, outermost first, as nvFuser gives it) is checked
        against the tensors passed at run time. For code written against
        circbuf's earlier ``define_tensor(shape, dtype)``, a DataType in
        second place is taken as the dtype.

        >>> fd = FusionDefinition(); t = fd.define_tensor([-1, 4])
        >>> x = fd.define_tensor([-1, -1, -1, -1], stride_order=[3, 0, 2, 1])  # channels-last
        """
        if isinstance(contiguity, DataType):
            contiguity, dtype = (dtype if isinstance(dtype, (list, tuple)) else None), contiguity
        if not isinstance(dtype, DataType):
            raise CircbufError(f"define_tensor: dtype must be a circbuf DataType, got {dtype!r}")
        if is_cpu:
            raise CircbufError("define_tensor: CPU scalar tensors (is_cpu=True) are not supported")
        if stride_order is not None:
            stride_order = list(stride_order)
            if sorted(stride_order) != list(range(len(shape))):
                raise CircbufError(
                    f"define_tensor: stride_order {stride_order} is not a permutation of 0..{len(shape) - 1}"
                )
        ids = []
        for k, s in enumerate(shape):
            if not isinstance(s, int) or isinstance(s, bool) or s < -1:
                raise CircbufError(f"define_tensor: extent {s!r} of axis {k} must be -1 or >= 0")
            if s == -1:
                ids.append(IterDomain(self.fusion.new_extent()))
            elif s == 1:
                ids.append(IterDomain(Const(1), IterType.Broadcast))
            else:
                ids.append(IterDomain(Const(s)))
        if contiguity is not None and len(contiguity) != len(shape):
            raise CircbufError(
                f"define_tensor: contiguity has {len(contiguity)} entries for {len(shape)} axes"
            )
        tv = self.fusion.register(TensorView(ids, dtype, contiguity=contiguity or [None] * len(ids)))
        tv.domain.stride_order = stride_order
        self.fusion.add_input(tv)
        return tv

    def define_scalar(self, value=None, dtype=None):
        """A scalar: a constant when ``value`` is given, else a run-time input.
        ``dtype`` defaults to the value's (``3`` is Int64, ``2.0`` Double, as in
        nvFuser), or Double for an input.

        >>> fd = FusionDefinition(); n = fd.define_scalar(dtype=DataType.Int64)
        """
        if dtype is None:
            dtype = _scalar_dtype(value) if value is not None else DataType.Double
        if not isinstance(dtype, DataType):
            raise CircbufError(f"define_scalar: dtype must be a circbuf DataType, got {dtype!r}")
        if value is not None:
            return Const(value, dtype)
        # a run-time value of either sign: index simplification must not assume it >= 0
        v = Var(f"s{sum(1 for i in self.fusion.inputs if isinstance(i, Var))}", dtype, lo=-math.inf)
        self.fusion.add_input(v)
        return v

    def define_vector(self, values, dtype=DataType.Int64):
        """A shape, as nvFuser's: ``values`` a list of ints and integer
        scalars (``[x.size(0) * x.size(1), 8]``), usable wherever a shape is
        (reshape, broadcast_in_dim, full); or an int ``n``: a run-time input
        of ``n`` integers, passed to ``execute`` as one list or tuple.

        >>> fd = FusionDefinition(); v = fd.define_vector([2, 3])
        >>> w = fd.define_vector(2)   # fd.execute([..., [4, 6]])
        """
        if dtype not in (DataType.Int64, DataType.Int32):
            raise CircbufError(f"define_vector: a vector of sizes is of an integer dtype, not {dtype!r}")
        if isinstance(values, int) and not isinstance(values, bool):
            if values < 0:
                raise CircbufError(f"define_vector: a vector input has >= 0 entries, not {values}")
            self._vectors.append((len(self.fusion.inputs), values))
            return [self.define_scalar(dtype=dtype) for _ in range(values)]
        if not isinstance(values, (list, tuple)):
            raise CircbufError(f"define_vector: values must be a list of sizes or a length, got {values!r}")
        for k, v in enumerate(values):
            _shape_entry(v, f"define_vector: entry {k} of {list(values)}")  # ints or integer scalars
        return list(values)

    def _flat_inputs(self, inputs):
        """``inputs`` with each define_vector(n) input's list spread into its n scalars."""
        if not self._vectors or not isinstance(inputs, (list, tuple)):
            return inputs
        flat, k = [], 0
        for pos, n in self._vectors:
            while len(flat) < pos and k < len(inputs):
                flat.append(inputs[k])
                k += 1
            if k >= len(inputs):
                break
            v = inputs[k]
            if not isinstance(v, (list, tuple)) or len(v) != n:
                raise CircbufError(f"input {k} is a vector of {n} sizes (define_vector({n})); got {v!r}")
            flat += list(v)
            k += 1
        return flat + list(inputs[k:])

    def add_output(self, tv: TensorView, alias_input: TensorView | None = None):
        """An output; with ``alias_input``, written in place into that input and
        not returned (nvFuser's semantics), e.g. a running-statistics update."""
        self.fusion.add_output(tv, alias_input)

    # --------------------------------------------------------- execution
    def _get_executor(self):
        from .compiler import FusionExecutor

        if self._executor is None:
            self._executor = FusionExecutor(self.fusion)
        return self._executor

    def execute(self, inputs):
        """Run on torch CUDA tensors; returns a list of output tensors."""
        ex = self._executor or self._get_executor()
        return ex.execute(self._flat_inputs(inputs) if self._vectors else inputs)

    def compile(self, inputs, arch: str | None = None, target=None):
        """Compile without running (no GPU needed when ``arch`` or ``target`` is given).
        ``inputs`` only give dtypes, shapes and strides; CPU tensors are fine.
        ``target``: the GPU the heuristics size kernels for (a ``circbuf.Target``, or
        ``"H100"``/``"H200"``); by default the current GPU's, or an H100's when there is
        none or ``arch`` is given. Returns a CompiledKernel, or a CompiledFusion when the
        fusion runs as several kernels; both list them in ``ck.kernels``.

        >>> # ck = fd.compile([torch.empty(4, 8)], arch="sm_90a"); ck.cuda, ck.cubin
        >>> # print(ck); [k.cuda for k in ck.kernels]
        >>> # fd.compile(inputs, target="H200")  # sm_90a, sized for an H200
        """
        return self._get_executor().compile(self._flat_inputs(inputs), arch=arch, target=target)

    def last_params(self):
        """The scheduler params of the most recent compile or execute (a list,
        one per kernel, for a segmented fusion)."""
        ex = self._executor
        return None if ex is None or ex.last is None else ex.last.params


def _check_overrides(fusion, overrides):
    """``fd.fusion.schedule`` names, checked against the fusion's schedulers."""
    from .scheduler.registry import check_overrides  # the registry knows the schedulers

    return check_overrides(fusion, overrides)


# ---------------------------------------------------------------- ops
def _is_tv(x):
    return isinstance(x, TensorView)


def _shape_entry(s, what):
    """A shape entry as an extent: ints (``-1``: None), integer scalars."""
    if isinstance(s, bool):
        raise CircbufError(f"{what}: {s!r} is not an extent")
    if isinstance(s, int):
        if s < -1:
            raise CircbufError(f"{what}: extent {s} must be -1 or >= 0")
        return None if s == -1 else Const(s)
    if isinstance(s, Scalar):
        if not s.dtype.is_int:
            raise CircbufError(f"{what}: extent {s} must be an integer scalar, it is {s.dtype.name}")
        return s
    raise CircbufError(f"{what}: {s!r} is neither an int nor an integer scalar")


def _scalar_dtype(x):
    if isinstance(x, bool):
        return DataType.Bool
    if isinstance(x, int):
        return DataType.Int64
    if isinstance(x, float):
        return DataType.Double
    if isinstance(x, Scalar):
        return x.dtype
    raise CircbufError(f"operand {x!r} is neither a tensor nor a scalar")


def _as_scalar_operand(x, what) -> Scalar:
    if isinstance(x, Scalar):
        return x
    if isinstance(x, (bool, int, float)):
        return as_scalar(x)
    raise CircbufError(f"{what}: operand {x!r} is neither a tensor nor a scalar")


def _scalar_unary(op, x, float_only, predicate=False) -> Scalar:
    """``op`` on a fusion scalar (``define_scalar``) or a number: a scalar
    expression the kernel computes (nvFuser's scalar math). Constants fold
    unless the value is a domain edge (``log(0.0)``), which the kernel then
    computes as C does."""
    a = _as_scalar_operand(x, op)
    dt = a.dtype
    if predicate:
        dt = DataType.Bool
    elif float_only and not dt.is_float:
        dt = DataType.Double
    return un(op, a, dt)


_SCALAR_BIN = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
    "maximum": "max",
    "minimum": "min",
    "bitwise_and": "&",
    "bitwise_or": "|",
    "bitwise_xor": "^",
    # the rest keep their names: cb::fmod(a, b), ... in the kernel
    **{
        op: op
        for op in (
            "fmod",
            "remainder",
            "pow",
            "atan2",
            "nextafter",
            "gcd",
            "bitwise_left_shift",
            "bitwise_right_shift",
            "logical_right_shift",
        )
    },
}


def _scalar_binary(op, a, b) -> Scalar:
    """``op`` on two scalars; integer ``div`` truncates toward zero as in C."""
    x, y = _as_scalar_operand(a, op), _as_scalar_operand(b, op)
    if op == "truediv":
        if not x.dtype.is_float:
            x = un("cast", x, DataType.Double)
        return _scalar_binary("div", x, y)
    if op == "mod":  # C's %: fmod on floating-point operands
        op = "fmod" if x.dtype.is_float or y.dtype.is_float else "%"
        return as_scalar(x)._bin_op(op, y)
    if op not in _SCALAR_BIN:
        raise CircbufError(f"{op}: not supported on scalars; apply it to a tensor")
    return as_scalar(x)._bin_op(_SCALAR_BIN[op], y)


def _dtype_of(x) -> DataType:
    return x.dtype if _is_tv(x) else _scalar_dtype(x)


def _describe(x) -> str:
    name = x.name if isinstance(x, (TensorView, Var)) else repr(x) if not isinstance(x, Scalar) else str(x)
    return f"{name} ({_dtype_of(x).name})"


# operand rules of binary ops beyond torch's promotion (nvFuser's checks)
_BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor")
_INT_ONLY = ("bitwise_left_shift", "bitwise_right_shift", "logical_right_shift", "gcd")
_NO_BOOL = ("pow", "fmod", "remainder", "mod")
_TO_FLOAT = ("truediv", "atan2")  # integer operands give Float (nvFuser's float_op_config)


def _check_operands(op, xs):
    """Refuse operand types an op has no meaning for, naming operand and rule."""
    dts = [_dtype_of(x) for x in xs]
    bad = None
    if op in _BITWISE:
        bad = next((x for x, d in zip(xs, dts) if d.is_float), None)
        rule = "takes integer or Bool operands"
    elif op in _INT_ONLY:
        bad = next((x for x, d in zip(xs, dts) if not d.is_int), None)
        rule = "takes integer operands"
    elif op == "nextafter" and not any(d.is_float for d in dts):  # the promoted type must be
        bad, rule = xs[0], "takes floating-point operands (cast integers first)"
    elif op in _NO_BOOL and all(d == DataType.Bool for d in dts):
        bad, rule = xs[0], "takes numeric operands, not two Bools (cast first)"
    if bad is not None:
        raise CircbufError(f"{op}: {_describe(bad)}: {op} {rule}")


def _float_unary(op, what):
    def fn(self, x):
        return self._unary(op, x)

    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = (
        f"{what}, elementwise. Integer and Bool inputs give Float; Half/BFloat16 are "
        f"computed in and return Float (nvFuser's float ops).\n\n>>> # ops.{op}(x)\n"
    )
    return fn


def _rounding_unary(op, what):
    def fn(self, x):
        if _dtype_of(x) == DataType.Bool:
            raise CircbufError(
                f"{op}: {_describe(x)}: {op} takes numeric operands (cast Bool first, as torch)"
            )
        return self._unary(op, x, float_only=False)

    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = (
        f"{what}, elementwise. Integers are returned as they are (their type kept); "
        f"Half/BFloat16 give Float.\n\n>>> # ops.{op}(x)\n"
    )
    return fn


def _predicate_unary(op, what):
    def fn(self, x):
        return self._predicate(op, x)

    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"{what}, elementwise: a Bool result for any input type.\n\n>>> # ops.{op}(x)\n"
    return fn


class Ops(ContractionOps):
    """``fd.ops``: nvFuser's op names. Arithmetic on Half/BFloat16 runs in fp32
    and returns Float (as nvFuser does); cast back with ``ops.cast``."""

    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    @property
    def _f(self) -> Fusion:
        return self._fd.fusion

    def _check(self, *xs):
        for x in xs:
            if _is_tv(x) and x.fusion is not self._f:
                raise CircbufError(f"{x.name} belongs to another FusionDefinition")

    def _new(self, ids, dtype) -> TensorView:
        from .ir import MemoryType

        return self._f.register(TensorView(ids, dtype, MemoryType.Local))

    # ------------------------------------------------------- broadcasting
    def _to_rank(self, t: TensorView, rank: int) -> TensorView:
        if t.ndim == rank:
            return t
        flags = [True] * (rank - t.ndim) + [False] * t.ndim
        return self._broadcast(t, flags)

    def _broadcast(self, t, flags) -> TensorView:
        out = self._new(broadcast_ids(t.domain.no_reductions(), flags), t.dtype)
        BroadcastOp(out, t, flags)
        return out

    def _pointwise_ids(self, tvs, what) -> list[IterDomain]:
        rank = max(t.ndim for t in tvs)
        return [
            self._out_axis([t.domain.no_reductions()[k] for t in tvs], what, f"axis {k}") for k in range(rank)
        ]

    def _out_axis(self, axes, what="", where="") -> IterDomain:
        """The axis of a computed tensor (elementwise op, matmul, reduction)
        where ``axes`` of its operands meet, as torch broadcasts: the extent of
        the concrete ones, which must be equal (constants now, symbolic ones at
        run time), or a broadcast axis when all are plain broadcasts. A
        broadcast expanded to an extent (``expand``, ``broadcast_in_dim`` to a
        fixed shape) is as concrete as an iteration axis of that extent: the
        result has that extent, computed (torch materializes it too)."""
        exts = [a.concrete_extent for a in axes if a.concrete_extent is not None]
        if not exts:
            return IterDomain(Const(1), IterType.Broadcast)
        ext = exts[0]
        for e in exts[1:]:
            self._require_same(
                ext,
                e,
                f"{what}: extents {ext} and {e} of {where} do not match",
                f"{what} combines them on {where}",
            )
            if isinstance(e, Const):  # a constant is the more useful name of the class
                ext = e
        return IterDomain(ext)

    def _cast_to(self, x, dt):
        if _is_tv(x):
            return x if x.dtype == dt else self.cast(x, dt)
        if isinstance(x, (bool, int, float)):
            return (
                Const(float(x) if dt.is_float else int(x), dt) if dt != DataType.Bool else Const(bool(x), dt)
            )
        return x  # a Scalar expression; codegen casts it

    def _result_dtype(self, xs):
        tvs = [x for x in xs if _is_tv(x)]
        dt = tvs[0].dtype
        for t in tvs[1:]:
            dt = promote(dt, t.dtype)
        for x in xs:
            if not _is_tv(x):
                dt = promote_with_scalar(dt, _scalar_dtype(x))
        return dt

    def _pointwise(self, xs, what):
        self._check(*xs)
        tvs = [x for x in xs if _is_tv(x)]
        if not tvs:
            raise CircbufError(f"{what}: needs at least one tensor operand")
        rank = max(t.ndim for t in tvs)
        xs = [self._to_rank(x, rank) if _is_tv(x) else x for x in xs]
        return xs, self._pointwise_ids([x for x in xs if _is_tv(x)], what)

    # ------------------------------------------------------------ unary
    def _unary(self, op, x, float_only=True):
        self._check(x)
        if not _is_tv(x):
            return _scalar_unary(op, x, float_only)
        dt = compute_type(x.dtype)
        if float_only and not dt.is_float:
            dt = DataType.Float
        x = self._cast_to(x, dt)
        out = self._new([self._out_axis([i]) for i in x.domain.no_reductions()], dt)
        UnaryOp(op, out, x)
        return out

    def neg(self, x):
        return self._unary("neg", x, float_only=False)

    def abs(self, x):
        return self._unary("abs", x, float_only=False)

    def relu(self, x):
        return self._unary("relu", x, float_only=False)

    def exp(self, x):
        return self._unary("exp", x)

    def exp2(self, x):
        return self._unary("exp2", x)

    def log(self, x):
        return self._unary("log", x)

    def sqrt(self, x):
        return self._unary("sqrt", x)

    def rsqrt(self, x):
        return self._unary("rsqrt", x)

    def reciprocal(self, x):
        return self._unary("reciprocal", x)

    def tanh(self, x):
        return self._unary("tanh", x)

    def sigmoid(self, x):
        return self._unary("sigmoid", x)

    def gelu(self, x):
        """Exact (erf) GELU, as ``torch.nn.functional.gelu``."""
        return self._unary("gelu", x)

    def silu(self, x):
        return self._unary("silu", x)

    sin = _float_unary("sin", "Sine (radians)")
    cos = _float_unary("cos", "Cosine (radians)")
    tan = _float_unary("tan", "Tangent (radians)")
    asin = _float_unary("asin", "Inverse sine, in radians; NaN outside [-1, 1]")
    acos = _float_unary("acos", "Inverse cosine, in radians; NaN outside [-1, 1]")
    atan = _float_unary("atan", "Inverse tangent, in radians")
    sinh = _float_unary("sinh", "Hyperbolic sine")
    cosh = _float_unary("cosh", "Hyperbolic cosine")
    asinh = _float_unary("asinh", "Inverse hyperbolic sine")
    acosh = _float_unary("acosh", "Inverse hyperbolic cosine; NaN below 1")
    atanh = _float_unary("atanh", "Inverse hyperbolic tangent; NaN outside [-1, 1]")
    erf = _float_unary("erf", "Error function")
    erfc = _float_unary("erfc", "Complementary error function 1 - erf(x)")
    erfinv = _float_unary("erfinv", "Inverse error function; NaN outside [-1, 1]")
    erfcinv = _float_unary("erfcinv", "Inverse complementary error function; NaN outside [0, 2]")
    lgamma = _float_unary("lgamma", "log|gamma(x)|")
    log1p = _float_unary("log1p", "log(1 + x), accurate near 0")
    expm1 = _float_unary("expm1", "exp(x) - 1, accurate near 0")
    log2 = _float_unary("log2", "Base-2 logarithm")
    log10 = _float_unary("log10", "Base-10 logarithm")

    floor = _rounding_unary("floor", "Largest whole number <= x")
    ceil = _rounding_unary("ceil", "Smallest whole number >= x")
    round = _rounding_unary("round", "Nearest whole number, halves to even (as torch.round)")
    trunc = _rounding_unary("trunc", "x rounded toward zero")

    def frac(self, x):
        """``x - trunc(x)`` (sign of x), elementwise; floating-point inputs only
        (torch refuses integers too); Half/BFloat16 give Float.

        >>> # ops.frac(x)
        """
        if not _dtype_of(x).is_float:
            raise CircbufError(f"frac: {_describe(x)}: frac takes floating-point operands, as torch.frac")
        return self._unary("frac", x)

    isnan = _predicate_unary("isnan", "True where x is NaN (never for integers)")
    isinf = _predicate_unary("isinf", "True where x is +-infinity")
    isfinite = _predicate_unary("isfinite", "True where x is neither infinite nor NaN (always for integers)")
    isposinf = _predicate_unary("isposinf", "True where x is +infinity")
    isneginf = _predicate_unary("isneginf", "True where x is -infinity")
    isreal = _predicate_unary(
        "isreal", "True where x has no imaginary part: always, circbuf has no complex types"
    )
    signbit = _predicate_unary(
        "signbit", "True where the sign bit is set (-0.0 and negative NaN too; x < 0 for integers)"
    )

    def _predicate(self, op, x):
        self._check(x)
        if not _is_tv(x):
            return _scalar_unary(op, x, False, predicate=True)
        x = self._cast_to(x, compute_type(x.dtype))  # 16-bit floats are tested in fp32: same answer
        out = self._new([self._out_axis([i]) for i in x.domain.no_reductions()], DataType.Bool)
        UnaryOp(op, out, x)
        return out

    def bitwise_not(self, x):
        """``~x`` on integers (type kept), ``not x`` on Bool (nvFuser maps it to logical_not).

        >>> # ops.bitwise_not(mask)
        """
        if _dtype_of(x).is_float:
            raise CircbufError(f"bitwise_not: {_describe(x)}: bitwise_not takes integer or Bool operands")
        return self._unary("bitwise_not", x, float_only=False)

    def cast(self, x, dtype: DataType):
        self._check(x)
        if not isinstance(dtype, DataType):
            raise CircbufError(f"cast: dtype must be a circbuf DataType, got {dtype!r}")
        if not _is_tv(x):
            return un("cast", _as_scalar_operand(x, "cast"), dtype)
        out = self._new([self._out_axis([i]) for i in x.domain.no_reductions()], dtype)
        if dtype == x.dtype:
            LoadStoreOp(out, x)
        else:
            CastOp(out, x)
        return out

    def set(self, x):
        """A copy of ``x``."""
        return self.cast(x, x.dtype)

    # ----------------------------------------------------------- binary
    def _binary(self, op, a, b, compare=False):
        self._check(a, b)
        _check_operands(op, [a, b])
        if not _is_tv(a) and not _is_tv(b):
            return _scalar_binary(op, a, b)
        (a, b), ids = self._pointwise([a, b], op)
        dt = self._result_dtype([a, b])
        if op in _TO_FLOAT and not dt.is_float:
            dt = DataType.Float
        # integer div truncates toward zero, as C and nvFuser do (torch's
        # true division is truediv)
        cdt = compute_type(dt)
        a, b = self._cast_to(a, cdt), self._cast_to(b, cdt)
        out = self._new(ids, DataType.Bool if compare else cdt)
        BinaryOp(op, out, a, b)
        return out

    def add(self, a, b):
        return self._binary("add", a, b)

    def sub(self, a, b):
        return self._binary("sub", a, b)

    def mul(self, a, b):
        return self._binary("mul", a, b)

    def div(self, a, b):
        return self._binary("div", a, b)

    def maximum(self, a, b):
        return self._binary("maximum", a, b)

    def minimum(self, a, b):
        return self._binary("minimum", a, b)

    def lt(self, a, b):
        return self._binary("lt", a, b, compare=True)

    def le(self, a, b):
        return self._binary("le", a, b, compare=True)

    def gt(self, a, b):
        return self._binary("gt", a, b, compare=True)

    def ge(self, a, b):
        return self._binary("ge", a, b, compare=True)

    def eq(self, a, b):
        return self._binary("eq", a, b, compare=True)

    def ne(self, a, b):
        return self._binary("ne", a, b, compare=True)

    def truediv(self, a, b):
        """``a / b`` in floating point: integer operands give Float (``div``
        truncates them instead).

        >>> # ops.truediv(i, 2)   # Int32 [3] -> Float [1.5]
        """
        return self._binary("truediv", a, b)

    def pow(self, a, b):
        """``a ** b`` with torch's promotion: integers stay integers (a negative
        exponent gives 0, or +-1 for a base of +-1, as torch and nvFuser).

        >>> # ops.pow(x, 2.0); ops.pow(2, n)
        """
        return self._binary("pow", a, b)

    def fmod(self, a, b):
        """C's ``fmod`` (and ``%`` on integers): the result has the sign of ``a``.

        >>> # ops.fmod(x, 3.0)   # -5 -> -2
        """
        return self._binary("fmod", a, b)

    def remainder(self, a, b):
        """Python's modulo (``torch.remainder``): the result has the sign of ``b``.

        >>> # ops.remainder(x, 3)   # -5 -> 1
        """
        return self._binary("remainder", a, b)

    def mod(self, a, b):
        """nvFuser's ``mod``: C's ``%`` (sign of ``a``), ``fmod`` on floating point.

        >>> # ops.mod(i, 4)
        """
        return self._binary("mod", a, b)

    def atan2(self, a, b):
        """Angle of the point (b, a) in radians, in [-pi, pi]; integers give Float.

        >>> # ops.atan2(y, x)
        """
        return self._binary("atan2", a, b)

    def nextafter(self, a, b):
        """The next representable value after ``a`` toward ``b``; floating-point
        operands only. Half/BFloat16 are computed in (and return) Float: the
        step is a Float ulp (nvFuser does the same).

        >>> # ops.nextafter(x, y)
        """
        return self._binary("nextafter", a, b)

    def bitwise_and(self, a, b):
        """``a & b`` on integers and Bools (two Bools give Bool).

        >>> # ops.bitwise_and(i, 0xFF)
        """
        return self._binary("bitwise_and", a, b)

    def bitwise_or(self, a, b):
        """``a | b`` on integers and Bools (two Bools give Bool)."""
        return self._binary("bitwise_or", a, b)

    def bitwise_xor(self, a, b):
        """``a ^ b`` on integers and Bools (two Bools give Bool)."""
        return self._binary("bitwise_xor", a, b)

    def bitwise_left_shift(self, a, b):
        """``a << b`` on integers; a shift outside [0, bits) gives 0 (as torch).

        >>> # ops.bitwise_left_shift(i, 3)
        """
        return self._binary("bitwise_left_shift", a, b)

    def bitwise_right_shift(self, a, b):
        """Arithmetic ``a >> b`` on integers (the sign fills in); a shift outside
        [0, bits) gives 0 or -1 by the sign of ``a`` (as torch)."""
        return self._binary("bitwise_right_shift", a, b)

    def logical_right_shift(self, a, b):
        """``a >> b`` shifting zeros in (``a`` read as unsigned); a shift outside
        [0, bits) gives 0 (as nvFuser and jax.lax.shift_right_logical).

        >>> # ops.logical_right_shift(i, 3)   # Int32 -1 -> 536870911
        """
        return self._binary("logical_right_shift", a, b)

    def gcd(self, a, b):
        """Greatest common divisor of integers (non-negative; gcd(0, 0) = 0)."""
        return self._binary("gcd", a, b)

    def addcmul(self, input, tensor1, tensor2, value):
        """``input + value * tensor1 * tensor2`` (torch.addcmul, nvFuser's
        addcmul): the three operands promoted together, ``value`` (a scalar)
        cast to their type.

        >>> # ops.addcmul(x, a, b, 0.5)
        """
        self._check(input, tensor1, tensor2)
        if _is_tv(value):
            raise CircbufError(f"addcmul: value must be a scalar, got tensor {value.name}")
        xs = [input, tensor1, tensor2]
        if not any(_is_tv(x) for x in xs):
            return self.add(input, self.mul(value, self.mul(tensor1, tensor2)))
        dt = compute_type(self._result_dtype(xs))
        x, t1, t2 = (self._cast_to(v, dt) for v in xs)
        v = _as_scalar_operand(value, "addcmul")
        if isinstance(v, Const):
            v = self._cast_to(v.value, dt)
        elif v.dtype != dt:
            v = un("cast", v, dt)
        return self.add(x, self.mul(v, self.mul(t1, t2)))

    def where(self, cond, a, b):
        """``cond ? a : b`` elementwise, with broadcasting."""
        (cond, a, b), ids = self._pointwise([cond, a, b], "where")
        if _is_tv(cond) and cond.dtype != DataType.Bool:
            cond = self.cast(cond, DataType.Bool)
        # a selection computes nothing: fp16 operands give an fp16 result (torch, nvFuser)
        # two scalars: their promoted type, as nvFuser (a Python float is Double, an int Int64)
        dt = (
            self._result_dtype([a, b])
            if _is_tv(a) or _is_tv(b)
            else promote(_scalar_dtype(a), _scalar_dtype(b))
        )
        a, b = self._cast_to(a, dt), self._cast_to(b, dt)
        out = self._new(ids, dt)
        TernaryOp(out, cond, a, b)
        return out

    def broadcast_in_dim(self, t, shape, broadcast_dims):
        """Place ``t``'s axes at ``broadcast_dims`` of an output of ``shape``;
        the other axes are broadcast. Entries of ``shape`` may be ints, -1
        (keep the input's extent) or extents of other tensors (``x.size(0)``).

        >>> # ops.broadcast_in_dim(bias, [-1, -1], [1])   # [C] -> [R, C]
        """
        self._check(t)
        if len(broadcast_dims) != t.ndim:
            raise CircbufError(
                f"broadcast_in_dim: {t.name} has {t.ndim} axes but broadcast_dims has {len(broadcast_dims)}"
            )
        n = len(shape)
        if sorted(broadcast_dims) != list(broadcast_dims) or any(not 0 <= d < n for d in broadcast_dims):
            raise CircbufError(f"broadcast_in_dim: broadcast_dims {broadcast_dims} invalid for rank {n}")
        flags = [k not in broadcast_dims for k in range(n)]
        out = self._broadcast(t, flags)
        for k, s in enumerate(shape):
            i = out.logical[k]
            if flags[k]:
                ext = s if isinstance(s, Scalar) else Const(s) if isinstance(s, int) and s >= 0 else None
                if ext is not None and not is_const(ext, 1):
                    i.iter_type = IterType.Iteration
                    i.extent = ext
                    i.iter_type = IterType.Broadcast
                    i.expanded_extent = ext
            elif i.is_broadcast:
                # an axis of extent 1 placed at a wider extent is expanded to it (torch's expand,
                # nvFuser's broadcast_in_dim): [1, 0] -> [0, 0], [2, 1, 4] -> [2, 3, 4]
                ext = s if isinstance(s, Scalar) else Const(s) if isinstance(s, int) and s >= 0 else None
                if ext is not None and not is_const(ext, 1):
                    i.expanded_extent = ext
            elif isinstance(s, int) and s not in (-1,):
                if isinstance(i.extent, Const) and i.extent.value != s:
                    raise CircbufError(
                        f"broadcast_in_dim: axis {k} of {t.name} has extent {i.extent}, shape says {s}"
                    )
        for i in out.logical:
            if i.is_broadcast and i.expanded_extent is not None:
                i.extent = Const(1)
        return out

    def broadcast(self, t, is_broadcast_dim):
        """Insert broadcast (size-1) axes where ``is_broadcast_dim`` is True; the
        False entries are ``t``'s axes, in order (nvFuser's ``broadcast``).

        >>> # ops.broadcast(x, [True, False, True])   # [N] -> [1, N, 1]
        """
        self._check(t)
        if not _is_tv(t):
            raise CircbufError(f"broadcast: operand {t!r} is not a tensor")
        flags = [bool(f) for f in is_broadcast_dim]
        if len(flags) - sum(flags) != t.ndim:
            raise CircbufError(
                f"broadcast: {t.name} has {t.ndim} axes but is_broadcast_dim {list(is_broadcast_dim)} "
                f"has {len(flags) - sum(flags)} False entries (one per axis of {t.name})"
            )
        return self._broadcast(t, flags) if any(flags) else self.set(t)

    def full(self, shape, fill_value, dtype):
        """A tensor of ``shape`` filled with ``fill_value`` (a number or a fusion
        scalar, cast to ``dtype``). Shape entries are ints >= 0, extents of other
        tensors (``x.size(0)``) or integer fusion scalars (run-time sizes).

        >>> # n = fd.define_scalar(dtype=DataType.Int64); ops.full([n, 4], 1.0, DataType.Float)
        """
        if not isinstance(dtype, DataType):
            raise CircbufError(f"full: dtype must be a circbuf DataType, got {dtype!r}")
        ids = []
        for k, s in enumerate(shape):
            ext = self._full_extent(s, k)
            ids.append(IterDomain(ext, IterType.Broadcast if is_const(ext, 1) else IterType.Iteration))
        fill = _as_scalar_operand(fill_value, "full")
        if isinstance(fill, Const):  # a variable one the kernel casts
            fill = self._cast_to(fill.value, dtype)
        out = self._new(ids, dtype)
        FullOp(out, fill)
        return out

    def _full_extent(self, s, k) -> Scalar:
        if isinstance(s, int) and not isinstance(s, bool):
            if s < 0:
                raise CircbufError(f"full: shape entry {k} is {s}; extents are >= 0")
            return Const(s)
        if not isinstance(s, Scalar) or not s.dtype.is_int:
            raise CircbufError(f"full: shape entry {k} ({s!r}) must be an int or an integer scalar")
        if isinstance(s, Const):
            return self._full_extent(int(s.value), k)
        if isinstance(s, Var) and s in self._f.extent_vars:
            return s
        # a run-time size: a named extent the runtime (and the kernel) compute from the scalar inputs
        return self._f.derived_extent(s)

    # ------------------------------------------------------------- views
    # Views re-index their input's elements: no arithmetic, and no copy in
    # the math. Each is an expr whose output axes map to the input's (see
    # circbuf.ir.nodes.ViewExpr), so they fuse with what surrounds them.
    def _view_input(self, t, what):
        self._check(t)
        if not _is_tv(t):
            raise CircbufError(f"{what}: operand must be a tensor, got {t!r}")
        return t

    def size(self, t, dim: int) -> Scalar:
        """Extent of axis ``dim`` of ``t`` (a scalar to build shapes from)."""
        return self._view_input(t, "size").size(dim)

    def shape(self, t) -> list:
        """Extents of ``t``'s axes."""
        return self._view_input(t, "shape").shape()

    def permute(self, t, dims):
        """Reorder axes: output axis ``k`` is input axis ``dims[k]`` (torch.permute).

        >>> # ops.permute(x, [0, 2, 1, 3])   # [B, S, H, D] -> [B, H, S, D]
        """
        from .ir import PermuteOp

        t = self._view_input(t, "permute")
        n = t.ndim
        try:
            perm = [d % n if isinstance(d, int) and -n <= d < n else None for d in dims]
        except TypeError:
            perm = [None]
        if sorted(p for p in perm if p is not None) != list(range(n)) or len(perm) != n:
            raise CircbufError(
                f"permute: dims {list(dims)} are not a permutation of the {n} axes of {t.name}"
            )
        src = t.domain.no_reductions()
        out = self._new([src[d].fresh() for d in perm], t.dtype)
        PermuteOp(out, t, perm)
        return out

    def squeeze(self, t, dims, squeeze_expanded=False):
        """Drop axes ``dims``, each of extent 1: a broadcast axis, a fixed 1,
        or a symbolic extent (then the inputs must give it size 1). An
        expanded broadcast axis only with ``squeeze_expanded=True``.

        >>> # ops.squeeze(x, [1])   # [N, 1, C] -> [N, C]
        """
        t = self._view_input(t, "squeeze")
        dims = self._dims(t, dims, "squeeze")
        src = t.domain.no_reductions()
        for d in dims:
            i = src[d]
            if i.is_broadcast:
                if i.expanded_extent is not None and not squeeze_expanded:
                    raise CircbufError(
                        f"squeeze: axis {d} of {t.name} is a broadcast expanded to {i.expanded_extent}; "
                        "pass squeeze_expanded=True to drop it"
                    )
            elif isinstance(i.extent, Const):
                if i.extent.value != 1:
                    raise CircbufError(f"squeeze: axis {d} of {t.name} has extent {i.extent}, not 1")
            else:
                self._f.require_equal(i.extent, Const(1), f"squeeze of axis {d} of {t.name}")
        return self._squeeze(t, dims)

    def _squeeze(self, t, dims):
        from .ir import SqueezeOp

        if not dims:
            return t
        src = t.domain.no_reductions()
        out = self._new([i.fresh() for k, i in enumerate(src) if k not in dims], t.dtype)
        SqueezeOp(out, t, dims)
        return out

    def expand(self, t, shape):
        """Give broadcast axes of ``t`` the extents in ``shape`` (``-1`` keeps
        an axis as it is); other axes keep their extent (torch.expand).

        >>> # ops.expand(b, [-1, 8])   # [N, 1] -> [N, 8]
        """
        from .ir import ExpandOp

        t = self._view_input(t, "expand")
        src = t.domain.no_reductions()
        if len(shape) != len(src):
            raise CircbufError(
                f"expand: shape {list(shape)} has {len(shape)} entries, {t.name} has {len(src)} axes"
            )
        ids = []
        for d, (i, s) in enumerate(zip(src, shape)):
            ext = _shape_entry(s, f"expand: entry {d}")
            o = i.fresh()
            ids.append(o)
            if ext is None:
                continue
            if i.is_broadcast:
                if not is_const(ext, 1):
                    o.expanded_extent = ext
                continue
            if ext == i.extent:
                continue
            if isinstance(ext, Const) and isinstance(i.extent, Const):
                raise CircbufError(
                    f"expand: axis {d} of {t.name} has extent {i.extent} and is not a broadcast; "
                    f"cannot expand it to {ext}"
                )
            self._f.require_equal(i.extent, ext, f"expand of axis {d} of {t.name} (not a broadcast)")
        out = self._new(ids, t.dtype)
        ExpandOp(out, t)
        return out

    def reshape(self, t, new_shape):
        """``t`` viewed with ``new_shape`` (row-major, as torch.reshape).
        Entries: ints, one ``-1`` (inferred), or integer scalars: fusion
        scalar inputs or extents of tensors (``ops.size(x, 0)``). A reshape
        is a view: splits and merges of ``t``'s axes, fused with what
        surrounds it (see :class:`circbuf.ir.nodes.ReshapeOp`).

        >>> # ops.reshape(x, [-1, 64])   # [B, S, 64*k] -> [B*S*k, 64]
        """
        from .ir import ReshapeOp
        from .ir.view import concretize

        t = self._view_input(t, "reshape")
        if not isinstance(new_shape, (list, tuple)):
            raise CircbufError(f"reshape: new_shape must be a list, got {new_shape!r}")
        exts = [
            _shape_entry(s, f"reshape: entry {k} of new_shape {list(new_shape)}")
            for k, s in enumerate(new_shape)
        ]
        if sum(e is None for e in exts) > 1:
            raise CircbufError(f"reshape: new_shape {list(new_shape)} has more than one -1")
        numel = Const(1)
        for i in t.domain.no_reductions():
            numel = numel * i.loop_extent
        known = Const(1)
        for e in exts:
            if e is not None:
                known = known * e
        if None in exts:
            if isinstance(numel, Const) and isinstance(known, Const):
                if known.value == 0 or numel.value % known.value:
                    raise CircbufError(
                        f"reshape: cannot infer the -1 of {list(new_shape)} for {t.name} "
                        f"({numel.value} elements)"
                    )
                inferred = Const(numel.value // known.value)
            else:
                inferred = numel // known
            exts[exts.index(None)] = inferred
        elif isinstance(numel, Const) and isinstance(known, Const) and numel.value != known.value:
            raise CircbufError(
                f"reshape: {t.name} has {numel.value} elements, new_shape {list(new_shape)} has {known.value}"
            )
        # every extent a tensor carries is a name or a constant: a computed
        # one (the -1, x.size(0) * 2) gets a name standing for it
        # (sizes known only at run time are checked when the reshape is concretized)
        exts = [e if isinstance(e, (Const, Var)) else self._f.derived_extent(e) for e in exts]
        # a 1 in the new shape is a broadcast axis (as nvFuser makes it); the
        # reshape maps the input's broadcast axes to these, one for one, so the
        # input gets any it lacks (a broadcast hoists to where it is cheap)
        plain = sum(i.concrete_extent is None for i in t.domain.no_reductions())
        more = sum(is_const(e, 1) for e in exts) - plain
        if more > 0:
            t = self._broadcast(t, [True] * more + [False] * t.ndim)
        v = self._new(
            [IterDomain(e, IterType.Broadcast if is_const(e, 1) else IterType.Iteration) for e in exts],
            t.dtype,
        )
        op = ReshapeOp(v, t)
        sizes = [i.loop_extent for i in t.domain.no_reductions()] + [i.extent for i in v.logical]
        if all(isinstance(x, Const) for x in sizes):  # fixed sizes: concrete now
            n = t.ndim
            concretize(op, [x.value for x in sizes[:n]], [x.value for x in sizes[n:]])
        return v

    def stride_order(self, t, stride_order):
        """A copy of ``t`` allocated with ``stride_order`` (nvFuser's
        convention: ``stride_order[d]`` ranks axis ``d``'s stride, larger =
        larger stride). Matters for outputs: they are allocated in that order.

        >>> # fd.add_output(ops.stride_order(y, [3, 0, 2, 1]))   # channels-last NCHW output
        """
        t = self._view_input(t, "stride_order")
        order = list(stride_order)
        if sorted(order) != list(range(t.ndim)):
            raise CircbufError(f"stride_order: {order} is not a permutation of 0..{t.ndim - 1} for {t.name}")
        out = self._new([i.fresh() for i in t.domain.no_reductions()], t.dtype)
        out.domain.stride_order = order
        LoadStoreOp(out, t)
        return out

    # -------------------------------------------------------- reductions
    def _dims(self, t, dims, what):
        if not _is_tv(t):
            raise CircbufError(f"{what}: operand must be a tensor")
        if isinstance(dims, int) and not isinstance(dims, bool):
            dims = [dims]
        n = t.ndim
        try:
            dims = list(dims)
        except TypeError:
            raise CircbufError(
                f"{what}: dims must be an int or a list of ints (axes of {t.name}), got {dims!r}"
            ) from None
        out = []
        for d in dims:
            if not isinstance(d, int) or isinstance(d, bool) or not -n <= d < n:
                raise CircbufError(f"{what}: dim {d} out of range for {t.name} with {n} axes")
            out.append(d % n)
        if len(set(out)) != len(out):
            raise CircbufError(f"{what}: repeated dims {list(dims)}")
        return sorted(out)

    def _reduce(self, op, t, dims, keepdim, dtype):
        self._check(t)
        if not _is_tv(t):
            raise CircbufError(f"{op}: operand must be a tensor")
        if isinstance(dims, DataType):  # nvFuser's op(t, dtype): over every axis
            if dtype is not None:
                raise CircbufError(f"{op}: dtype given twice ({dims.name} in place of dims, and {dtype})")
            dims, dtype = list(range(t.ndim)), dims
        if dtype is not None and not isinstance(dtype, DataType):
            raise CircbufError(f"{op}: dtype must be a DataType, got {dtype!r}")
        if not isinstance(keepdim, bool):
            raise CircbufError(f"{op}: keepdim must be a bool, got {keepdim!r}")
        dims = self._dims(t, dims, op)
        acc = compute_type(t.dtype)
        if op in ("sum", "prod") and not acc.is_float:
            acc = DataType.Int64  # as nvFuser and torch: integer and Bool sums/products in Int64
        t = self._cast_to(t, acc)
        ids = []
        for k, i in enumerate(t.domain.no_reductions()):
            if k in dims:  # over an expanded broadcast: its extent of equal elements
                ids.append(IterDomain(i.loop_extent, IterType.Reduction))
            else:
                ids.append(self._out_axis([i]))
        out = self._new(ids, acc)
        ReductionOp(op, out, t, reduction_init(op, acc))
        if keepdim:
            out = self._broadcast(out, [k in dims for k in range(t.ndim)])
        if dtype is not None and dtype != out.dtype:
            out = self.cast(out, dtype)
        return out

    def sum(self, t, dims, keepdim=False, dtype=None):
        return self._reduce("sum", t, dims, keepdim, dtype)

    def prod(self, t, dims, keepdim=False, dtype=None):
        """Product over ``dims`` (init 1): floating point in its compute type
        (Half/BFloat16 give Float), integers and Bool in Int64, as nvFuser.

        >>> # ops.prod(x, [1])
        """
        return self._reduce("prod", t, dims, keepdim, dtype)

    def max(self, t, dims, keepdim=False, dtype=None):
        return self._reduce("max", t, dims, keepdim, dtype)

    def min(self, t, dims, keepdim=False, dtype=None):
        return self._reduce("min", t, dims, keepdim, dtype)

    def _count(self, t, dims) -> Scalar:
        n = Const(1)
        for d in dims:
            n = n * t.size(d)
        return n

    def mean(self, t, dims, keepdim=False, dtype=None):
        if dtype is not None and not isinstance(dtype, DataType):
            raise CircbufError(f"mean: dtype must be a DataType, got {dtype!r}")
        if not isinstance(keepdim, bool):
            raise CircbufError(f"mean: keepdim must be a bool, got {keepdim!r}")
        dims = self._dims(t, dims, "mean")
        s = self.sum(t, dims, keepdim)
        if not s.dtype.is_float:
            s = self.cast(s, DataType.Float)
        out = self.div(s, self._count(t, dims))
        return out if dtype is None else self.cast(out, dtype)

    def var(self, t, dims, correction=1, keepdim=False):
        """Variance over ``dims`` with ``correction`` (torch.var; nvFuser's
        ``var``): sum((x - mean)^2) / (N - correction), in Float (Double stays).

        >>> # ops.var(x, [1], correction=0)
        """
        return self._var_mean(t, dims, correction, keepdim, "var")[0]

    def welford(self, t, dims):
        """``(avg, var_sum, n)`` over ``dims``, as nvFuser's welford: the mean, the
        sum of squared deviations (M2: ``var_sum / n`` is the biased variance)
        and the element count as an Int64 tensor of avg's shape. Built from two
        reductions (mean, then squared deviations), not a one-pass Welford.

        >>> # avg, m2, n = ops.welford(x, [-1]); var = ops.div(m2, n)
        """
        avg, m2, dims = self._moments(t, dims, False, "welford")
        shape = [s for k, s in enumerate(t.shape()) if k not in dims]
        n = self.full(shape, self._count(t, dims), DataType.Int64)
        return avg, m2, n

    def var_mean(self, t, dims, correction=1, keepdim=False):
        """(variance, mean) over ``dims``, ``correction`` as in torch."""
        return self._var_mean(t, dims, correction, keepdim, "var_mean")

    def _var_mean(self, t, dims, correction, keepdim, what):
        if isinstance(correction, bool) or not isinstance(correction, (int, float)) or not correction >= 0:
            raise CircbufError(f"{what}: correction must be a number >= 0 (torch's), got {correction!r}")
        if not isinstance(keepdim, bool):
            raise CircbufError(f"{what}: keepdim must be a bool, got {keepdim!r}")
        m, ss, dims = self._moments(t, dims, keepdim, what)
        return self.div(ss, self._count(t, dims) - correction), m

    def _moments(self, t, dims, keepdim, what):
        """(mean, sum of squared deviations from it, dims) over ``dims``, in
        Float (Double stays): the mean is reduced once and broadcast back to
        subtract it."""
        self._check(t)
        dims = self._dims(t, dims, what)
        xf = self._cast_to(t, compute_type(t.dtype) if t.dtype.is_float else DataType.Float)
        m = self.mean(xf, dims)
        mk = self._broadcast(m, [k in dims for k in range(t.ndim)])
        d = self.sub(xf, mk)
        return (mk if keepdim else m), self.sum(self.mul(d, d), dims, keepdim), dims

    # ------------------------------------------------------- composites
    def _tensor_arg(self, x, what, arg, optional=False, float_only=False):
        """``x`` is a tensor of this fusion (or None where ``optional``)."""
        if x is None and optional:
            return
        if not _is_tv(x):
            raise CircbufError(f"{what}: {arg} must be a tensor{' or None' if optional else ''}, got {x!r}")
        self._check(x)
        if float_only and not x.dtype.is_float:
            raise CircbufError(f"{what}: {arg} {x.name} must be floating point, it is {x.dtype.name}")

    @staticmethod
    def _eps(eps, what):
        """A number or a fusion scalar (nvFuser's eps): never None, a string or a bool."""
        if isinstance(eps, Scalar):
            if eps.dtype == DataType.Bool:
                raise CircbufError(f"{what}: eps must be a number, got a Bool scalar")
            return eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise CircbufError(f"{what}: eps must be a number or a fusion scalar, got {eps!r}")
        if not eps >= 0:
            raise CircbufError(f"{what}: eps must be >= 0, got {eps!r}")
        return float(eps)

    def _affine_args(self, what, x, k, **params):
        """weight/bias of a norm over the last ``k`` axes of ``x``: their
        extents must be those axes' (as torch's normalized_shape)."""
        tail = x.domain.no_reductions()[x.ndim - k :]
        for arg, p in params.items():
            self._tensor_arg(p, what, arg, optional=True, float_only=True)
            if p is None:
                continue
            if p.ndim != k:
                raise CircbufError(
                    f"{what}: {arg} {p.name} has {p.ndim} axes; it must have the {k} normalized axes of {x.name}"
                )
            for j, (a, b) in enumerate(zip(p.domain.no_reductions(), tail)):
                self._require_same(
                    a.extent,
                    b.extent,
                    f"{what}: axis {j} of {arg} {p.name} ({a.extent}) differs from normalized axis {j} of "
                    f"{x.name} ({b.extent})",
                    f"{what}: {arg} {p.name} axis {j} == {x.name} axis {x.ndim - k + j}",
                )

    def softmax(self, x, dim):
        """Numerically stable softmax in fp32 (Double stays); output in x's dtype."""
        self._tensor_arg(x, "softmax", "x")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise CircbufError(f"softmax: dim must be an int (an axis of {x.name}), got {dim!r}")
        (d,) = self._dims(x, [dim], "softmax")
        xf = self._cast_to(x, compute_type(x.dtype) if x.dtype.is_float else DataType.Float)
        m = self.max(xf, [d], keepdim=True)
        if xf.dtype == DataType.Double:  # exact exp: exp2 of a rounded product loses bits in Double
            e = self.exp(self.sub(xf, m))
        else:
            # exp(x - m) as exp2((x - m) * log2(e)): exp2f is a few instructions
            # cheaper than expf at the same accuracy (<= 2 ulp), and softmax is
            # instruction-bound on Hopper once its input is in shared memory
            e = self.exp2(self.mul(self.sub(xf, m), 1.4426950408889634))
        s = self.sum(e, [d], keepdim=True)
        # one reciprocal per row, a multiply per element (a division per element is ~10 instructions)
        y = self.mul(e, self.reciprocal(s))
        return self._cast_to(y, x.dtype if x.dtype.is_float else DataType.Float)

    def layer_norm(self, x, weight=None, bias=None, eps=1e-5, normalized_ndim=None):
        """LayerNorm over the last ``normalized_ndim`` axes (default: weight's rank, or 1);
        fp32 math (Double stays Double), output in x's dtype."""
        self._tensor_arg(x, "layer_norm", "x", float_only=True)
        eps = self._eps(eps, "layer_norm")
        if normalized_ndim is not None and (
            isinstance(normalized_ndim, bool) or not isinstance(normalized_ndim, int)
        ):
            raise CircbufError(f"layer_norm: normalized_ndim must be an int, got {normalized_ndim!r}")
        given = weight if _is_tv(weight) else bias if _is_tv(bias) else None
        k = normalized_ndim if normalized_ndim is not None else given.ndim if given is not None else 1
        if not 1 <= k <= x.ndim:
            raise CircbufError(f"layer_norm: cannot normalize {k} axes of {x.name} ({x.ndim} axes)")
        self._affine_args("layer_norm", x, k, weight=weight, bias=bias)
        dims = list(range(x.ndim - k, x.ndim))
        var, mean = self.var_mean(x, dims, correction=0, keepdim=True)
        xf = self._cast_to(x, compute_type(x.dtype))
        y = self.mul(self.sub(xf, mean), self.rsqrt(self.add(var, eps)))
        # weight and bias in their compute type: a Double one is never rounded through Float
        if weight is not None:
            y = self.mul(y, self._cast_to(weight, compute_type(weight.dtype)))
        if bias is not None:
            y = self.add(y, self._cast_to(bias, compute_type(bias.dtype)))
        return self._cast_to(y, x.dtype)

    def rms_norm(self, x, weight=None, eps=1e-6):
        """``x * rsqrt(mean(x^2, -1) + eps) * weight`` in fp32 (Double stays Double);
        output in x's dtype."""
        self._tensor_arg(x, "rms_norm", "x", float_only=True)
        eps = self._eps(eps, "rms_norm")
        k = weight.ndim if _is_tv(weight) else 1
        if not 1 <= k <= x.ndim:
            raise CircbufError(f"rms_norm: cannot normalize {k} axes of {x.name} ({x.ndim} axes)")
        self._affine_args("rms_norm", x, k, weight=weight)
        dims = list(range(x.ndim - k, x.ndim))
        xf = self._cast_to(x, compute_type(x.dtype))
        ms = self.mean(self.mul(xf, xf), dims, keepdim=True)
        y = self.mul(xf, self.rsqrt(self.add(ms, eps)))
        if weight is not None:
            y = self.mul(y, self._cast_to(weight, compute_type(weight.dtype)))
        return self._cast_to(y, x.dtype)
