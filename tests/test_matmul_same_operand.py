"""A matmul or linear whose two operands read one tensor: ``x @ x`` of a
square x, the Gram matrix ``linear(x, x)`` = ``x @ x.T``, also written with a
permute (``matmul(x, permute(x))``, ``x.T @ x``, ``relu(x) @ x.T``). The
tensor's axes would be one axis of the fusion twice over (M and K, or M and N),
which no loop nest walks; the fusion is cut so that the B operand's side of the
matmul's segment reads the tensor as a second input with axes of its own
(``segmenter._b_side_reads``), and runs on the matmul scheduler like any other
(tensor cores for 16-bit operands).

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
DT = {torch.bfloat16: D.BFloat16, torch.float16: D.Half, torch.float32: D.Float}


def _square(fd, dt):
    a = fd.define_tensor([-1, -1], dtype=DT[dt])
    fd.add_output(fd.ops.matmul(a, a))
    return [(96, 96)], lambda a: [a @ a]


def _gram(fd, dt):
    x = fd.define_tensor([-1, -1], dtype=DT[dt])
    fd.add_output(fd.ops.linear(x, x))
    return [(80, 72)], lambda x: [x @ x.T]


def _gram_bias_relu(fd, dt):
    x = fd.define_tensor([-1, -1], dtype=DT[dt])
    b = fd.define_tensor([-1], dtype=DT[dt])
    fd.add_output(fd.ops.cast(fd.ops.relu(fd.ops.linear(x, x, b)), DT[dt]))
    return [(80, 72), (80,)], lambda x, b: [F.relu(F.linear(x, x, b))]


def _batched_square(fd, dt):
    a = fd.define_tensor([-1, -1, -1], dtype=DT[dt])
    fd.add_output(fd.ops.matmul(a, a))
    return [(3, 40, 40)], lambda a: [a @ a]


def _computed_operand(fd, dt):
    a = fd.define_tensor([-1, -1], dtype=DT[dt])
    r = fd.ops.cast(fd.ops.relu(a), DT[dt])
    fd.add_output(fd.ops.matmul(r, r))
    return [(64, 64)], lambda a: [F.relu(a) @ F.relu(a)]


def _returned_too(fd, dt):
    x = fd.define_tensor([-1, -1], dtype=DT[dt])
    fd.add_output(fd.ops.linear(x, x))
    fd.add_output(fd.ops.sum(x, [1]))
    return [(48, 64)], lambda x: [x @ x.T, x.sum(1)]


def _x_xt(fd, dt):
    a = fd.define_tensor([-1, -1], dtype=DT[dt])
    fd.add_output(fd.ops.matmul(a, fd.ops.permute(a, [1, 0])))
    return [(80, 72)], lambda a: [a @ a.T]


def _xt_x(fd, dt):
    a = fd.define_tensor([-1, -1], dtype=DT[dt])
    fd.add_output(fd.ops.matmul(fd.ops.permute(a, [1, 0]), a))
    return [(80, 72)], lambda a: [a.T @ a]


def _relu_x_xt(fd, dt):
    a = fd.define_tensor([-1, -1], dtype=DT[dt])
    r = fd.ops.cast(fd.ops.relu(a), DT[dt])
    fd.add_output(fd.ops.matmul(r, fd.ops.permute(a, [1, 0])))
    return [(64, 48)], lambda a: [F.relu(a) @ a.T]


CASES = {
    "x @ x": _square,
    "linear(x, x)": _gram,
    "linear(x, x, b), relu": _gram_bias_relu,
    "batched x @ x": _batched_square,
    "relu(x) @ relu(x)": _computed_operand,
    "linear(x, x) and a sum of x": _returned_too,
    "x @ x.T (a permute)": _x_xt,
    "x.T @ x (a permute)": _xt_x,
    "relu(x) @ x.T": _relu_x_xt,
}


def _case(name, dt, device):
    g = seeded(len(name))
    with cb.FusionDefinition() as fd:
        shapes, ref = CASES[name](fd, dt)
    xs = [torch.randn(s, generator=g).to(dt).to(device) for s in shapes]
    return fd, xs, ref


def _check(fd, outs, xs, ref, dt):
    ps = fd.last_params()
    ps = ps if isinstance(ps, list) else [ps]
    mm = [p for p in ps if hasattr(p, "simt")]
    assert mm, [str(p) for p in ps]
    if dt != torch.float32:  # 16-bit operands: the tensor cores
        assert all(p.simt is None for p in mm), [str(p) for p in mm]
    check_outputs(outs, ref(*[to_double(x).cpu() for x in xs]), written=True)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreted(name, dt):
    fd, xs, ref = _case(name, dt, "cpu")
    _check(fd, interpret(fd, xs), xs, ref, dt)


def test_the_segment_reads_the_tensor_twice():
    fd, xs, _ = _case("linear(x, x)", torch.bfloat16, "cpu")
    ck = fd.compile(xs, arch="sm_90a")
    (seg,) = ck.segments.segments
    assert len(seg.fusion.inputs) == 2
    a, b = seg.fusion.inputs
    assert a.name != b.name and {i.id for i in a.logical}.isdisjoint(i.id for i in b.logical)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_a_dot_of_a_computed_vector_with_itself_is_one_kernel(dt):
    """relu(v) @ relu(v): a vector's one axis is K on both sides; one kernel, as before."""
    with cb.FusionDefinition() as fd:
        v = fd.define_tensor([-1], dtype={torch.float32: D.Float, torch.float64: D.Double}[dt])
        r = fd.ops.relu(v)
        fd.add_output(fd.ops.matmul(r, r))
    x = torch.randn(40, generator=seeded(3), dtype=dt)
    (out,) = interpret(fd, [x])
    assert not isinstance(fd.last_params(), list)
    check_outputs([out], [torch.relu(x.double()) @ torch.relu(x.double())], written=True)


def test_an_expanded_operand_read_twice_is_written_out_twice():
    """expand(v) @ expand(v) (every row v): both inputs of the matmul's segment, the
    operand and its second reading, are the expand written out in full."""
    with cb.FusionDefinition() as fd:
        v = fd.define_tensor([-1], dtype=D.BFloat16)
        e = fd.ops.broadcast_in_dim(v, [v.size(0), -1], [1])
        fd.add_output(fd.ops.matmul(e, e))
    x = torch.randn(32, generator=seeded(4)).bfloat16()
    (out,) = interpret(fd, [x])
    ex = x.double().expand(32, 32)
    check_outputs([out], [ex @ ex], written=True)


def test_non_square_x_at_x_is_refused_by_name():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, a))
    with pytest.raises(cb.CircbufError):
        fd.execute([torch.randn(64, 96).bfloat16()])


@pytest.mark.gpu
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_on_gpu(name, dt):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    fd, xs, ref = _case(name, dt, DEV)
    _check(fd, [o.cpu() for o in fd.execute(xs)], xs, ref, dt)
