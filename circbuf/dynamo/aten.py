"""aten -> FusionDefinition: the translation table, one entry per aten op,
and the Translator that builds one FusionDefinition from a partition of an
aten graph.

Every translation follows the aten op's semantics; the result is then cast
to the dtype the graph records for the node (``node.meta["val"]``), so a
bf16 graph rounds where eager rounds, and its shape is checked against the
recorded one. A node the table has no entry for, or one whose translation
raises (a ``CircbufError`` from the frontend: a dtype mix a matmul refuses,
an expand the frontend cannot express), is reported as ``Unsupported`` with
the reason; the partitioner then leaves it to eager aten.

>>> from circbuf.dynamo.aten import TABLE
>>> import torch
>>> torch.ops.aten.addmm.default in TABLE
True
"""

from __future__ import annotations

import math
import operator

import torch

from ..frontend import FusionDefinition
from ..ir import CircbufError, Const, DataType, Scalar, TensorView

aten = torch.ops.aten
prims = torch.ops.prims

TORCH_TO_CB = {
    torch.float32: DataType.Float,
    torch.float64: DataType.Double,
    torch.float16: DataType.Half,
    torch.bfloat16: DataType.BFloat16,
    torch.int32: DataType.Int32,
    torch.int64: DataType.Int64,
    torch.bool: DataType.Bool,
}


class Unsupported(Exception):
    """``node`` cannot be translated; ``reason`` says why (shown by explain)."""

    def __init__(self, node, reason: str):
        super().__init__(f"{node.name if node is not None else '?'}: {reason}")
        self.node, self.reason = node, reason


# op -> translate(tr, node) returning a TensorView, a tuple of them, or a Scalar
TABLE: dict = {}
# ops whose value is a view of their input: torch makes them without a copy, so
# at a fusion's boundary they are left to torch (the partitioner's bookend removal)
VIEW_OPS: list = []


def _ops(*names):
    """The overloads ``aten.<name>.<overload>`` this torch has (a missing one is skipped)."""
    out = []
    for name in names:
        ns = prims if name.startswith("prims.") else aten
        packet, _, overload = name.removeprefix("prims.").partition(".")
        op = getattr(getattr(ns, packet, None), overload or "default", None)
        if op is not None:
            out.append(op)
    return out


def register(*names, view=False):
    def deco(fn):
        for op in _ops(*names):
            TABLE[op] = fn
            if view:
                VIEW_OPS.append(op)
        return fn

    return deco


def _norm_dim(d, n):
    return d % n if n else 0


# ------------------------------------------------------------- pointwise
_UNARY = {
    "abs": "abs",
    "neg": "neg",
    "relu": "relu",
    "exp": "exp",
    "exp2": "exp2",
    "log": "log",
    "log2": "log2",
    "log10": "log10",
    "log1p": "log1p",
    "expm1": "expm1",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "reciprocal": "reciprocal",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "silu": "silu",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "erf": "erf",
    "erfc": "erfc",
    "erfinv": "erfinv",
    "lgamma": "lgamma",
    "floor": "floor",
    "ceil": "ceil",
    "trunc": "trunc",
    "frac": "frac",
    "isnan": "isnan",
    "isinf": "isinf",
    "isfinite": "isfinite",
    "isposinf": "isposinf",
    "isneginf": "isneginf",
    "signbit": "signbit",
    "bitwise_not": "bitwise_not",
}


def _unary(cb_name):
    def fn(tr, node):
        return getattr(tr.ops, cb_name)(tr.arg(node, 0))

    return fn


for _a, _c in _UNARY.items():
    register(f"{_a}.default")(_unary(_c))


@register("round.default")
def _round(tr, node):
    return tr.ops.round(tr.arg(node, 0))


def _scaled(tr, v, alpha):
    return v if alpha is None or alpha == 1 else tr.ops.mul(v, alpha)


@register("add.Tensor", "add.Scalar")
def _add(tr, node):
    return tr.ops.add(tr.arg(node, 0), _scaled(tr, tr.arg(node, 1), tr.kwarg(node, "alpha", 2, None)))


@register("sub.Tensor", "sub.Scalar")
def _sub(tr, node):
    return tr.ops.sub(tr.arg(node, 0), _scaled(tr, tr.arg(node, 1), tr.kwarg(node, "alpha", 2, None)))


@register("rsub.Tensor", "rsub.Scalar")
def _rsub(tr, node):
    return tr.ops.sub(tr.arg(node, 1), _scaled(tr, tr.arg(node, 0), tr.kwarg(node, "alpha", 2, None)))


@register("mul.Tensor", "mul.Scalar")
def _mul(tr, node):
    return tr.ops.mul(tr.arg(node, 0), tr.arg(node, 1))


@register("div.Tensor", "div.Scalar")
def _div(tr, node):
    return tr.ops.truediv(tr.arg(node, 0), tr.arg(node, 1))  # torch's / is true division


@register("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(tr, node):
    a, b = tr.arg(node, 0), tr.arg(node, 1)
    mode = tr.kwarg(node, "rounding_mode", 2, None)
    if mode is None:
        return tr.ops.truediv(a, b)
    if mode == "trunc":
        if tr.meta_dtype(node).is_float:
            return tr.ops.trunc(tr.ops.truediv(a, b))
        return tr.ops.div(a, b)  # integers: C division truncates toward zero
    raise Unsupported(node, f"div with rounding_mode={mode!r} (only None and 'trunc' are translated)")


def _binary(cb_name):
    def fn(tr, node):
        return getattr(tr.ops, cb_name)(tr.arg(node, 0), tr.arg(node, 1))

    return fn


for _a, _c in {
    "maximum": "maximum",
    "minimum": "minimum",
    "fmod": "fmod",
    "remainder": "remainder",
    "atan2": "atan2",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "eq": "eq",
    "ne": "ne",
    "bitwise_and": "bitwise_and",
    "bitwise_or": "bitwise_or",
    "bitwise_xor": "bitwise_xor",
    "pow": "pow",
}.items():
    register(f"{_a}.Tensor", f"{_a}.Scalar", f"{_a}.default", f"{_a}.Tensor_Tensor", f"{_a}.Tensor_Scalar")(
        _binary(_c)
    )
register("pow.Scalar")(_binary("pow"))


def _as_bool(tr, x):
    if isinstance(x, TensorView):
        return x if x.dtype == DataType.Bool else tr.ops.ne(x, 0)
    return bool(x)


@register("logical_not.default")
def _logical_not(tr, node):
    x = tr.arg(node, 0)
    return tr.ops.bitwise_not(x) if x.dtype == DataType.Bool else tr.ops.eq(x, 0)


@register("logical_and.default", "logical_or.default", "logical_xor.default")
def _logical(tr, node):
    op = {"logical_and": "bitwise_and", "logical_or": "bitwise_or", "logical_xor": "bitwise_xor"}
    a, b = _as_bool(tr, tr.arg(node, 0)), _as_bool(tr, tr.arg(node, 1))
    return getattr(tr.ops, op[node.target._opname])(a, b)


@register("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(tr, node):
    return tr.ops.where(_as_bool(tr, tr.arg(node, 0)), tr.arg(node, 1), tr.arg(node, 2))


@register("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(tr, node):
    x, mask, value = tr.arg(node, 0), tr.arg(node, 1), tr.arg(node, 2)
    if isinstance(value, TensorView) and value.dtype != x.dtype:
        value = tr.ops.cast(value, x.dtype)  # torch casts the fill value to x's type
    return tr.ops.where(_as_bool(tr, mask), value, x)


@register("clamp.default", "clamp.Tensor", "clamp_min.default", "clamp_max.default", "hardtanh.default")
def _clamp(tr, node):
    x = tr.arg(node, 0)
    name = node.target._opname
    if name == "clamp_min":
        lo, hi = tr.arg(node, 1), None
    elif name == "clamp_max":
        lo, hi = None, tr.arg(node, 1)
    elif name == "hardtanh":
        lo, hi = tr.kwarg(node, "min_val", 1, -1.0), tr.kwarg(node, "max_val", 2, 1.0)
    else:
        lo, hi = tr.kwarg(node, "min", 1, None), tr.kwarg(node, "max", 2, None)
    # maximum/minimum propagate NaN, as torch.clamp does
    if lo is not None:
        x = tr.ops.maximum(x, lo)
    if hi is not None:
        x = tr.ops.minimum(x, hi)
    return x


@register("leaky_relu.default")
def _leaky_relu(tr, node):
    x = tr.arg(node, 0)
    slope = tr.kwarg(node, "negative_slope", 1, 0.01)
    return tr.ops.where(tr.ops.gt(x, 0), x, tr.ops.mul(x, slope))


@register("gelu.default")
def _gelu(tr, node):
    x = tr.arg(node, 0)
    if tr.kwarg(node, "approximate", 1, "none") == "none":
        return tr.ops.gelu(x)
    # tanh approximation, as torch: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    ops = tr.ops
    xf = ops.cast(x, DataType.Float) if x.dtype.is_reduced_float else x
    inner = ops.mul(ops.add(xf, ops.mul(ops.mul(ops.mul(xf, xf), xf), 0.044715)), math.sqrt(2.0 / math.pi))
    return ops.mul(ops.mul(xf, 0.5), ops.add(ops.tanh(inner), 1.0))


@register("addcmul.default")
def _addcmul(tr, node):
    return tr.ops.addcmul(tr.arg(node, 0), tr.arg(node, 1), tr.arg(node, 2), tr.kwarg(node, "value", 3, 1))


@register("addcdiv.default")
def _addcdiv(tr, node):
    x, a, b = tr.arg(node, 0), tr.arg(node, 1), tr.arg(node, 2)
    return tr.ops.add(x, _scaled(tr, tr.ops.truediv(a, b), tr.kwarg(node, "value", 3, 1)))


# ------------------------------------------------------- casts and copies
@register("_to_copy.default")
def _to_copy(tr, node):
    x = tr.arg(node, 0)
    return tr.ops.cast(x, tr.meta_dtype(node))


@register("prims.convert_element_type.default")
def _convert(tr, node):
    return tr.ops.cast(tr.arg(node, 0), tr.meta_dtype(node))


@register("clone.default", "lift_fresh_copy.default")
def _clone(tr, node):
    return tr.ops.set(tr.arg(node, 0))


@register("alias.default", "detach.default", view=True)
def _alias(tr, node):
    return tr.arg(node, 0)


# ------------------------------------------------------------- constants
@register(
    "full.default",
    "zeros.default",
    "ones.default",
    "scalar_tensor.default",
    "full_like.default",
    "zeros_like.default",
    "ones_like.default",
    "new_full.default",
    "new_zeros.default",
    "new_ones.default",
    "fill.Scalar",
)
def _full(tr, node):
    name = node.target._opname
    if name in ("zeros", "zeros_like", "new_zeros"):
        value = 0
    elif name in ("ones", "ones_like", "new_ones"):
        value = 1
    elif name == "scalar_tensor":
        value = tr.arg(node, 0)
    else:  # full(size, v), full_like(x, v), new_full(x, size, v), fill(x, v)
        value = tr.arg(node, 2 if name == "new_full" else 1)
    if isinstance(value, TensorView):
        raise Unsupported(node, "a fill value that is a tensor")
    return tr.ops.full(tr.meta_shape(node), value, tr.meta_dtype(node))


# ------------------------------------------------------------------ views
@register("view.default", "_unsafe_view.default", "reshape.default", view=True)
def _view(tr, node):
    x = tr.arg(node, 0)
    shape = tr.meta_shape(node)
    if tr.static_shape(x) == shape and all(isinstance(s, int) for s in shape):
        return x
    return tr.ops.reshape(x, shape)


@register("permute.default", view=True)
def _permute(tr, node):
    x = tr.arg(node, 0)
    dims = [_norm_dim(d, x.ndim) for d in tr.arg(node, 1)]
    return x if dims == list(range(x.ndim)) else tr.ops.permute(x, dims)


@register("t.default", view=True)
def _t(tr, node):
    x = tr.arg(node, 0)
    return tr.ops.permute(x, [1, 0]) if x.ndim == 2 else x


@register("transpose.int", view=True)
def _transpose(tr, node):
    x = tr.arg(node, 0)
    n = x.ndim
    if n < 2:
        return x
    a, b = _norm_dim(tr.arg(node, 1), n), _norm_dim(tr.arg(node, 2), n)
    dims = list(range(n))
    dims[a], dims[b] = dims[b], dims[a]
    return x if a == b else tr.ops.permute(x, dims)


@register("expand.default", view=True)
def _expand(tr, node):
    x = tr.arg(node, 0)
    shape = tr.meta_shape(node)
    if len(shape) > x.ndim:  # torch.expand adds leading axes
        x = tr.ops.broadcast(x, [True] * (len(shape) - x.ndim) + [False] * x.ndim)
    cur = tr.static_shape(x)
    axes = x.domain.no_reductions()
    entries = []
    for s, c, ax in zip(shape, cur, axes):
        if ax.is_broadcast and ax.expanded_extent is None:
            entries.append(s if not (isinstance(s, int) and s == 1) else -1)
        elif c is not None and isinstance(s, int) and c == s:
            entries.append(-1)
        elif isinstance(s, int):
            entries.append(s)
        else:
            entries.append(-1)  # a symbolic extent: the axis keeps its own (the graph says they agree)
    return x if all(e == -1 for e in entries) else tr.ops.expand(x, entries)


@register("unsqueeze.default", view=True)
def _unsqueeze(tr, node):
    x = tr.arg(node, 0)
    d = _norm_dim(tr.arg(node, 1), x.ndim + 1)
    flags = [False] * x.ndim
    flags.insert(d, True)
    return tr.ops.broadcast(x, flags)


@register("squeeze.default", "squeeze.dim", "squeeze.dims", view=True)
def _squeeze(tr, node):
    x = tr.arg(node, 0)
    n = x.ndim
    if n == 0:
        return x
    name = node.target._overloadname
    if name == "default":
        dims = list(range(n))
    elif name == "dim":
        dims = [tr.arg(node, 1)]
    else:
        dims = list(tr.arg(node, 1))
    sizes = tr.static_shape(x)
    dims = sorted(
        {_norm_dim(d, n) for d in dims if sizes[_norm_dim(d, n)] == 1}
    )  # torch: only size-1 axes go
    return tr.ops.squeeze(x, dims) if dims else x


# ------------------------------------------------------------- reductions
def _red_dims(tr, node, x, pos, name="dim"):
    dims = tr.kwarg(node, name, pos, None)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.ndim))  # None and [] reduce every axis (torch)
    if isinstance(dims, int):
        dims = [dims]
    return sorted({_norm_dim(d, x.ndim) for d in dims})


def _reduction(cb_name, dim_pos=1, keep_pos=2):
    def fn(tr, node):
        x = tr.arg(node, 0)
        if x.ndim == 0:
            return tr.ops.set(x)
        if cb_name in ("sum", "mean", "prod") and node.target._overloadname == "default":  # every axis
            dims, keep = list(range(x.ndim)), False
        else:
            dims = _red_dims(tr, node, x, dim_pos)
            keep = bool(tr.kwarg(node, "keepdim", keep_pos, False))
        return getattr(tr.ops, cb_name)(x, dims, keep)

    return fn


register("sum.dim_IntList", "sum.default")(_reduction("sum"))
register("mean.dim", "mean.default")(_reduction("mean"))
register("amax.default")(_reduction("max"))
register("amin.default")(_reduction("min"))
register("prod.dim_int", "prod.default")(_reduction("prod"))


@register("any.dim", "any.dims", "any.default", "all.dim", "all.dims", "all.default")
def _any_all(tr, node):
    x = _as_bool(tr, tr.arg(node, 0))
    if x.ndim == 0:
        return x
    dims = list(range(x.ndim)) if node.target._overloadname == "default" else _red_dims(tr, node, x, 1)
    keep = bool(tr.kwarg(node, "keepdim", 2, False))
    return getattr(tr.ops, "max" if node.target._opname == "any" else "min")(x, dims, keep)


def _correction(tr, node):
    c = tr.kwarg(node, "correction", 2, None)
    if c is None:
        unbiased = node.kwargs.get("unbiased")
        return 1 if unbiased is None else int(bool(unbiased))
    return c


@register("var.correction")
def _var(tr, node):
    x = tr.arg(node, 0)
    dims = _red_dims(tr, node, x, 1)
    return tr.ops.var(x, dims, _correction(tr, node), bool(tr.kwarg(node, "keepdim", 3, False)))


@register("var_mean.correction")
def _var_mean(tr, node):
    x = tr.arg(node, 0)
    dims = _red_dims(tr, node, x, 1)
    return tr.ops.var_mean(x, dims, _correction(tr, node), bool(tr.kwarg(node, "keepdim", 3, False)))


# ------------------------------------------------------------ composites
@register("_softmax.default")
def _softmax(tr, node):
    x, dim, half_to_float = tr.arg(node, 0), tr.arg(node, 1), tr.arg(node, 2)
    if half_to_float and x.dtype.is_reduced_float:
        x = tr.ops.cast(x, DataType.Float)
    return tr.ops.softmax(x, _norm_dim(dim, x.ndim))


@register("_log_softmax.default")
def _log_softmax(tr, node):
    ops = tr.ops
    x, dim = tr.arg(node, 0), _norm_dim(tr.arg(node, 1), tr.arg(node, 0).ndim)
    xf = ops.cast(x, DataType.Float) if x.dtype != DataType.Double else x
    s = ops.sub(xf, ops.max(xf, [dim], keepdim=True))
    return ops.sub(s, ops.log(ops.sum(ops.exp(s), [dim], keepdim=True)))


@register("native_layer_norm.default")
def _native_layer_norm(tr, node):
    ops = tr.ops
    x, shape, w, b, eps = (tr.arg(node, k) for k in range(5))
    k = len(shape)
    dims = list(range(x.ndim - k, x.ndim))
    xf = ops.cast(x, DataType.Float) if x.dtype.is_reduced_float else x
    var, mean = ops.var_mean(xf, dims, correction=0, keepdim=True)
    rstd = ops.rsqrt(ops.add(var, eps))
    y = ops.mul(ops.sub(xf, mean), rstd)
    if w is not None:
        y = ops.mul(y, w)
    if b is not None:
        y = ops.add(y, b)
    return y, mean, rstd


@register("_fused_rms_norm.default")
def _fused_rms_norm(tr, node):
    ops = tr.ops
    x, shape, w = tr.arg(node, 0), tr.arg(node, 1), tr.arg(node, 2)
    eps = tr.kwarg(node, "eps", 3, None)
    if eps is None:  # torch: the epsilon of the computation type
        eps = torch.finfo(torch.float64 if x.dtype == DataType.Double else torch.float32).eps
    dims = list(range(x.ndim - len(shape), x.ndim))
    xf = ops.cast(x, DataType.Float) if x.dtype.is_reduced_float else x
    rstd = ops.rsqrt(ops.add(ops.mean(ops.mul(xf, xf), dims, keepdim=True), eps))
    y = ops.mul(xf, rstd)
    if w is not None:
        y = ops.mul(y, w)
    return y, rstd


# --------------------------------------------------------------- matmul
@register("mm.default", "bmm.default", "mv.default", "dot.default")
def _mm(tr, node):
    return tr.ops.matmul(tr.arg(node, 0), tr.arg(node, 1))


@register("addmm.default")
def _addmm(tr, node):
    bias, a, b = tr.arg(node, 0), tr.arg(node, 1), tr.arg(node, 2)
    beta, alpha = tr.kwarg(node, "beta", 3, 1), tr.kwarg(node, "alpha", 4, 1)
    out = _scaled(tr, tr.ops.matmul(a, b), alpha)
    if beta == 0:  # torch ignores the bias (even NaN in it)
        return out
    return tr.ops.add(out, _scaled(tr, bias, beta))


def _getitem(tr, node):
    src = tr.env[node.args[0]]
    if not isinstance(src, tuple):
        raise Unsupported(node, "getitem of a value that is not a tuple")
    return src[node.args[1]]


TABLE[operator.getitem] = _getitem


# ------------------------------------------------------------ translator
class Translator:
    """Build one FusionDefinition from ``nodes`` (a partition, in topological
    order) reading ``inputs`` (the values from outside it, in the order the
    fused call passes them) and producing ``outputs`` (its nodes used
    outside). ``run()`` returns the FusionDefinition; ``in_pos`` says which
    call argument each fusion input is, ``out_map`` where each output comes
    from (``("out", k)``: fusion output k; ``("in", i)``: call argument i,
    a value the partition passes through unchanged)."""

    def __init__(self, nodes, inputs, outputs):
        self.nodes, self.inputs, self.outputs = list(nodes), list(inputs), list(outputs)
        self.fd = FusionDefinition()
        self.ops = self.fd.ops
        self.env: dict = {}
        self.sym: dict = {}  # sympy expression -> circbuf Scalar (extent)
        self.in_pos: list[int] = []
        self.out_map: list[tuple[str, int]] = []
        # per fusion output: (the strides the graph records, the (axis, stride) pairs to
        # check), or None where they are symbolic or not dense
        self.out_layouts: list = []

    # ---------------------------------------------------------- helpers
    def arg(self, node, k, default=None):
        a = node.args[k] if k < len(node.args) else default
        return self.value(a)

    def kwarg(self, node, name, pos, default):
        if name in node.kwargs:
            return self.value(node.kwargs[name])
        if pos is not None and pos < len(node.args):
            return self.value(node.args[pos])
        return default

    def value(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.size(a)
        return a

    def meta_dtype(self, node) -> DataType:
        v = node.meta["val"]
        return TORCH_TO_CB[v.dtype]

    def size(self, s):
        """A size from the graph's metadata: an int, or a circbuf Scalar for a
        symbolic one (an extent of an input, or arithmetic on extents)."""
        if isinstance(s, int):
            return s
        if isinstance(s, torch.SymInt):
            expr = s.node.expr
            if expr.is_number:
                return int(expr)
            return self._sym_expr(expr)
        raise Unsupported(None, f"a symbolic value {s!r} that is not an integer size")

    def _sym_expr(self, expr):
        import sympy

        if expr in self.sym:
            return self.sym[expr]
        if expr.is_Integer:
            return int(expr)
        args = [self._sym_expr(a) for a in expr.args] if expr.args else []
        if isinstance(expr, sympy.Mul):
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if isinstance(expr, sympy.Add):
            out = args[0]
            for a in args[1:]:
                out = out + a
            return out
        if type(expr).__name__ == "FloorDiv":
            return args[0] // args[1]
        raise Unsupported(None, f"symbolic size {expr} (no input extent gives it)")

    def meta_shape(self, node) -> list:
        return [self.size(s) for s in node.meta["val"].shape]

    @staticmethod
    def static_shape(tv) -> list:
        """Each axis's size as an int where it is fixed, else None."""
        out = []
        for ax in tv.domain.no_reductions():
            if ax.is_broadcast and ax.expanded_extent is None:
                out.append(1)
                continue
            e = ax.loop_extent
            out.append(int(e.value) if isinstance(e, Const) else None)
        return out

    # ------------------------------------------------------------- run
    def _define_input(self, pos, node):
        v = node.meta.get("val")
        if isinstance(v, torch.Tensor):
            dt = TORCH_TO_CB.get(v.dtype)
            if dt is None:
                raise Unsupported(node, f"dtype {v.dtype} is not one circbuf has")
            shape, later = [], []
            for d, s in enumerate(v.shape):
                if isinstance(s, torch.SymInt) and not s.node.expr.is_number:
                    shape.append(-1)
                    later.append((d, s.node.expr))
                else:
                    shape.append(int(s))
            tv = self.fd.define_tensor(shape, dtype=dt)
            for d, expr in later:
                self.sym.setdefault(expr, self.ops.size(tv, d))
            self.env[node] = tv
            self.in_pos.append(pos)
            return True
        return False

    def run(self) -> FusionDefinition:
        later = []
        for pos, node in enumerate(self.inputs):  # tensors first: their extents name the symbols
            if not self._define_input(pos, node):
                later.append((pos, node))
        for pos, node in later:
            v = node.meta.get("val")
            if isinstance(v, torch.SymInt):
                expr = v.node.expr
                try:
                    self.env[node] = self.size(v)
                except Unsupported:
                    if not expr.is_Symbol:
                        raise Unsupported(node, f"symbolic size {expr} (no input extent gives it)") from None
                    s = self.fd.define_scalar(dtype=DataType.Int64)
                    self.sym[expr] = s
                    self.env[node] = s
                    self.in_pos.append(pos)
            elif isinstance(v, (int, float, bool)):
                self.env[node] = v
            else:
                raise Unsupported(node, f"an input of type {type(v).__name__}")
        for node in self.nodes:
            fn = TABLE.get(node.target)
            if fn is None:
                raise Unsupported(node, "no circbuf translation")
            try:
                out = fn(self, node)
                out = self._conform(node, out)
            except Unsupported as e:
                if e.node is None:
                    e = Unsupported(node, e.reason)
                raise e from None
            except CircbufError as e:
                raise Unsupported(node, f"CircbufError: {e}") from None
            self.env[node] = out
        self._add_outputs()
        return self.fd

    def _conform(self, node, out):
        """Cast to the dtype the graph records and check the shape."""
        v = node.meta.get("val")
        if isinstance(out, tuple):
            if not isinstance(v, (tuple, list)) or len(v) != len(out):
                raise Unsupported(node, "a tuple result unlike the graph's")
            return tuple(self._conform_one(node, o, m) for o, m in zip(out, v))
        if isinstance(out, TensorView):
            return self._conform_one(node, out, v)
        if isinstance(out, Scalar) or not isinstance(v, torch.Tensor):
            return out
        raise Unsupported(node, f"a result of type {type(out).__name__}")

    def _conform_one(self, node, tv, meta):
        if meta is None:  # an output the graph does not use (a tuple's unused element)
            return tv
        if not isinstance(tv, TensorView) or not isinstance(meta, torch.Tensor):
            raise Unsupported(node, "a result unlike the graph's")
        dt = TORCH_TO_CB.get(meta.dtype)
        if dt is None:
            raise Unsupported(node, f"dtype {meta.dtype} is not one circbuf has")
        if tv.dtype != dt:
            tv = self.ops.cast(tv, dt)
        got, want = self.static_shape(tv), list(meta.shape)
        if len(got) != len(want):
            raise Unsupported(node, f"translated to rank {len(got)}, the graph says {len(want)}")
        for g, w in zip(got, want):
            if g is not None and isinstance(w, int) and g != w:
                raise Unsupported(node, f"translated to shape {got}, the graph says {list(want)}")
        return tv

    def _add_outputs(self):
        done: dict = {}  # id(tv) -> fusion output index (a value returned for several nodes once)
        for node in self.outputs:
            tv = self.env[node]
            if not isinstance(tv, TensorView):
                raise Unsupported(node, "a fusion output that is not a tensor")
            if tv in self.fd.fusion.inputs:  # passed through unchanged (alias, detach)
                self.out_map.append(("in", self.in_pos[self.fd.fusion.inputs.index(tv)]))
                continue
            if id(tv) not in done:
                order, strides = _layout(node.meta["val"])
                out = self.ops.stride_order(tv, order) if order is not None else tv
                done[id(tv)] = len(self.out_layouts)
                self.fd.add_output(out)
                self.out_layouts.append(strides)
            self.out_map.append(("out", done[id(tv)]))


def _hint(s) -> int:
    if isinstance(s, int):
        return s
    h = s.node.hint
    if h is None:
        raise Unsupported(None, f"a size {s} with no hint")
    return int(h)


def _layout(meta):
    """How the graph lays out a result: (circbuf ``stride_order`` for a dense
    layout other than row-major, else None; the strides to check the result
    against, or None where they are symbolic or not dense: there circbuf's
    dense row-major result has the same values, and any view the graph takes
    of the recorded layout is valid on it)."""
    n = meta.dim()
    sizes = [_hint(s) for s in meta.shape]
    strides = [_hint(s) for s in meta.stride()]
    by = sorted(range(n), key=lambda d: (strides[d], -d))  # innermost first
    expect = 1
    for d in by:
        if sizes[d] == 1:
            continue
        if strides[d] != expect:
            return None, None  # overlapping or with gaps
        expect *= sizes[d]
    static = all(isinstance(s, int) for s in (*meta.shape, *meta.stride()))
    check = (tuple(strides), tuple((d, strides[d]) for d in range(n) if sizes[d] > 1)) if static else None
    plain = [d for d in range(n) if sizes[d] != 1]
    pos = {d: r for r, d in enumerate(by)}
    if all(pos[a] > pos[b] for a, b in zip(plain, plain[1:])):
        return None, check  # row-major, up to size-1 axes
    return [pos[d] for d in range(n)], check
