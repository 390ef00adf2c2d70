"""A matmul whose M or N the definition fixes to 1 runs on the tensor cores.

``define_tensor([1, K])`` makes axis 0 a broadcast (nvFuser's semantics), and
torch.compile's static shapes define a batch-1 decode step's activations that
way: ``linear(x[1, 4096], w)`` under ``torch.compile(backend="circbuf")`` ran
on the SIMT sum of products (~100x slower than cuBLAS) because a broadcast
axis is not allocated and the operand tile would have had no rows. The matmul
scheduler now turns that broadcast axis, the matmul output's and those of the
elementwise epilogue computed from it into iteration axes of extent 1
(``matmul_path.fixed_ones``); a consumer that is no elementwise op (the reshape
after ``aten.mm`` of a ``[1, 1, K]`` input) makes the segmenter cut the
matmul from it instead.

Each case runs on the interpreter (CPU) and on the GPU with NaN-poisoned
outputs, against float64 torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import circbuf as cb
from circbuf.interpret import interpret
from tests.util import D, check_outputs, seeded, to_double

DEV = "cuda"


def _bf16(g, *shape):
    return torch.randn(*shape, generator=g).bfloat16()


def _linear_bias_silu(fd, g):
    x = fd.define_tensor([1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    b = fd.define_tensor([-1], dtype=D.BFloat16)
    fd.add_output(fd.ops.cast(fd.ops.silu(fd.ops.linear(x, w, b)), D.BFloat16))
    return [_bf16(g, 1, 128), _bf16(g, 192, 128), _bf16(g, 192)], lambda x, w, b: [F.silu(x @ w.T + b)]


def _matmul_row(fd, g):
    x = fd.define_tensor([1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.matmul(x, w))
    return [_bf16(g, 1, 64), _bf16(g, 64, 136)], lambda x, w: [x @ w]


def _linear_one_column(fd, g):
    x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.linear(x, w))
    return [_bf16(g, 70, 64), _bf16(g, 1, 64)], lambda x, w: [x @ w.T]


def _linear_3d(fd, g):
    x = fd.define_tensor([1, 1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.linear(x, w))
    return [_bf16(g, 1, 1, 64), _bf16(g, 96, 64)], lambda x, w: [x @ w.T]


def _batched(fd, g):
    x = fd.define_tensor([2, 1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.matmul(x, w))
    return [_bf16(g, 2, 1, 64), _bf16(g, 64, 80)], lambda x, w: [x @ w]


def _residual_row(fd, g):
    x = fd.define_tensor([1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    r = fd.define_tensor([1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.linear(x, w), r), D.BFloat16))
    return [_bf16(g, 1, 64), _bf16(g, 128, 64), _bf16(g, 1, 128)], lambda x, w, r: [x @ w.T + r]


def _split_k(fd, g):
    x = fd.define_tensor([1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.cast(fd.ops.relu(fd.ops.linear(x, w)), D.BFloat16))
    fd.fusion.schedule(split_k=2)
    return [_bf16(g, 1, 256), _bf16(g, 64, 256)], lambda x, w: [torch.relu(x @ w.T)]


CASES = {
    "linear [1, K] + bias + silu": _linear_bias_silu,
    "matmul [1, K] @ [K, N]": _matmul_row,
    "linear with W [1, K] (N fixed to 1)": _linear_one_column,
    "linear [1, 1, K]": _linear_3d,
    "batched [2, 1, K] @ [K, N]": _batched,
    "linear + residual [1, N]": _residual_row,
    "split_k=2": _split_k,
}


def _case(name, device):
    with cb.FusionDefinition() as fd:
        xs, ref = CASES[name](fd, seeded(len(name)))
    return fd, [x.to(device) for x in xs], ref


def _tensor_cores(fd):
    p = fd.last_params()
    return all(
        getattr(q, "simt", 0) is None for q in (p if isinstance(p, list) else [p]) if hasattr(q, "simt")
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreted(name):
    fd, xs, ref = _case(name, "cpu")
    outs = interpret(fd, xs)
    assert _tensor_cores(fd), fd.last_params()
    check_outputs(outs, ref(*[to_double(x) for x in xs]), written=True)


def test_a_reshape_after_the_matmul_is_cut_away():
    """mm of a [1, K] view, then a reshape of the result (torch.compile's graph
    of linear on [1, 1, K]): the matmul is a segment of its own on the tensor
    cores."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.reshape(fd.ops.linear(x, w), [1, 1, -1])
        fd.add_output(fd.ops.cast(fd.ops.silu(y), D.BFloat16))
    g = seeded(11)
    xs = [_bf16(g, 1, 64), _bf16(g, 128, 64)]
    (out,) = interpret(fd, xs)
    params = fd.last_params()
    assert isinstance(params, list) and params[0].simt is None, params
    xd, wd = (to_double(t) for t in xs)
    check_outputs([out], [F.silu(xd @ wd.T).reshape(1, 1, -1)], written=True)


@pytest.mark.parametrize("shape", [(1, 4096), (1, 1, 4096)])
def test_torch_compile_decode_step_takes_the_tensor_cores(monkeypatch, shape):
    """A batch-1 decode linear under torch.compile: its static shapes fix M = 1."""
    import circbuf.dynamo as cd

    seen = []
    compile_ = cb.FusionDefinition.compile

    def spy(self, *a, **k):
        ck = compile_(self, *a, **k)
        seen.append(self.last_params())
        return ck

    monkeypatch.setattr(cb.FusionDefinition, "compile", spy)
    torch._dynamo.reset()
    w = torch.randn(4096, 4096, dtype=torch.bfloat16)
    cd.explain(lambda x, w: F.silu(F.linear(x, w)), torch.randn(*shape, dtype=torch.bfloat16), w)
    params = [q for p in seen for q in (p if isinstance(p, list) else [p])]
    mm = [q for q in params if hasattr(q, "simt")]
    assert mm and all(q.simt is None for q in mm), [str(q) for q in params]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, xs, ref = _case(name, DEV)
    outs = fd.execute(xs)
    assert _tensor_cores(fd), fd.last_params()
    check_outputs(outs, ref(*[to_double(x).cpu() for x in xs]), written=True)


# ---- found by review: the matmul's one row broadcast against an epilogue input's rows


def _broadcast_residual(rows, defined):
    def case(fd, g):
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        r = fd.define_tensor(defined, dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.linear(x, w), r), D.BFloat16))
        return [_bf16(g, 1, 64), _bf16(g, 128, 64), _bf16(g, rows, 128)], lambda x, w, r: [x @ w.T + r]

    return case


BROADCASTS = {
    "[1, K] @ W.T + r[4, N] (static)": _broadcast_residual(4, [4, 128]),
    "[1, K] @ W.T + r[-1, -1] of 3 rows": _broadcast_residual(3, [-1, -1]),
    "[1, K] @ W.T + r[-1, -1] of 1 row": _broadcast_residual(1, [-1, -1]),
}


@pytest.mark.parametrize("name", sorted(BROADCASTS))
def test_one_row_broadcast_against_rows_is_cut_away(name):
    """torch broadcasts the matmul's one row to the residual's rows; the tile's
    zero-filled rows are no such broadcast (rows 1.. once held the residual
    alone, and a [-1, -1] residual met a lowering check): the matmul is a
    kernel of its own on the tensor cores, the add another."""
    with cb.FusionDefinition() as fd:
        xs, ref = BROADCASTS[name](fd, seeded(len(name)))
    outs = interpret(fd, xs)
    params = fd.last_params()
    assert isinstance(params, list) and params[0].simt is None, params
    check_outputs(outs, ref(*[to_double(x) for x in xs]), written=True)


def test_fp32_one_row_broadcast_keeps_the_sum_of_products():
    """TF32 off: the FFMA path's tile would meet the same broadcast; the sum of
    products (torch's broadcasting) takes it."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.Float)
        w = fd.define_tensor([-1, -1], dtype=D.Float)
        r = fd.define_tensor([3, -1], dtype=D.Float)
        fd.add_output(fd.ops.add(fd.ops.linear(x, w), r))
    g = seeded(5)
    xs = [
        torch.randn(1, 64, generator=g),
        torch.randn(128, 64, generator=g),
        torch.randn(3, 128, generator=g),
    ]
    (out,) = interpret(fd, xs)
    ref = xs[0].double() @ xs[1].double().T + xs[2].double()
    assert (out.double() - ref).abs().max() < 1e-4


def test_one_tensor_as_both_operands():
    """linear(x, x) with x [1, K]: M and N would be one axis; the sum of products."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(x, x))
    xs = [_bf16(seeded(2), 1, 64)]
    (out,) = interpret(fd, xs)
    xd = to_double(xs[0])
    check_outputs([out], [xd @ xd.T], written=True)


def test_mma_form_refuses_a_fixed_one():
    from circbuf.scheduler import mma_form

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, 64], dtype=D.BFloat16)
        w = fd.define_tensor([128, 64], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    with pytest.raises(cb.CircbufError, match="an M or N extent of 1 fixed in the definition"):
        mma_form(fd.fusion)
