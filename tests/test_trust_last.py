"""Valid fusions the fuzzer found ending in lowering checks (issue 16, last round).

Each case is a fusion nobody scheduled by hand. The CPU test compiles it
for sm_90a, checks that every output store on a grid depends on blockIdx,
and runs the kernels on the interpreter against float64 torch; the GPU
test runs it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from tests.test_trust_loops import assert_stores_bind_the_grid
from tests.util import D, assert_close

DEV = "cuda"


def _linear_k_fixed_by_another_segment(fd):
    """fuzz 602:131: linear(x1[1, k], x2[130, k], bias[130]) beside
    x2 - x6[n, 130]: the sub makes k 130, the linear makes x1's k x2's. The
    union of x1's and x2's k named x1's extent the class's representative,
    which the constant reached after the union; canonicalize_extents mapped
    x2's k to 130 and left x1's symbolic (two K loops in the SIMT product)."""
    x1 = fd.define_tensor([-1, -1], dtype=D.Half)
    x2 = fd.define_tensor([-1, -1], dtype=D.Half)
    x3 = fd.define_tensor([130], dtype=D.Half)
    x6 = fd.define_tensor([-1, 130], dtype=D.Bool)
    fd.add_output(fd.ops.sub(x2, x6))
    fd.add_output(fd.ops.linear(x1, x2, x3))

    def inputs(device):
        g = torch.Generator().manual_seed(602)
        xs = [
            torch.randn(1, 130, generator=g).half(),
            torch.randn(130, 130, generator=g).half(),
            torch.randn(130, generator=g).half(),
            torch.rand(130, 130, generator=g) > 0.5,
        ]
        return [x.to(device) for x in xs]

    def ref(x1, x2, x3, x6):
        return [x2 - x6.double(), x1 @ x2.T + x3]

    return inputs, ref


def _squeeze_of_a_reshaped_size_one_axis(fd):
    """fuzz 601:84: max(x, ~prod(x)) (x Bool [127]) reshaped to [1, -1, 127]
    and squeezed back to [127]. The -1 (1 here) was split out of the 127
    input axis; the squeeze dropped that piece, so the reference's axis (the
    split's whole) could not be derived for the squeeze's consumers, which
    kept unscheduled loops while the reshape was inlined into them. A size-1
    output axis of a reshape is a new axis now, as nvFuser makes it."""
    x1 = fd.define_tensor([-1], contiguity=[True], dtype=D.Bool)
    x8 = fd.define_tensor([-1], dtype=D.Float)
    t3 = fd.ops.bitwise_not(fd.ops.prod(x1, [0], keepdim=True))
    fd.ops.broadcast_in_dim(t3, [-1, 1, 2], [0])  # unused
    t6 = fd.ops.reshape(fd.ops.maximum(x1, t3), [1, -1, 127])
    t7 = fd.ops.squeeze(t6, [0, 1])
    fd.add_output(fd.ops.ne(t7, x8))
    fd.add_output(t6)
    fd.add_output(t7)

    def inputs(device):
        g = torch.Generator().manual_seed(601)
        x = torch.rand(127, generator=g) > 0.01
        x[5] = True  # prod 1 or 0 both reachable: make it 1 on one input
        xs = [x, torch.randn(254, generator=g)[1::2]]
        return [t.to(device) for t in xs]

    def ref(x1, x8):
        x = x1.to(torch.int64)
        t3 = torch.bitwise_not(torch.prod(x, 0, keepdim=True))
        t5 = torch.maximum(x, t3)
        t6 = t5.reshape(1, 1, 127)
        return [t5 != x8, t6, t5]

    return inputs, ref


def _all_true(fd):
    """601:84 with an all-True input (prod 1, ~1 = -2: max is x)."""
    inputs, ref = _squeeze_of_a_reshaped_size_one_axis(fd)

    def inputs1(device):
        x1, x8 = inputs(device)
        return [torch.ones_like(x1), x8]

    return inputs1, ref


CASES = {
    "602:131": _linear_k_fixed_by_another_segment,
    "601:84": _squeeze_of_a_reshaped_size_one_axis,
    "601:84-all-true": _all_true,
}


def _build(name):
    with cb.FusionDefinition() as fd:
        inputs, ref = CASES[name](fd)
    return fd, inputs, ref


def _check(outs, refs):
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        if not o.is_floating_point():
            assert o.dtype == r.dtype, (o.dtype, r.dtype)
            assert torch.equal(o.cpu(), r.cpu())
        else:
            assert_close(o, r, atol=1e-2 if o.dtype == torch.float16 else None)


def _double(x):
    return x.double() if x.is_floating_point() else x


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_runs(name):
    fd, inputs, ref = _build(name)
    xs = inputs("cpu")
    ck = fd.compile(xs, arch="sm_90a")
    kernels = getattr(ck, "kernels", None) or [ck]
    for k in kernels:
        assert_stores_bind_the_grid(k)
    _check(interpret(fd, xs), ref(*[_double(x) for x in xs]))


def test_linear_k_is_one_extent():
    """602:131: i1 == i3 (the linear's K) then i3 == 130 (the sub): both
    operands' K axes become the constant, wherever the constant reaches the
    class."""
    from circbuf.scheduler.utils import canonicalize_extents

    fd, _, _ = _build("602:131")
    f = fd.fusion.clone()
    mapping = canonicalize_extents(f)
    assert mapping.get("i1") == "130" and mapping.get("i3") == "130", mapping
    x1, x2 = f.inputs[0], f.inputs[1]
    assert str(x1.logical[1].extent) == str(x2.logical[1].extent) == "130"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = _build(name)
    xs = inputs(DEV)
    _check(fd.execute(xs), ref(*[_double(x).cpu() for x in xs]))
