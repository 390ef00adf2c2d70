"""Valid fusions the fuzzer found ending in a lowering check or an
undocumented refusal (issue 16, seeds 708 and 709), minimized.

Each CPU test compiles the fusion for sm_90a, checks that every output
store on a grid depends on blockIdx, and runs kernels without TMA on the
interpreter against float64 torch; the GPU test runs it with NaN-poisoned
outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.scheduler.matmul import MatmulScheduler
from circbuf.scheduler.utils import LogicalMap, hoist_broadcasts
from tests.test_trust_loops import _plain, assert_stores_bind_the_grid
from tests.util import D, build_case, check_outputs, seeded, to_double

DEV = "cuda"


# ------------------------------------------------ 708:1: hoisted broadcasts
def _expand_beside_its_broadcast(fd):
    """fuzz 708:1: b = broadcast_in_dim(f(x), [n, 5, 31]) and expand(b) both
    returned. hoist_broadcasts rewrote expand(b) as f(expand(x)): a copy of
    the elementwise chain whose broadcast of x, merged with the inner one into
    one broadcast, had a new axis of 5 of its own. Nothing joined it to b's,
    so the pointwise loop over b's (n * 5 * 31) elements did not reach the
    expand's output, which kept a loop over its 5 and a grid of n * 31 / 128:
    two extents for blockIdx.x. A merged broadcast now keeps the inner one's
    axes joined to the original's (TensorView.joined_axes)."""
    x = fd.define_tensor([-1, 31], dtype=D.Bool)
    t = fd.ops.bitwise_or(fd.ops.ne(x, True), x)
    b = fd.ops.broadcast_in_dim(t, [-1, 5, 31], [0, 2])
    fd.add_output(b)
    fd.add_output(fd.ops.expand(b, [-1, -1, -1]))

    def inputs(device):
        return [(torch.rand(7, 31, generator=seeded(708)) > 0.5).to(device)]

    def ref(x):
        t = (x != True) | x  # noqa: E712  (the fusion's ne(x, True))
        b = t[:, None, :].expand(7, 5, 31)
        return [b, b]

    return inputs, ref


def _broadcast_beside_a_reduction(fd):
    """The same root through the reduction scheduler: s = -broadcast(x) to
    [n, 5, 31], returned broadcast to [n, 5, 1, 31] and summed over its 31.
    The hoisted copy of s lost the 5 of the sum's rows (grid n * 5 vs n)."""
    x = fd.define_tensor([-1, 31], dtype=D.Float)
    s = fd.ops.neg(fd.ops.broadcast_in_dim(x, [-1, 5, 31], [0, 2]))
    fd.add_output(fd.ops.broadcast_in_dim(s, [-1, 5, 1, 31], [0, 1, 3]))
    fd.add_output(fd.ops.sum(s, [2]))

    def inputs(device):
        return [torch.randn(7, 31, generator=seeded(7081)).to(device)]

    def ref(x):
        s = -x[:, None, :].expand(7, 5, 31)
        return [s[:, :, None, :], s.sum(2)]

    return inputs, ref


def _identity_broadcast_beside_its_input(fd):
    """Likewise with a broadcast that adds no axis (broadcast_in_dim to the
    same shape) returned beside its input."""
    x = fd.define_tensor([-1, 31], dtype=D.Float)
    s = fd.ops.neg(fd.ops.broadcast_in_dim(x, [-1, 5, 31], [0, 2]))
    fd.add_output(fd.ops.broadcast_in_dim(s, [-1, 5, 31], [0, 1, 2]))
    fd.add_output(s)

    def inputs(device):
        return [torch.randn(7, 31, generator=seeded(7082)).to(device)]

    def ref(x):
        s = -x[:, None, :].expand(7, 5, 31)
        return [s, s]

    return inputs, ref


# ------------------------------------ 709:174: the matmul's SIMT fallback
def _linear_beside_its_bias(fd, m=4, k=10, n=6, seed=709):
    """fuzz 709:174 (a [n] output of the bias beside linear(x, w, bias)):
    the matmul scheduler's can_schedule took it, but the tensor cores never
    write an output of another shape than the matmul's, and the SIMT path it
    falls back to (a sum of products the reduction scheduler runs) has no
    grid over [n] alone: "no path takes it" at compile. can_schedule now asks
    the reduction scheduler about the decomposition, so the segmenter gives
    the [n] output a kernel of its own. K = 10 bf16 (20-byte rows) is no
    tensor map's: the SIMT path ran it until issue 18; now its operands are
    copied to aligned rows and the TMA path runs (the kernel interpreter
    runs it)."""
    x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    bias = fd.define_tensor([-1], dtype=D.BFloat16)
    fd.add_output(fd.ops.mul(bias, 2.0))
    fd.add_output(fd.ops.linear(x, w, bias))

    def inputs(device):
        g = seeded(seed)
        xs = [torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)]
        return [t.bfloat16().to(device) for t in xs]

    def ref(x, w, bias):
        return [bias * 2, x @ w.T + bias]

    return inputs, ref


def _linear_beside_its_bias_tensor_cores(fd):
    """709:174 with inputs the tensor cores take (K = 64): segmented the same
    way, the linear on the tensor cores."""
    return _linear_beside_its_bias(fd, m=128, k=64, n=96, seed=7091)


def _float_matmul_beside_its_bias(fd):
    """A Float matmul (always the SIMT path) with a bias epilogue and the
    bias's [n] returned too."""
    a = fd.define_tensor([-1, -1], dtype=D.Float)
    b = fd.define_tensor([-1, -1], dtype=D.Float)
    bias = fd.define_tensor([-1], dtype=D.Float)
    c = fd.ops.matmul(a, b)
    fd.add_output(fd.ops.add(c, fd.ops.broadcast_in_dim(bias, [-1, -1], [1])))
    fd.add_output(fd.ops.mul(bias, 2.0))

    def inputs(device):
        g = seeded(7092)
        xs = [torch.randn(5, 9, generator=g), torch.randn(9, 7, generator=g), torch.randn(7, generator=g)]
        return [t.to(device) for t in xs]

    def ref(a, b, bias):
        return [a @ b + bias, bias * 2]

    return inputs, ref


CASES = {
    "708:1": _expand_beside_its_broadcast,
    "708:1-reduction": _broadcast_beside_a_reduction,
    "708:1-identity": _identity_broadcast_beside_its_input,
    "709:174": _linear_beside_its_bias,
    "709:174-tensor-cores": _linear_beside_its_bias_tensor_cores,
    "709:174-float": _float_matmul_beside_its_bias,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_runs(name):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu")
    ck = fd.compile(xs, arch="sm_90a")
    kernels = getattr(ck, "kernels", None) or [ck]
    for k in kernels:
        assert_stores_bind_the_grid(k)
    if name == "709:174-tensor-cores":
        assert any(k.params.__class__.__name__ == "MatmulParams" and k.params.simt is None for k in kernels)
        return  # wgmma and TMA: the GPU test runs it
    if name == "709:174":  # the linear's segment: its operands (rows of 20 bytes) are copied
        # to aligned rows (circbuf.realign) and the tensor cores read them by TMA
        mm = [k.params for k in kernels if k.params.__class__.__name__ == "MatmulParams"]
        assert mm and mm[0].simt is None and mm[0].fill == ("tma", "tma")
        out = interpret(fd, xs)
    else:
        assert all(_plain(k) for k in kernels), name
        out = interpret(fd, xs)
    check_outputs(out, ref(*[to_double(x) for x in xs]), exact_dtype=True)


@pytest.mark.parametrize("name", ["708:1", "708:1-reduction", "708:1-identity"])
def test_hoisted_copy_keeps_the_broadcast_axes(name):
    """After hoist_broadcasts, every output axis of extent 5 is one axis of
    the fusion (the loop one kernel runs over it), as before the rewrite."""
    fd, _, _ = build_case(CASES, name)
    f = fd.fusion.clone()

    def fives(f):
        lmap = LogicalMap(f)
        return {lmap.find(i) for o in f.outputs for i in o.logical if str(i.loop_extent) == "5"}

    assert len(fives(f)) == 1
    hoist_broadcasts(f)
    assert len(fives(f)) == 1


def test_matmul_refuses_what_its_simt_path_cannot_take():
    """The whole 709:174 fusion is refused by the matmul scheduler's
    can_schedule (the segmenter splits it; a bf16 matmul beside an output of
    another shape is cut out for the tensor cores, before the SIMT path's
    own rule is asked), and a matmul with a same-shape epilogue output is
    still taken whole."""
    fd, _, _ = build_case(CASES, "709:174")
    why = MatmulScheduler.can_schedule(fd.fusion)
    assert why is not None and "does not have the matmul output's shape" in why, why
    with cb.FusionDefinition() as fd2:
        x = fd2.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd2.define_tensor([-1, -1], dtype=D.BFloat16)
        bias = fd2.define_tensor([-1], dtype=D.BFloat16)
        fd2.add_output(fd2.ops.relu(fd2.ops.linear(x, w, bias)))
    assert MatmulScheduler.can_schedule(fd2.fusion) is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs(DEV)
    check_outputs(fd.execute(xs), ref(*[to_double(x).cpu() for x in xs]), exact_dtype=True)
