"""Issue 16 (frontend, codegen, compile driver): results that were silently
wrong and internal errors that reached the user.

CPU tests compile for sm_90a and run kernels in circbuf.interpret;
GPU tests compare with torch in float64 on fresh random inputs, outputs
poisoned with NaN.
"""

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from tests.util import TORCH, D, assert_close

DEV = "cuda"


@pytest.fixture
def poison(monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")


def _shapes(fd, inputs):
    """The shapes ``execute`` returns, worked out on the CPU."""
    ex = fd._get_executor()
    info, _ = ex._bind(inputs, need_cuda=False)
    outs = [torch.zeros(*s) for s in ex._out_shapes(info.extents)]
    finish = ex._finish(info.extents)
    return [tuple(o.shape) for o in (outs if finish is None else finish(inputs, outs))]


# ------------------------------------------------- 2: broadcast outputs keep their extent
def _expand_of_shape_fusion():
    """nvFuser's test_tensor_shape_expand_bcast: a [2, 1, 4] input placed at
    the shape of another broadcast ([2, 3, 4])."""
    with cb.FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        t1 = fd.define_tensor([-1, 1, -1], dtype=D.Float)
        t2 = fd.define_tensor([-1, 1, -1], dtype=D.Float)
        t1b = fd.ops.broadcast_in_dim(t1, fd.ops.shape(t0), [0, 1, 2])
        fd.add_output(fd.ops.broadcast_in_dim(t2, fd.ops.shape(t1b), [0, 1, 2]))
    return fd


def _expand_to_zero_fusion():
    """nvFuser's test_expand_to_zero: [1, 0] and [1, 1] placed at [0, 0]."""
    with cb.FusionDefinition() as fd:
        t0 = fd.define_tensor([1, -1], dtype=D.Float)
        t1 = fd.define_tensor([1, 1], dtype=D.Float)
        fd.add_output(fd.ops.broadcast_in_dim(t0, [0, 0], [0, 1]))
        fd.add_output(fd.ops.broadcast_in_dim(t1, [0, 0], [0, 1]))
    return fd


def test_size_one_axes_placed_at_a_wider_extent_are_expanded():
    x = [torch.randn(2, 3, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4)]
    assert _shapes(_expand_of_shape_fusion(), x) == [(2, 3, 4)]
    assert _shapes(_expand_to_zero_fusion(), [torch.randn(1, 0), torch.randn(1, 1)]) == [(0, 0), (0, 0)]


def test_expanded_size_one_axis_values_on_the_cpu():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.Float)
        y = fd.define_tensor([-1], dtype=D.Float)
        xb = fd.ops.broadcast_in_dim(x, [3, -1], [0, 1])
        fd.add_output(fd.ops.add(xb, fd.ops.broadcast_in_dim(y, [3, -1], [1])))
        fd.add_output(xb)
    X, Y = torch.randn(1, 5), torch.randn(5)
    s, b = interpret(fd, [X, Y])
    assert torch.equal(s, X.expand(3, 5) + Y) and torch.equal(b, X.expand(3, 5))


@pytest.mark.gpu
def test_expanded_broadcast_outputs_match_torch(poison):
    x = [torch.randn(2, 3, 4, device=DEV), torch.randn(2, 1, 4, device=DEV), torch.randn(2, 1, 4, device=DEV)]
    (out,) = _expand_of_shape_fusion().execute(x)
    assert_close(out, x[2].double().expand(2, 3, 4))
    outs = _expand_to_zero_fusion().execute([torch.randn(1, 0, device=DEV), torch.randn(1, 1, device=DEV)])
    assert [tuple(o.shape) for o in outs] == [(0, 0), (0, 0)]


# ------------------------------------------------------ 3: Double stays Double
def _double_composites():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Double)
        w = fd.define_tensor([-1], dtype=D.Double)
        b = fd.define_tensor([-1], dtype=D.Double)
        fd.add_output(fd.ops.layer_norm(x, w, b, 1e-5))
        fd.add_output(fd.ops.rms_norm(x, w, 1e-6))
        fd.add_output(fd.ops.softmax(x, 1))
        fd.add_output(fd.ops.var(x, [1]))
        v, m = fd.ops.var_mean(x, [0], correction=0)
        fd.add_output(v)
        fd.add_output(m)
        fd.add_output(fd.ops.mean(x, [1]))
        avg, m2, _ = fd.ops.welford(x, [1])
        fd.add_output(avg)
        fd.add_output(m2)
        fd.add_output(fd.ops.gelu(x))
        fd.add_output(fd.ops.silu(x))
    return fd


def _double_refs(x, w, b):
    f = torch.nn.functional
    v0, m0 = torch.var_mean(x, [0], correction=0)
    return [
        f.layer_norm(x, [x.shape[1]], w, b, 1e-5),
        x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
        torch.softmax(x, 1),
        torch.var(x, [1]),
        v0,
        m0,
        x.mean(1),
        x.mean(1),
        ((x - x.mean(1, keepdim=True)) ** 2).sum(1),
        f.gelu(x),
        f.silu(x),
    ]


def test_double_composites_never_round_through_float():
    fd = _double_composites()
    math = fd.fusion.print_math()
    assert "Float" not in math and "f32" not in math, math
    assert all(o.dtype == D.Double for o in fd.fusion.outputs)


@pytest.mark.gpu
def test_double_composites_match_torch_in_double(poison):
    fd = _double_composites()
    x = torch.randn(37, 300, dtype=torch.float64, device=DEV)
    w, b = (torch.randn(300, dtype=torch.float64, device=DEV) for _ in range(2))
    for out, ref in zip(fd.execute([x, w, b]), _double_refs(x, w, b)):
        assert out.dtype == torch.float64
        assert_close(out, ref)  # float64 tolerance: 1e-12


# ----------------------------------------------------- 4: where of two scalars
def test_where_of_two_scalars_takes_their_type():
    with cb.FusionDefinition() as fd:
        c = fd.define_tensor([-1], dtype=D.Bool)
        got = [
            fd.ops.where(c, 3.0, 5.0).dtype,
            fd.ops.where(c, 3, 5).dtype,
            fd.ops.where(c, True, False).dtype,
            fd.ops.where(c, 3, 5.0).dtype,
            fd.ops.where(c, fd.define_scalar(3.0, D.Float), fd.define_scalar(5.0, D.Float)).dtype,
            fd.ops.where(c, fd.define_scalar(3, D.Int32), fd.define_scalar(5, D.Int32)).dtype,
            fd.ops.where(c, fd.define_scalar(3.0), fd.define_scalar(5.0)).dtype,
        ]
    assert got == [D.Double, D.Int64, D.Bool, D.Double, D.Float, D.Int32, D.Double]


@pytest.mark.gpu
def test_where_of_two_scalars_on_the_gpu(poison):
    with cb.FusionDefinition() as fd:
        c = fd.define_tensor([-1], dtype=D.Bool)
        fd.add_output(fd.ops.where(c, 0.1, 0.2))
        fd.add_output(fd.ops.where(c, 2**40, -3))
        fd.add_output(fd.ops.where(c, True, False))
    cond = torch.rand(1000, device=DEV) > 0.5
    d, i, b = fd.execute([cond])
    f64 = {"dtype": torch.float64, "device": DEV}  # torch.where(cond, 0.1, 0.2) would be float32
    assert d.dtype == torch.float64
    assert torch.equal(d, torch.where(cond, torch.tensor(0.1, **f64), torch.tensor(0.2, **f64)))
    assert i.dtype == torch.int64 and torch.equal(i, torch.where(cond, 2**40, -3))
    assert b.dtype == torch.bool and torch.equal(b, cond)


# --------------------------------------------------- 5: reductions' signatures
def test_prod_and_sum_take_nvfusers_signatures():
    with cb.FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        t1 = fd.ops.prod(t0, D.Float)  # over every axis
        t2 = fd.ops.prod(t0, 1, False, D.Float)
        t3 = fd.ops.prod(t0, 1, True, D.Float)
        t4 = fd.ops.prod(t0, [-1], False, D.Double)
        t5 = fd.ops.sum(t0, D.Double)
    assert [t.ndim for t in (t1, t2, t3, t4, t5)] == [0, 2, 3, 2, 0]
    assert (t4.dtype, t5.dtype) == (D.Double, D.Double)
    with cb.FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], dtype=D.Float)
        for bad, msg in [
            (lambda: fd.ops.prod(t0, None), "prod: dims must be an int or a list of ints"),
            (lambda: fd.ops.sum(t0, [True]), r"sum: dim True out of range"),
            (lambda: fd.ops.max(t0, [0], keepdim="yes"), "max: keepdim must be a bool"),
            (lambda: fd.ops.sum(t0, [0], False, "float"), "sum: dtype must be a DataType"),
        ]:
            with pytest.raises(cb.CircbufError, match=msg):
                bad()


@pytest.mark.gpu
def test_prod_matches_torch(poison):
    with cb.FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        fd.add_output(fd.ops.prod(t0, D.Float))
        fd.add_output(fd.ops.prod(t0, 1, False, D.Float))
        fd.add_output(fd.ops.prod(t0, 1, True, D.Float))
        fd.add_output(fd.ops.prod(t0, [-1]))
    x = 1 + 0.01 * torch.randn(2, 4, 8, device=DEV)
    refs = [x.double().prod(), x.double().prod(1), x.double().prod(1, keepdim=True), x.double().prod(-1)]
    for out, ref in zip(fd.execute([x]), refs):
        assert_close(out, ref)


# ---------------------------------------------------- 8: integer min/max/sum/prod
INT_DTYPES = [D.Int32, D.Int64, D.Bool]


def _int_reduction(op, dtype, dim):
    with cb.FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1], dtype=dtype), [dim]))
    return fd


def _int_input(dtype, shape, device="cpu"):
    if dtype == D.Bool:
        return torch.rand(shape, device=device) > 0.5
    info = torch.iinfo(TORCH[dtype])
    x = torch.randint(-1000, 1000, shape, device=device).to(TORCH[dtype])
    x.view(-1)[0], x.view(-1)[-1] = info.min, info.max  # the extremes survive a min/max
    return x


def _torch_reduce(op, x, dim):
    r = getattr(torch, op)(x, dim)
    return r.values if op in ("max", "min") else r


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("op", ["max", "min", "sum", "prod"])
def test_integer_reductions_compile(op, dtype):
    """max/min of Int32 once failed NVRTC on the init -2147483648 (a long long), Bool on the warp shuffle."""
    for shape, dim in [((3, 40), 1), ((40, 3), 0), ((3, 1000), 1)]:
        fd = _int_reduction(op, dtype, dim)
        x = _int_input(dtype, shape)
        if op in ("sum", "prod") and dtype != D.Bool:
            x = torch.randint(-1, 2, shape).to(TORCH[dtype])  # no overflow in the reference
        ck = fd.compile([x], arch="sm_90a")
        assert ck.cubin
        if op in ("max", "min", "sum"):  # the interpreter has no prod
            (out,) = interpret(fd, [x])
            ref = _torch_reduce(op, x, dim)
            assert out.dtype == ref.dtype and torch.equal(out, ref), (op, dtype, shape)


def test_extreme_integer_literals_are_typed_right():
    from circbuf.ir.scalar import Const
    from circbuf.lowering.codegen import literal

    assert literal(Const(-(2**31), D.Int32), D.Int32) == "(-2147483647 - 1)"
    assert literal(Const(-(2**63), D.Int64), D.Int64) == "(-9223372036854775807LL - 1)"
    assert literal(Const(-(2**63), D.Int64), D.Int32) == "(-9223372036854775807LL - 1)"  # index math
    assert literal(Const(2**31 - 1, D.Int32), D.Int32) == "2147483647"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("op", ["max", "min", "sum", "prod"])
def test_integer_reductions_match_torch(op, dtype, poison):
    for shape, dim in [((3, 40), 1), ((40, 3), 0), ((7, 5000), 1), ((5000, 7), 0)]:
        x = _int_input(dtype, shape, DEV)
        if op in ("sum", "prod") and dtype != D.Bool:
            x = torch.randint(-1, 2, shape, device=DEV).to(TORCH[dtype])
        (out,) = _int_reduction(op, dtype, dim).execute([x])
        ref = _torch_reduce(op, x, dim)
        assert out.dtype == ref.dtype and torch.equal(out, ref), (op, dtype, shape)


# ---------------------------------------------------- 9: composite arguments
def test_composite_arguments_are_checked_by_name():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        w = fd.define_tensor([-1], dtype=D.Float)
        w2 = fd.define_tensor([-1, -1], dtype=D.Float)
        i = fd.define_tensor([-1, -1], dtype=D.Int32)
        bad = [
            (
                lambda: fd.ops.rms_norm(x, w, eps=None),
                "rms_norm: eps must be a number or a fusion scalar, got None",
            ),
            (lambda: fd.ops.rms_norm(x, w, eps="1e-6"), "rms_norm: eps must be a number"),
            (lambda: fd.ops.rms_norm(x, w, eps=True), "rms_norm: eps must be a number"),
            (lambda: fd.ops.layer_norm(x, w, w, eps=-1.0), "layer_norm: eps must be >= 0"),
            (lambda: fd.ops.layer_norm(x, w, w, eps=float("nan")), "layer_norm: eps must be >= 0"),
            (lambda: fd.ops.layer_norm(x, 1.0, None), "layer_norm: weight must be a tensor or None"),
            (lambda: fd.ops.layer_norm(x, w, w2), r"layer_norm: bias T\d+ has 2 axes; it must have the 1"),
            (lambda: fd.ops.layer_norm(x, w, None, 1e-5, 0), "layer_norm: cannot normalize 0 axes"),
            (lambda: fd.ops.layer_norm(x, w, None, 1e-5, 1.5), "layer_norm: normalized_ndim must be an int"),
            (lambda: fd.ops.layer_norm(1.0), "layer_norm: x must be a tensor"),
            (lambda: fd.ops.layer_norm(i), r"layer_norm: x T\d+ must be floating point"),
            (lambda: fd.ops.rms_norm(x, w2, 1e-6), None),  # fine: normalizes both axes
            (lambda: fd.ops.softmax(x, 2), "softmax: dim 2 out of range"),
            (lambda: fd.ops.softmax(x, [1]), "softmax: dim must be an int"),
            (lambda: fd.ops.softmax(x, True), "softmax: dim must be an int"),
            (lambda: fd.ops.var(x, [1], correction=-1), "var: correction must be"),
            (lambda: fd.ops.var(x, [1], correction=None), "var: correction must be"),
            (lambda: fd.ops.var_mean(x, [1], correction="1"), "var_mean: correction must be"),
            (lambda: fd.ops.var(x, [1], keepdim=1), "var: keepdim must be a bool"),
            (lambda: fd.ops.mean(x, [1], dtype="f"), "mean: dtype must be a DataType"),
        ]
        for f, msg in bad:
            if msg is None:
                f()
                continue
            with pytest.raises(cb.CircbufError, match=msg):
                f()
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, 8], dtype=D.Float)
        w = fd.define_tensor([4], dtype=D.Float)
        with pytest.raises(cb.CircbufError, match=r"rms_norm: axis 0 of weight T\d+ \(4\) differs"):
            fd.ops.rms_norm(x, w, 1e-6)


def test_eps_may_be_a_fusion_scalar():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        eps = fd.define_scalar(dtype=D.Double)
        fd.add_output(fd.ops.rms_norm(x, None, eps))
    X = torch.randn(3, 32)
    (out,) = interpret(fd, [X, 1e-6])
    ref = X.double() * torch.rsqrt(X.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert_close(out, ref)


# --------------------------------------------- 1: reductions over an axis of extent 0
# (sum 0, prod 1, mean NaN as torch; max/min the init -inf/+inf, as nvFuser's
# empty-reduction pass gives: torch raises there)
ZERO_CASES = [
    ((5, 0), [1]),
    ((0, 96), [0]),
    ((3, 0), [0, 1]),
    ((8, 0, 64), [1]),
    ((0,), [0]),
    ((4096, 0), [1]),
]
ZERO_REFS = {
    "sum": lambda x, d: x.sum(d),
    "prod": lambda x, d: torch.ones_like(x.sum(d)),
    "mean": lambda x, d: x.mean(d),
    "max": lambda x, d: torch.full_like(x.sum(d), -float("inf")),
    "min": lambda x, d: torch.full_like(x.sum(d), float("inf")),
}


def _zero_reduction(op, rank, dims, dtype=D.Float, keepdim=False):
    with cb.FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1] * rank, dtype=dtype), dims, keepdim))
    return fd


def _mean_sub_sum():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        t1 = fd.ops.mean(x, [1], keepdim=True)
        fd.add_output(fd.ops.sum(fd.ops.sub(x, t1), [0]))
    return fd


@pytest.mark.parametrize("shape, dims", ZERO_CASES)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])  # the interpreter has no prod
def test_reduction_over_an_empty_axis_gives_the_identity(op, shape, dims):
    x = torch.randn(*shape)
    (out,) = interpret(_zero_reduction(op, len(shape), dims), [x])
    assert_close(out, ZERO_REFS[op](x.double(), dims))


def _interpret_segments(fd, inputs):
    """``interpret`` for a fusion that runs as several kernels: each segment in turn."""
    from circbuf.interpret import interpret_executor

    ex = fd._get_executor()
    fd.compile(inputs, arch="sm_90a")
    seg, subs = ex._segments
    vals = {}
    info, _ = ex._bind(inputs, need_cuda=False)
    for s, sub in zip(seg.segments, subs):
        args = [
            inputs[k] if kind == "input" else vals[k] if kind == "tensor" else info.extents[k]
            for kind, k in s.inputs
        ]
        for name, o in zip(s.outputs, interpret_executor(sub, args, finish=False)):
            vals[name] = o
    return [vals[o.name] for o in ex.fusion.outputs]


def test_reductions_over_empty_axes_from_the_issue():
    (out,) = _interpret_segments(_mean_sub_sum(), [torch.randn(0, 96)])
    assert torch.equal(out, torch.zeros(96))
    x = torch.randn(3, 0, dtype=torch.bfloat16)
    (out,) = interpret(_zero_reduction("sum", 2, [0, 1], D.BFloat16, keepdim=True), [x])
    assert out.shape == (1, 1) and torch.equal(out.float(), torch.zeros(1, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dims", ZERO_CASES)
@pytest.mark.parametrize("op", ["sum", "prod", "mean", "max", "min"])
def test_reduction_over_an_empty_axis_on_the_gpu(op, shape, dims, poison):
    x = torch.randn(*shape, device=DEV)
    (out,) = _zero_reduction(op, len(shape), dims).execute([x])
    assert_close(out, ZERO_REFS[op](x.double(), dims))


@pytest.mark.gpu
def test_reductions_over_empty_axes_from_the_issue_on_the_gpu(poison):
    (out,) = _mean_sub_sum().execute([torch.randn(0, 96, device=DEV)])
    assert_close(out, torch.zeros(96, dtype=torch.float64))
    x = torch.randn(3, 0, dtype=torch.bfloat16, device=DEV)
    (out,) = _zero_reduction("sum", 2, [0, 1], D.BFloat16, keepdim=True).execute([x])
    assert_close(out, torch.zeros(1, 1, dtype=torch.float64))


# ------------------------------------------------- 7: views over extents of 0
def _empty_view_fusion():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1, -1, -1], dtype=D.Float)
        r = fd.ops.reshape(x, [-1, 64, 31])
        b = fd.ops.broadcast(r, [True, False, False, False])
        fd.add_output(fd.ops.expand(b, [4, 0, 64, 31]))
        fd.add_output(fd.ops.mul(b, 2.0))
    fd.fusion.schedule(vectorize=4)
    return fd


def test_views_over_extents_of_0_compile():
    """An index of the empty view divides by a constant 0: left to run time
    (no thread reaches it), once a ZeroDivisionError when folding it."""
    from circbuf.ir.scalar import Bin, Const

    assert isinstance(Const(5) // Const(0), Bin) and isinstance(Const(5) % Const(0), Bin)
    fd = _empty_view_fusion()
    x = torch.randn(1, 0, 64, 31)
    assert fd.compile([x], arch="sm_90a").cubin
    outs = interpret(fd, [x])
    assert [tuple(o.shape) for o in outs] == [(4, 0, 64, 31), (1, 0, 64, 31)]


@pytest.mark.gpu
def test_views_over_extents_of_0_on_the_gpu(poison):
    outs = _empty_view_fusion().execute([torch.randn(1, 0, 64, 31, device=DEV)])
    assert [tuple(o.shape) for o in outs] == [(4, 0, 64, 31), (1, 0, 64, 31)]


# ----------------------------------------------- 10: manual schedules of a matmul
@pytest.mark.parametrize("op", ["matmul", "linear"])
def test_manual_schedule_of_a_matmul_is_refused_by_name(op):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        c = getattr(fd.ops, op)(a, b)
        fd.add_output(c)
    c.split(0, 64)
    w = torch.randn(128, 64) if op == "linear" else torch.randn(64, 128)
    x = [torch.randn(128, 64, dtype=torch.bfloat16), w.to(torch.bfloat16)]
    with pytest.raises(cb.CircbufError, match=f"{op} T2: manual scheduling of a fusion with a matmul"):
        fd.compile(x, arch="sm_90a")


# ------------------------------------------ 6: matmul of 1-D and small operands
MM_SHAPES = [
    ((64,), (64, 32)),  # [K] @ [K, N]
    ((32, 64), (64,)),  # [M, K] @ [K]
    ((64,), (64,)),  # [K] @ [K]
    ((1, 64), (64, 1)),
    ((2, 3), (3, 5)),
    ((3,), (2, 3, 5)),
    ((2, 3, 64), (64,)),
    ((8, 8), (8, 8)),
    ((1, 256), (256, 512)),
]
LINEAR_SHAPES = [
    ((64,), (32, 64), (32,)),
    ((64,), (32, 64), None),
    ((64,), (64,), None),
    ((3, 64), (32, 64), (32,)),
]
MM_DTYPES = [D.BFloat16, D.Half, D.Float]


def _mm_fusion(op, shapes, dtype, fixed):
    with cb.FusionDefinition() as fd:
        xs = [
            None if s is None else fd.define_tensor(list(s) if fixed else [-1] * len(s), dtype=dtype)
            for s in shapes
        ]
        fd.add_output(fd.ops.matmul(*xs) if op == "matmul" else fd.ops.linear(*xs))
    return fd


def _mm_inputs(shapes, dtype, device="cpu"):
    return [torch.randn(*s, dtype=TORCH[dtype], device=device) for s in shapes if s is not None]


def _mm_ref(op, xs):
    xs = [x.double() for x in xs]
    return xs[0] @ xs[1] if op == "matmul" else torch.nn.functional.linear(*xs)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_small_and_vector_matmuls_compile(dtype, fixed):
    for op, cases in [("matmul", MM_SHAPES), ("linear", LINEAR_SHAPES)]:
        for shapes in cases:
            fd = _mm_fusion(op, shapes, dtype, fixed)
            ck = fd.compile(_mm_inputs(shapes, dtype), arch="sm_90a")
            # (a 16-bit vector operand is a one-row view: the view, the matmul, the squeeze)
            assert all(k.cubin for k in ck.kernels), (op, shapes)


def test_fixed_single_k_step_matmul():
    shapes = ((3, 64), (64, 32))
    _mm_fusion("matmul", shapes, D.BFloat16, True).compile(_mm_inputs(shapes, D.BFloat16), arch="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_small_and_vector_matmuls_match_torch(dtype, poison):
    for op, cases in [("matmul", MM_SHAPES), ("linear", LINEAR_SHAPES)]:
        for shapes in cases:
            xs = _mm_inputs(shapes, dtype, DEV)
            for fixed in (False, True):  # fixed: K known when compiling (one k tile or less too)
                (out,) = _mm_fusion(op, shapes, dtype, fixed).execute(xs)
                tol = 1e-4 if dtype == D.Float else None  # fp32 accumulation over K = 256
                assert out.dtype == TORCH[dtype]
                assert_close(out, _mm_ref(op, xs).to(out.dtype), rtol=tol, atol=tol)
