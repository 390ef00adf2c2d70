"""fp32 matmuls on TF32 tensor cores, where torch would use TF32 (issue 18).

torch runs an fp32 matmul in IEEE fp32 unless TF32 is allowed
(``torch.backends.cuda.matmul.allow_tf32``, ``fp32_precision = "tf32"``,
``set_float32_matmul_precision("high")``); circbuf follows the same switch,
read at each call (it is part of the plan's key). With TF32 on, the operands
are staged by TMA as K-major tiles of 32 fp32 (one 128-byte swizzled row)
and multiplied by ``wgmma ... k8.f32.tf32.tf32``; an operand that is not
K-major (matmul's row-major B, an M-major A) or that a tensor map cannot
describe is copied K-major first (scheduler/realign.py).

Each result is checked against float64 torch element by element with TF32's
own error bound: the tensor cores read 10 of fp32's 23 mantissa bits of each
operand (each off by less than 2^-10 of itself), so a product is off by less
than 2^-9 of |a| |b|, and ``|out - ref| <= 2^-9 (|A| @ |B|)`` plus fp32's
rounding of the sum. The low bits are dropped (truncated), not rounded: the
max error is 2-3x that of cuBLAS's TF32 GEMM (``test_gpu_error_against_torch``).
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.runtime.precision import allows_tf32
from tests.util import D, seeded

DEV = "cuda"


@pytest.fixture
def tf32():
    """TF32 allowed for fp32 matmuls, as a user sets it (the legacy switch)."""
    m = torch.backends.cuda.matmul
    m.allow_tf32 = True
    yield
    m.allow_tf32 = False


def _fusion(kind, bias=False, relu=False, out=None):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1] if kind != "batched" else [-1, -1, -1], dtype=D.Float)
        b = fd.define_tensor([-1, -1] if kind != "batched" else [-1, -1, -1], dtype=D.Float)
        if kind == "linear":
            c = fd.ops.linear(a, b, fd.define_tensor([-1], dtype=D.Float)) if bias else fd.ops.linear(a, b)
        else:
            c = fd.ops.matmul(a, b)
        if relu:
            c = fd.ops.relu(c)
        fd.add_output(fd.ops.cast(c, out) if out is not None else c)
    return fd


def _inputs(kind, m, n, k, bias=False, a_m_major=False, device="cpu", batch=3):
    g = seeded(m * 7919 + n * 31 + k)
    if kind == "batched":
        a = torch.randn(batch, m, k, generator=g)
        b = torch.randn(batch, k, n, generator=g)
    else:
        a = torch.randn(k, m, generator=g).T if a_m_major else torch.randn(m, k, generator=g)
        b = torch.randn(n, k, generator=g) if kind == "linear" else torch.randn(k, n, generator=g)
    xs = [a, b] + ([torch.randn(n, generator=g)] if bias else [])
    return [x.to(device) for x in xs]


def _reference(kind, xs, relu=False):
    """(float64 result, the TF32 bound 2^-9 |A| @ |B| per element)."""
    a, b = xs[0].cpu().double(), xs[1].cpu().double()
    bt = b.transpose(-1, -2) if kind == "linear" else b
    ref = a @ bt
    bound = (a.abs() @ bt.abs()) * 2.0**-9
    if len(xs) > 2:
        ref = ref + xs[2].cpu().double()
    if relu:
        ref = ref.clamp_min(0)
    return ref, bound + ref.abs() * 2.0**-22 + 1e-6


def _check(out, ref, bound, out_dtype=None):
    out = out.cpu().double()
    assert not out.isnan().any(), "an output element was not written (NaN poison)"
    if out_dtype is not None:  # and the output's own rounding (bf16: 2^-8 relative)
        bound = bound + ref.abs() * 2.0**-8
    err = (out - ref).abs()
    assert (err <= bound).all(), (
        f"max error {err.max().item():.3g}, over the TF32 bound at {(err > bound).sum()} elements"
    )


CASES = {
    # name: (kind, m, n, k, options)
    "linear 128x256x64": ("linear", 128, 256, 64, {}),
    "linear 65x40x33 (odd K: realigned)": ("linear", 65, 40, 33, {}),
    "matmul 200x136x72 (B N-major: copied K-major)": ("matmul", 200, 136, 72, {}),
    "matmul M-major A": ("matmul", 96, 64, 40, {"a_m_major": True}),
    "batched 3 x 70x40x48": ("batched", 70, 40, 48, {}),
    "linear + bias + relu": ("linear", 130, 72, 96, {"bias": True, "relu": True}),
    "linear M = 1 (small-M tiles)": ("linear", 1, 256, 128, {}),
    "matmul to bf16": ("matmul", 64, 128, 64, {"out": D.BFloat16}),
}


def _run_case(name, run):
    kind, m, n, k, opt = CASES[name]
    fd = _fusion(kind, opt.get("bias", False), opt.get("relu", False), opt.get("out"))
    xs = _inputs(kind, m, n, k, opt.get("bias", False), opt.get("a_m_major", False), **run)
    return fd, xs, kind, opt


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreted(tf32, name):
    fd, xs, kind, opt = _run_case(name, {})
    (out,) = interpret(fd, xs)
    params = fd.last_params()
    assert params.tf32 and params.simt is None, params
    ref, bound = _reference(kind, xs, opt.get("relu", False))
    _check(out, ref, bound, opt.get("out"))


def test_ieee_by_default_and_the_switch_is_read_at_each_call(monkeypatch):
    """TF32 off (torch's default): the fp32 path. Switched on, the next call
    makes a TF32 plan; switched off again, the IEEE one is back (the plan's key
    holds the switch). Run on CPU tensors through ``execute`` (the interpreter)."""
    monkeypatch.setenv("CIRCBUF_INTERPRET", "1")
    assert not allows_tf32()
    fd = _fusion("linear")
    xs = _inputs("linear", 64, 64, 256)
    first = fd.execute(xs)[0]
    assert fd.last_params().simt is not None
    m = torch.backends.cuda.matmul
    m.allow_tf32 = True
    try:
        second = fd.execute(xs)[0]
        assert fd.last_params().tf32
    finally:
        m.allow_tf32 = False
    third = fd.execute(xs)[0]
    ref = xs[0].double() @ xs[1].double().T
    # fp32 accumulation of exact products vs TF32 operands: the errors differ by orders
    assert (first.double() - ref).abs().max() < 1e-3 < (second.double() - ref).abs().max()
    assert torch.equal(first, third)


def test_new_switch():
    m = torch.backends.cuda.matmul
    if not hasattr(m, "fp32_precision"):
        pytest.skip("this torch has only the legacy switch")
    try:
        m.fp32_precision = "tf32"
        assert allows_tf32()
        m.fp32_precision = "ieee"
        assert not allows_tf32()
    finally:
        m.fp32_precision = "none"
    assert not allows_tf32()


def test_sass(tf32):
    """HGMMA on TF32 k8, TMA loads and stores (fp32 output sub-tiles of 32
    columns, one 128-byte swizzled row), no spills."""
    fd = _fusion("matmul")
    ck = fd._get_executor().compile([torch.empty(4096, 4096), torch.empty(4096, 4096)], arch="sm_90a")
    assert ck.params.tf32 and ck.params.epilogue_tile == (64, 32) and ck.params.store == "tma", ck.params
    sass = ck.sass()
    assert set(re.findall(r"HGMMA\.64x\d+x8\.F32\.TF32", sass)) == {"HGMMA.64x256x8.F32.TF32"}
    for op in ("UTMALDG", "UTMASTG", "USETMAXREG"):
        assert op in sass, op
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory (spills)"
    assert "k8.f32.tf32.tf32" in ck.cuda


def test_overrides_named(tf32):
    fd = _fusion("linear")
    xs = _inputs("linear", 128, 128, 64)
    fd.fusion.schedule(fill="cp.async")
    with pytest.raises(cb.CircbufError, match="TF32 operands are filled by TMA only"):
        fd.compile(xs, arch="sm_90a")
    fd = _fusion("linear")
    fd.fusion.schedule(tile=(128, 128, 128))
    with pytest.raises(cb.CircbufError, match="bk = 128 must be 32 or 64"):
        fd.compile(xs, arch="sm_90a")


def test_two_swizzled_rows_per_stage(tf32):
    """tile bk = 64: two 128-byte rows of 32 fp32 per stage."""
    fd = _fusion("matmul")
    fd.fusion.schedule(tile=(128, 128, 64))
    xs = _inputs("matmul", 128, 128, 192)
    (out,) = interpret(fd, xs)
    assert fd.last_params().tile == (128, 128, 64)
    _check(out, *_reference("matmul", xs))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(tf32, monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, xs, kind, opt = _run_case(name, {"device": DEV})
    (out,) = fd.execute(xs)
    ref, bound = _reference(kind, xs, opt.get("relu", False))
    _check(out, ref, bound, opt.get("out"))


@pytest.mark.gpu
def test_gpu_error_against_torch(tf32):
    """At 2048^3 circbuf's TF32 max error against float64 is 2-3x that of
    torch's own TF32 result (cuBLAS): the tensor cores drop each operand's low
    13 mantissa bits as wgmma reads them from shared memory (a truncation: a
    bias of about -2^-10 of each output), where cuBLAS's result is as if its
    operands were rounded to nearest (measured on an H200: 0.188 vs 0.075
    at this shape). Both are within TF32's bound (the other tests)."""
    fd = _fusion("matmul")
    xs = _inputs("matmul", 2048, 2048, 2048, device=DEV)
    ref = xs[0].double() @ xs[1].double()
    ours = (fd.execute(xs)[0].double() - ref).abs().max().item()
    theirs = (torch.matmul(*xs).double() - ref).abs().max().item()
    assert ours <= 3.5 * theirs, (ours, theirs)


@pytest.mark.gpu
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 300),
    n=st.integers(1, 300),
    k=st.integers(1, 600),
    kind=st.sampled_from(["matmul", "linear"]),
    allow=st.booleans(),
    off=st.integers(0, 3),
)
def test_gpu_hypothesis_tf32_on_and_off(m, n, k, kind, allow, off):
    """fp32 shapes of any size, A ``off`` elements into its buffer, TF32 allowed
    or not: TF32's bound with it (where a shape keeps the fp32 path, as a
    one-column B does, its result is within it too), fp32's rounding of a
    k-term sum without (the FFMA path); outputs NaN-poisoned."""
    # (no monkeypatch: a function-scoped fixture is not reset between hypothesis' examples;
    # conftest poisons GPU outputs)
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    flags.allow_tf32 = allow
    try:
        _tf32_example(m, n, k, kind, allow, off)
    finally:
        flags.allow_tf32 = before


def _tf32_example(m, n, k, kind, allow, off):
    g = seeded(m * 7919 + n * 31 + k + off)
    a = torch.randn(off + m * k, generator=g).to(DEV)[off:].view(m, k)  # (the offset kept on the GPU)
    b = torch.randn((n, k) if kind == "linear" else (k, n), generator=g).to(DEV)
    fd = _fusion(kind)
    (out,) = fd.execute([a, b])
    ref, bound = _reference(kind, [a, b])
    if not allow:  # IEEE fp32: each of k products and sums rounded once
        bt = b.cpu().double().T if kind == "linear" else b.cpu().double()
        bound = (a.cpu().double().abs() @ bt.abs()) * (k + 2) * 2.0**-24 + 1e-6
    _check(out, ref, bound)


def test_one_column_b_keeps_the_fp32_path(tf32):
    """matmul(a, b[K, 1]): no K-major copy of a one-column B is a layout a tensor
    map takes as TF32 needs it; the fp32 path runs it (and the realign choice
    does not ask for a copy that would be refused again)."""
    fd = _fusion("matmul")
    g = seeded(1)
    xs = [torch.randn(64, 48, generator=g), torch.randn(48, 1, generator=g)]
    (out,) = interpret(fd, xs)
    assert fd.last_params().simt is not None
    ref = xs[0].double() @ xs[1].double()
    assert (out.double() - ref).abs().max() < 1e-4


def test_no_copy_without_tf32():
    """With TF32 off the CUDA cores take an fp32 matmul as it lies: no operand
    is copied (realign is for tensor maps)."""
    from circbuf.scheduler.realign import choose

    fd = _fusion("matmul")
    xs = [torch.randn(33, 31), torch.randn(31, 17)]
    ex = fd._get_executor()
    info, _ = ex._bind(xs, need_cuda=False)
    assert not info.tf32 and choose(fd.fusion, info, {}) == ()
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        info, _ = ex._bind(xs, need_cuda=False)
        assert info.tf32 and choose(fd.fusion, info, {}) == ((0, -1), (1, -2))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


# ---- fp32 outputs of a bf16 GEMM (the 64 x 32 TMA-stored sub-tiles): found by review


def _bf16_linear(outputs):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        outputs(fd, fd.ops.linear(x, w))
    g = seeded(3)
    xs = [torch.randn(256, 64, generator=g).bfloat16(), torch.randn(512, 64, generator=g).bfloat16()]
    return fd, xs, xs[0].double() @ xs[1].double().T


def _close(out, ref, rel=2.0**-8):
    """Within one bf16 rounding of the float64 product (linear's bf16 result,
    rounded from the fp32 accumulator, then cast to fp32)."""
    err = (out.double() - ref).abs()
    assert (err <= rel * ref.abs() + 1e-6).all(), err.max()


def test_row_reduction_beside_an_fp32_output():
    """cast(y, fp32) beside amax(y): the row reduction's partials keep their
    64-column sub-tiles (an fp32 output alone would take 32)."""

    def outputs(fd, y):
        fd.add_output(fd.ops.cast(y, D.Float))
        fd.add_output(fd.ops.max(fd.ops.abs(y), [-1]))

    fd, xs, y = _bf16_linear(outputs)
    yf, amax = interpret(fd, xs)
    _close(yf, y)
    _close(amax, y.abs().amax(-1))


@pytest.mark.parametrize("count, store", [(1, "tma"), (5, "tma"), (6, "direct")])
def test_several_fp32_outputs_fit(count, store):
    """Each fp32 output staged for its TMA store takes 16 KB per buffer: five
    keep one buffer and 3 operand stages, six store from registers (they
    raised for want of shared memory once)."""

    def outputs(fd, y):
        c = fd.ops.cast(y, D.Float)
        for k in range(count):
            fd.add_output(fd.ops.mul(c, float(k + 1)) if k else c)

    fd, xs, y = _bf16_linear(outputs)
    outs = interpret(fd, xs)
    p = fd.last_params()
    assert p.store == store and p.stages >= 3, p
    for k, o in enumerate(outs):
        _close(o, y * (k + 1), 2.0**-8 + 2.0**-22)
