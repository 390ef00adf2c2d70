"""16-bit matmuls with no sum of products on the SIMT path (issue 18: "no
bf16/fp16 matmul takes the SIMT path").

- K fixed to 1 in the definition (``define_tensor([-1, 1])``, as torch.compile
  defines a static size 1): an outer product, defined as the elementwise
  product in fp32 cast back once (``circbuf/frontend_matmul.py``); a
  pointwise kernel, the same bits as torch's 16-bit matmul (the product of
  two 16-bit values is exact in fp32).
- An expand that the fusion both returns and reads as a matmul operand: it is
  returned as torch's stride-0 view, and the matmul's segment reads it as
  rows (``segmenter._write_out_expanded(strided=True)``), copied dense by the
  runtime before the TMA path (``scheduler/realign.py``).

- K = 0 for the inputs' sizes: the sum of no products is a fill (zeros, or
  linear's bias), which the segmenter cuts for those sizes
  (``scheduler/empty_k.py``); other sizes keep the tensor cores.

Each case runs on the interpreter (CPU) and on the GPU with NaN-poisoned
outputs, against float64 torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import interpret
from tests.util import D, check_outputs, seeded, to_double

DEV = "cuda"
B16 = {torch.bfloat16: D.BFloat16, torch.float16: D.Half}


def _paths(fd):
    """The kernels' schedulers: ``"tensor cores"``, ``"simt"`` or the params' class."""

    def flat(p):
        return [r for q in p for r in flat(q)] if isinstance(p, list) else [p]

    out = []
    for q in flat(fd.last_params()):
        if hasattr(q, "simt"):
            out.append("tensor cores" if q.simt is None else "simt")
        else:
            out.append(type(q).__name__)
    return out


def _outer(ashape, bshape, defa=None, defb=None):
    """matmul of operands defined with K fixed to 1 (-1: any extent)."""

    def build(fd, dt):
        a = fd.define_tensor(defa or [1 if s == 1 else -1 for s in ashape], dtype=B16[dt])
        b = fd.define_tensor(defb or [1 if s == 1 else -1 for s in bshape], dtype=B16[dt])
        fd.add_output(fd.ops.matmul(a, b))
        return [ashape, bshape], lambda a, b: [a @ b]

    return build


def _outer_linear(xshape, wshape, bias=None, act=False):
    def build(fd, dt):
        x = fd.define_tensor([1 if s == 1 else -1 for s in xshape], dtype=B16[dt])
        w = fd.define_tensor([1 if s == 1 else -1 for s in wshape], dtype=B16[dt])
        b = None if bias is None else fd.define_tensor([-1] * len(bias), dtype=B16[dt])
        y = fd.ops.linear(x, w, b)
        fd.add_output(fd.ops.cast(fd.ops.gelu(y), B16[dt]) if act else y)
        shapes = [xshape, wshape] + ([bias] if bias is not None else [])

        def ref(x, w, *b):
            y = F.linear(x, w, *b)
            return [F.gelu(y) if act else y]

        return shapes, ref

    return build


CASES = {
    "[M, 1] @ [1, N]": _outer((70, 1), (1, 90)),
    "[B, M, 1] @ [1, N]": _outer((3, 70, 1), (1, 90)),
    "[M, 1] @ [B, 1, N]": _outer((70, 1), (3, 1, 90)),
    "[1, M, 1] @ [B, 1, N] (batch broadcast)": _outer((1, 70, 1), (3, 1, 90)),
    "[1] @ [1, N] (a vector of one)": _outer((1,), (1, 90)),
    "[M, 1] @ [1] (a vector of one)": _outer((70, 1), (1,)),
    "[M, 1] @ [K, N], K = 1 given": _outer((70, 1), (1, 90), defb=[-1, -1]),
    "linear [M, 1], [N, 1]": _outer_linear((70, 1), (90, 1)),
    "linear [B, S, 1], [N, 1], bias, gelu": _outer_linear((2, 5, 1), (90, 1), bias=(90,), act=True),
    "linear [M, 1], [N, 1], bias": _outer_linear((70, 1), (90, 1), bias=(90,)),
}


def _case(name, dt, device):
    g = seeded(len(name))
    with cb.FusionDefinition() as fd:
        shapes, ref = CASES[name](fd, dt)
    xs = [torch.randn(tuple(s), generator=g).to(dt).to(device) for s in shapes]
    return fd, xs, ref


def _check(fd, outs, xs, ref):
    assert "simt" not in _paths(fd) and "tensor cores" not in _paths(fd), _paths(fd)
    check_outputs(outs, ref(*[to_double(x).cpu() for x in xs]), written=True)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_k_fixed_to_one_interpreted(name, dt):
    fd, xs, ref = _case(name, dt, "cpu")
    _check(fd, interpret(fd, xs), xs, ref)


def test_outer_product_is_elementwise_in_the_definition():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, 1], dtype=D.BFloat16)
        b = fd.define_tensor([1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    kinds = [type(e).__name__ for e in fd.fusion.exprs()]
    assert "MatmulOp" not in kinds and "BinaryOp" in kinds, kinds


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_outer_product_has_torchs_bits(dt):
    """The product of two 16-bit values is exact in fp32 and rounded once:
    torch's own 16-bit matmul gives the same bits."""
    fd, xs, _ = _case("[B, M, 1] @ [1, N]", dt, "cpu")
    (out,) = interpret(fd, xs)
    assert _paths(fd) == ["PointwiseParams"], _paths(fd)
    assert torch.equal(out, xs[0] @ xs[1])


def test_expanded_k_is_still_a_sum():
    """An expand along K (``x[M, 1].expand(M, K)``) is a sum over K rows, not an
    outer product: it stays a matmul (the expand is written out for the tensor
    cores)."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, 1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(fd.ops.expand(a, [-1, 64]), b))
    g = seeded(5)
    xs = [torch.randn(70, 1, generator=g).bfloat16(), torch.randn(64, 90, generator=g).bfloat16()]
    outs = interpret(fd, xs)
    assert "tensor cores" in _paths(fd), _paths(fd)
    check_outputs(outs, [to_double(xs[0]).expand(70, 64) @ to_double(xs[1])], written=True)


def test_k_mismatch_with_a_fixed_one_is_named():
    """A K of 1 on one side, K given by the inputs on the other: torch refuses
    a K that is not 1; so does circbuf, by name."""
    fd, _, _ = _case("[M, 1] @ [K, N], K = 1 given", torch.bfloat16, "cpu")
    bad = [torch.randn(70, 1).bfloat16(), torch.randn(5, 90).bfloat16()]
    with pytest.raises(cb.CircbufError, match="K of T0 and T1"):
        fd.compile(bad, arch="sm_90a")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.sampled_from([1, 2, 7, 61, 128]), n=st.sampled_from([1, 3, 8, 127, 264]))
def test_k_fixed_to_one_shapes(m, n):
    g = seeded(m * 1000 + n)
    fd, _, _ = _case("[M, 1] @ [1, N]", torch.bfloat16, "cpu")
    xs = [torch.randn(m, 1, generator=g).bfloat16(), torch.randn(1, n, generator=g).bfloat16()]
    (out,) = interpret(fd, xs)
    assert _paths(fd) == ["PointwiseParams"], _paths(fd)
    assert torch.equal(out, xs[0] @ xs[1])


# ------------------------------------------------ an expand returned and read by a matmul


def _expand_returned(fd, dt=torch.bfloat16, m=70):
    x = fd.define_tensor([1, -1], dtype=B16[dt])
    w = fd.define_tensor([-1, -1], dtype=B16[dt])
    e = fd.ops.expand(x, [m, -1])
    fd.add_output(e)
    fd.add_output(fd.ops.linear(e, w))


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_expand_returned_and_read_by_a_matmul_takes_the_tensor_cores(dt):
    with cb.FusionDefinition() as fd:
        _expand_returned(fd, dt)
    g = seeded(8)
    xs = [torch.randn(1, 64, generator=g).to(dt), torch.randn(90, 64, generator=g).to(dt)]
    ex, y = interpret(fd, xs)
    assert _paths(fd)[-1] == "tensor cores", _paths(fd)
    assert ex.stride() == (0, 1), ex.stride()  # torch's expand, returned as a view
    xd, wd = to_double(xs[0]).expand(70, 64), to_double(xs[1])
    check_outputs([ex, y], [xd, xd @ wd.T], written=True)


# ------------------------------------------------ K = 0


def _k0(fd, dt, kind, bias=False, act=False, rank=2):
    a = fd.define_tensor([-1] * rank, dtype=dt)
    b = fd.define_tensor([-1, -1], dtype=dt)
    if kind == "matmul":
        y = fd.ops.matmul(a, b)
    else:
        y = fd.ops.linear(a, b, fd.define_tensor([-1], dtype=dt) if bias else None)
    fd.add_output(fd.ops.cast(fd.ops.gelu(y), dt) if act else y)


K0_CASES = {
    "matmul": dict(kind="matmul"),
    "linear": dict(kind="linear"),
    "linear + bias": dict(kind="linear", bias=True),
    "linear + bias, gelu": dict(kind="linear", bias=True, act=True),
    "batched matmul": dict(kind="matmul", rank=3),
}


def _k0_inputs(case, k, dt, device, m=70, n=90):
    g = seeded(k + m)
    rank, kind = case.get("rank", 2), case["kind"]
    shapes = [((3,) if rank == 3 else ()) + (m, k), (k, n) if kind == "matmul" else (n, k)]
    if case.get("bias"):
        shapes.append((n,))
    return [torch.randn(s, generator=g).to(dt).to(device) for s in shapes]


def _k0_ref(case, xs):
    x = [to_double(t).cpu() for t in xs]
    y = x[0] @ x[1] if case["kind"] == "matmul" else F.linear(*x)
    return [F.gelu(y) if case.get("act") else y]


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", sorted(K0_CASES))
def test_k_zero_is_a_fill(name, dt):
    case = K0_CASES[name]
    with cb.FusionDefinition() as fd:
        _k0(fd, {torch.bfloat16: D.BFloat16, torch.float32: D.Float}[dt], **case)
    xs = _k0_inputs(case, 0, dt, "cpu")
    outs = interpret(fd, xs)
    assert "simt" not in _paths(fd) and "tensor cores" not in _paths(fd), _paths(fd)
    check_outputs(outs, _k0_ref(case, xs), written=True)
    if dt == torch.bfloat16:  # the same fusion with K > 0: the tensor cores, as before
        xs = _k0_inputs(case, 64, dt, "cpu")
        outs = interpret(fd, xs)
        assert "tensor cores" in _paths(fd), _paths(fd)
        check_outputs(outs, _k0_ref(case, xs), written=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(K0_CASES)),
    dt=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    m=st.integers(0, 200),
    n=st.integers(0, 200),
    k=st.sampled_from([0, 0, 1, 7, 64, 131]),
)
def test_hypothesis_k_zero_among_other_ks(name, dt, m, n, k):
    """K drawn with 0 among other sizes (M and N 0 too), every dtype: K = 0 is
    the fill, never the SIMT path for 16-bit operands; results against float64
    with the outputs poisoned (the interpreter)."""
    case = K0_CASES[name]
    with cb.FusionDefinition() as fd:
        _k0(fd, {torch.bfloat16: D.BFloat16, torch.float16: D.Half, torch.float32: D.Float}[dt], **case)
    xs = _k0_inputs(case, k, dt, "cpu", m=m, n=n)
    outs = interpret(fd, xs)
    check_outputs(outs, _k0_ref(case, xs), written=True)
    if dt != torch.float32 and m * n:
        assert "simt" not in _paths(fd), _paths(fd)
        assert ("tensor cores" in _paths(fd)) == (k > 0), _paths(fd)


def test_k_zero_bias_is_torchs():
    """linear with K = 0 is its bias, rounded once: the same bits as torch."""
    case = K0_CASES["linear + bias"]
    with cb.FusionDefinition() as fd:
        _k0(fd, D.BFloat16, **case)
    xs = _k0_inputs(case, 0, torch.bfloat16, "cpu")
    (out,) = interpret(fd, xs)
    assert _paths(fd) == ["PointwiseParams"], _paths(fd)
    assert torch.equal(out, F.linear(*xs))


# ---- found by review


def test_k_zero_through_an_expand_is_a_fill():
    """K given by an expand of a [M, 1] operand (its axis' extent is the
    expand's): K = 0 is still the fill (an internal Unschedulable once)."""
    with cb.FusionDefinition() as fd:
        a0 = fd.define_tensor([-1, 1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(fd.ops.expand(a0, [-1, fd.ops.size(b, 0)]), b))
    xs = [torch.randn(70, 1).bfloat16(), torch.randn(0, 90).bfloat16()]
    check_outputs(interpret(fd, xs), [torch.zeros(70, 90, dtype=torch.float64)], written=True)
    assert "simt" not in _paths(fd), _paths(fd)


@pytest.mark.parametrize("op", ["matmul", "linear"])
def test_expanded_k_beside_a_fixed_one_stays_a_matmul(op):
    """One side's K an expand (to a size the inputs make 1), the other's fixed
    to 1: an expand along K is a sum over K rows, so this stays a matmul (the
    outer product's rewrite paired the expanded axis with M or N once)."""
    with cb.FusionDefinition() as fd:
        x0 = fd.define_tensor([-1, 1], dtype=D.BFloat16)
        k = fd.define_tensor([-1], dtype=D.BFloat16)
        b = fd.define_tensor([1, -1] if op == "matmul" else [-1, 1], dtype=D.BFloat16)
        x = fd.ops.expand(x0, [-1, fd.ops.size(k, 0)])
        fd.add_output(getattr(fd.ops, op)(x, b))
    g = seeded(12)
    xs = [
        torch.randn(70, 1, generator=g).bfloat16(),
        torch.randn(1, generator=g).bfloat16(),
        torch.randn(1, 90, generator=g).bfloat16()
        if op == "matmul"
        else torch.randn(90, 1, generator=g).bfloat16(),
    ]
    ref = to_double(xs[0]) @ (to_double(xs[2]) if op == "matmul" else to_double(xs[2]).T)
    check_outputs(interpret(fd, xs), [ref], written=True)


def test_matmul_overrides_with_k_zero_are_ignored():
    """schedule(realign=False, stages=3) with K = 0: no matmul runs for those
    sizes, so its overrides apply to nothing (not an error, not the fill's
    kernel); K > 0 takes them."""
    for ov in (dict(realign=False), dict(stages=3)):
        with cb.FusionDefinition() as fd:
            a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
            b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
            fd.add_output(fd.ops.matmul(a, b))
        fd.fusion.schedule(**ov)
        outs = interpret(fd, [torch.randn(70, 0).bfloat16(), torch.randn(0, 90).bfloat16()])
        check_outputs(outs, [torch.zeros(70, 90, dtype=torch.float64)], written=True)
        assert _paths(fd) == ["PointwiseParams"], _paths(fd)
        xs = [torch.randn(70, 64).bfloat16(), torch.randn(64, 90).bfloat16()]
        outs = interpret(fd, xs)
        assert _paths(fd) == ["tensor cores"], _paths(fd)
        check_outputs(outs, [to_double(xs[0]) @ to_double(xs[1])], written=True)


# ------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_k_fixed_to_one(monkeypatch, name, dt):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, xs, ref = _case(name, dt, DEV)
    _check(fd, fd.execute(xs), xs, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(4096, 4096), (1, 4097), (4099, 3)])
def test_gpu_outer_product_has_torchs_bits(monkeypatch, m, n):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, _, _ = _case("[M, 1] @ [1, N]", torch.bfloat16, DEV)
    g = seeded(m + n)
    xs = [
        torch.randn(m, 1, generator=g).bfloat16().to(DEV),
        torch.randn(1, n, generator=g).bfloat16().to(DEV),
    ]
    (out,) = fd.execute(xs)
    assert _paths(fd) == ["PointwiseParams"], _paths(fd)
    assert torch.equal(out, xs[0] @ xs[1])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [70, 4096])
def test_gpu_expand_returned_and_read_by_a_matmul(monkeypatch, m):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    with cb.FusionDefinition() as fd:
        _expand_returned(fd, m=m)
    g = seeded(m)
    xs = [
        torch.randn(1, 512, generator=g).bfloat16().to(DEV),
        torch.randn(264, 512, generator=g).bfloat16().to(DEV),
    ]
    for _ in range(2):  # the second call runs the plan made by the first
        ex, y = fd.execute(xs)
        assert _paths(fd)[-1] == "tensor cores", _paths(fd)
        assert ex.stride() == (0, 1), ex.stride()
        xd, wd = to_double(xs[0]).cpu().expand(m, 512), to_double(xs[1]).cpu()
        check_outputs([ex, y], [xd, xd @ wd.T], written=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(K0_CASES))
def test_gpu_k_zero_is_a_fill(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    case = K0_CASES[name]
    with cb.FusionDefinition() as fd:
        _k0(fd, D.BFloat16, **case)
    for j, k in enumerate((0, 64, 0)):  # K = 0, K > 0 (the tensor cores), K = 0 again (its plan)
        xs = _k0_inputs(case, k, torch.bfloat16, DEV, m=4099, n=1030)
        outs = fd.execute(xs)
        if j < 2:  # (last_params() is the last compile's: the third call runs the first's plan)
            assert ("tensor cores" in _paths(fd)) == (k > 0), _paths(fd)
        check_outputs(outs, _k0_ref(case, xs), written=True)
