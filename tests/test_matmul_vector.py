"""16-bit matmuls with a vector operand or an expanded operand run on the
tensor cores (issue 18: no bf16/fp16 matmul on the SIMT sum of products).

- A vector operand (``matmul(a[K], b[K, N])``, ``linear(x[K], w)``, a
  ``[..., M, K] @ [K]``, a dot) is defined as the 2-D product of a one-row
  (one-column) view of the vector, that axis squeezed from the result
  (``circbuf/frontend_matmul.py``): the M = 1 (N = 1) GEMM it is.
- An expanded operand (``x[1, K].expand(M, K)``, a batch of one expanded) is
  cut from the matmul, and the segmenter writes the operand's expanded axes
  out in full (``segmenter._write_out_expanded``): a tensor map reads rows.

Each case runs on the interpreter (CPU) and on the GPU with NaN-poisoned
outputs, against float64 torch; hypothesis varies the extents (1, primes).
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


def _t(fd, shape, dt):
    return fd.define_tensor([-1] * len(shape), dtype=B16[dt])


def _matmul(ashape, bshape):
    def build(fd, dt):
        fd.add_output(fd.ops.matmul(_t(fd, ashape, dt), _t(fd, bshape, dt)))
        return [ashape, bshape], lambda a, b: [a @ b]

    return build


def _linear(xshape, wshape, bias=False, act=False):
    def build(fd, dt):
        x, w = _t(fd, xshape, dt), _t(fd, wshape, dt)
        b = fd.define_tensor([-1] if len(wshape) == 2 else [], dtype=B16[dt]) if bias else None
        y = fd.ops.linear(x, w, b)
        fd.add_output(fd.ops.cast(fd.ops.silu(y), B16[dt]) if act else y)
        shapes = [xshape, wshape] + ([(wshape[0],) if len(wshape) == 2 else ()] if bias else [])

        def ref(x, w, *b):
            # (torch's F.linear refuses a bias beside a 1-D weight: x @ w + b is its meaning)
            y = x @ w + b[0] if b and w.ndim == 1 else F.linear(x, w, *b)
            return [F.silu(y) if act else y]

        return shapes, ref

    return build


def _expanded(what):
    def build(fd, dt):
        if what == "rows":  # [1, K] -> [M, K]: every row the same
            a, b = fd.define_tensor([1, -1], dtype=B16[dt]), _t(fd, (0, 0), dt)
            fd.add_output(fd.ops.matmul(fd.ops.expand(a, [70, -1]), b))
            return [(1, 64), (64, 80)], lambda a, b: [a.expand(70, 64) @ b]
        a, b = _t(fd, (0, 0), dt), fd.define_tensor([1, -1, -1], dtype=B16[dt])  # a batch of one, expanded
        fd.add_output(fd.ops.matmul(a, fd.ops.expand(b, [3, -1, -1])))
        return [(70, 64), (1, 64, 80)], lambda a, b: [a @ b.expand(3, 64, 80)]

    return build


CASES = {
    "matmul a[K] @ b[K, N]": _matmul((136,), (136, 80)),
    "matmul a[M, K] @ b[K]": _matmul((70, 136), (136,)),
    "matmul dot a[K] @ b[K]": _matmul((136,), (136,)),
    "matmul a[B, M, K] @ b[K]": _matmul((3, 70, 64), (64,)),
    "matmul a[K] @ b[B, K, N]": _matmul((64,), (3, 64, 80)),
    "linear x[K], w[N, K]": _linear((136,), (80, 136)),
    "linear x[K], w[N, K], bias, silu": _linear((136,), (80, 136), bias=True, act=True),
    "linear x[M, K], w[K], 0-D bias": _linear((70, 136), (136,), bias=True),
    "linear x[B, S, K], w[K]": _linear((2, 5, 64), (64,)),
    "expanded rows": _expanded("rows"),
    "expanded batch": _expanded("batch"),
}


def _case(name, dt, device):
    g = seeded(len(name))
    with cb.FusionDefinition() as fd:
        shapes, ref = CASES[name](fd, dt)
    xs = [torch.randn(tuple(s), generator=g).to(dt).to(device) for s in shapes]
    return fd, xs, ref


def _matmul_kernels(fd):
    def flat(p):  # (a split-K matmul segment's params are a list of its own)
        return [r for q in p for r in flat(q)] if isinstance(p, list) else [p]

    return [q for q in flat(fd.last_params()) if hasattr(q, "simt")]


def _check(fd, outs, xs, ref):
    mm = _matmul_kernels(fd)
    assert mm and all(q.simt is None for q in mm), [str(q) for q in mm]
    check_outputs(outs, ref(*[to_double(x).cpu() for x in xs]), written=True)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreted(name, dt):
    fd, xs, ref = _case(name, dt, "cpu")
    _check(fd, interpret(fd, xs), xs, ref)


def test_vector_is_a_one_row_view_in_the_definition():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    assert [type(e).__name__ for e in fd.fusion.exprs()] == ["BroadcastOp", "MatmulOp", "SqueezeOp"]


def test_fp32_vector_keeps_one_expr():
    # fp32 (TF32 decided per call) and fp64 keep the 1-D matmul: the FFMA path
    # and the sum of products take it whole
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=D.Float)
        b = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.matmul(a, b))
    assert [type(e).__name__ for e in fd.fusion.exprs()] == ["MatmulOp"]


def test_one_d_weight_takes_a_zero_d_bias_only():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        with pytest.raises(cb.CircbufError, match="bias T2 must be 0-D for a 1-D weight"):
            fd.ops.linear(x, w, b)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.sampled_from([1, 2, 7, 61, 128]),
    k=st.sampled_from([8, 64, 136, 264]),
    vec=st.sampled_from(["a", "b"]),
)
def test_interpreted_shapes(m, k, vec):
    g = seeded(m * 1000 + k)
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1] if vec == "a" else [-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1] if vec == "b" else [-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    xs = [
        torch.randn(*((k,) if vec == "a" else (m, k)), generator=g).bfloat16(),
        torch.randn(*((k,) if vec == "b" else (k, m)), generator=g).bfloat16(),
    ]
    _check(fd, interpret(fd, xs), xs, lambda a, b: [a @ b])


@pytest.mark.gpu
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name, dt):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, xs, ref = _case(name, dt, DEV)
    _check(fd, fd.execute(xs), xs, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(4096, 4096), (14336, 4096), (4099, 1021)])
def test_gpu_decode_vector(monkeypatch, n, k):
    """A decode step's matrix-vector product, at a Llama's sizes and odd ones."""
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    g = seeded(n + k)
    xs = [torch.randn(k, generator=g).bfloat16().to(DEV), torch.randn(n, k, generator=g).bfloat16().to(DEV)]
    _check(fd, fd.execute(xs), xs, lambda x, w: [F.linear(x, w)])


def test_split_k_override_reaches_the_matmul_segment():
    """``schedule(split_k=2)`` on a fusion the segmenter cuts (the expand, then
    the matmul): the matmul's segment takes it; the whole fusion once raised
    that its operand was computed in the fusion."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(fd.ops.expand(x, [128, -1]), w))
    fd.fusion.schedule(split_k=2)
    g = seeded(3)
    xs = [torch.randn(1, 256, generator=g).bfloat16(), torch.randn(64, 256, generator=g).bfloat16()]
    outs = interpret(fd, xs)
    # the matmul's segment runs split, summed in its kernel
    assert fd.last_params()[-1].split_k == 2, fd.last_params()
    _check(fd, outs, xs, lambda x, w: [x.expand(128, 256) @ w.T])
    fd.fusion.schedule(split_k=2, split_k_sum="reduction")
    outs = interpret(fd, xs)
    # summed by a reduction kernel: the segment's params are the partial products' and the reduction's
    assert isinstance(fd.last_params()[-1], list), fd.last_params()
    _check(fd, outs, xs, lambda x, w: [x.expand(128, 256) @ w.T])


@pytest.mark.gpu
def test_gpu_split_k_segment_last(monkeypatch):
    """A split-K matmul as the fusion's last segment: ``last_params()`` and
    ``print`` of the compiled fusion once failed (the split-K segment's
    kernels compile on its first run, after the plan was recorded)."""
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(fd.ops.expand(x, [128, -1]), w))
    fd.fusion.schedule(split_k=2, split_k_sum="reduction")
    g = seeded(4)
    xs = [
        torch.randn(1, 512, generator=g).bfloat16().to(DEV),
        torch.randn(256, 512, generator=g).bfloat16().to(DEV),
    ]
    for _ in range(2):
        outs = fd.execute(xs)
        _check(fd, outs, xs, lambda x, w: [x.expand(128, 512) @ w.T])
    assert "split-K" in str(fd._get_executor().last)


# ---- found by review


@pytest.mark.parametrize("ashape,bshape", [([1], [1, -1]), ([1], [1]), ([-1, 1], [1, -1])])
def test_k_fixed_to_one_is_an_outer_product(ashape, bshape):
    """K defined as 1 (a broadcast axis, as torch.compile defines a static size
    1): an outer product, defined elementwise (tests/test_matmul_no_simt.py);
    the tensor-core path's one-row operand tiles once met a lowering check."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor(ashape, dtype=D.BFloat16)
        b = fd.define_tensor(bshape, dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    g = seeded(len(ashape) + len(bshape))
    xs = [
        torch.randn(*[7 if s == -1 else s for s in ashape], generator=g).bfloat16(),
        torch.randn(*[24 if s == -1 else s for s in bshape], generator=g).bfloat16(),
    ]
    check_outputs(interpret(fd, xs), [to_double(xs[0]) @ to_double(xs[1])], written=True)


def test_expand_returned_keeps_its_stride_zero_layout():
    """An expand that is both returned and a matmul operand: returned as
    torch's stride-0 view (the segmenter writes out only operands it does
    not return)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        e = fd.ops.expand(x, [70, -1])
        fd.add_output(e)
        fd.add_output(fd.ops.matmul(e, w))
    g = seeded(9)
    xs = [torch.randn(1, 64, generator=g).bfloat16(), torch.randn(64, 80, generator=g).bfloat16()]
    ex, mm = interpret(fd, xs)
    assert ex.stride() == (0, 1), ex.stride()
    check_outputs(
        [ex, mm], [to_double(xs[0]).expand(70, 64), to_double(xs[0]).expand(70, 64) @ to_double(xs[1])]
    )


@pytest.mark.parametrize("op", ["matmul", "linear"])
def test_k_mismatch_names_the_users_tensors(op):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([64], dtype=D.BFloat16)
        b = fd.define_tensor([32, -1] if op == "matmul" else [-1, 32], dtype=D.BFloat16)
        with pytest.raises(cb.CircbufError, match=rf"{op}: K of T0 \(64\) and T1 \(32\) differ"):
            getattr(fd.ops, op)(a, b)
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(getattr(fd.ops, op)(a, b))
    bad = [
        torch.randn(64).bfloat16(),
        torch.randn(32, 16).bfloat16() if op == "matmul" else torch.randn(16, 32).bfloat16(),
    ]
    with pytest.raises(cb.CircbufError, match=rf"{op}: K of T0 and T1"):
        fd.compile(bad, arch="sm_90a")
