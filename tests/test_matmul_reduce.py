"""Row reductions of a matmul's output (issue 17, "reductions of the output in
the epilogue"): ``y = linear(x, w)`` returned with ``max(abs(y), -1)`` (an fp8
cast's per-row scale) or ``sum(y, -1)``.

The numerics hold for any plan: the reduction reads the value the fusion
defines (here the bf16-rounded output, cast to fp32 by the frontend), max
propagates NaN as torch's amax does, and an empty row gives the identity
(sum 0, max -inf: torch's amax refuses an empty dimension; nvFuser and circbuf
give the init). Run on the CPU kernel interpreter, outputs poisoned with NaN,
against float64 torch."""

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret

D = cb.DataType


def row_fusion(what, bias=False, reduce_fp32=False):
    """``y = linear(x, w (+ b))``, returned with its row amax / sum. ``reduce_fp32``:
    the reduction reads the fp32 value before the cast to bf16 (the fusion's
    ``linear`` output cast to Float is the accumulator's value, not the rounded y)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16) if bias else None
        y = fd.ops.linear(x, w, b)
        fd.add_output(y)
        if what == "amax":
            fd.add_output(fd.ops.max(fd.ops.abs(y), [-1]))
        elif what == "max":
            fd.add_output(fd.ops.max(y, [-1]))
        else:
            fd.add_output(fd.ops.sum(y, [-1]))
    return fd


def reference(what, x, w, b=None):
    """float64 torch of what the fusion defines: the reduction of the bf16 output."""
    y = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    yb = y.to(torch.bfloat16).double()
    n = yb.shape[-1]
    if what == "sum":
        return y.to(torch.bfloat16), yb.sum(-1)
    if n == 0:  # torch's amax refuses an empty dimension: the identity, as circbuf's init
        return y.to(torch.bfloat16), torch.full(yb.shape[:-1], -torch.inf, dtype=torch.float64)
    r = yb.abs().amax(-1) if what == "amax" else yb.amax(-1)
    return y.to(torch.bfloat16), r


def run(what, m, n, k, nan=False, bias=False, **ov):
    torch.manual_seed(m * 1000 + n + k)
    fd = row_fusion(what, bias=bias)
    if ov:
        fd.fusion.schedule(**ov)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    ins = [x, w] + ([torch.randn(n, dtype=torch.bfloat16)] if bias else [])
    if nan:
        x[m // 2, k // 3] = float("nan")  # row m // 2 of y is NaN
    y, r = interpret(fd, ins)
    y_ref, r_ref = reference(what, *ins)
    assert r.dtype == torch.float32 and r.shape == (m,)
    torch.testing.assert_close(y.double(), y_ref.double(), rtol=1.6e-2, atol=1.6e-2, equal_nan=True)
    # max/amax of bf16 values is exact; the sum is fp32 accumulation of n bf16 values
    tol = dict(rtol=1e-5, atol=1e-5 * max(n, 1) * k) if what == "sum" else dict(rtol=0, atol=0)
    torch.testing.assert_close(r.double(), r_ref, equal_nan=True, **tol)
    if nan:
        assert torch.isnan(r[m // 2]) and not torch.isnan(r[: m // 2]).any()
    return fd


@pytest.mark.parametrize("what", ["amax", "max", "sum"])
@pytest.mark.parametrize(
    "m, n, k",
    [
        (67, 131, 40),  # primes, N < bn
        (131, 1, 24),  # N = 1
        (37, 389, 72),  # several N tiles (bn <= 256), a ragged last one
    ],
)
def test_row_reduction_numerics(what, m, n, k):
    run(what, m, n, k)


@pytest.mark.parametrize("ov", [dict(pingpong=False), dict(pingpong=True)], ids=["cooperative", "pingpong"])
@pytest.mark.parametrize("what", ["amax", "sum"])
def test_row_reduction_nan_propagates(what, ov):
    run(what, 70, 300, 48, nan=True, **ov)


@pytest.mark.parametrize("what", ["amax", "sum"])
def test_row_reduction_with_bias(what):
    run(what, 45, 260, 32, bias=True)


@pytest.mark.parametrize("what", ["amax", "sum"])
def test_empty_rows_give_the_identity(what):
    run(what, 9, 0, 16)


def test_row_reduction_is_deterministic():
    fd = row_fusion("sum")
    x, w = torch.randn(70, 64, dtype=torch.bfloat16), torch.randn(300, 64, dtype=torch.bfloat16)
    a = interpret(fd, [x, w])[1]
    b = interpret(fd, [x, w], seed=1)[1]
    assert torch.equal(a, b)
