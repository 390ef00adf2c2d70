"""nvFuser frontend parity (issue 8, parts 1 and 2): results nvFuser gives
that circbuf once got silently wrong, and fusions it once refused.

CPU tests compile for sm_90a and check messages; GPU tests compare with
torch in float64 on fresh random inputs (outputs poisoned with NaN).
"""

import itertools

import pytest
import torch

import circbuf as cb
from tests.util import TORCH, D, assert_close

DEV = "cuda"


def _bcast_output(in_shape, shape, dims):
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(in_shape), dtype=D.Float)
        fd.add_output(fd.ops.broadcast_in_dim(t, shape, dims))
    return fd


BCAST_CASES = [((3,), [3, 3], [0]), ((0,), [0, 0], [1]), ((2, 4), [2, 3, 4], [0, 2]), ((5,), [4, 5], [1])]


@pytest.mark.parametrize("in_shape, shape, dims", BCAST_CASES)
def test_broadcast_output_shape_is_the_expanded_shape(in_shape, shape, dims):
    fd = _bcast_output(in_shape, shape, dims)
    ex = fd._get_executor()
    env = {f"i{k}": s for k, s in enumerate(in_shape)}
    x = torch.randn(*in_shape)
    kernel_outs = [torch.zeros(*s) for s in ex._out_shapes(env)]
    (out,) = ex._finish(env)([x], kernel_outs)
    assert list(out.shape) == shape


@pytest.mark.gpu
@pytest.mark.parametrize("in_shape, shape, dims", BCAST_CASES)
def test_broadcast_output_matches_torch(in_shape, shape, dims):
    fd = _bcast_output(in_shape, shape, dims)
    x = torch.randn(*in_shape, device=DEV)
    (out,) = fd.execute([x])
    ref = x.double().reshape([s if d in dims else 1 for d, s in enumerate(shape)]).expand(shape)
    assert_close(out, ref)


def _two_outputs(fixed):
    with cb.FusionDefinition() as fd:
        t0 = fd.define_tensor([1, 4, 2, 3] if fixed else [1, -1, -1, -1], dtype=D.Float)
        t1 = fd.define_tensor([1, 5, 2, 3] if fixed else [1, -1, -1, -1], dtype=D.Float)
        t2 = fd.define_tensor([1, 2, 3] if fixed else [1, -1, -1], dtype=D.Float)
        b = fd.ops.broadcast_in_dim(t2, [1, 1, 2, 3], [0, 2, 3])
        fd.add_output(fd.ops.add(b, t0))
        fd.add_output(fd.ops.add(b, t1))
    return fd


@pytest.mark.parametrize("fixed", [True, False])
def test_outputs_of_different_extents_through_one_broadcast_are_segmented(fixed):
    # nvFuser's test_bcast_different_extent: one kernel cannot loop over both
    # extents, so the fusion runs as one kernel per output (issue 16)
    from tests.test_segmentation import run_here

    fd = _two_outputs(fixed)
    a, b, c = torch.randn(1, 4, 2, 3), torch.randn(1, 5, 2, 3), torch.randn(1, 2, 3)
    o1, o2 = run_here(fd, [a, b, c])
    assert len(fd._get_executor()._segments[0]) == 2
    torch.testing.assert_close(o1, a + c)
    torch.testing.assert_close(o2, b + c)


def test_outputs_of_equal_extents_through_one_broadcast_compile():
    fd = _two_outputs(False)
    fd.compile([torch.randn(1, 4, 2, 3), torch.randn(1, 4, 2, 3), torch.randn(1, 2, 3)], arch="sm_90a")


@pytest.mark.gpu
def test_two_outputs_sharing_a_broadcast():
    fd = _two_outputs(False)
    a, b, c = (
        torch.randn(1, 4, 2, 3, device=DEV),
        torch.randn(1, 4, 2, 3, device=DEV),
        torch.randn(1, 2, 3, device=DEV),
    )
    o1, o2 = fd.execute([a, b, c])
    assert_close(o1, a.double() + c.double())
    assert_close(o2, b.double() + c.double())
    b5 = torch.randn(1, 5, 2, 3, device=DEV)
    o1, o2 = fd.execute([a, b5, c])  # extents 4 and 5: one kernel per output
    assert_close(o1, a.double() + c.double())
    assert_close(o2, b5.double() + c.double())


def _where_fusion(dtype):
    with cb.FusionDefinition() as fd:
        c = fd.define_tensor([-1, -1], dtype=D.Bool)
        a = fd.define_tensor([-1, -1], dtype=dtype)
        b = fd.define_tensor([-1, -1], dtype=dtype)
        fd.add_output(fd.ops.where(c, a, b))
    return fd


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [D.Half, D.BFloat16, D.Float])
def test_where_keeps_the_operand_dtype(dtype):
    fd = _where_fusion(dtype)
    c = torch.rand(33, 65, device=DEV) > 0.5
    a, b = (torch.randn(33, 65, device=DEV, dtype=TORCH[dtype]) for _ in range(2))
    (out,) = fd.execute([c, a, b])
    assert out.dtype == TORCH[dtype]
    assert torch.equal(out, torch.where(c, a, b))


def _int_div_fusion(dtype):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=dtype)
        b = fd.define_tensor([-1], dtype=dtype)
        fd.add_output(fd.ops.div(a, b))
        fd.add_output(fd.ops.div(a, 3))
    return fd


def test_integer_div_keeps_the_integer_type():
    fd = _int_div_fusion(D.Int32)
    assert [o.dtype for o in fd.fusion.outputs] == [D.Int32, D.Int32]
    fd.compile([torch.ones(8, dtype=torch.int32), torch.ones(8, dtype=torch.int32)], arch="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [D.Int32, D.Int64])
def test_integer_div_truncates_toward_zero(dtype):
    fd = _int_div_fusion(dtype)
    a = torch.randint(-1000, 1000, (1001,), device=DEV, dtype=TORCH[dtype])
    sign = torch.randint(0, 2, (1001,), device=DEV, dtype=TORCH[dtype]) * 2 - 1
    b = torch.randint(1, 50, (1001,), device=DEV, dtype=TORCH[dtype]) * sign
    o1, o2 = fd.execute([a, b])
    assert torch.equal(o1, torch.div(a, b, rounding_mode="trunc"))
    assert torch.equal(o2, torch.div(a, 3, rounding_mode="trunc"))


def _fixed_broadcast_fusion():
    # nvFuser's prim layer_norm / rms_norm tests: a weight broadcast to a fixed
    # shape, multiplied into a tensor of symbolic extents
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        w = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.mul(x, fd.ops.broadcast_in_dim(w, [6, 40], [1])))
    return fd


def test_fixed_broadcast_shape_unifies_with_symbolic_extents():
    fd = _fixed_broadcast_fusion()
    ck = fd.compile([torch.randn(6, 40), torch.randn(40)], arch="sm_90a")
    assert "i0" not in ck.kernel_ir.split("\n", 1)[1]  # i0 became 6: the loops compare equal
    with pytest.raises(cb.CircbufError, match="must be equal"):
        fd.compile([torch.randn(7, 40), torch.randn(40)], arch="sm_90a")


@pytest.mark.gpu
def test_fixed_broadcast_shape_next_to_symbolic_extents():
    fd = _fixed_broadcast_fusion()
    x, w = torch.randn(6, 40, device=DEV), torch.randn(40, device=DEV)
    (out,) = fd.execute([x, w])
    assert_close(out, x.double() * w.double())


def _scalar_fusion():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        s = fd.define_scalar(dtype=D.Double)
        n = fd.define_scalar(dtype=D.Int64)
        k = fd.ops.mul(fd.ops.add(s, 2.0), fd.ops.reciprocal(fd.ops.neg(s)))  # -(s + 2) / s
        q = fd.ops.cast(fd.ops.div(n, 3), D.Float)  # integer division of a scalar
        y = fd.ops.add(fd.ops.mul(x, k), q)
        fd.add_output(fd.ops.cast(y, D.BFloat16))
    return fd


def test_scalar_math_compiles():
    fd = _scalar_fusion()
    ck = fd.compile([torch.randn(8, dtype=torch.bfloat16), 0.5, 7], arch="sm_90a")
    assert "cb::reciprocal" in ck.cuda and "cb::neg" in ck.cuda


@pytest.mark.gpu
def test_scalar_math_values():
    fd = _scalar_fusion()
    x = torch.randn(1000, device=DEV, dtype=torch.bfloat16)
    for s, n in ((0.5, 7), (-1.25, -8)):
        (out,) = fd.execute([x, s, n])
        k = (s + 2.0) * (1.0 / -s)
        q = float(int(n / 3))  # C truncation
        assert_close(out, x.double() * k + q)


NONFINITE = [float("nan"), float("inf"), float("-inf")]


def _nonfinite_fusion(dtype):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=dtype)
        y = fd.ops.where(fd.ops.gt(x, 0.0), fd.ops.add(x, NONFINITE[0]), NONFINITE[1])
        y = fd.ops.maximum(y, NONFINITE[2])
        fd.add_output(fd.ops.cast(y, dtype))
    return fd


@pytest.mark.parametrize("dtype", [D.Float, D.Double, D.Half, D.BFloat16])
def test_nan_and_infinity_constants_compile(dtype):
    fd = _nonfinite_fusion(dtype)
    ck = fd.compile([torch.randn(8, dtype=TORCH[dtype])], arch="sm_90a")
    assert "nanf" not in ck.cuda


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [D.Float, D.Double, D.Half, D.BFloat16])
def test_nan_and_infinity_constants(dtype):
    fd = _nonfinite_fusion(dtype)
    x = torch.randn(100, device=DEV, dtype=TORCH[dtype])
    (out,) = fd.execute([x])
    xd = x.double()
    ref = torch.maximum(torch.where(xd > 0, xd + float("nan"), float("inf")), torch.tensor(-float("inf")))
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(ref.cpu()))
    assert torch.equal(out[~torch.isnan(out)].double().cpu(), ref[~torch.isnan(ref)].cpu())


KEEPDIM = [
    (dtype, rank, dims, variant)
    for dtype in (D.Float, D.BFloat16)
    for rank in (2, 3, 4)
    for n in range(1, rank + 1)
    for dims in itertools.combinations(range(rank), n)
    for variant in ("add", "sub_mean", "output_too")
]
SHAPE = (8, 16, 32, 64)


def _keepdim_fusion(dtype, rank, dims, variant):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank, dtype=dtype)
        if variant == "sub_mean":
            s = fd.ops.mean(x, list(dims), keepdim=True)
            fd.add_output(fd.ops.sub(x, s))
        else:
            s = fd.ops.sum(x, list(dims), keepdim=True)
            fd.add_output(fd.ops.add(x, s))
            if variant == "output_too":
                fd.add_output(s)
    return fd


@pytest.mark.parametrize("dtype, rank, dims, variant", KEEPDIM)
def test_keepdim_reduction_added_to_its_input_compiles(dtype, rank, dims, variant):
    fd = _keepdim_fusion(dtype, rank, dims, variant)
    fd.compile([torch.randn(*SHAPE[:rank], dtype=TORCH[dtype])], arch="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rank, dims, variant", KEEPDIM)
def test_keepdim_reduction_added_to_its_input(dtype, rank, dims, variant):
    fd = _keepdim_fusion(dtype, rank, dims, variant)
    x = torch.randn(*SHAPE[:rank], device=DEV, dtype=TORCH[dtype])
    outs = fd.execute([x])
    xd = x.double()
    if variant == "sub_mean":
        refs = [xd - xd.mean(dims, keepdim=True)]
    else:
        s = xd.sum(dims, keepdim=True)
        refs = [xd + s] + ([s] if variant == "output_too" else [])
    for o, r in zip(outs, refs):
        # fp32 sums of bf16 values: compare at the size of the sum
        assert_close(o, r, rtol=1e-4, atol=1e-4 * max(1.0, r.abs().max().item()))


def _reduction_into_larger():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        y = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        fd.add_output(fd.ops.add(y, fd.ops.sum(x, [1], keepdim=True)))
    return fd


def test_reduction_broadcast_to_a_larger_tensor_is_segmented():
    """No reduction kernel covers the larger tensor (the reason is named);
    the sum and the add run as two kernels."""
    from circbuf.scheduler.reduction import ReductionScheduler

    fd = _reduction_into_larger()
    assert "is not an axis of the reduction" in ReductionScheduler.can_schedule(fd.fusion)
    ck = fd.compile([torch.randn(8, 16), torch.randn(7, 8, 16)], arch="sm_90a")
    assert [k.name for k in ck.kernels] == ["circbuf_normalization", "circbuf_pointwise"]


@pytest.mark.gpu
def test_reduction_broadcast_to_a_larger_tensor_runs():
    x, y = torch.randn(8, 16, device=DEV), torch.randn(7, 8, 16, device=DEV)
    (out,) = _reduction_into_larger().execute([x, y])
    assert_close(out, y.double() + x.double().sum(1, keepdim=True), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_input_returned_as_output_is_the_input():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(x)
        fd.add_output(fd.ops.exp(x))
    x = torch.randn(100, device=DEV)
    a, b = fd.execute([x])
    assert a is x
    assert_close(b, x.double().exp())
    with cb.FusionDefinition() as only:
        y = only.define_tensor([-1], dtype=D.Float)
        only.add_output(y)
    (c,) = only.execute([x])
    assert c is x
