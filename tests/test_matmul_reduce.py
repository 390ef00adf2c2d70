"""Row reductions of a matmul's output (issue 17, "reductions of the output in
the epilogue"): ``y = linear(x, w)`` returned with ``max(abs(y), -1)`` (an fp8
cast's per-row scale) or ``sum(y, -1)``. The GEMM's epilogue writes partials
[M, ceil(N / 64), 4] (scheduler/matmul_reduce.py) and a small reduction kernel
reduces them: two kernels, no second read of the output.

The numerics hold for any plan: the reduction reads the value the fusion
defines (here the bf16-rounded output, cast to fp32 by the frontend), max
propagates NaN as torch's amax does, and an empty row gives the identity
(sum 0, max -inf: torch's amax refuses an empty dimension; nvFuser and circbuf
give the init). Run on the CPU kernel interpreter, outputs poisoned with NaN,
against float64 torch."""

import re

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.scheduler import matmul_reduce

D = cb.DataType


def _split(fd) -> bool:
    """Whether the last run's plan has a row reduction's partials."""
    last = fd._get_executor().last
    segs = last.segments.segments if getattr(last, "segments", None) is not None else []
    return any(matmul_reduce.is_partial(e) for s in segs for e in s.fusion.exprs())


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


@pytest.mark.parametrize(
    "ov",
    [dict(pingpong=False), dict(pingpong=True), dict(cluster=(2, 1))],
    ids=["cooperative", "pingpong", "cluster"],
)
@pytest.mark.parametrize("what", ["amax", "sum"])
def test_row_reduction_nan_propagates(what, ov):
    run(what, 250, 300, 48, nan=True, **ov)  # 2 x 2 tiles: a (2, 1) cluster divides them


@pytest.mark.parametrize("what", ["amax", "sum"])
def test_row_reduction_with_bias(what):
    run(what, 45, 260, 32, bias=True)


@pytest.mark.parametrize("what", ["amax", "sum"])
def test_empty_rows_give_the_identity(what):
    # (N = 0: no partials, the reduction kernel of the empty output gives the identity)
    fd = run(what, 9, 0, 16)
    assert not _split(fd)


def test_row_reduction_is_deterministic():
    fd = row_fusion("sum")
    x, w = torch.randn(70, 64, dtype=torch.bfloat16), torch.randn(300, 64, dtype=torch.bfloat16)
    a = interpret(fd, [x, w])[1]
    b = interpret(fd, [x, w], seed=1)[1]
    assert torch.equal(a, b)


@pytest.mark.parametrize("what", ["amax", "sum"])
def test_two_kernels_gemm_with_partials_and_a_small_reduction(what):
    """The segmenter plans the GEMM with the partials in its epilogue and a
    reduction of the partials [M, ceil(N / 64), 4] (fp32), not of the output."""
    fd = row_fusion(what)
    m, n, k = 300, 500, 200
    ck = fd.compile(
        [torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)], arch="sm_90a"
    )
    gemm, red = ck.segments.segments
    assert [kk.name for kk in ck.kernels] == ["circbuf_matmul", "circbuf_reduction"]
    assert gemm.scheduler == "matmul"
    assert any(re.search(r"= partial (max|sum)\(", s) for s in gemm.math), gemm.math
    (p,) = [x for x in red.fusion.inputs if isinstance(x, cb.ir.TensorView)]
    assert p.dtype == D.Float and [str(i.extent) for i in p.logical][1:] == ["ceilDiv(i2, 64)", "4"]
    assert red.inputs[0] == ("tensor", gemm.outputs[-1])  # the partials, written by the GEMM
    # the epilogue: one register per fragment row (h), initialized in a loop of its own
    # before the sub-tile's column loops, stored once per (row, 64-column group, quad lane)
    src = ck.kernels[0].cuda
    assert re.search(
        r"float (T\d+)\[2\];\s*#pragma unroll\s*for \(index_t (j\d+) = 0; \2 < 2; \+\+\2\) \{\s*\1\[\2\] = ",
        src,
    )


@pytest.mark.parametrize("what", ["amax", "sum"])
def test_the_reduction_reads_the_rounded_output(what):
    """``max(abs(y))`` of the bf16 output ``y`` is the max of the values stored,
    not of the fp32 accumulator (which the matmul's epilogue otherwise uses for
    ``cast(y, Float)``)."""
    torch.manual_seed(3)
    fd = row_fusion(what)
    x, w = torch.randn(90, 136, dtype=torch.bfloat16), torch.randn(333, 136, dtype=torch.bfloat16)
    y, r = interpret(fd, [x, w])
    if what == "amax":
        assert torch.equal(r, y.float().abs().amax(-1))
    else:  # fp32 sums of the stored values; the unrounded ones differ by ~1e-1
        torch.testing.assert_close(r.double(), y.double().sum(-1), rtol=0, atol=2e-3)


@pytest.mark.parametrize("ov", [dict(pingpong=False), dict(pingpong=True)], ids=["cooperative", "pingpong"])
def test_protocol_checker_passes_the_fused_kernel(ov):
    fd = row_fusion("amax")
    fd.fusion.schedule(**ov)
    x, w = torch.randn(200, 64, dtype=torch.bfloat16), torch.randn(300, 64, dtype=torch.bfloat16)
    y, r = interpret(fd, [x, w], check=4)
    torch.testing.assert_close(r.double(), reference("amax", x, w)[1], rtol=0, atol=0)


@pytest.mark.parametrize(
    "ov",
    [dict(epilogue="role"), dict(tile=(128, 176, 64)), dict(epilogue_tile=(64, 32)), dict(realign=False)],
    ids=["role", "bn176", "epilogue_tile32", "realign_false"],
)
def test_schedules_that_cannot_hold_the_partials_keep_the_reduction_whole(ov):
    """Overrides under which the matmul cannot hold the partials (or may run on
    the SIMT path) compile as before the partials existed: the GEMM, then a
    reduction of its output (review: these raised, where they had run)."""
    fd = row_fusion("sum")
    fd.fusion.schedule(**ov)
    k = 41 if "realign" in ov else 64  # (rows of 82 bytes: the cp.async fill under realign=False)
    x, w = torch.randn(130, k, dtype=torch.bfloat16), torch.randn(300, k, dtype=torch.bfloat16)
    y, r = interpret(fd, [x, w])
    assert not _split(fd)
    torch.testing.assert_close(r.double(), y.double().sum(-1), rtol=1e-5, atol=1e-3)


def _residual_fusion(red: bool, in_place: bool = False):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        o = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.cast(fd.ops.add(fd.ops.linear(x, w), o), D.BFloat16)
        fd.add_output(y, alias_input=o) if in_place else fd.add_output(y)
        if red:
            fd.add_output(fd.ops.sum(fd.ops.cast(y, D.Float), [1]))
    return fd


def test_a_reduction_leaves_the_other_outputs_values_alone():
    """y = bf16(linear + o) returned beside sum(y): the partials would read the
    matmul's output rounded, and y with it (review: 9335 of 33410 elements of y
    changed once the sum was added). Such a reduction stays whole."""
    g = torch.Generator().manual_seed(3)
    x, w, o = (torch.randn(*s, generator=g).bfloat16() for s in ((130, 64), (257, 64), (130, 257)))
    (y0,) = interpret(_residual_fusion(False), [x, w, o])
    y1, r = interpret(_residual_fusion(True), [x, w, o])
    assert torch.equal(y0, y1)
    torch.testing.assert_close(r.double(), y1.double().sum(-1), rtol=1e-5, atol=1e-3)


def test_partials_outside_the_matmul_segment_are_not_kept():
    """y written in place into o beside sum(y): the alias keeps the reduction out
    of the matmul's segment, so split partials would be a reduction kernel of
    their own, whose loads ran past the rows (review: the interpreter refused
    the read of T7[33410]). The unsplit plan runs instead."""
    g = torch.Generator().manual_seed(4)
    x, w, o = (torch.randn(*s, generator=g).bfloat16() for s in ((130, 64), (257, 64), (130, 257)))
    ref_y = (x.double() @ w.double().T + o.double()).bfloat16()
    fd = _residual_fusion(True, in_place=True)
    (r,) = interpret(fd, [x, w, o])
    assert not _split(fd)
    assert (o.double() - ref_y.double()).abs().max() <= 0.0625
    torch.testing.assert_close(r.double(), o.double().sum(-1), rtol=1e-5, atol=1e-3)


def test_a_register_accumulator_per_inner_iteration():
    """Lowering: a reduction whose loop runs an iteration axis inside its
    reduction axis (rows inside the column loop) holds one register per row,
    each initialized in a loop of its own before the column loop."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.max(x, [1]))
    out = fd.fusion.outputs[0]
    acc = out.cache_before()  # registers
    acc.split(0, 4)  # [R/4, 4, rC]
    acc.reorder([0, 2, 1])  # [R/4, rC, 4]: the rows of a group inside the column loop
    out.split(0, 4)
    acc.inline_at(1)
    x_ = torch.randn(10, 7)
    x_[3, 2] = float("nan")
    ck = fd.compile([x_], arch="sm_90a")
    # FOR j3 in 0..4 { T2[j3] = -inf }  FOR j1 in 0..i1 { FOR j2 in 0..4 { T2[j2] = max(T2[j2], ..) } }
    ir = ck.kernel_ir
    assert re.search(r"FOR (j\d+) in 0\.\.4\n\s+(T\d+)\[\1\] = -inf\n\s+FOR j\d+ in 0\.\.i1\n", ir), ir
    (r,) = interpret(fd, [x_])
    ref = x_.double().amax(1)
    torch.testing.assert_close(r.double(), ref, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("ov", [{}, dict(pingpong=True)], ids=["heuristic", "pingpong"])
def test_fused_kernel_keeps_tma_stores_and_registers(ov):
    """At the benchmark's 8192x8192x1024 the GEMM with partials still stores its
    output by TMA (an output the epilogue reads again) and spills nothing."""
    fd = row_fusion("amax")
    if ov:
        fd.fusion.schedule(**ov)
    x, w = torch.empty(8192, 1024, dtype=torch.bfloat16), torch.empty(8192, 1024, dtype=torch.bfloat16)
    ck = fd.compile([x, w], arch="sm_90a")
    assert ck.kernels[0].params.store == "tma"
    sass = ck.kernels[0].sass()
    assert "UTMASTG" in sass and "HGMMA" in sass
    assert not re.search(r"\b(STL|LDL)\b", sass), "local memory in the fused GEMM"


def test_a_matmul_split_k_takes_keeps_its_reduction_apart():
    """Where the split-K heuristic splits the matmul (a decode shape on an H200:
    few output tiles, so little output to read again), the row reduction stays a
    kernel of its own: a K chunk cannot hold a row's partials."""
    # (16 x 4096 x 4096: the H200 splits it in two, the H100 does not; scheduler/split_k.py)
    shapes = [torch.empty(16, 4096, dtype=torch.bfloat16), torch.empty(4096, 4096, dtype=torch.bfloat16)]
    for target, partial in (("h200", False), ("h100", True)):
        fd = row_fusion("sum")
        ck = fd.compile(shapes, arch="sm_90a", target=target)
        math = [m for s in ck.segments.segments for m in s.math]
        assert any("partial" in m for m in math) == partial, (target, math)


def test_a_reduction_whose_result_meets_the_rows_again_is_not_split():
    """An fp8-style quantization (y scaled by its row's amax) reads the rows
    again after the reduction: one normalization kernel does both (as before),
    no partials."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.linear(x, w)
        amax = fd.ops.max(fd.ops.abs(y), [-1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.div(y, amax), D.BFloat16))
    xs, ws = torch.randn(96, 64, dtype=torch.bfloat16), torch.randn(136, 64, dtype=torch.bfloat16)
    ck = fd.compile([xs, ws], arch="sm_90a")
    assert not any("partial" in m for s in ck.segments.segments for m in s.math)
    (q,) = interpret(fd, [xs, ws])
    y64 = torch.nn.functional.linear(xs.double(), ws.double()).to(torch.bfloat16).double()
    torch.testing.assert_close(q.double(), y64 / y64.abs().amax(-1, keepdim=True), rtol=1.6e-2, atol=1.6e-2)
