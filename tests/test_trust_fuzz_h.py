"""A lowering check the fuzzer hit (issue 16: fuzz 960:29 with the interp
profile), minimized: an output without an axis of the reference output,
where a reshape keeps their ranks equal.

``exp(x1[5, 127])`` returned beside ``reshape(exp(x1), [1, -1]) > x4[n, 1]``:
the reshape's new size-1 axis is a broadcast (``[1, 5, 127]`` merged to
``[1, 635]``) that meets x4's n, so the pointwise reference is ``[n, 635]``.
Both outputs have rank 2, so ``outputs have different ranks`` let the
pointwise scheduler take them in one kernel; the exp output, replayed from
the reference's merged loop, has no n to merge: its grid axis has 5 blocks
(635 / 128) where the reference's has ceilDiv(n * 635, 128), and the loop
nest refused the kernel ("another axis bound to it has extent ..."). Were
the grids one, the exp output would be written once per row of n.

The pointwise schedulers now refuse an output that lacks an axis of the
reference (nor has one a view splits or merges it from;
``_unrelated_output`` in :mod:`circbuf.scheduler.pointwise`), as nvFuser's
pointwise scheduler does not put a broadcast's producer output under the
broadcast's loops; the segmenter gives the exp output a kernel of its own
(the broadcast side recomputes exp from the input).

Each CPU test compiles the fusion for sm_90a and runs it on the kernel
interpreter against float64 torch (outputs NaN-poisoned); the GPU test runs
it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.scheduler.pointwise import PointwiseScheduler
from tests.test_trust_loops import _plain
from tests.util import D, build_case, check_outputs, seeded, to_double

DEV = "cuda"


# ------------------------------------------------------------------ the fuzz case and its variants
def _fuzz_960_29(fd):
    """fuzz 960:29 as found."""
    x1 = fd.define_tensor([5, 127], dtype=D.BFloat16)
    x4 = fd.define_tensor([-1, 1], dtype=D.Double)
    t2 = fd.ops.exp(x1)
    t3 = fd.ops.reshape(t2, [1, -1])
    t5 = fd.ops.gt(t3, x4)
    t6 = fd.ops.where(t5, 3.0, x4)
    fd.ops.broadcast_in_dim(x1, [-1, -1], [0, 1])  # unused
    t8 = fd.ops.addcmul(t6, t5, t5, 0.5)
    fd.add_output(fd.ops.neg(t8))
    fd.add_output(t2)
    fd.add_output(t6)

    def inputs(device, n=1):
        g = seeded(960)
        return [
            torch.randn(5, 127, generator=g).to(torch.bfloat16).to(device),
            torch.randn(n, 1, generator=g, dtype=torch.float64).mul(2).to(device),
        ]

    def ref(x1, x4):
        t2 = torch.exp(x1)
        t5 = (t2.reshape(1, -1) > x4).double()
        t6 = torch.where(t5 > 0, 3.0, x4)
        return [-(t6 + 0.5 * t5 * t5), t2, t6]

    return inputs, ref


def _merged_view_beside_rows(fd):
    """Minimized: exp(x[5, 127]) beside reshape(exp(x), [1, -1]) + y[n, 1]."""
    x = fd.define_tensor([5, 127], dtype=D.Float)
    y = fd.define_tensor([-1, 1], dtype=D.Float)
    e = fd.ops.exp(x)
    fd.add_output(fd.ops.add(fd.ops.reshape(e, [1, -1]), y))
    fd.add_output(e)

    def inputs(device, n=1):
        g = seeded(9601)
        return [torch.randn(5, 127, generator=g).to(device), torch.randn(n, 1, generator=g).to(device)]

    def ref(x, y):
        e = torch.exp(x)
        return [e.reshape(1, -1) + y, e]

    return inputs, ref


def _split_view_beside_rows(fd):
    """A view that splits: neg(x[24]) beside reshape(neg(x), [1, 4, 6]) * y[n, 1, 1]
    (ranks 1 and 3: the rank rule refuses it; the new rule says the same)."""
    x = fd.define_tensor([24], dtype=D.Float)
    y = fd.define_tensor([-1, 1, 1], dtype=D.Float)
    e = fd.ops.neg(x)
    fd.add_output(fd.ops.mul(fd.ops.reshape(e, [1, 4, 6]), y))
    fd.add_output(e)

    def inputs(device, n=1):
        g = seeded(9602)
        return [torch.randn(24, generator=g).to(device), torch.randn(n, 1, 1, generator=g).to(device)]

    def ref(x, y):
        return [(-x).reshape(1, 4, 6) * y, -x]

    return inputs, ref


def _reshape_keeping_rank_beside_columns(fd):
    """The new axis last: sin(x[6, 20]) beside reshape(sin(x), [-1, 1]) - y[1, m]."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    y = fd.define_tensor([1, -1], dtype=D.Float)
    s = fd.ops.sin(x)
    fd.add_output(fd.ops.sub(fd.ops.reshape(s, [-1, 1]), y))
    fd.add_output(s)

    def inputs(device, n=1):
        g = seeded(9603)
        return [torch.randn(6, 20, generator=g).to(device), torch.randn(1, n, generator=g).to(device)]

    def ref(x, y):
        s = torch.sin(x)
        return [s.reshape(-1, 1) - y, s]

    return inputs, ref


CASES = {
    "960:29": _fuzz_960_29,
    "merged": _merged_view_beside_rows,
    "split": _split_view_beside_rows,
    "columns": _reshape_keeping_rank_beside_columns,
}


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_output_without_a_reference_axis(name, n):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu", n)
    ck = fd.compile(xs, arch="sm_90a")
    assert all(_plain(k) for k in ck.kernels)  # each runs on the interpreter
    check_outputs(interpret(fd, xs), ref(*[to_double(x) for x in xs]), written=True)


def test_the_output_gets_a_kernel_of_its_own():
    """The pointwise scheduler names the output without the reference's axis;
    the compile gives it a kernel of its own."""
    fd, inputs, _ = build_case(CASES, "merged")
    why = PointwiseScheduler.can_schedule(fd.fusion)
    assert why is not None and "output 1 has no axis 0 of output 0" in why, why
    ck = fd.compile(inputs("cpu"), arch="sm_90a")
    assert len(ck.kernels) == 2, ck


def test_a_view_with_every_axis_stays_one_kernel():
    """An output a view makes every reference axis from is no such output:
    exp(x[4, 6]) beside reshape(exp(x), [6, 4]) + y[6, 4] is one kernel."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([4, 6], dtype=D.Float)
        y = fd.define_tensor([6, 4], dtype=D.Float)
        e = fd.ops.exp(x)
        fd.add_output(fd.ops.add(fd.ops.reshape(e, [6, 4]), y))
        fd.add_output(e)
    assert PointwiseScheduler.can_schedule(fd.fusion) is None
    g = seeded(9604)
    xs = [torch.randn(4, 6, generator=g), torch.randn(6, 4, generator=g)]
    assert len(fd.compile(xs, arch="sm_90a").kernels) == 1  # no segments
    e = torch.exp(xs[0].double())
    check_outputs(interpret(fd, xs), [e.reshape(6, 4) + xs[1].double(), e], written=True)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_output_without_a_reference_axis_gpu(name, n, monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs(DEV, n)
    outs = fd.execute(xs)
    check_outputs([o.cpu() for o in outs], ref(*[to_double(x.cpu()) for x in xs]), written=True)
