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

from .ir import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    CircbufError,
    Const,
    DataType,
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
    compute_type,
    promote,
    promote_with_scalar,
    reduction_init,
)
from .ir.scalar import is_const


class FusionDefinition:
    """Define a fusion inside ``with``; then ``execute`` or ``compile`` it."""

    def __init__(self):
        self.fusion = Fusion()
        self.fusion.check_overrides = _check_overrides
        self.ops = Ops(self)
        self._executor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    # ------------------------------------------------------------ inputs
    def define_tensor(self, shape, dtype=DataType.Float, contiguity=None) -> TensorView:
        """A tensor input. ``-1`` marks a symbolic extent, ``1`` a broadcast axis,
        other ints a fixed extent. ``contiguity`` (per axis, True/False/None)
        is checked against the tensors passed at run time.

        >>> fd = FusionDefinition(); t = fd.define_tensor([-1, 4])
        """
        if not isinstance(dtype, DataType):
            raise CircbufError(f"define_tensor: dtype must be a circbuf DataType, got {dtype!r}")
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
        self.fusion.add_input(tv)
        return tv

    def define_scalar(self, value=None, dtype=DataType.Double):
        """A scalar: a constant when ``value`` is given, else a run-time input."""
        if value is not None:
            return Const(value, dtype)
        v = Var(f"s{sum(1 for i in self.fusion.inputs if isinstance(i, Var))}", dtype)
        self.fusion.add_input(v)
        return v

    def add_output(self, tv: TensorView):
        self.fusion.add_output(tv)

    # --------------------------------------------------------- execution
    def _get_executor(self):
        from .runtime.executor import FusionExecutor

        if self._executor is None:
            self._executor = FusionExecutor(self.fusion)
        return self._executor

    def execute(self, inputs):
        """Run on torch CUDA tensors; returns a list of output tensors."""
        ex = self._executor or self._get_executor()
        return ex.execute(inputs)

    def compile(self, inputs, arch: str | None = None):
        """Compile without running (no GPU needed when ``arch`` is given).
        ``inputs`` only give dtypes, shapes and strides; CPU tensors are fine.

        >>> # ck = fd.compile([torch.empty(4, 8)], arch="sm_90a"); ck.cuda, ck.cubin
        """
        return self._get_executor().compile(inputs, arch=arch)

    def last_params(self):
        """The scheduler params of the most recent compile or execute."""
        ex = self._executor
        return None if ex is None or ex.last is None else ex.last.params


def _check_overrides(fusion, overrides):
    """``fd.fusion.schedule`` names, checked against the fusion's schedulers."""
    from .runtime.executor import check_overrides  # the compile driver knows the schedulers

    return check_overrides(fusion, overrides)


# ---------------------------------------------------------------- ops
def _is_tv(x):
    return isinstance(x, TensorView)


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


class Ops:
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

    def _broadcast(self, t, flags, extents=None) -> TensorView:
        src = iter(t.domain.no_reductions())
        ids = []
        for f in flags:
            if f:
                ids.append(IterDomain(Const(1), IterType.Broadcast))
            else:
                i = next(src)
                ids.append(IterDomain(i.extent, i.iter_type))
        out = self._new(ids, t.dtype)
        BroadcastOp(out, t, flags)
        return out

    def _pointwise_ids(self, tvs, what) -> list[IterDomain]:
        rank = max(t.ndim for t in tvs)
        ids = []
        for k in range(rank):
            axes = [t.domain.no_reductions()[k] for t in tvs]
            conc = [a for a in axes if not a.is_broadcast]
            if not conc:
                ids.append(IterDomain(Const(1), IterType.Broadcast))
                continue
            ext = conc[0].extent
            for a in conc[1:]:
                if a.extent == ext:
                    continue
                if isinstance(a.extent, Const) and isinstance(ext, Const):
                    raise CircbufError(f"{what}: extents {ext} and {a.extent} of axis {k} do not match")
                self._f.extent_equalities.append((ext, a.extent))
                if isinstance(a.extent, Const):
                    ext = a.extent
            ids.append(IterDomain(ext))
        return ids

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
            raise CircbufError(f"{op}: operand must be a tensor, got {x!r}")
        dt = compute_type(x.dtype)
        if float_only and not dt.is_float:
            dt = DataType.Float
        x = self._cast_to(x, dt)
        out = self._new([IterDomain(i.extent, i.iter_type) for i in x.domain.no_reductions()], dt)
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

    def cast(self, x, dtype: DataType):
        self._check(x)
        if not _is_tv(x):
            raise CircbufError(f"cast: operand must be a tensor, got {x!r}")
        if not isinstance(dtype, DataType):
            raise CircbufError(f"cast: dtype must be a circbuf DataType, got {dtype!r}")
        out = self._new([IterDomain(i.extent, i.iter_type) for i in x.domain.no_reductions()], dtype)
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
        (a, b), ids = self._pointwise([a, b], op)
        dt = self._result_dtype([a, b])
        if op == "div" and not dt.is_float:
            dt = DataType.Float  # true division, as torch
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

    def where(self, cond, a, b):
        """``cond ? a : b`` elementwise, with broadcasting."""
        (cond, a, b), ids = self._pointwise([cond, a, b], "where")
        if _is_tv(cond) and cond.dtype != DataType.Bool:
            cond = self.cast(cond, DataType.Bool)
        vals = [x for x in (a, b)]
        dt = compute_type(self._result_dtype(vals)) if any(_is_tv(v) for v in vals) else DataType.Float
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
            elif isinstance(s, int) and s not in (-1,) and not i.is_broadcast:
                if isinstance(i.extent, Const) and i.extent.value != s:
                    raise CircbufError(
                        f"broadcast_in_dim: axis {k} of {t.name} has extent {i.extent}, shape says {s}"
                    )
        for i in out.logical:
            if i.is_broadcast and i.expanded_extent is not None:
                i.extent = Const(1)
        return out

    # -------------------------------------------------------- reductions
    def _dims(self, t, dims, what):
        if isinstance(dims, int):
            dims = [dims]
        n = t.ndim
        out = []
        for d in dims:
            if not isinstance(d, int) or not -n <= d < n:
                raise CircbufError(f"{what}: dim {d} out of range for {t.name} with {n} axes")
            out.append(d % n)
        if len(set(out)) != len(out):
            raise CircbufError(f"{what}: repeated dims {list(dims)}")
        return sorted(out)

    def _reduce(self, op, t, dims, keepdim, dtype):
        self._check(t)
        if not _is_tv(t):
            raise CircbufError(f"{op}: operand must be a tensor")
        dims = self._dims(t, dims, op)
        acc = compute_type(t.dtype)
        if op == "sum" and not acc.is_float:
            acc = DataType.Int64
        t = self._cast_to(t, acc)
        ids = []
        for k, i in enumerate(t.domain.no_reductions()):
            if k in dims:
                ids.append(IterDomain(i.extent, IterType.Reduction))
            else:
                ids.append(IterDomain(i.extent, i.iter_type))
        out = self._new(ids, acc)
        ReductionOp(op, out, t, reduction_init(op, acc))
        if keepdim:
            out = self._broadcast(out, [k in dims for k in range(t.ndim)])
        if dtype is not None and dtype != out.dtype:
            out = self.cast(out, dtype)
        return out

    def sum(self, t, dims, keepdim=False, dtype=None):
        return self._reduce("sum", t, dims, keepdim, dtype)

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
        dims = self._dims(t, dims, "mean")
        s = self.sum(t, dims, keepdim)
        if not s.dtype.is_float:
            s = self.cast(s, DataType.Float)
        out = self.div(s, self._count(t, dims))
        return out if dtype is None else self.cast(out, dtype)

    def var_mean(self, t, dims, correction=1, keepdim=False):
        """(variance, mean) over ``dims``, ``correction`` as in torch."""
        dims = self._dims(t, dims, "var_mean")
        xf = self._cast_to(t, compute_type(t.dtype) if t.dtype.is_float else DataType.Float)
        m = self.mean(xf, dims, keepdim=True)
        d = self.sub(xf, m)
        ss = self.sum(self.mul(d, d), dims, keepdim)
        var = self.div(ss, self._count(t, dims) - correction)
        if not keepdim:
            m = self.mean(xf, dims)
        return var, m

    # ------------------------------------------------------- composites
    def softmax(self, x, dim):
        """Numerically stable softmax in fp32; output in x's dtype."""
        self._check(x)
        (d,) = self._dims(x, [dim], "softmax")
        xf = self._cast_to(x, compute_type(x.dtype) if x.dtype.is_float else DataType.Float)
        m = self.max(xf, [d], keepdim=True)
        # exp(x - m) as exp2((x - m) * log2(e)): exp2f is a few instructions
        # cheaper than expf at the same accuracy (<= 2 ulp), and softmax is
        # instruction-bound on Hopper once its input is in shared memory
        e = self.exp2(self.mul(self.sub(xf, m), 1.4426950408889634))
        s = self.sum(e, [d], keepdim=True)
        # one reciprocal per row, a multiply per element (a division per element is ~10 instructions)
        y = self.mul(e, self.reciprocal(s))
        return self._cast_to(y, x.dtype if x.dtype.is_float else DataType.Float)

    def layer_norm(self, x, weight=None, bias=None, eps=1e-5, normalized_ndim=None):
        """LayerNorm over the last ``normalized_ndim`` axes (default: weight's rank, or 1)."""
        self._check(x, weight, bias)
        k = normalized_ndim or (weight.ndim if weight is not None else 1)
        if not 1 <= k <= x.ndim:
            raise CircbufError(f"layer_norm: cannot normalize {k} axes of {x.name} ({x.ndim} axes)")
        dims = list(range(x.ndim - k, x.ndim))
        var, mean = self.var_mean(x, dims, correction=0, keepdim=True)
        xf = self._cast_to(x, compute_type(x.dtype))
        y = self.mul(self.sub(xf, mean), self.rsqrt(self.add(var, float(eps))))
        if weight is not None:
            y = self.mul(y, self._cast_to(weight, DataType.Float))
        if bias is not None:
            y = self.add(y, self._cast_to(bias, DataType.Float))
        return self._cast_to(y, x.dtype)

    def rms_norm(self, x, weight=None, eps=1e-6):
        """``x * rsqrt(mean(x^2, -1) + eps) * weight`` in fp32; output in x's dtype."""
        self._check(x, weight)
        dims = list(range(x.ndim - (weight.ndim if weight is not None else 1), x.ndim))
        xf = self._cast_to(x, compute_type(x.dtype))
        ms = self.mean(self.mul(xf, xf), dims, keepdim=True)
        y = self.mul(xf, self.rsqrt(self.add(ms, float(eps))))
        if weight is not None:
            y = self.mul(y, self._cast_to(weight, DataType.Float))
        return self._cast_to(y, x.dtype)

    # ---------------------------------------------------------- matmul
    def matmul(self, a, b):
        """``a @ b`` for a [..., M, K] and b [K, N], accumulated in fp32 (Float out).

        Until the Hopper matmul scheduler lands this is broadcast + mul + sum,
        which the reduction scheduler runs correctly but slowly.
        """
        self._check(a, b)
        if b.ndim != 2 or a.ndim < 2:
            raise CircbufError(f"matmul: needs a [..., M, K] and b [K, N]; got {a.ndim}-D and {b.ndim}-D")
        ka, kb = a.size(-1), b.size(0)
        if isinstance(ka, Const) and isinstance(kb, Const) and ka.value != kb.value:
            raise CircbufError(f"matmul: K of {a.name} ({ka}) and {b.name} ({kb}) differ")
        af = self._cast_to(a, compute_type(a.dtype))
        bf = self._cast_to(b, compute_type(b.dtype))
        ab = self._broadcast(af, [False] * a.ndim + [True])  # [..., M, K, 1]
        bb = self._to_rank(bf, a.ndim + 1)  # [1.., K, N]
        return self.sum(self.mul(ab, bb), [a.ndim - 1])

    def linear(self, a, w, bias=None):
        """``a @ w.T + bias`` with w [N, K] (torch.nn.functional.linear)."""
        self._check(a, w, bias)
        if w.ndim != 2:
            raise CircbufError(f"linear: weight {w.name} must be [N, K], got {w.ndim}-D")
        af = self._cast_to(a, compute_type(a.dtype))
        wf = self._cast_to(w, compute_type(w.dtype))
        ab = self._broadcast(af, [False] * (a.ndim - 1) + [True, False])  # [..., 1, K]
        out = self.sum(self.mul(ab, wf), [a.ndim])
        if bias is not None:
            out = self.add(out, bias)
        return out
