"""Valid fusions the fuzzer found ending in lowering checks (issue 16,
seeds 701-709): reductions over, or rows of, axes of one element, and a
tensor combined with a view of itself.

Two root causes:

- Axes of one element (extent 1, fixed when compiling: a squeezed symbolic
  axis, a reduction over a size-1 axis). The reduction schedulers split
  the rows (outer layout) or the reduced axes (inner layout) over threads
  even when every one of them had one element, so a tensor a squeeze or a
  reshape left without them (``squeeze(softmax(x[n, 1], 1), [1])``) had
  fewer loops than its producer: fuzz 708:111, 701:38, 702:41, 704:181.
  Now the plain reduction scheduler reduces across threads only real
  (longer) axes, a reduction of one element per row is per thread, rows
  of one element go innermost; the normalization scheduler refuses rows of
  one element that a view drops, the outer-reduction one a reduction of
  one element.
- A view self mapping (fuzz 709:50): ``x[128, 1] == reshape(x, [2, 64, 1, 1])``
  (broadcast to [2, 64, 128, 1]) holds x's axis 0 both as itself and,
  through the reshape, as the two pieces; no reference's transforms can be
  replayed onto x for both. The pointwise and reduction schedulers refuse
  it by name (:func:`circbuf.scheduler.utils.view_self_mapping`), so the
  segmenter computes the reshape in a kernel of its own.

Each CPU test compiles the minimized fusion for sm_90a and, where the
kernels are plain (no TMA), runs it on the interpreter against float64
torch; the GPU test runs it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from tests.test_trust_loops import _plain, assert_stores_bind_the_grid
from tests.util import D, assert_close, build_case, check_outputs, seeded, to_double

DEV = "cuda"


# ------------------------------------------------------------------ one-element axes
def _sum_rows_of_one_squeezed(fd):
    """fuzz 708:111, minimized: a [1, n, 1, 1] broadcast of x[n, 1] (x
    expanded: stride 0) summed over n and squeezed to 0-dim. Every row axis
    of the reduction has one element; the outer layout split that one row
    over 128 threads, the squeeze's output had no loops for them."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    t = fd.ops.broadcast(x, [True, False, True, False])
    fd.add_output(fd.ops.squeeze(fd.ops.sum(t, [1]), [0, 1, 2]))
    fd.add_output(t)

    def inputs(device):
        return [torch.randn(1, 1, generator=seeded(708)).expand(127, 1).to(device)]

    def ref(x):
        return [x.sum(0).reshape([]), x[None, :, None, :]]

    return inputs, ref


def _outer_sum_of_one_column(fd):
    """708:111 at its simplest: sum(x[n, 1], [0]) squeezed to 0-dim."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    fd.add_output(fd.ops.squeeze(fd.ops.sum(x, [0]), [0]))

    def inputs(device):
        return [torch.randn(300, 1, generator=seeded(1)).to(device)]

    def ref(x):
        return [x.sum(0).squeeze(0)]

    return inputs, ref


def _softmax_over_one_squeezed(fd):
    """fuzz 701:38, minimized: softmax over a size-1 axis, that axis
    squeezed (relu after it). The inner layout split the one element over
    32 threads; the squeezed tensor had no loops for them."""
    x = fd.define_tensor([32, -1, -1], dtype=D.Float)
    fd.add_output(fd.ops.relu(fd.ops.squeeze(fd.ops.softmax(x, 2), [2])))

    def inputs(device):
        return [torch.randn(1, 5, 32, generator=seeded(701)).permute(2, 1, 0).to(device)]

    def ref(x):
        return [torch.relu(torch.softmax(x, 2).squeeze(2))]

    return inputs, ref


def _softmax_of_one_element(fd):
    """fuzz 702:41, minimized: softmax of a 1-D x of extent 1, squeezed to
    0-dim: no axis longer than 1 at all (one thread)."""
    x = fd.define_tensor([-1], dtype=D.Float)
    w = fd.define_tensor([], dtype=D.Float)
    fd.add_output(fd.ops.neg(fd.ops.where(fd.ops.gt(fd.ops.squeeze(fd.ops.softmax(x, 0), [0]), w), 3.0, w)))

    def inputs(device):
        return [torch.randn(1, generator=seeded(702)).to(device), torch.tensor(0.5).to(device)]

    def ref(x, w):
        s = torch.softmax(x, 0).squeeze(0)
        return [-torch.where(s > w, torch.tensor(3.0, dtype=x.dtype), w)]

    return inputs, ref


def _sum_over_one_dropped_by_reshape(fd):
    """fuzz 704:181, minimized: sum(x[n, 1], [1]) beside reshape(x, [n, 1, 1]),
    which drops x's size-1 axis (its size-1 output axes are new axes)."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    fd.add_output(fd.ops.sum(fd.ops.asinh(x), [1]))
    fd.add_output(fd.ops.minimum(fd.ops.reshape(fd.ops.abs(x), [2, 1, 1]), 0.25))

    def inputs(device):
        return [torch.randn(2, 2, generator=seeded(704))[:, :1].to(device)]

    def ref(x):
        return [torch.asinh(x).sum(1), torch.clamp(x.abs().reshape(2, 1, 1), max=0.25)]

    return inputs, ref


def _softmax_of_one_row_squeezed(fd):
    """Rows of one element in the normalization scheduler: softmax of
    x[1, n] squeezed to [n]. Its row loops [row_iter, G, Y] are first in
    every tensor's loop nest; the squeezed one had none. Refused there by
    name; the plain reduction kernel puts the one row innermost."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    fd.add_output(fd.ops.squeeze(fd.ops.softmax(x, 1), [0]))

    def inputs(device):
        return [torch.randn(1, 64, generator=seeded(3)).to(device)]

    def ref(x):
        return [torch.softmax(x, 1).squeeze(0)]

    return inputs, ref


def _layer_norm_of_one_row_squeezed(fd):
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    fd.add_output(fd.ops.squeeze(fd.ops.layer_norm(x, None, None, 1e-5), [0]))

    def inputs(device):
        return [torch.randn(1, 96, generator=seeded(4)).to(device)]

    def ref(x):
        return [torch.nn.functional.layer_norm(x, [96], eps=1e-5).squeeze(0)]

    return inputs, ref


def _column_sum_of_one_row(fd):
    """A reduction of one element per column (x[1, n] summed over its
    size-1 axis 0) beside that axis squeezed: the outer-reduction kernel
    (a ring over the reduced rows, [C/W, R/TR, W, ...]) took it and the
    squeezed tensor had no ring loop; it refuses it now: one thread per
    column."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    t = fd.ops.mul(x, 2.0)
    fd.add_output(fd.ops.sum(t, [0]))
    fd.add_output(fd.ops.squeeze(t, [0]))

    def inputs(device):
        return [torch.randn(1, 1024, generator=seeded(5)).to(device)]

    def ref(x):
        return [(2 * x).sum(0), (2 * x).squeeze(0)]

    return inputs, ref


# ------------------------------------------------------------------ view self mapping
def _reshape_eq_softmax(fd):
    """fuzz 709:50, minimized: x[128, 1] reshaped to [2, 64, 1, 1] compared
    with softmax(x, 0) broadcast to [1, 1, 128, 1]: x's axis 0 is the
    result's axis 2 and, through the reshape, its axes 0 and 1."""
    x = fd.define_tensor([128, 1], dtype=D.Float)
    y = fd.ops.softmax(x, 0)
    fd.add_output(fd.ops.sub(fd.ops.reshape(x, [2, 64, 1, 1]), y))

    def inputs(device):
        return [torch.randn(128, 1, generator=seeded(709)).to(device)]

    def ref(x):
        return [x.reshape(2, 64, 1, 1) - torch.softmax(x, 0)]

    return inputs, ref


def _reshape_plus_itself(fd):
    """The pointwise form: add(reshape(x, [2, 64, 1, 1]), neg(x))."""
    x = fd.define_tensor([128, 1], dtype=D.Float)
    fd.add_output(fd.ops.add(fd.ops.reshape(x, [2, 64, 1, 1]), fd.ops.neg(x)))

    def inputs(device):
        return [torch.randn(128, 1, generator=seeded(7)).to(device)]

    def ref(x):
        return [x.reshape(2, 64, 1, 1) - x]

    return inputs, ref


CASES = {
    "708:111": _sum_rows_of_one_squeezed,
    "708:111-min": _outer_sum_of_one_column,
    "701:38": _softmax_over_one_squeezed,
    "702:41": _softmax_of_one_element,
    "704:181": _sum_over_one_dropped_by_reshape,
    "norm-one-row": _softmax_of_one_row_squeezed,
    "layer-norm-one-row": _layer_norm_of_one_row_squeezed,
    "outer-one-row": _column_sum_of_one_row,
    "709:50": _reshape_eq_softmax,
    "709:50-pointwise": _reshape_plus_itself,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_runs(name):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu")
    ck = fd.compile(xs, arch="sm_90a")
    kernels = getattr(ck, "kernels", None) or [ck]
    for k in kernels:
        assert_stores_bind_the_grid(k)
    assert all(_plain(k) for k in kernels)  # each runs on the interpreter
    check_outputs(interpret(fd, xs), ref(*[to_double(x) for x in xs]))


def _kernel_names(fd, xs):
    ck = fd.compile(xs, arch="sm_90a")
    return [k.name for k in (getattr(ck, "kernels", None) or [ck])]


def test_one_element_layouts():
    """Which kernel runs each: a reduction of one element per row is the plain
    kernel, one thread per row (no block reduction); rows of one element
    reduce across threads."""
    fd, inputs, _ = build_case(CASES, "701:38")
    xs = inputs("cpu")
    ck = fd.compile(xs, arch="sm_90a")
    assert ck.name == "circbuf_reduction" and not ck.params.inner, ck.params
    assert "block_reduce" not in ck.cuda.split("end of prelude")[1]
    fd, inputs, _ = build_case(CASES, "708:111-min")
    ck = fd.compile(inputs("cpu"), arch="sm_90a")
    assert ck.name == "circbuf_reduction" and ck.params.inner, ck.params
    for name in ("norm-one-row", "layer-norm-one-row", "outer-one-row"):
        fd, inputs, _ = build_case(CASES, name)
        assert _kernel_names(fd, inputs("cpu")) == ["circbuf_reduction"], name


def test_refusals_name_the_rule():
    """The normalization and outer-reduction schedulers say why they do not
    take the one-element fusions; a softmax of a [1, n] x that keeps its row
    axis stays with the normalization kernel."""
    from circbuf.scheduler.normalization import NormalizationScheduler
    from circbuf.scheduler.outer_reduction import OuterReductionScheduler

    with cb.FusionDefinition() as fd:  # norm-one-row with its 1 given when defined
        fd.add_output(fd.ops.squeeze(fd.ops.softmax(fd.define_tensor([1, -1], dtype=D.Float), 1), [0]))
    why = NormalizationScheduler.can_schedule(fd.fusion)
    assert why is not None and "drops every row axis" in why, why
    with cb.FusionDefinition() as fd:  # outer-one-row with its 1 given when defined
        x = fd.define_tensor([1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.squeeze(fd.ops.neg(x), [0]))
    why = OuterReductionScheduler.can_schedule(fd.fusion)
    assert why is not None and "extent 1" in why, why
    with cb.FusionDefinition() as fd:
        fd.add_output(fd.ops.softmax(fd.define_tensor([1, -1], dtype=D.Float), 1))
    assert NormalizationScheduler.can_schedule(fd.fusion) is None


def test_view_self_mapping_is_named():
    """view_self_mapping names the tensor combining an axis with a view's
    pieces of it, and leaves a reshape beside unrelated axes alone."""
    from circbuf.scheduler.pointwise import PointwiseScheduler
    from circbuf.scheduler.reduction import ReductionScheduler
    from circbuf.scheduler.utils import view_self_mapping

    fd, _, _ = build_case(CASES, "709:50-pointwise")
    why = view_self_mapping(fd.fusion)
    assert why is not None and "combined with a view of itself" in why, why
    assert PointwiseScheduler.can_schedule(fd.fusion) == why
    fd, _, _ = build_case(CASES, "709:50")
    assert "combined with a view of itself" in (ReductionScheduler.can_schedule(fd.fusion) or "")
    with cb.FusionDefinition() as fd:  # [2, 64] + reshape(x[128]): the pieces only
        x = fd.define_tensor([128], dtype=D.Float)
        y = fd.define_tensor([2, 64], dtype=D.Float)
        fd.add_output(fd.ops.add(fd.ops.reshape(x, [2, 64]), y))
    assert view_self_mapping(fd.fusion) is None


def test_view_self_mapping_segments():
    """The reshape of a self mapping runs in a kernel of its own."""
    for name in ("709:50", "709:50-pointwise"):
        fd, inputs, _ = build_case(CASES, name)
        assert len(_kernel_names(fd, inputs("cpu"))) == 2, name


def test_symbolic_view_self_mapping_segments():
    """With sizes only the inputs give, the reshape has no splits until it is
    concretized for sizes; the segmenter concretizes a copy for the first
    call's sizes (as it cuts axes of different extents apart by them), so it
    sees the self mapping and runs the reshape in a kernel of its own (it was
    refused by name before, fuzz 931:108 needed it)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.add(fd.ops.reshape(x, [2, 64, 1, 1]), fd.ops.neg(x)))
    xs = [torch.randn(128, 1, generator=seeded(5))]
    assert len(_kernel_names(fd, xs)) == 2
    (out,) = interpret(fd, xs)
    x = xs[0].double()
    assert_close(out, x.reshape(2, 64, 1, 1) - x)


def test_empty_tensor_is_no_self_mapping():
    """x[n, 0, 8] and reshape(x, [0, 8]) compared (fuzz 900:5, interp
    profile): the reshape's merge of n and 0 is 0, the extent of x's axis 1,
    which the comparison makes one axis with it. An empty tensor is walked by
    no loop: the fusion runs (its outputs empty), as it did before the check."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, 0, 8], dtype=D.Float)
        y = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.le(x, fd.ops.sub(fd.ops.reshape(x, [0, 8]), y)))
    xs = [torch.randn(127, 0, 8), torch.randn(0, 8)]
    (out,) = interpret(fd, xs)
    assert out.shape == (127, 0, 8) and out.dtype == torch.bool


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs(DEV)
    check_outputs(fd.execute(xs), ref(*[to_double(x).cpu() for x in xs]))
