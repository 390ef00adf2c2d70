"""Valid fusions the fuzzer found ending in an internal error or a lowering
check (issue 16: fuzz 743:89, 745:158, 746:171 with the interp profile),
minimized. Three root causes:

- Rows of no element (743:89): ``sum(x[n, 0], [1])`` of an input a tensor
  map can describe. The normalization scheduler sized its TMA box from the
  row length, 0, and divided by it (``ZeroDivisionError`` in
  ``compute_params``). A row of no element has nothing to stage: it
  declines now, naming that (as the outer-reduction scheduler does), and the plain reduction kernel writes the init values (an error
  naming it where ``staging=`` was asked for).
- A broadcast of a broadcast, cached as an output (745:158):
  ``u = broadcast(t)`` of ``t = broadcast_in_dim(x, [n, 1, m, 5])``, u an
  output another output reads, t reduced. ``hoist_broadcasts`` makes u one
  broadcast of x and records that u's new axes are t's
  (``TensorView.joined_axes``); ``cache_before`` (the output's register
  cache) moved u's definition to the cache with fresh axes and left the
  link on axes no tensor had any more, so the axis of 5 was two axes of the
  fusion: the reduction's grid merged it, u's cache kept it as a loop of
  its own, and two extents met on blockIdx.x. ``cache_before`` now moves
  the link to the cache's axes.
- A reshape of an empty tensor (746:171): ``reshape(t[0, n, 127],
  [0, 1, 1, 127])`` with n = 1, t's axis 1 also met, through an input's
  size-1 axis, by the reshape's new size-1 axis. A reshape squeezes input
  axes of size 1 (and makes output ones new axes) as nvFuser's view
  analysis does, except that it did not for a tensor of no element, whose
  one group merged them into the 0: the reshape's input then held n's axis
  twice (as itself and as the hoisted broadcast of the new axis), and its
  loops outnumbered its consumer's. Axes of size 1 are squeezed whenever
  there are others.

The fuzz run after those fixes (seeds 950, 951) found one more, 950:14: a
reduction's broadcast row axis that another tensor gives an extent, beside
an output without it (see ``_rms_norm_of_broadcast_beside_input``).

Each CPU test compiles the minimized fusion for sm_90a and runs it on the
kernel interpreter against float64 torch; the GPU test runs it with
NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.ir import CircbufError, ReshapeOp, concretize_reshapes
from circbuf.scheduler.overrides import Declined
from tests.test_trust_loops import _plain, assert_stores_bind_the_grid
from tests.util import D, build_case, check_outputs, seeded, to_double

DEV = "cuda"


# ------------------------------------------------------------------ rows of no element
def _sum_of_empty_rows(fd):
    """fuzz 743:89, minimized: sum(x[n, 0], [1]) (zeros) beside a softmax of
    the empty rows (empty), rows 16 bytes apart: a tensor map describes x."""
    x = fd.define_tensor([-1, 0], dtype=D.Float)
    fd.add_output(fd.ops.sum(x, [1]))
    fd.add_output(fd.ops.softmax(x, 1))

    def inputs(device):
        return [torch.randn(5, 4, generator=seeded(743))[:, :0].to(device)]

    def ref(x):
        return [x.sum(1), torch.softmax(x, 1)]

    return inputs, ref


def _sum_of_no_rows(fd):
    """No rows at all: x[0, 64] (every output empty)."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    fd.add_output(fd.ops.sum(x, [1]))
    fd.add_output(fd.ops.softmax(x, 1))

    def inputs(device):
        return [torch.randn(0, 64).to(device)]

    def ref(x):
        return [x.sum(1), torch.softmax(x, 1)]

    return inputs, ref


# ------------------------------------------------------------------ broadcast of a broadcast
def _min_beside_broadcast_of_broadcast(fd):
    """fuzz 745:158, minimized: t = broadcast_in_dim(x, [n, 1, m, 5]) reduced
    over its size-1 axis; u = broadcast(t) returned and read by another
    output (so it gets a register cache)."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    t = fd.ops.broadcast_in_dim(x, [-1, 1, -1, 5], [0, 2])
    fd.add_output(fd.ops.min(t, [1]))
    u = fd.ops.broadcast(t, [True, False, False, False, False])
    fd.add_output(u)
    fd.add_output(fd.ops.neg(u))

    def inputs(device):
        return [torch.randn(24, 16, generator=seeded(745)).to(device)]

    def ref(x):
        t = x[:, None, :, None].expand(-1, 1, -1, 5)
        return [t.amin(1), t[None], -t[None]]

    return inputs, ref


def _sum_beside_broadcast_of_broadcast(fd):
    """The same with a sum, u's reader an exp computed before u is stored."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    t = fd.ops.broadcast_in_dim(x, [-1, 1, -1, 5], [0, 2])
    fd.add_output(fd.ops.sum(t, [1]))
    u = fd.ops.broadcast(t, [True, False, False, False, False])
    fd.add_output(fd.ops.exp(u))
    fd.add_output(u)

    def inputs(device):
        return [torch.randn(8, 40, generator=seeded(7451)).to(device)]

    def ref(x):
        t = x[:, None, :, None].expand(-1, 1, -1, 5)
        return [t.sum(1), torch.exp(t[None]), t[None]]

    return inputs, ref


# ------------------------------------------------------------------ reshape of an empty tensor
def _reshape_of_empty_meets_itself(fd):
    """fuzz 746:171, minimized: t = exp2(x[0, n, 127] * y[0, 1, 127]) (n = 1)
    reshaped to [0, 1, 1, 127] and added to a broadcast of y: y's size-1
    axis is t's axis 1 and the reshape's new axis 1."""
    x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    y = fd.define_tensor([0, 1, -1], dtype=D.Float)
    t = fd.ops.exp2(fd.ops.mul(x, y))
    fd.add_output(
        fd.ops.add(fd.ops.reshape(t, [0, 1, 1, 127]), fd.ops.broadcast_in_dim(y, [-1, -1, 1, -1], [0, 1, 3]))
    )

    def inputs(device):
        return [torch.randn(0, 1, 127).to(device), torch.randn(0, 1, 127).to(device)]

    def ref(x, y):
        return [torch.exp2(x * y).reshape(0, 1, 1, 127) + y[:, :, None, :]]

    return inputs, ref


def _symbolic_reshape(fd):
    x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    y = fd.define_tensor([-1, 1, -1], dtype=D.Float)
    t = fd.ops.exp2(fd.ops.mul(x, y))
    fd.add_output(
        fd.ops.add(fd.ops.reshape(t, [-1, 1, 1, 127]), fd.ops.broadcast_in_dim(y, [-1, -1, 1, -1], [0, 1, 3]))
    )

    def ref(x, y):
        return [torch.exp2(x * y).reshape(-1, 1, 1, 127) + y[:, :, None, :]]

    return ref


def _symbolic_reshape_of_empty(fd):
    """The same with sizes the inputs give: refused before ("no scheduler can
    take this fusion"), as the self mapping showed once the reshape was
    concretized for the empty sizes."""
    ref = _symbolic_reshape(fd)

    def inputs(device):
        return [torch.randn(0, 1, 127).to(device), torch.randn(0, 1, 127).to(device)]

    return inputs, ref


def _symbolic_reshape_with_rows(fd):
    """And with rows: the definition above on [3, 1, 127] (values to check)."""
    ref = _symbolic_reshape(fd)

    def inputs(device):
        g = seeded(746)
        return [
            torch.randn(3, 1, 127, generator=g).to(device),
            torch.randn(3, 1, 127, generator=g).to(device),
        ]

    return inputs, ref


# ------------------------------------------------------------------ a broadcast row axis given an extent
def _rms_norm_of_broadcast_beside_input(fd):
    """fuzz 950:14 (found by the run after the fixes above), minimized:
    rms_norm of x[n, 1] broadcast to [n, 1, 1, 1], times a [n, a, b, c]
    (a = 3 here, 1 in the fuzz case, symbolic either way), beside neg(x)
    [n, 1]. The reduction's row axis 1, a broadcast, gets a's extent; its
    grid runs over n * a * b rows, where neg(x) has n * b: two extents on
    blockIdx.x. ``_output_lacks_a_row_axis`` took the broadcast for one
    element; it asks :func:`_one_axes` now, so neg(x) is a kernel of its
    own."""
    x = fd.define_tensor([-1, 1], dtype=D.Float)
    y = fd.define_tensor([-1, -1, -1, -1], dtype=D.Float)
    r = fd.ops.rms_norm(fd.ops.broadcast(x, [False, True, False, True]), None, 1e-5)
    fd.add_output(fd.ops.mul(r, y))
    fd.add_output(fd.ops.neg(x))

    def inputs(device):
        g = seeded(950)
        return [torch.randn(16, 1, generator=g).to(device), torch.randn(16, 3, 1, 1, generator=g).to(device)]

    def ref(x, y):
        t = x[:, None, :, None]
        r = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5)
        return [r * y, -x]

    return inputs, ref


CASES = {
    "743:89": _sum_of_empty_rows,
    "743:89-no-rows": _sum_of_no_rows,
    "745:158": _min_beside_broadcast_of_broadcast,
    "745:158-sum": _sum_beside_broadcast_of_broadcast,
    "746:171": _reshape_of_empty_meets_itself,
    "746:171-symbolic": _symbolic_reshape_of_empty,
    "746:171-rows": _symbolic_reshape_with_rows,
    "950:14": _rms_norm_of_broadcast_beside_input,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_runs(name):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu")
    ck = fd.compile(xs, arch="sm_90a")
    kernels = getattr(ck, "kernels", None) or [ck]
    refs = ref(*[to_double(x) for x in xs])
    if all(r.numel() for r in refs):  # an empty output's index may drop blockIdx (its extent 0 is fixed)
        for k in kernels:
            assert_stores_bind_the_grid(k)
    assert all(_plain(k) for k in kernels)  # each runs on the interpreter
    check_outputs(interpret(fd, xs), refs)


def test_empty_rows_are_not_staged():
    """The normalization scheduler declines rows of no element, naming why;
    the plain reduction kernel runs them. Asked for a staging, the compile
    names the rule. No rows at all (x[0, 64]) it still takes: its kernel
    runs no row loop (and the plan launches nothing)."""
    from circbuf.scheduler.info import InputInfo, TensorInfo
    from circbuf.scheduler.normalization import NormalizationScheduler
    from circbuf.scheduler.utils import prepare

    fd, inputs, _ = build_case(CASES, "743:89")
    (x,) = inputs("cpu")
    assert NormalizationScheduler.can_schedule(fd.fusion) is None  # the structure is its
    f = fd.fusion.clone()
    info = InputInfo(
        (TensorInfo(tuple(x.shape), tuple(x.stride()), 4, 16),), {f.inputs[0].logical[0].extent.name: 5}
    )
    prepare(f, info.extents)
    got = NormalizationScheduler.compute_params(f, info, {})
    assert isinstance(got, Declined) and "nothing to stage" in got.why, got
    assert fd.compile([x], arch="sm_90a").name == "circbuf_reduction"
    fd, inputs, _ = build_case(CASES, "743:89")
    fd.fusion.schedule(staging="registers")
    with pytest.raises(CircbufError, match=r"schedule\(staging='registers'\): nothing to stage"):
        fd.compile(inputs("cpu"), arch="sm_90a")
    fd, inputs, _ = build_case(CASES, "743:89-no-rows")
    assert fd.compile(inputs("cpu"), arch="sm_90a").name == "circbuf_normalization"


def test_output_cache_keeps_joined_axes():
    """cache_before moves the link hoist_broadcasts made between u's new
    axes and t's (u = broadcast(t), t a broadcast) to the cache's axes: the
    axis of 5 is one axis of the fusion in t, in u's cache and in u."""
    from circbuf.scheduler.utils import LogicalMap, cache_output, hoist_broadcasts

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([8, 16], dtype=D.Float)
        t = fd.ops.broadcast_in_dim(x, [8, 1, 16, 5], [0, 2])
        fd.add_output(fd.ops.min(t, [1]))
        u = fd.ops.broadcast(t, [True, False, False, False, False])
        fd.add_output(u)
        fd.add_output(fd.ops.neg(u))
    f = fd.fusion
    hoist_broadcasts(f)
    assert u.joined_axes and u.definition.inputs[0] is x  # one broadcast of x now, linked to t's axes
    c = cache_output(f, u)
    assert not u.joined_axes and c.joined_axes
    assert all(b in c.logical for _, b in c.joined_axes)
    lmap = LogicalMap(f)
    assert lmap.same(t.logical[3], c.logical[4]) and lmap.same(c.logical[4], u.logical[4])
    assert lmap.same(t.logical[1], c.logical[2])


def test_reshape_of_empty_squeezes_ones():
    """[0, n, 127] -> [0, 1, 127] with n = 1: the input's axis of size 1 is
    squeezed (a group of its own, equated with 1), not merged into the 0."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, 127], dtype=D.Float)
        y = fd.ops.reshape(x, [0, 1, 127])
        fd.add_output(fd.ops.neg(y))
    op = y.definition
    assert isinstance(op, ReshapeOp) and not op.concrete
    src = op.inputs[0]  # x, with the broadcast axis the reshape's 1 maps to
    n = next(k for k, i in enumerate(src.logical) if i.extent is x.logical[1].extent)
    f = fd.fusion
    concretize_reshapes(f, {x.logical[0].extent.name: 0, x.logical[1].extent.name: 1})
    assert ((n,), ()) in op.groups, op.groups
    assert any(str(a) == str(x.logical[1].extent) and str(b) == "1" for a, b in f.extent_equalities)
    merged = [g for g in op.groups if len(g[0]) > 1]
    assert all(n not in g[0] for g in merged), op.groups


def test_broadcast_row_axis_given_an_extent_is_a_row():
    """The reduction schedulers refuse 950:14 whole, naming the output that
    lacks the row axis; the segmenter runs it in two kernels."""
    from circbuf.scheduler.reduction import ReductionScheduler

    fd, inputs, _ = build_case(CASES, "950:14")
    why = ReductionScheduler.can_schedule(fd.fusion)
    assert why is not None and "has no axis of the reduction" in why and "axis 1" in why, why
    ck = fd.compile(inputs("cpu"), arch="sm_90a")
    assert [k.name for k in ck.kernels] == ["circbuf_reduction", "circbuf_pointwise"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs(DEV)
    check_outputs(fd.execute(xs), ref(*[to_double(x).cpu() for x in xs]))
