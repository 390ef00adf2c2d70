"""Valid fusions the fuzzer found ending in the loop nest's inline check
("inline position N exceeds the loop axes of T or its consumer", issue 16:
fuzz 931:108, 931:188), minimized.

One root cause, twice: a tensor holding one axis of the fusion twice (a
self mapping), which no reference's transforms can be replayed onto, and
which the reduction schedulers' ``can_schedule`` did not see.

- Through a broadcast (931:108): ``reshape(x[1, n, m], [1, n, 1, m])``, its
  ``var`` over axis 1 (keepdim), combined with ``neg(x)``. The reshape's new
  size-1 axis 2 meets x's axis 1 in the combination (``[1, n, m]`` lines up
  with the last three axes), and the var reduces x's axis 1 too: the reduced
  tensor holds x's axis 1 once reduced and once as that broadcast (the
  statistic is computed for every element of x's axis 1). The reduction
  scheduler's reference had the axis twice, everything else once.
  ``check_distinct_axes`` skips broadcast axes, and the fusion has no view
  relation between the two (``x[n]`` broadcast to ``[n, 1]``, summed over
  axis 0 and added to x is the same without any view).
  :func:`circbuf.scheduler.utils.view_self_mapping` now also names a tensor
  with an axis and a plain broadcast axis the fusion expands to it, so the
  segmenter computes the reduction in one kernel and combines its result
  with x in another.
- Through a view of an empty tensor (931:188): ``sum(x[0, 1, 2], [1, 2])``
  beside ``reshape(x, [0])`` joined to the sum's result: 0 x 1 x 2 = 0, so
  the reshape merges the row axis with the reduced ones into an axis that
  is the row axis again. ``view_self_mapping`` skipped tensors with no
  element (the pointwise kernel leaves their loops empty and runs: fuzz
  900:5); the reduction kernels inline the reshape's producer at the row
  and reduced loops, which the reshaped tensor lacks. The reduction
  schedulers now check empty tensors too (``empty=True``): the reduction
  runs in one kernel, the reshape in another.

Both fuzz cases have symbolic input sizes, so their reshapes have no splits
or merges until compiled, and the segmenter, which needed no sizes, could
not see either self mapping. It now concretizes a copy of such a fusion for
the first call's sizes before asking the schedulers (as it already cut axes
of different extents apart by them) and cuts the segments from the fusion.

Each CPU test compiles the fusion for sm_90a and runs it on the interpreter
against float64 torch; the GPU test runs it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.scheduler.reduction import ReductionScheduler
from circbuf.scheduler.segmenter import segment
from circbuf.scheduler.utils import LogicalMap, prepare, view_self_mapping
from tests.test_trust_loops import _plain, assert_stores_bind_the_grid
from tests.util import D, assert_close, build_case, check_outputs, seeded, to_double

DEV = "cuda"


# ------------------------------------------------ a broadcast of an axis beside it
def _var_over_reshape_beside_x(fd, shape=(-1, -1, -1)):
    """fuzz 931:108, minimized: var of reshape(x[1, n, m], [1, n, 1, m]) over
    axis 1 (keepdim) plus neg(x): [1, 1, n, m], x's axis 1 both the reduced
    axis and the reshape's new size-1 axis 2."""
    x = fd.define_tensor(list(shape), dtype=D.Float)
    v = fd.ops.var(fd.ops.reshape(x, [1, 7, 1, 5]), [1], keepdim=True, correction=0)
    fd.add_output(fd.ops.add(fd.ops.neg(x), v))

    def inputs(device):
        return [torch.randn(1, 7, 5, generator=seeded(931108)).to(device)]

    def ref(x):
        return [-x.reshape(1, 1, 7, 5) + x.reshape(1, 7, 1, 5).var(1, keepdim=True, unbiased=False)]

    return inputs, ref


def _var_over_reshape_fixed(fd):
    """The same with sizes given when defined (the reshape is concrete at once)."""
    return _var_over_reshape_beside_x(fd, (1, 7, 5))


def _fuzz_931_108(fd):
    """fuzz 931:108 as found (sizes shrunk for the interpreter): gelu, a bf16
    cast, the var combined through maximum and mul, and the gelu and its
    fp32 copy returned too."""
    x1 = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    t2 = fd.ops.gelu(x1)
    t5 = fd.ops.neg(fd.ops.cast(t2, D.BFloat16))
    t6 = fd.ops.cast(t2, D.Float)
    t8 = fd.ops.var(fd.ops.reshape(t6, [1, 13, 1, 9]), [1], keepdim=True, correction=0)
    fd.add_output(fd.ops.mul(t8, fd.ops.maximum(t5, t8)))
    fd.add_output(t2)
    fd.add_output(t6)

    def inputs(device):
        return [torch.randn([118], generator=seeded(931))[1:].view(1, 13, 9).to(device)]

    def ref(x):
        g = torch.nn.functional.gelu(x)
        n = -g.to(torch.bfloat16).double()
        v = g.reshape(1, 13, 1, 9).var(1, keepdim=True, unbiased=False)
        return [v * torch.maximum(n, v), g, g]

    return inputs, ref


def _sum_of_broadcast_beside_x(fd):
    """The same self mapping without a view: x[n] broadcast to [n, 1],
    summed over axis 0 (a [1]) and added to x: the broadcast tensor holds
    x's axis as its axis 0 and, through the add, as its broadcast axis 1."""
    x = fd.define_tensor([-1], dtype=D.Float)
    fd.add_output(fd.ops.add(x, fd.ops.sum(fd.ops.broadcast(x, [False, True]), [0])))

    def inputs(device):
        return [torch.randn(100, generator=seeded(2)).to(device)]

    def ref(x):
        return [x + x.sum()]

    return inputs, ref


# ------------------------------------------------ a view of an empty tensor
def _empty_reshape_beside_sum(fd, twice=True):
    """fuzz 931:188, minimized: x[0, 1, 2] reshaped (through [0, 1, 2]) to
    [0], added to sum(x, [1, 2]): the reshape's axis is the sum's row axis,
    merged from it and the reduced axes."""
    x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    t = fd.ops.neg(x)
    s = fd.ops.sum(t, [1, 2])
    r = fd.ops.reshape(fd.ops.reshape(t, [0, 1, 2]), [0]) if twice else fd.ops.reshape(t, [0])
    fd.add_output(fd.ops.add(r, s))
    fd.add_output(t)
    fd.add_output(s)

    def inputs(device):
        return [torch.randn(1, 2, 0, generator=seeded(931188)).permute(2, 0, 1).to(device)]

    def ref(x):
        t = -x
        return [t.reshape(0) + t.sum([1, 2]), t, t.sum([1, 2])]

    return inputs, ref


def _empty_reshape_once(fd):
    return _empty_reshape_beside_sum(fd, twice=False)


def _fuzz_931_188(fd):
    """fuzz 931:188 as found: Int64 inputs, reciprocal, addcmul with a Bool."""
    x1 = fd.define_tensor([-1, -1, -1], dtype=D.Int64)
    x4 = fd.define_tensor([1, -1, -1], dtype=D.Int64)
    x8 = fd.define_tensor([0], dtype=D.Bool)
    t2 = fd.ops.reciprocal(x1)
    t3 = fd.ops.sum(t2, [1, 2])
    fd.ops.bitwise_or(x1, x4)  # unused, as in the case
    t7 = fd.ops.reshape(fd.ops.reshape(t2, [0, 1, 2]), [0])
    fd.add_output(fd.ops.asinh(fd.ops.addcmul(t7, t3, x8, 0.5)))
    fd.add_output(t2)
    fd.add_output(t3)

    def inputs(device):
        return [
            torch.randint(-9, 10, [1, 2, 0], dtype=torch.int64, generator=seeded(1))
            .permute([2, 0, 1])
            .to(device),
            torch.randint(-9, 10, [1, 1, 2], dtype=torch.int64, generator=seeded(2)).to(device),
            (torch.rand([0], generator=seeded(3)) > 0.5).to(device),
        ]

    def ref(x1, x4, x8):
        t2 = torch.reciprocal(x1.double())
        t3 = t2.sum([1, 2])
        return [torch.asinh(t2.reshape(0) + 0.5 * t3 * x8.double()), t2, t3]

    return inputs, ref


CASES = {
    "931:108": _fuzz_931_108,
    "931:108-min": _var_over_reshape_beside_x,
    "931:108-fixed": _var_over_reshape_fixed,
    "broadcast-self": _sum_of_broadcast_beside_x,
    "931:188": _fuzz_931_188,
    "931:188-min": _empty_reshape_beside_sum,
    "931:188-once": _empty_reshape_once,
}


def _kernels(fd, xs):
    ck = fd.compile(xs, arch="sm_90a")
    return getattr(ck, "kernels", None) or [ck]


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_runs(name):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu")
    kernels = _kernels(fd, xs)
    assert len(kernels) >= 2, name  # the self mapping is cut apart
    for k in kernels:
        assert_stores_bind_the_grid(k)
    assert all(_plain(k) for k in kernels), name
    check_outputs(interpret(fd, xs), ref(*[to_double(x) for x in xs]))


def _prepared(name):
    fd, inputs, _ = build_case(CASES, name)
    ex = fd._get_executor()
    info, _ = ex._bind(inputs("cpu"), need_cuda=False, target=cb.target.DEFAULT)
    f = fd.fusion.clone()
    prepare(f, info.extents)
    return f, info


def test_broadcast_self_mapping_is_named():
    """view_self_mapping names the tensor and both axes; the reduction
    schedulers refuse the fusion with it (the segmenter then splits)."""
    for name, tensor_axes in (
        ("931:108-min", "axis 1 of T1 is a broadcast the fusion expands to its axis 3"),
        ("broadcast-self", "axis 1 of T1 is a broadcast the fusion expands to its axis 0"),
    ):
        f, _ = _prepared(name)
        why = view_self_mapping(f)
        assert why is not None and "holds one axis of the fusion twice" in why, (name, why)
        assert tensor_axes in why, why
        assert ReductionScheduler.can_schedule(f) == why


def test_normalizations_are_no_self_mapping():
    """A statistic broadcast back along the axis it reduced (softmax, layer
    norm, x - mean over a reshape) meets that axis in another tensor, never
    beside it: no self mapping, one kernel."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        y = fd.ops.reshape(x, [4, 2, 8])
        m = fd.ops.mean(y, [1, 2], keepdim=True)
        fd.add_output(fd.ops.softmax(fd.ops.sub(y, m), 2))
        fd.add_output(fd.ops.sub(x, fd.ops.mean(x, [1], keepdim=True)))
    xs = [torch.randn(4, 16, generator=seeded(3))]
    f = fd.fusion.clone()
    info, _ = fd._get_executor()._bind(xs, need_cuda=False, target=cb.target.DEFAULT)
    prepare(f, info.extents)
    assert view_self_mapping(f, LogicalMap(f), empty=True) is None
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.layer_norm(x, None, None, 1e-5))
    assert view_self_mapping(fd.fusion, empty=True) is None
    assert len(_kernels(fd, [torch.randn(6, 64)])) == 1


def test_empty_view_self_mapping_only_for_reductions():
    """An empty tensor whose view makes an axis from itself: the reduction
    schedulers refuse it (empty=True), the pointwise check leaves it (its
    loops are empty; fuzz 900:5 runs as one kernel)."""
    f, _ = _prepared("931:188-min")
    assert view_self_mapping(f) is None
    why = view_self_mapping(f, empty=True)
    assert why is not None and "combined with a view of itself" in why, why
    assert ReductionScheduler.can_schedule(f) == why


def test_segmenter_concretizes_symbolic_reshapes():
    """Given the first call's sizes, the segmenter judges a copy with the
    reshapes concretized and cuts the segments from the fusion itself (their
    reshapes stay symbolic, concretized when each segment compiles). Without
    sizes it is structural, as before: 931:188's self mapping is invisible
    and the fusion one group, which the compile then refuses."""
    from circbuf.ir import ReshapeOp

    fd, inputs, _ = build_case(CASES, "931:188-min")
    info, _ = fd._get_executor()._bind(inputs("cpu"), need_cuda=False, target=cb.target.DEFAULT)
    assert len(segment(fd.fusion)) == 1
    seg = segment(fd.fusion, info.extents)
    assert [s.scheduler for s in seg.segments] == ["normalization", "pointwise_tma"], seg
    # reshape(x, [0, 1, 2]) has symbolic sizes, its reshape to [0] fixed ones (concrete when defined)
    pending = [not e.concrete for e in fd.fusion.exprs() if isinstance(e, ReshapeOp)]
    assert pending == [True, False]  # the fusion is left as it was
    reshapes = [e for s in seg.segments for e in s.fusion.exprs() if isinstance(e, ReshapeOp)]
    assert [not e.concrete for e in reshapes] == pending


def test_squeezed_extent_counts_within_its_segment():
    """The reshape of 931:108 squeezes x's symbolic axis 0 (1 for these
    sizes): a group with the reshape knows it (the reduction takes the whole
    var with the reshape, as its compiled segment will); a group without it
    does not (the combination with x is a segment of its own)."""
    fd, inputs, _ = build_case(CASES, "931:108-min")
    info, _ = fd._get_executor()._bind(inputs("cpu"), need_cuda=False, target=cb.target.DEFAULT)
    seg = segment(fd.fusion, info.extents)
    assert [s.scheduler for s in seg.segments] == ["reduction", "pointwise_tma"], seg
    assert any(m.startswith("T2 = reshape") for m in seg.segments[0].math), seg
    assert any(m.startswith("T11 = neg") for m in seg.segments[1].math), seg


def test_later_sizes_reuse_the_segments():
    """A second call with other sizes (same groups) runs the segments made
    for the first."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        n = fd.ops.size(x, 1)
        m = fd.ops.size(x, 2)
        v = fd.ops.var(fd.ops.reshape(x, [1, n, 1, m]), [1], keepdim=True, correction=0)
        fd.add_output(fd.ops.add(fd.ops.neg(x), v))
    for shape in ((1, 7, 5), (1, 3, 4)):
        x = torch.randn(*shape, generator=seeded(shape[1]))
        (out,) = interpret(fd, [x])
        xd = x.double()
        ref = -xd.reshape(1, 1, *shape[1:]) + xd.reshape(1, shape[1], 1, shape[2]).var(
            1, keepdim=True, unbiased=False
        )
        assert_close(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs(DEV)
    check_outputs(fd.execute(xs), ref(*[to_double(x).cpu() for x in xs]))


@pytest.mark.gpu
def test_gpu_931_108_as_found(monkeypatch):
    """931:108 at its found size ([1, 127, 127]), NaN-poisoned outputs."""
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        v = fd.ops.var(fd.ops.reshape(x, [1, 127, 1, 127]), [1], keepdim=True, correction=0)
        fd.add_output(fd.ops.add(fd.ops.neg(x), v))
    x = torch.randn([16130], generator=seeded(931))[1:].view([1, 127, 127])
    (out,) = fd.execute([x.to(DEV)])
    xd = x.double()
    assert_close(
        out, -xd.reshape(1, 1, 127, 127) + xd.reshape(1, 127, 1, 127).var(1, keepdim=True, unbiased=False)
    )
