"""Frontend: dtype rules, broadcasting, composites and definition-time errors."""

import pytest

import circbuf as cb
from circbuf.ir import IterType

D = cb.DataType


def test_arithmetic_on_bf16_computes_in_fp32():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        y = fd.ops.mul(x, 2.0)
        c = fd.ops.lt(x, 0.0)
        i = fd.define_tensor([-1], dtype=D.Int32)
        assert y.dtype == D.Float and c.dtype == D.Bool
        assert fd.ops.add(i, 1).dtype == D.Int32
        assert fd.ops.div(i, 2).dtype == D.Int32  # truncates, as nvFuser and C
        assert fd.ops.sum(i, [0]).dtype == D.Int64
        assert fd.ops.max(x, [0]).dtype == D.Float


def test_implicit_broadcast_and_extent_equalities():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        b = fd.define_tensor([-1], dtype=D.Float)
        col = fd.define_tensor([-1, 1], dtype=D.Float)
        y = fd.ops.add(fd.ops.add(x, b), col)
        fd.add_output(y)
    assert y.ndim == 2 and all(a.iter_type == IterType.Iteration for a in y.logical)
    eq = {(str(a), str(c)) for a, c in fd.fusion.extent_equalities}
    assert ("i1", "i2") in eq and ("i0", "i3") in eq


def test_fixed_extent_mismatch_is_a_definition_error():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([4, 8], dtype=D.Float)
        y = fd.define_tensor([4, 9], dtype=D.Float)
        with pytest.raises(cb.CircbufError, match="extents 8 and 9 of axis 1 do not match"):
            fd.ops.add(x, y)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda fd, x: fd.ops.sum(x, [2]), "dim 2 out of range for T0"),
        (lambda fd, x: fd.ops.sum(x, [0, -2]), "repeated dims"),
        (lambda fd, x: fd.ops.cast(x, "float"), "must be a circbuf DataType"),
        (lambda fd, x: fd.ops.softmax(x, 5), "dim 5 out of range"),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, [2, 3], [0]), "has 2 axes but broadcast_dims has 1"),
        (
            lambda fd, x: fd.ops.matmul(fd.define_tensor([2, 3]), fd.define_tensor([4, 5])),
            r"K of T1 \(3\) and T2 \(4\) differ",
        ),
        (
            lambda fd, x: fd.ops.matmul(x, fd.define_tensor([-1, -1], dtype=D.Half)),
            "operands must have one dtype",
        ),
        (lambda fd, x: fd.ops.linear(x, fd.define_tensor([-1, -1, -1])), "must be .N, K. or .K."),
        (lambda fd, x: fd.ops.exp("3"), "neither a tensor nor a scalar"),
        (lambda fd, x: fd.add_output(fd.ops.add(fd.define_scalar(), 1.0)), "fusion outputs are tensors"),
        (lambda fd, x: fd.define_tensor([-1], dtype="bf16"), "dtype must be a circbuf DataType"),
        (lambda fd, x: fd.define_tensor([-1], contiguity=[True, True]), "contiguity has 2 entries"),
    ],
)
def test_definition_errors(build, match):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        with pytest.raises(cb.CircbufError, match=match):
            build(fd, x)


def test_outputs_belong_to_the_fusion():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
    with cb.FusionDefinition() as other:
        y = other.define_tensor([-1], dtype=D.Float)
    with pytest.raises(cb.CircbufError, match="not a tensor of this fusion"):
        fd.add_output(y)
    with pytest.raises(cb.CircbufError, match="belongs to another FusionDefinition"):
        fd.ops.add(x, y)


def test_an_input_returned_as_an_output_is_not_computed():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.exp(x))
        fd.add_output(x)
    assert fd.fusion.returns == [("output", 0), ("input", 0)]
    assert len(fd.fusion.outputs) == 1
    assert "T0 (input, returned as is)" in fd.fusion.print_math()


def test_where_keeps_16_bit_floats_and_comparisons_give_bool():
    with cb.FusionDefinition() as fd:
        c = fd.define_tensor([-1], dtype=D.Bool)
        h = fd.define_tensor([-1], dtype=D.Half)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        assert fd.ops.where(c, h, h).dtype == D.Half
        assert fd.ops.where(c, h, 2.0).dtype == D.Half
        assert fd.ops.where(c, b, h).dtype == D.Float  # mixed 16-bit types promote, as torch
        assert fd.ops.where(c, 1.0, 2.0).dtype == D.Double  # two scalars: their type (nvFuser)


def test_scalar_math_builds_scalar_expressions():
    with cb.FusionDefinition() as fd:
        s = fd.define_scalar(dtype=D.Double)
        i = fd.define_scalar(dtype=D.Int64)
        e = fd.ops.mul(fd.ops.add(s, 2.0), fd.ops.neg(s))
        assert isinstance(e, cb.ir.Scalar) and e.dtype == D.Double
        assert str(fd.ops.reciprocal(s)) == "reciprocal(s0)"
        assert fd.ops.cast(s, D.Int32).dtype == D.Int32
        assert fd.ops.div(i, 2).dtype == D.Int64 and fd.ops.exp(i).dtype == D.Double
        assert fd.ops.div(7, -2) == cb.ir.Const(-3)  # C truncation
        assert fd.ops.lt(s, 1.0).dtype == D.Bool


def test_scalar_constants_fold_where_host_and_device_agree():
    with cb.FusionDefinition() as fd:
        assert fd.ops.cast(7, D.Double) == cb.ir.Const(7.0, D.Double)
        assert fd.ops.cast(-2.5, D.Int32) == cb.ir.Const(-2, D.Int32)  # C truncation
        assert fd.ops.cast(0, D.Bool) == cb.ir.Const(False, D.Bool)
        assert fd.ops.truediv(7, 2) == cb.ir.Const(3.5, D.Double)
        assert fd.ops.exp(0.0) == cb.ir.Const(1.0, D.Double)
        # the device rounds these: the kernel computes them
        assert str(fd.ops.cast(0.1, D.BFloat16)) == "cast(0.1, BFloat16)"
        assert str(fd.ops.cast(0.1, D.Float)) == "cast(0.1, Float)"
        assert str(fd.ops.cast(1e20, D.Int64)) == "cast(1e+20, Int64)"
        assert str(fd.ops.log(0.0)) == "log(0.0)"


def test_expanded_broadcast_equates_its_extent():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        w = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.mul(x, fd.ops.broadcast_in_dim(w, [3, 4], [1])))
    eq = {(str(a), str(c)) for a, c in fd.fusion.extent_equalities}
    assert ("i0", "3") in eq


def test_composites_are_built_from_primitives():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Half)
        w = fd.define_tensor([-1], dtype=D.Half)
        b = fd.define_tensor([-1], dtype=D.Half)
        ln = fd.ops.layer_norm(x, w, b, 1e-5)
        rn = fd.ops.rms_norm(x, w, 1e-6)
        fd.add_output(ln)
        fd.add_output(rn)
    names = {type(e).__name__ for e in fd.fusion.exprs()}
    assert names <= {"CastOp", "ReductionOp", "BroadcastOp", "BinaryOp", "UnaryOp"}
    assert ln.dtype == D.Half and rn.dtype == D.Half
