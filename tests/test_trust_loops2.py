"""Valid fusions the fuzzer found ending in lowering checks (issue 16, second round).

Each case is a fusion nobody scheduled by hand; the schedulers must either
schedule it correctly or refuse it in ``can_schedule`` (another scheduler or
the segmenter takes it). The CPU test compiles it for sm_90a, checks that
every output store on a grid depends on blockIdx, and runs plain kernels on
the interpreter (each element stored exactly once) against float64 torch;
the GPU test runs it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from tests.kir_interp import interpret
from tests.test_trust_loops import _plain, assert_stores_bind_the_grid
from tests.util import D, assert_close

DEV = "cuda"


def _reshape_back_onto_itself(fd):
    """fuzz 301:27: x[8, 1, 1] (symbolic sizes) reshaped to [8, 1, 1] and
    combined with x. Merging the size-1 axes into the 8 put x's axis 1 on
    both sides of the reshape (its broadcast meets x again): a loop axis the
    consumer lacked. Size-1 input axes of a reshape are squeezed instead."""
    x = fd.define_tensor([-1, -1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.eq(fd.ops.reshape(x, [8, 1, 1]), x))
    fd.add_output(fd.ops.add(fd.ops.reshape(x, [8, 1, 1]), x))

    def inputs(device):
        return [torch.randn(9, dtype=torch.bfloat16)[1:].view(8, 1, 1).to(device)]

    def ref(x):
        return [torch.ones(8, 1, 1, dtype=torch.bool), (2 * x).bfloat16().double()]

    return inputs, ref


def _output_without_a_row_axis(fd):
    """fuzz 302:135: a [n, m] tensor is an output and, broadcast to [5, n, m, 2],
    the input of a softmax: the reduction's grid covers 5 * n * m rows, the
    output has n * m (blockIdx.x bound to two extents). The reduction
    schedulers refuse it; the segmenter gives the output its own kernel."""
    x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    z = fd.define_tensor([-1], dtype=D.Float)
    a = fd.ops.abs(x)
    b = fd.ops.broadcast_in_dim(a, [5, -1, -1, 2], [1, 2])
    fd.add_output(fd.ops.softmax(fd.ops.add(b, fd.ops.broadcast_in_dim(z, [5, -1, -1, 2], [3])), 3))
    fd.add_output(a)
    fd.add_output(fd.ops.exp(fd.ops.add(a, 0.1)))

    def inputs(device):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(7, 24, generator=g).bfloat16()[:, 1::2]
        return [x.to(device), torch.randn(2, generator=g).to(device)]

    def ref(x, z):
        a = x.float().abs().double()
        s = (a[None, :, :, None] + z).softmax(3).expand(5, -1, -1, -1)
        return [s, a, (a + 0.1).exp()]

    return inputs, ref


CASES = {
    "301:27": _reshape_back_onto_itself,
    "302:135": _output_without_a_row_axis,
}


def _build(name):
    with cb.FusionDefinition() as fd:
        inputs, ref = CASES[name](fd)
    return fd, inputs, ref


def _check(outs, refs):
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        if o.dtype == torch.bool:
            assert torch.equal(o.cpu(), r.cpu())
        else:
            assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_runs(name):
    fd, inputs, ref = _build(name)
    xs = inputs("cpu")
    ck = fd.compile(xs, arch="sm_90a")
    kernels = getattr(ck, "kernels", None) or [ck]
    for k in kernels:
        assert_stores_bind_the_grid(k)
    if all(_plain(k) for k in kernels):
        _check(interpret(fd, xs), ref(*[x.double() for x in xs]))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = _build(name)
    xs = inputs(DEV)
    _check(fd.execute(xs), ref(*[x.double().cpu() for x in xs]))
