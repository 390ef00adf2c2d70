"""The ops nvFuser users write (issue 8, part 3, the non-view part).

CPU tests check every op's result dtype against nvFuser's type promotion,
the refusals by name, and compile every op for sm_90a; GPU tests compare
with torch in float64 on fresh random inputs in each op's domain (outputs
are poisoned with NaN by conftest, so an unwritten element fails).
"""

import math
import re

import pytest
import torch

import circbuf as cb
from circbuf.ir import Un, simplify
from tests.util import TORCH, D, assert_close

DEV = "cuda"
FLOATS = [D.Float, D.Double, D.Half, D.BFloat16]
INTS = [D.Int32, D.Int64]
ALL = FLOATS + INTS + [D.Bool]
ERR = "error"

# op -> (torch reference, input domain (lo, hi))
FLOAT_UNARY = {
    "sin": (torch.sin, (-4, 4)),
    "cos": (torch.cos, (-4, 4)),
    "tan": (torch.tan, (-1.4, 1.4)),
    "asin": (torch.asin, (-0.99, 0.99)),
    "acos": (torch.acos, (-0.99, 0.99)),
    "atan": (torch.atan, (-4, 4)),
    "sinh": (torch.sinh, (-4, 4)),
    "cosh": (torch.cosh, (-4, 4)),
    "asinh": (torch.asinh, (-4, 4)),
    "acosh": (torch.acosh, (1, 5)),
    "atanh": (torch.atanh, (-0.99, 0.99)),
    "erf": (torch.erf, (-3, 3)),
    "erfc": (torch.erfc, (-3, 3)),
    "erfinv": (torch.erfinv, (-0.99, 0.99)),
    "erfcinv": (lambda x: torch.erfinv(1 - x), (0.01, 1.99)),  # torch has no erfcinv
    "lgamma": (torch.lgamma, (0.1, 8)),
    "log1p": (torch.log1p, (-0.9, 4)),
    "expm1": (torch.expm1, (-3, 3)),
    "log2": (torch.log2, (0.1, 8)),
    "log10": (torch.log10, (0.1, 8)),
}
ROUNDING = {"floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc}
PREDICATES = {
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "isfinite": torch.isfinite,
    "isposinf": torch.isposinf,
    "isneginf": torch.isneginf,
    "isreal": torch.isreal,
    "signbit": torch.signbit,
}
UNARY = [*FLOAT_UNARY, *ROUNDING, "frac", *PREDICATES, "bitwise_not"]
BINARY = [
    "truediv",
    "pow",
    "fmod",
    "remainder",
    "mod",
    "atan2",
    "nextafter",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "logical_right_shift",
    "gcd",
]


def _float_result(dt):
    """Arithmetic type: Double stays, every other type computes in Float."""
    return D.Double if dt == D.Double else D.Float


def expected_unary(op, dt):
    """The result dtype nvFuser's rules give (Half/BFloat16 compute in Float here)."""
    if op in FLOAT_UNARY:
        return _float_result(dt)  # float_op_config: integers and Bool promote
    if op in ROUNDING:
        return ERR if dt == D.Bool else dt if dt.is_int else _float_result(dt)
    if op == "frac":
        return _float_result(dt) if dt.is_float else ERR
    if op in PREDICATES:
        return D.Bool
    assert op == "bitwise_not"
    return ERR if dt.is_float else dt


def expected_binary(op, dt):
    """Result dtype of ``op(a, b)`` with both tensors of ``dt``."""
    if op in ("truediv", "atan2"):
        return _float_result(dt)
    if op in ("pow", "fmod", "remainder", "mod"):
        return ERR if dt == D.Bool else dt if dt.is_int else _float_result(dt)
    if op == "nextafter":
        return _float_result(dt) if dt.is_float else ERR
    if op.startswith("bitwise_") and not op.endswith("shift"):
        return ERR if dt.is_float else dt
    return dt if dt.is_int else ERR  # shifts and gcd: integers only


# (op, dtype) pairs the op takes, and an id for each
UNARY_CASES = [(op, dt) for op in UNARY for dt in ALL if expected_unary(op, dt) != ERR]
BINARY_CASES = [(op, dt) for op in BINARY for dt in ALL if expected_binary(op, dt) != ERR]


def _case_id(case):
    return f"{case[0]}-{case[1].name}"


def _unary_fusion(op, dt, rank=2):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank, dtype=dt)
        fd.add_output(getattr(fd.ops, op)(x))
    return fd


def _binary_fusion(op, da, db=None, scalar=None):
    """``op(a, b)`` on two tensors, or ``op(a, scalar)``."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=da)
        b = fd.define_tensor([-1, -1], dtype=db or da) if scalar is None else scalar
        fd.add_output(getattr(fd.ops, op)(a, b))
    return fd


def _cpu(dt, shape=(4, 8)):
    return torch.zeros(shape, dtype=TORCH[dt])


# --------------------------------------------------------------- CPU: dtypes
@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("op", UNARY)
def test_unary_dtype(op, dt):
    want = expected_unary(op, dt)
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        if want == ERR:
            with pytest.raises(cb.CircbufError, match=rf"{op}: T0 \({dt.name}\): {op} takes"):
                getattr(fd.ops, op)(x)
            return
        y = getattr(fd.ops, op)(x)
    assert y.dtype == want


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("op", BINARY)
def test_binary_dtype(op, dt):
    want = expected_binary(op, dt)
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=dt)
        b = fd.define_tensor([-1], dtype=dt)
        if want == ERR:
            with pytest.raises(cb.CircbufError, match=rf"{op}: T0 \({dt.name}\): {op} takes"):
                getattr(fd.ops, op)(a, b)
            return
        y = getattr(fd.ops, op)(a, b)
    assert y.dtype == want


@pytest.mark.parametrize(
    "op, da, other, want",
    [
        ("pow", D.Int32, 2, D.Int32),  # a Python int keeps an integer tensor's type
        ("pow", D.Int32, 0.5, D.Float),  # a Python float makes it Float
        ("pow", D.BFloat16, 2, D.Float),
        ("pow", D.Bool, 2, D.Int64),  # as torch.result_type
        ("fmod", D.Int64, 3.0, D.Float),
        ("truediv", D.Int64, 2, D.Float),
        ("truediv", D.Int32, D.Int64, D.Float),
        ("atan2", D.Int32, D.Double, D.Double),
        ("nextafter", D.Float, 2, D.Float),  # the promoted type is floating point
        ("nextafter", D.Half, D.BFloat16, D.Float),
        ("bitwise_and", D.Int32, D.Bool, D.Int32),
        ("bitwise_or", D.Bool, D.Bool, D.Bool),
        ("bitwise_xor", D.Int32, D.Int64, D.Int64),
        ("bitwise_left_shift", D.Int32, 3, D.Int32),
        ("logical_right_shift", D.Int64, D.Int32, D.Int64),
        ("gcd", D.Int32, 6, D.Int32),
        ("remainder", D.Half, D.Float, D.Float),
    ],
)
def test_binary_promotion(op, da, other, want):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=da)
        b = fd.define_tensor([-1], dtype=other) if isinstance(other, cb.DataType) else other
        assert getattr(fd.ops, op)(a, b).dtype == want


@pytest.mark.parametrize(
    "op, da, other, match",
    [
        ("gcd", D.Int32, 2.5, r"gcd: 2.5 \(Double\): gcd takes integer operands"),
        ("bitwise_and", D.Int32, 1.0, r"bitwise_and: 1.0 \(Double\): bitwise_and takes integer or Bool"),
        ("bitwise_right_shift", D.Int32, True, r"True \(Bool\): bitwise_right_shift takes integer"),
        ("nextafter", D.Int32, 1, r"nextafter: T0 \(Int32\): nextafter takes floating-point operands"),
        ("pow", D.Bool, True, r"pow: T0 \(Bool\): pow takes numeric operands, not two Bools"),
    ],
)
def test_binary_refusals_name_operand_and_rule(op, da, other, match):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=da)
        with pytest.raises(cb.CircbufError, match=match):
            getattr(fd.ops, op)(a, other)


# -------------------------------------------------------------- CPU: compile
@pytest.mark.parametrize("op, dt", UNARY_CASES, ids=[_case_id(c) for c in UNARY_CASES])
def test_unary_compiles(op, dt):
    ck = _unary_fusion(op, dt).compile([_cpu(dt)], arch="sm_90a")
    assert f"cb::{op}(" in ck.cuda and ck.cubin


@pytest.mark.parametrize("op, dt", BINARY_CASES, ids=[_case_id(c) for c in BINARY_CASES])
def test_binary_compiles(op, dt):
    ck = _binary_fusion(op, dt).compile([_cpu(dt), _cpu(dt)], arch="sm_90a")
    infix = {"truediv": " / ", "bitwise_and": " & ", "bitwise_or": " | ", "bitwise_xor": " ^ "}
    assert (infix[op] if op in infix else f"cb::{op}(") in ck.cuda and ck.cubin


@pytest.mark.parametrize("op, scalar", [("pow", 2), ("pow", 0.5), ("fmod", -3), ("bitwise_left_shift", 3)])
def test_binary_with_a_scalar_compiles(op, scalar):
    fd = _binary_fusion(op, D.Int32, scalar=scalar)
    fd.compile([_cpu(D.Int32)], arch="sm_90a")


# ------------------------------------------------------------ CPU: scalars
def test_scalar_constants_fold():
    with cb.FusionDefinition() as fd:
        ops = fd.ops
        assert ops.fmod(7, -3).value == 1  # C: the sign of the dividend
        assert ops.remainder(7, -3).value == -2  # Python: the sign of the divisor
        assert ops.mod(-7, 3).value == -1
        assert ops.pow(2, 10).value == 1024 and ops.pow(2, -1).value == 0 and ops.pow(-1, -3).value == -1
        assert ops.truediv(7, 2).value == 3.5
        assert ops.gcd(-12, 18).value == 6
        assert ops.logical_right_shift(-1, 60).value == 15 and ops.bitwise_left_shift(1, 64).value == 0
        assert ops.bitwise_right_shift(-8, 70).value == -1
        assert ops.bitwise_and(True, False).dtype == D.Bool
        assert ops.round(2.5).value == 2.0 and ops.floor(-0.5).value == -1.0
        assert ops.signbit(-0.0).value is True and ops.isnan(float("nan")).value is True
        assert ops.sin(0.5).value == pytest.approx(math.sin(0.5))
        assert ops.erfinv(ops.erf(0.3).value).value == pytest.approx(0.3)
        assert fd.define_scalar(3).dtype == D.Int64 and fd.define_scalar(3.0).dtype == D.Double
        # a domain edge is left to the kernel, which computes it as C does (-inf)
        assert isinstance(ops.log(0.0), Un)


def _scalar_math_fusion():
    # nvFuser's test_reshape_dynamic computes sizes with these on scalars
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        n = fd.define_scalar(dtype=D.Int64)
        f = fd.define_scalar(dtype=D.Double)
        a = fd.ops.fmod(n, 3)
        b = fd.ops.bitwise_and(n, 6)
        c = fd.ops.cast(fd.ops.ne(n, 0), D.Int64)
        s = fd.ops.cast(fd.ops.signbit(n), D.Int64)
        k = fd.ops.sub(fd.ops.mul(fd.ops.add(a, b), c), s)
        r = fd.ops.mul(fd.ops.reciprocal(f), fd.ops.remainder(f, 0.75))
        y = fd.ops.add(fd.ops.mul(x, fd.ops.cast(k, D.Float)), r)
        big = fd.ops.isinf(fd.ops.mul(f, 1e308))  # overflows to +-inf for |f| > 1.8
        fd.add_output(fd.ops.add(y, fd.ops.cast(big, D.Float)))
    return fd


def _scalar_math_reference(x, n, f):
    a = int(math.fmod(n, 3))  # C: the sign of n
    k = (a + (n & 6)) * int(n != 0) - int(n < 0)
    r = (1 / f) * (f % 0.75)  # Python's %: torch.remainder
    return x.double() * k + r + float(math.isinf(f * 1e308))


def test_scalar_math_compiles():
    ck = _scalar_math_fusion().compile([torch.zeros(8), -7, 2.5], arch="sm_90a")
    for fn in ("cb::fmod(", "cb::signbit(", "cb::remainder(", "cb::isinf(", "& 6"):
        assert fn in ck.cuda


def test_integer_scalar_inputs_are_not_assumed_non_negative():
    with cb.FusionDefinition() as fd:
        n = fd.define_scalar(dtype=D.Int64)
    assert str(simplify((n * 4 + 1) // 4)) != "s0"  # s0 = -1: (-4 + 1) / 4 is 0 in C


# ----------------------------------------------------------- CPU: full etc.
def _full_scalar_only():
    with cb.FusionDefinition() as fd:
        s0 = fd.define_scalar(dtype=D.Double)
        s1 = fd.define_scalar(dtype=D.Double)
        fd.add_output(fd.ops.full([5], fd.ops.add(s0, s1), D.Float))
    return fd


def test_scalar_only_fusion_compiles():
    fd = _full_scalar_only()
    assert "T0 = full({5}, (s0 + s1))" in fd.fusion.print_math()
    ck = fd.compile([1.0, 2.5], arch="sm_90a")
    assert "cb::cast<float>((s0 + s1))" in ck.cuda
    with cb.FusionDefinition() as fd2:  # no inputs at all
        fd2.add_output(fd2.ops.full([3, 2], 1.5, D.Half))
    fd2.compile([], arch="sm_90a")


def _full_sized_by_scalar(dtype=D.Int32):
    with cb.FusionDefinition() as fd:
        n = fd.define_scalar(dtype=D.Int64)
        fd.add_output(fd.ops.full([fd.ops.add(n, 1), 3], 7, dtype))
    return fd


def test_full_sized_by_a_scalar():
    fd = _full_sized_by_scalar()
    ex = fd._get_executor()
    info, _ = ex._bind([4], need_cuda=False)
    assert ex._out_shapes(info.extents) == [(5, 3)]
    ck = fd.compile([4], arch="sm_90a")
    assert "< ((s0 * 3) + 3)" in ck.cuda  # the kernel computes the size from its scalar argument
    with pytest.raises(cb.CircbufError, match=r"size i0 = \(s0 \+ 1\) is -2 for these inputs"):
        fd.compile([-3], arch="sm_90a")


@pytest.mark.parametrize(
    "shape, match",
    [([-1], "shape entry 0 is -1; extents are >= 0"), ([2, 1.5], "shape entry 1 .* must be an int")],
)
def test_full_refuses_bad_shapes(shape, match):
    with cb.FusionDefinition() as fd:
        with pytest.raises(cb.CircbufError, match=match):
            fd.ops.full(shape, 1.0, D.Float)


@pytest.mark.parametrize("dtype", [D.Float, D.Half, D.BFloat16, D.Int64, D.Bool])
def test_full_next_to_a_tensor_compiles(dtype):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        s = fd.define_scalar(dtype=D.Double)
        t = fd.ops.full([x.size(0), x.size(1)], s, dtype)
        assert t.dtype == dtype
        fd.add_output(fd.ops.add(x, t))
        fd.add_output(t)
    fd.compile([torch.zeros(3, 40), 1.5], arch="sm_90a")


def test_broadcast_places_the_axes():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        y = fd.ops.broadcast(x, [True, False, True])
        assert [i.is_broadcast for i in y.logical] == [True, False, True]
        with pytest.raises(cb.CircbufError, match=r"broadcast: T0 has 1 axes but is_broadcast_dim"):
            fd.ops.broadcast(x, [False, False])


def test_addcmul_casts_value_to_the_operands_type():
    with cb.FusionDefinition() as fd:
        i = fd.define_tensor([-1], dtype=D.Int32)
        h = fd.define_tensor([-1], dtype=D.Half)
        assert fd.ops.addcmul(i, i, i, 2.5).dtype == D.Int32  # 2.5 becomes 2, as nvFuser casts it
        assert fd.ops.addcmul(h, h, i, 0.5).dtype == D.Float
        with pytest.raises(cb.CircbufError, match="addcmul: value must be a scalar, got tensor T0"):
            fd.ops.addcmul(i, i, i, i)


@pytest.mark.parametrize(
    "dt, want", [(D.Float, D.Float), (D.BFloat16, D.Float), (D.Double, D.Double), (D.Int32, D.Int64)]
)
def test_prod_dtype_and_compile(dt, want):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        y = fd.ops.prod(x, [1])
        fd.add_output(y)
    assert y.dtype == want and "prod(T" in fd.fusion.print_math()
    ck = fd.compile([_cpu(dt, (4, 64))], arch="sm_90a")
    assert "cb::MulOp()" in ck.cuda


# (shape, reduced dim) -> the scheduler that takes a product over it
PROD_SCHEDULERS = [
    ((6, 1000), 1, "normalization"),
    ((8, 64), 0, "outer_reduction"),
    ((3, 7, 5), 1, "reduction"),
]


def _prod_fusion(rank, dim, dt=D.Float):
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1] * rank, dtype=dt)
        fd.add_output(fd.ops.prod(t, [dim]))
    return fd


@pytest.mark.parametrize("shape, dim, sched", PROD_SCHEDULERS)
def test_prod_through_each_scheduler_compiles(shape, dim, sched):
    ck = _prod_fusion(len(shape), dim).compile([torch.zeros(shape)], arch="sm_90a")
    assert ck.name == f"circbuf_{sched}"
    assert re.search(
        r"(T\d+(?:\[[^\]]*\])?) = \1 \* ", ck.cuda
    )  # acc = acc * x (a scalar or an array element)
    assert ("cb::MulOp()" in ck.cuda) == (sched != "reduction")  # thread partials combined


def test_welford_and_var_compile():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        avg, m2, n = fd.ops.welford(x, [-1])
        assert (avg.dtype, m2.dtype, n.dtype) == (D.Float, D.Float, D.Int64)
        fd.add_output(fd.ops.div(m2, n))
        fd.add_output(avg)
        fd.add_output(n)
        fd.add_output(fd.ops.var(x, [1], correction=0))
    fd.compile([_cpu(D.BFloat16, (8, 96))], arch="sm_90a")


@pytest.mark.parametrize("op", ["welford", "var_mean", "var_mean_keepdim"])
def test_the_mean_is_reduced_once(op):
    # one sum for the mean, one for the squared deviations from it
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        if op == "welford":
            outs = fd.ops.welford(x, [-1])[:2]
        else:
            outs = fd.ops.var_mean(x, [-1], keepdim=op.endswith("keepdim"))
        for o in outs:
            fd.add_output(o)
    assert sum(isinstance(e, cb.ir.ReductionOp) for e in fd.fusion.exprs()) == 2
    assert sum(e.op_name == "sum" for e in fd.fusion.exprs() if isinstance(e, cb.ir.ReductionOp)) == 2


# ------------------------------------------------------------------- GPU
def _rand(shape, dt, lo=-3.0, hi=3.0):
    if dt == D.Bool:
        return torch.rand(shape, device=DEV) > 0.5
    if dt.is_int:
        return torch.randint(int(lo), int(hi) + 1, shape, device=DEV, dtype=TORCH[dt])
    x = torch.rand(shape, device=DEV, dtype=torch.float64) * (hi - lo) + lo
    return x.to(TORCH[dt])


SHAPE = (33, 257)


@pytest.mark.gpu
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(FLOAT_UNARY))
def test_float_unary_values(op, dt):
    ref, (lo, hi) = FLOAT_UNARY[op]
    x = _rand(SHAPE, dt, lo, hi)
    (out,) = _unary_fusion(op, dt).execute([x])
    assert out.dtype == TORCH[_float_result(dt)]
    assert_close(out, ref(x.double()))


@pytest.mark.gpu
@pytest.mark.parametrize("dt", INTS + [D.Bool], ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["sin", "erf", "log2", "lgamma", "atan"])
def test_float_unary_of_integers_gives_float(op, dt):
    x = _rand(SHAPE, dt, 1, 9)
    (out,) = _unary_fusion(op, dt).execute([x])
    assert out.dtype == torch.float32
    assert_close(out, FLOAT_UNARY[op][0](x.double()))


def _with_halves(x):
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -0.0, 3.0], device=DEV, dtype=x.dtype)
    x = x.clone()
    x.view(-1)[: halves.numel()] = halves
    return x


ROUNDING_CASES = [(op, dt) for op, dt in UNARY_CASES if op in ROUNDING or op == "frac"]


@pytest.mark.gpu
@pytest.mark.parametrize("op, dt", ROUNDING_CASES, ids=[_case_id(c) for c in ROUNDING_CASES])
def test_rounding_values(op, dt):
    x = _rand(SHAPE, dt, -50, 50)
    x = _with_halves(x) if dt.is_float else x
    (out,) = _unary_fusion(op, dt).execute([x])
    if dt.is_int:
        assert out.dtype == x.dtype and torch.equal(out, x)  # whole already
        return
    ref = torch.frac(x.double()) if op == "frac" else ROUNDING[op](x.double())
    assert out.dtype == TORCH[_float_result(dt)]
    assert torch.equal(out.double(), ref)  # exact: round halves to even, frac has x's sign


def _specials(dt):
    if dt == D.Bool:
        return _rand(SHAPE, dt)
    x = _rand(SHAPE, dt, -100, 100)
    if dt.is_float:
        sp = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0, 1.5, -2.5], dtype=torch.float32)
        x.view(-1)[: sp.numel()] = sp.to(x.device, x.dtype)
        x.view(-1)[-3:] = sp[:3].to(x.device, x.dtype)
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(PREDICATES))
def test_predicate_values(op, dt):
    x = _specials(dt)
    (out,) = _unary_fusion(op, dt).execute([x])
    assert out.dtype == torch.bool
    ref = PREDICATES[op](x.float() if dt.is_float else x)  # fp16/bf16 -> fp32 keeps NaN, inf, -0.0
    assert torch.equal(out.cpu(), ref.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("dt", INTS + [D.Bool], ids=lambda d: d.name)
def test_bitwise_not_values(dt):
    x = _rand(SHAPE, dt, -1000, 1000)
    (out,) = _unary_fusion("bitwise_not", dt).execute([x])
    assert out.dtype == x.dtype and torch.equal(out, torch.bitwise_not(x))


def _nonzero(shape, dt, lo, hi):
    b = _rand(shape, dt, lo, hi)
    return torch.where(b == 0, torch.ones_like(b), b)


# (a, b) input makers per op, and the torch reference computed in float64 (or exactly on integers)
def _binary_case(op, dt):
    if op == "truediv":
        a, b = _rand(SHAPE, dt, -50, 50), _nonzero(SHAPE, dt, -9, 9)
        return a, b, lambda a, b: a.double() / b.double()
    if op == "pow":
        if dt.is_int:
            return _rand(SHAPE, dt, -3, 3), _rand(SHAPE, dt, -2, 9), lambda a, b: torch.pow(a.cpu(), b.cpu())
        return (
            _rand(SHAPE, dt, 0.1, 3),
            _rand(SHAPE, dt, -3, 3),
            lambda a, b: torch.pow(a.double(), b.double()),
        )
    if op in ("fmod", "remainder", "mod"):
        a = _rand(SHAPE, dt, -40, 40)
        b = _nonzero(SHAPE, dt, -7, 7)
        fn = torch.remainder if op == "remainder" else torch.fmod  # mod: C's %, fmod on floats
        return a, b, lambda a, b: fn(a.cpu(), b.cpu()) if dt.is_int else fn(a.double(), b.double())
    if op == "atan2":
        return (
            _rand(SHAPE, dt, -5, 5),
            _rand(SHAPE, dt, -5, 5),
            lambda a, b: torch.atan2(a.double(), b.double()),
        )
    if op == "nextafter":
        a, b = _rand(SHAPE, dt), _rand(SHAPE, dt)
        b.view(-1)[:4] = a.view(-1)[:4]  # equal: returns b
        # the step is one ulp of the computing type: Float for 16-bit inputs
        ct = torch.float64 if dt == D.Double else torch.float32
        return a, b, lambda a, b: torch.nextafter(a.to(ct), b.to(ct))
    if op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        fn = getattr(torch, op)
        return _rand(SHAPE, dt, -1000, 1000), _rand(SHAPE, dt, -1000, 1000), fn
    if op in ("bitwise_left_shift", "bitwise_right_shift"):
        bits = 8 * TORCH[dt].itemsize
        a, b = _rand(SHAPE, dt, -(2**20), 2**20), _rand(SHAPE, dt, -2, bits + 2)
        fn = getattr(torch, op)
        return a, b, lambda a, b: fn(a.cpu(), b.cpu())  # torch's defined results out of range
    if op == "logical_right_shift":
        bits = 8 * TORCH[dt].itemsize
        a, b = _rand(SHAPE, dt, -(2**30), 2**30), _rand(SHAPE, dt, -2, bits + 2)
        return a, b, lambda a, b: _logical_shift_reference(a, b, bits)
    assert op == "gcd"
    return _rand(SHAPE, dt, -60, 60), _rand(SHAPE, dt, -60, 60), lambda a, b: torch.gcd(a.cpu(), b.cpu())


def _logical_shift_reference(a, b, bits):
    mask = (1 << bits) - 1
    out = []
    for x, s in zip(a.flatten().tolist(), b.flatten().tolist()):
        v = (x & mask) >> s if 0 <= s < bits else 0
        out.append(v - (1 << bits) if v >= 1 << (bits - 1) else v)
    return torch.tensor(out, dtype=a.dtype).reshape(a.shape)


@pytest.mark.gpu
@pytest.mark.parametrize("op, dt", BINARY_CASES, ids=[_case_id(c) for c in BINARY_CASES])
def test_binary_values(op, dt):
    want = expected_binary(op, dt)
    a, b, ref = _binary_case(op, dt)
    (out,) = _binary_fusion(op, dt).execute([a, b])
    assert out.dtype == TORCH[want]
    r = ref(a, b)
    if op == "nextafter" or not out.is_floating_point():
        assert torch.equal(out.cpu(), r.to(out.dtype).cpu())
    else:
        assert_close(out, r)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "op, dt, scalar, ref",
    [
        ("pow", D.Float, 2.0, lambda a: a.double() ** 2),
        ("pow", D.Int32, 3, lambda a: a.long() ** 3),
        ("pow", D.Int32, 0.5, lambda a: a.double().abs() ** 0.5),
        ("fmod", D.Int64, -3, lambda a: torch.fmod(a.cpu(), -3)),
        ("remainder", D.Float, 0.75, lambda a: torch.remainder(a.double(), 0.75)),
        ("truediv", D.Int32, 4, lambda a: a.double() / 4),
        ("bitwise_xor", D.Int32, 0x5A5A, lambda a: a.cpu() ^ 0x5A5A),
        ("gcd", D.Int64, 12, lambda a: torch.gcd(a.cpu(), torch.tensor(12))),
    ],
)
def test_binary_with_a_scalar_values(op, dt, scalar, ref):
    a = _rand(SHAPE, dt, -40, 40)
    if op == "pow" and scalar == 0.5:
        a = a.abs()
    (out,) = _binary_fusion(op, dt, scalar=scalar).execute([a])
    assert_close(out, ref(a).to(out.device))


# nvFuser's test_right_shift_logical: expected values from jax.lax.shift_right_logical(x, 3)
SHIFT_INPUT = [-1, -2147483648, 1073741824, -64463884, -65968277, 4042311, -98914167, 5526216]
SHIFT_BY_3 = {
    D.Int32: [536870911, 268435456, 134217728, 528812926, 528624877, 505288, 524506641, 690777],
    D.Int64: [
        2305843009213693951,
        2305843008945258496,
        134217728,
        2305843009205635966,
        2305843009205447917,
        505288,
        2305843009201329681,
        690777,
    ],
}


@pytest.mark.gpu
@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_logical_right_shift_matches_nvfuser(dt):
    x = torch.tensor(SHIFT_INPUT, device=DEV, dtype=TORCH[dt])
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=dt)
        fd.add_output(fd.ops.logical_right_shift(t, fd.define_scalar(3)))
    (out,) = fd.execute([x])
    assert out.tolist() == SHIFT_BY_3[dt]
    with cb.FusionDefinition() as fd2:  # by the type's width: all zeros
        t = fd2.define_tensor([-1], dtype=dt)
        fd2.add_output(fd2.ops.logical_right_shift(t, fd2.define_scalar(dtype=D.Int64)))
    (out,) = fd2.execute([x, 8 * TORCH[dt].itemsize])
    assert out.tolist() == [0] * len(SHIFT_INPUT)


@pytest.mark.gpu
@pytest.mark.parametrize("dt", [D.Float, D.BFloat16, D.Int32], ids=lambda d: d.name)
def test_addcmul_values(dt):
    x, a, b = (_rand(SHAPE, dt, -9, 9) for _ in range(3))
    value = 0.5 if dt.is_float else 3
    with cb.FusionDefinition() as fd:
        tx, ta, tb = (fd.define_tensor([-1, -1], dtype=dt) for _ in range(3))
        fd.add_output(fd.ops.addcmul(tx, ta, tb, value))
    (out,) = fd.execute([x, a, b])
    if dt.is_int:
        assert torch.equal(out, torch.addcmul(x, a, b, value=value))
    else:
        assert_close(out, x.double() + value * a.double() * b.double())


@pytest.mark.gpu
def test_scalar_math_values():
    fd = _scalar_math_fusion()
    x = torch.randn(1000, device=DEV)
    for n, f in ((-7, 2.5), (12, -1.25), (0, 0.5)):
        (out,) = fd.execute([x, n, f])
        assert_close(out, _scalar_math_reference(x, n, f))


@pytest.mark.gpu
def test_scalar_only_fusion_runs_on_the_current_device():
    fd = _full_scalar_only()
    (out,) = fd.execute([1.0, 2.5])
    assert out.device == torch.device("cuda", torch.cuda.current_device())
    assert torch.equal(out.cpu(), torch.full((5,), 3.5))
    (out,) = fd.execute([-1.0, 0.25])  # the cached plan, new values
    assert torch.equal(out.cpu(), torch.full((5,), -0.75))
    with cb.FusionDefinition() as fd2:  # no inputs at all
        fd2.add_output(fd2.ops.full([3, 2], 1.5, D.Half))
    (out,) = fd2.execute([])
    assert out.dtype == torch.float16 and torch.equal(out.cpu(), torch.full((3, 2), 1.5, dtype=torch.float16))


@pytest.mark.gpu
def test_full_sized_by_a_scalar_values():
    fd = _full_sized_by_scalar()
    for n in (4, 0, 130, -1):  # -1: an empty [0, 3] tensor
        (out,) = fd.execute([n])
        assert out.shape == (n + 1, 3) and torch.equal(
            out.cpu(), torch.full((n + 1, 3), 7, dtype=torch.int32)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [D.Float, D.Half, D.BFloat16, D.Int64, D.Bool])
def test_full_next_to_a_tensor_values(dtype):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        s = fd.define_scalar(dtype=D.Double)
        t = fd.ops.full([x.size(0), x.size(1)], s, dtype)
        fd.add_output(fd.ops.add(x, t))
        fd.add_output(t)
    x = torch.randn(37, 129, device=DEV)
    y, t = fd.execute([x, 1.75])
    fill = torch.full(x.shape, 1.75, device=DEV).to(TORCH[dtype])
    assert t.dtype == TORCH[dtype] and torch.equal(t, fill)
    assert_close(y, x.double() + fill.double())


@pytest.mark.gpu
def test_broadcast_values():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        z = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        b = fd.ops.broadcast(x, [True, False, True])
        fd.add_output(b)
        fd.add_output(fd.ops.add(z, b))
    x, z = torch.randn(65, device=DEV), torch.randn(3, 65, 7, device=DEV)
    b, y = fd.execute([x, z])
    assert b.shape == (1, 65, 1)
    assert_close(b, x.double()[None, :, None])
    assert_close(y, z.double() + x.double()[None, :, None])


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [[0], [1], [2], [0, 2], [1, 2], [0, 1, 2]])
@pytest.mark.parametrize("dt", [D.Float, D.BFloat16, D.Int64], ids=lambda d: d.name)
def test_prod_values(dt, dims):
    if dt.is_int:
        x = torch.tensor([-1, 1, 1, 2, 1, 1], device=DEV)[torch.randint(0, 6, (6, 10, 3), device=DEV)]
    else:
        x = (1 + 0.05 * torch.randn(6, 10, 3, device=DEV)).to(TORCH[dt])
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1], dtype=dt)
        fd.add_output(fd.ops.prod(t, dims))
    (out,) = fd.execute([x])
    ref = x.cpu() if dt.is_int else x.double()
    for d in sorted(dims, reverse=True):
        ref = ref.prod(d)
    if dt.is_int:
        assert out.dtype == torch.int64 and torch.equal(out.cpu(), ref)
    else:
        assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dim, sched", PROD_SCHEDULERS)
def test_prod_through_each_scheduler_values(shape, dim, sched):
    x = 1 + 0.01 * torch.randn(shape, device=DEV)
    fd = _prod_fusion(len(shape), dim)
    (out,) = fd.execute([x])
    assert fd._executor.last.name == f"circbuf_{sched}"
    assert_close(out, x.double().prod(dim), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dims, keepdim", [([1], False), ([0], True), ([0, 1], False), ([1], True)])
def test_var_values(dims, keepdim, correction):
    x = torch.randn(48, 300, device=DEV) * 3 + 1
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.var(t, dims, correction=correction, keepdim=keepdim))
    (out,) = fd.execute([x])
    assert_close(out, torch.var(x.double(), dims, correction=correction, keepdim=keepdim), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(24, 257), (256, 4096)])
@pytest.mark.parametrize("dt", [D.Float, D.BFloat16], ids=lambda d: d.name)
def test_welford_values(dt, rows, cols):
    # nvFuser's test_welford: var_sum / n is the biased variance
    x = torch.randn(rows, cols, device=DEV).to(TORCH[dt])
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=dt)
        avg, m2, n = fd.ops.welford(t, [-1])
        fd.add_output(fd.ops.div(m2, n))
        fd.add_output(avg)
        fd.add_output(m2)
        fd.add_output(n)
    var, avg, m2, n = fd.execute([x])
    xd = x.double()
    assert_close(var, torch.var(xd, -1, correction=0), rtol=1e-4)
    assert_close(avg, xd.mean(-1), rtol=1e-4, atol=1e-5)
    assert_close(m2, torch.var(xd, -1, correction=0) * cols, rtol=1e-4)
    assert n.dtype == torch.int64 and torch.equal(n.cpu(), torch.full((rows,), cols))
