"""IR unit tests: dtypes, scalar simplification, transforms, printing."""

import re

import pytest

import circbuf as cb
from circbuf.ir import (
    Const,
    DataType,
    IterDomain,
    IterType,
    ParallelType,
    TensorView,
    Var,
    evaluate,
    simplify,
    transform_history,
)
from circbuf.ir.dtype import promote, promote_with_scalar
from circbuf.ir.scalar import ceil_div, value_range

D = DataType


def norm_ids(text: str) -> str:
    """IterDomain numbers depend on creation order; golden tests compare shapes."""
    return re.sub(r"(?<=[a-zS}x.yzVR])\d+\{", "#{", text)


def test_dtype_sizes_and_promotion():
    assert [d.size for d in (D.Float, D.Double, D.Half, D.BFloat16, D.Int32, D.Int64, D.Bool)] == [
        4,
        8,
        2,
        2,
        4,
        8,
        1,
    ]
    assert promote(D.Half, D.BFloat16) == D.Float
    assert promote(D.Int32, D.Half) == D.Half
    assert promote(D.Int32, D.Int64) == D.Int64
    assert promote(D.Bool, D.Int32) == D.Int32
    assert promote(D.Float, D.Double) == D.Double
    assert promote_with_scalar(D.BFloat16, D.Double) == D.BFloat16
    assert promote_with_scalar(D.Int32, D.Double) == D.Float


def test_simplify_split_roundtrip():
    i = Var("i", hi=Const(4))
    n = Var("n")
    assert simplify((n * 4 + i) // 4) == n
    assert simplify((n * 4 + i) % 4) == i
    x = Var("x")
    assert simplify((x // 8) * 8 + x % 8) == x
    m = Var("m")
    assert simplify((x // m) * m + x % m) == x


def test_simplify_constants_and_ranges():
    assert simplify(ceil_div(Const(10), 4)) == Const(3)
    j = Var("j", hi=Const(128))
    assert value_range(j * 8 + 7) == (7, 1023)
    assert simplify((j * 8 + 3) // 1024) == Const(0)
    assert evaluate(ceil_div(Var("a"), Const(3)) * 2, {"a": 7}) == 6


def test_xor_folds_to_the_type_bin_gives_it():
    t, f = Const(True, D.Bool), Const(False, D.Bool)
    x = t._bin_op("^", f)
    assert x.dtype == D.Bool and x.value is True  # a Bool, not the int 1
    assert evaluate(Var("p", D.Bool)._bin_op("^", t), {"p": True}) is False
    y = Const(6)._bin_op("^", Const(3))
    assert y.dtype == D.Int64 and y.value == 5
    assert Var("s")._bin_op("^", t).dtype == D.Int64  # an integer with a Bool: Int64


def test_split_merge_extents_and_history():
    tv = TensorView([IterDomain(Var("i0")), IterDomain(Var("i1"))], D.Float)
    tv.merge(0).split(0, 128).split(0, 4)
    assert [str(a.loop_extent) for a in tv.loop] == [
        "ceilDiv(ceilDiv((i0 * i1), 128), 4)",
        "4",
        "128",
    ]
    kinds = [type(t).__name__ for t in transform_history(tv)]
    assert kinds == ["Merge", "Split", "Split"]


def test_outer_split_and_reorder():
    tv = TensorView([IterDomain(Const(100)), IterDomain(Const(6))], D.Float)
    tv.split(0, 4, inner_split=False)
    assert [str(a.loop_extent) for a in tv.loop] == ["4", "25", "6"]
    tv.reorder({0: 2})
    assert [str(a.loop_extent) for a in tv.loop] == ["25", "6", "4"]
    tv.reorder([2, 0, 1])
    assert [str(a.loop_extent) for a in tv.loop] == ["4", "25", "6"]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda tv: tv.split(0, 0), "factor must be a positive int"),
        (lambda tv: tv.split(0, -3), "factor must be a positive int"),
        (lambda tv: tv.split(5, 2), "axis 5 out of range"),
        (lambda tv: tv.merge(0, 7), "axis 7 out of range"),
        (lambda tv: tv.merge(0), "merge: cannot merge reduction axis with iteration axis"),
        (lambda tv: tv.reorder([0, 0]), "not a permutation"),
        (lambda tv: tv.axis(3), "axis 3 out of range"),
        (lambda tv: tv.axis(0).parallelize("x"), "not a ParallelType"),
    ],
)
def test_invalid_transforms(call, match):
    tv = TensorView([IterDomain(Var("i0")), IterDomain(Var("i1"), IterType.Reduction)], D.Float)
    with pytest.raises(cb.CircbufError, match=match):
        call(tv)


def test_print_tv_nvfuser_style():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.cast(fd.ops.relu(x), D.BFloat16)
        fd.add_output(y)
    y.merge(0).split(0, 128)
    y.axis(0).parallelize(ParallelType.BIDx)
    y.axis(1).parallelize(ParallelType.TIDx)
    assert norm_ids(str(y)) == "T3_g_bf16[iblockIdx.x#{ceilDiv((i0 * i1), 128)}, ithreadIdx.x#{128}]"
    t1 = y.definition.inputs[0]
    t1.inline_at(0)
    assert str(t1).startswith("T2_l_f32[")


def test_print_math_golden():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.softmax(x, -1))
    text = norm_ids(fd.fusion.print_math())
    assert text == (
        "Inputs:\n"
        "  T0_g_bf16[iS#{i0}, iS#{i1}]\n"
        "Outputs:\n"
        "  T11_g_bf16[iS#{i0}, iS#{i1}]\n"
        "\n"
        "%kernel_math {\n"
        "  T1 = cast(T0, Float)\n"
        "  T2 = max(T1, dims=[1], init=-inf)\n"
        "  T3 = broadcast(T2, ib)\n"
        "  T4 = sub(T1, T3)\n"
        "  T5 = mul(T4, 1.4426950408889634)\n"
        "  T6 = exp2(T5)\n"
        "  T7 = sum(T6, dims=[1], init=0.0)\n"
        "  T8 = broadcast(T7, ib)\n"
        "  T9 = reciprocal(T8)\n"
        "  T10 = mul(T6, T9)\n"
        "  T11 = cast(T10, BFloat16)\n"
        "}"
    )


def test_cache_after_and_before_rewire_uses():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        y = fd.ops.exp(x)
        z = fd.ops.add(y, x)
        fd.add_output(z)
    c = x.cache_after()
    assert all(e.inputs[0] is c or c in e.inputs for e in x.uses if e.out is not c)
    assert c.definition.inputs[0] is x
    cz = z.cache_before()
    assert z.definition.inputs[0] is cz
    assert cz.definition.op_name == "add"
    assert fd.fusion.manual_schedule
    with pytest.raises(cb.CircbufError, match="op='bulk' is not supported"):
        x.cache_after(op="bulk")
    with pytest.raises(cb.CircbufError, match="must be a global fusion input"):
        c.cache_after(op="tma")


def test_reduction_output_keeps_reduction_axis():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, 8, -1], dtype=D.Float)
        s = fd.ops.sum(x, [0, 2])
        fd.add_output(s)
    assert [a.iter_type for a in s.logical] == [IterType.Reduction, IterType.Iteration, IterType.Reduction]
    assert s.ndim == 1 and str(s.shape()[0]) == "8"
