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
from circbuf.interpret import interpret
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


def _weight_output_beside_rms_norm(fd):
    """fuzz 304:182: rms_norm(silu(floor(x)), w) beside outputs of w alone
    (a [257] tensor) and of x: the row grid had no block axis for the [257]
    output (every CTA wrote all of it). Refused by the reduction schedulers,
    segmented."""
    x = fd.define_tensor([-1, -1], dtype=D.Double)
    w = fd.define_tensor([257], dtype=D.Double)
    fd.add_output(fd.ops.neg(fd.ops.sigmoid(w)))
    fd.add_output(fd.ops.abs(x))
    fd.add_output(fd.ops.rms_norm(fd.ops.silu(fd.ops.floor(x)), w, 1e-6))

    def inputs(device):
        g = torch.Generator().manual_seed(304)
        x = torch.randn(6 * 257 + 1, generator=g, dtype=torch.float64)[1:].view(6, 257)
        return [x.to(device), torch.randn(257, generator=g, dtype=torch.float64).to(device)]

    def ref(x, w):
        s = torch.nn.functional.silu(x.floor())
        return [-w.sigmoid(), x.abs(), s * (s.pow(2).mean(1, keepdim=True) + 1e-6).rsqrt() * w]

    return inputs, ref


def _empty_layer_norm_beside_a_weight_output(fd):
    """fuzz 307:108: an empty layer norm (x [0, 64, 4, 128]) then rms_norm,
    beside w * s (s a 0-dim input): the [128] output had no block axis."""
    x = fd.define_tensor([-1, 64, -1, 128], dtype=D.Float)
    w = fd.define_tensor([-1], dtype=D.Float)
    v = fd.define_tensor([-1], dtype=D.Float)
    s = fd.define_tensor([], dtype=D.Int64)
    fd.add_output(fd.ops.mul(w, s))
    fd.add_output(fd.ops.rms_norm(fd.ops.layer_norm(x, w, None, 1e-5), v, 1e-6))

    def inputs(device):
        g = torch.Generator().manual_seed(307)
        return [
            torch.randn(0, 64, 4, 131, generator=g)[..., :128].to(device),
            torch.randn(128, generator=g).to(device),
            torch.randn(128, generator=g).to(device),
            torch.tensor(-3, dtype=torch.int64).to(device),
        ]

    def ref(x, w, v, s):
        return [w * s, torch.empty(0, 64, 4, 128, dtype=torch.float64)]

    return inputs, ref


def _reshape_through_a_size_one_axis(fd):
    """fuzz 301:198: a [16, 7, 1, 7] result (inputs of symbolic sizes, one
    [16, 1, 1, 7]) reshaped to [16, 7, 1, 7] and then [112, 7]: the size-1
    axis, merged into its neighbour, met itself through the broadcast of
    the [.., 1, ..] input (loop axes bound to blockIdx.x that differ)."""
    x1 = fd.define_tensor([-1, -1, -1, -1], dtype=D.Double)
    x3 = fd.define_tensor([-1, 7, -1, 7], dtype=D.BFloat16)
    x5 = fd.define_tensor([], dtype=D.Bool)
    x7 = fd.define_tensor([-1, -1, -1, 7], dtype=D.Bool)
    x9 = fd.define_tensor([-1, 1, -1, 7], dtype=D.Half)
    t8 = fd.ops.minimum(fd.ops.le(fd.ops.sub(x1, x3), x5), x7)
    t11 = fd.ops.gt(fd.ops.add(t8, x9), x9)
    fd.add_output(fd.ops.reshape(fd.ops.reshape(t11, [16, 7, 1, 7]), [112, 7]))

    def inputs(device):
        g = torch.Generator().manual_seed(301)
        return [
            torch.randn(16, 7, 1, 7, generator=g, dtype=torch.float64).to(device),
            torch.randn(16, 7, 7, 1, generator=g).bfloat16().to(device).permute(0, 1, 3, 2),
            torch.tensor(True).to(device),
            (torch.rand(16, 14, 1, 7, generator=g) > 0.5).to(device)[:, 1::2],
            torch.randn(16, 1, 1, 7, generator=g).half().to(device),
        ]

    def ref(x1, x3, x5, x7, x9):
        t8 = torch.minimum((x1 - x3.float().double()) <= x5, x7.bool())
        h = x9.half()
        return [((t8.half() + h) > h).reshape(112, 7)]

    return inputs, ref


def _scalar_math_reshaped(fd):
    """fuzz 307:37: addcmul(cast(x), s, s) with s a 0-dim input, reshaped to
    [1, 3, 11]. The broadcast of s, hoisted through the reshape, was split
    by the view into broadcast axes of extent 3 and 11 with no expanded
    extent; the scheduler's split then gave its loops one trip (threadIdx.x
    of extent 1 inlined into one of 128)."""
    x = fd.define_tensor([-1], dtype=D.Int64)
    s = fd.define_tensor([], dtype=D.Float)
    fd.add_output(fd.ops.reshape(fd.ops.addcmul(fd.ops.cast(x, D.Float), s, s, 2.0), [1, 3, 11]))

    def inputs(device):
        g = torch.Generator().manual_seed(37)
        x = torch.randint(-9, 10, [34], generator=g, dtype=torch.int64)[1:]
        return [x.to(device), torch.randn([], generator=g).to(device)]

    def ref(x, s):
        return [(x + 2.0 * s * s).reshape(1, 3, 11)]

    return inputs, ref


def _where_of_a_scalar_reshaped(fd):
    """fuzz 305:234: where(c, x, b) with b a 0-dim Bool input, reshaped to
    [11, 3, 1] (the same split broadcast), beside an output of c."""
    c = fd.define_tensor([33], dtype=D.Bool)
    x = fd.define_tensor([-1], dtype=D.Float)
    b = fd.define_tensor([], dtype=D.Bool)
    nc = fd.ops.eq(c, False)
    fd.add_output(fd.ops.reshape(fd.ops.where(nc, x, b), [11, 3, 1]))
    fd.add_output(fd.ops.eq(nc, False))

    def inputs(device):
        g = torch.Generator().manual_seed(234)
        return [
            (torch.rand(36, generator=g) > 0.5)[:33].to(device),
            torch.randn(33, generator=g).to(device),
            torch.tensor(True).to(device),
        ]

    def ref(c, x, b):
        c = c.bool()
        return [torch.where(~c, x, b.double()).reshape(11, 3, 1), c]

    return inputs, ref


def _where_of_a_scalar_over_a_reshaped_sum(fd):
    """fuzz 306:7: sum(x, [0, 3]) reshaped to [n], compared with an input and
    chosen by where() against a 0-dim input: its broadcast, split by the
    view into [i1, i2], lost the grid's extent (blockIdx.x of extent 1
    inlined into one of ceilDiv(i1 * i2, 128))."""
    x = fd.define_tensor([-1, -1, -1, -1], dtype=D.Int32)
    v = fd.define_tensor([-1], dtype=D.Float)
    w = fd.define_tensor([-1], dtype=D.Double)
    s = fd.define_tensor([], dtype=D.Double)
    t = fd.ops.sum(x, [0, 3])
    fd.add_output(fd.ops.where(fd.ops.gt(fd.ops.reshape(t, [48]), v), w, s))
    fd.add_output(t)

    def inputs(device):
        g = torch.Generator().manual_seed(7)
        return [
            torch.randint(-9, 10, [2, 8, 3, 24], generator=g, dtype=torch.int32)
            .permute(1, 3, 0, 2)
            .to(device),
            (torch.randn(48, generator=g) * 4).to(device),
            torch.randn(49, generator=g, dtype=torch.float64)[1:].to(device),
            torch.tensor(0.25, dtype=torch.float64).to(device),
        ]

    def ref(x, v, w, s):
        t = x.sum([0, 3])
        return [torch.where(t.reshape(48).float().double() > v, w, s), t]

    return inputs, ref


CASES = {
    "301:27": _reshape_back_onto_itself,
    "302:135": _output_without_a_row_axis,
    "304:182": _weight_output_beside_rms_norm,
    "307:108": _empty_layer_norm_beside_a_weight_output,
    "301:198": _reshape_through_a_size_one_axis,
    "307:37": _scalar_math_reshaped,
    "305:234": _where_of_a_scalar_reshaped,
    "306:7": _where_of_a_scalar_over_a_reshaped_sum,
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
