"""A silent wrong result the fuzzer found (issue 16: fuzz 942:41 with the
interp profile), minimized: an output with elements whose broadcast axis is
one axis of the fusion with an axis of extent 0.

``neg(x2[13, 1])`` beside ``mul(x1[13, 0], x2)``: x2's size-1 axis meets
x1's axis of 0 in the product, so it is one axis of the fusion. The
pointwise scheduler took both outputs in one kernel, its reference the
broadcast-free ``[13, 0]`` product, its loop 13 x 0 elements: no block, no
launch, and the ``[13, 1]`` output was never written (NaN under poisoning).
A loop over an axis of extent 0 writes nothing, so no one kernel can write
such an output (the structure is fine; the sizes are not). nvFuser
concretizes extents that are 0 at run time and removes the empty tensors'
math; here ``prepare`` checks it for each input signature
(:func:`circbuf.scheduler.utils.unwritten_output`, through
``bind_axis_extents``: ``AxisExtentsDiffer``) and the segmenter, given the
sizes, gives the output a kernel without the empty axis. The executor keeps
a split per set of sizes that are 0 (a fusion split for sizes with elements,
its segments joining the output and the empty axis, is split again for
them), as nvFuser keys its concretized fusions by the extents that are 0.

Each CPU test compiles the fusion for sm_90a and runs it on the kernel
interpreter against float64 torch (outputs NaN-poisoned); the GPU test runs
it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.scheduler.utils import AxisExtentsDiffer, prepare, unwritten_output
from tests.test_trust_loops import _plain
from tests.util import D, build_case, check_outputs, seeded, to_double

DEV = "cuda"


# ------------------------------------------------------------------ the fuzz case and its variants
def _column_beside_empty_rows(fd):
    """fuzz 942:41, minimized: neg(x2[13, 1]) beside mul(x1[13, 0], x2)."""
    x1 = fd.define_tensor([-1, -1], dtype=D.Float)
    x2 = fd.define_tensor([-1, 1], dtype=D.Float)
    fd.add_output(fd.ops.neg(x2))
    fd.add_output(fd.ops.mul(x1, x2))

    def inputs(device, n=0):
        g = seeded(942)
        return [torch.randn(13, n, generator=g).to(device), torch.randn(13, 1, generator=g).to(device)]

    def ref(x1, x2):
        return [-x2, x1 * x2]

    return inputs, ref


def _fuzz_942_41(fd):
    """fuzz 942:41 as found: x2 returned through stride_order (a copy), beside
    an addcmul of the empty product, and a 0-dim sum returned in place."""
    x1 = fd.define_tensor([-1, -1], dtype=D.Int32)
    x2 = fd.define_tensor([-1, 1], dtype=D.Float)
    x4 = fd.define_tensor([-1, 0], dtype=D.Int32)
    t3 = fd.ops.mul(x1, x2)
    t6 = fd.ops.add(t3, fd.ops.addcmul(x1, x4, t3, 0.5))
    fd.add_output(fd.ops.stride_order(x2, [1, 0]))
    fd.add_output(t6)

    def inputs(device, n=0):
        g = seeded(9421)
        return [
            torch.randint(-9, 10, (13, n), generator=g, dtype=torch.int32).to(device),
            torch.randn(13, 1, generator=g).to(device),
            torch.randint(-9, 10, (0, 13), generator=g, dtype=torch.int32).t().to(device),
        ]

    def ref(x1, x2, x4):
        t3 = x1 * x2
        return [x2, t3 + (x1 + 0.5 * x4 * t3)]

    return inputs, ref


def _row_beside_empty_columns(fd):
    """The transpose: exp(x2[1, 7]) beside add(x1[0, 7], x2)."""
    x1 = fd.define_tensor([-1, -1], dtype=D.Float)
    x2 = fd.define_tensor([1, -1], dtype=D.Float)
    fd.add_output(fd.ops.exp(x2))
    fd.add_output(fd.ops.add(x1, x2))

    def inputs(device, n=0):
        g = seeded(9422)
        return [torch.randn(n, 7, generator=g).to(device), torch.randn(1, 7, generator=g).to(device)]

    def ref(x1, x2):
        return [torch.exp(x2), x1 + x2]

    return inputs, ref


def _column_beside_sum_of_empty_rows(fd):
    """A reduction: neg(x2[13, 1]) beside sum(x1[13, 0] * x2, [1]) (zeros)."""
    x1 = fd.define_tensor([-1, -1], dtype=D.Float)
    x2 = fd.define_tensor([-1, 1], dtype=D.Float)
    fd.add_output(fd.ops.neg(x2))
    fd.add_output(fd.ops.sum(fd.ops.mul(x1, x2), [1]))

    def inputs(device, n=0):
        g = seeded(9423)
        return [torch.randn(13, n, generator=g).to(device), torch.randn(13, 1, generator=g).to(device)]

    def ref(x1, x2):
        return [-x2, (x1 * x2).sum(1)]

    return inputs, ref


def _column_beside_softmax_of_empty_rows(fd):
    """A normalization: x2[13, 1] * 2 beside softmax(x1[13, 0] + x2, 1) (empty)."""
    x1 = fd.define_tensor([-1, -1], dtype=D.Float)
    x2 = fd.define_tensor([-1, 1], dtype=D.Float)
    fd.add_output(fd.ops.mul(x2, 2.0))
    fd.add_output(fd.ops.softmax(fd.ops.add(x1, x2), 1))

    def inputs(device, n=0):
        g = seeded(9424)
        return [torch.randn(13, n, generator=g).to(device), torch.randn(13, 1, generator=g).to(device)]

    def ref(x1, x2):
        return [x2 * 2, torch.softmax(x1 + x2, 1)]

    return inputs, ref


def _keepdim_sum_beside_empty_rows(fd):
    """A broadcast output of a reduction over the empty axis: sum(x1[13, 0],
    [1], keepdim) (zeros, [13, 1]) beside x1 - that sum (empty)."""
    x1 = fd.define_tensor([-1, -1], dtype=D.Float)
    s = fd.ops.sum(x1, [1], keepdim=True)
    fd.add_output(s)
    fd.add_output(fd.ops.sub(x1, s))

    def inputs(device, n=0):
        return [torch.randn(13, n, generator=seeded(9425)).to(device)]

    def ref(x1):
        s = x1.sum(1, keepdim=True)
        return [s, x1 - s]

    return inputs, ref


def _split_beside_reductions(fd):
    """The column beside the empty rows in a fusion split anyway (sums of y
    over each axis): the split made for sizes with elements puts neg(x2) and
    x1 * x2 in one segment; sizes of 0 need their own split."""
    y = fd.define_tensor([-1, -1], dtype=D.Float)
    x1 = fd.define_tensor([-1, -1], dtype=D.Float)
    x2 = fd.define_tensor([-1, 1], dtype=D.Float)
    fd.add_output(fd.ops.sum(y, [0]))
    fd.add_output(fd.ops.sum(y, [1]))
    fd.add_output(fd.ops.neg(x2))
    fd.add_output(fd.ops.mul(x1, x2))
    fd.fusion.schedule(tma=False)  # plain kernels: the interpreter runs them

    def inputs(device, n=0):
        g = seeded(9426)
        return [
            torch.randn(8, 16, generator=g).to(device),
            torch.randn(13, n, generator=g).to(device),
            torch.randn(13, 1, generator=g).to(device),
        ]

    def ref(y, x1, x2):
        return [y.sum(0), y.sum(1), -x2, x1 * x2]

    return inputs, ref


CASES = {
    "942:41": _fuzz_942_41,
    "column": _column_beside_empty_rows,
    "row": _row_beside_empty_columns,
    "sum": _column_beside_sum_of_empty_rows,
    "softmax": _column_beside_softmax_of_empty_rows,
    "keepdim-sum": _keepdim_sum_beside_empty_rows,
    "split": _split_beside_reductions,
}


def _env(fusion, xs):
    """The sizes of the inputs' symbolic axes, by extent name."""
    return {
        i.extent.name: n
        for x, t in zip(fusion.inputs, xs)
        for i, n in zip(x.logical, t.shape)
        if hasattr(i.extent, "name")
    }


def _interpreted(fd, xs):
    ck = fd.compile(xs, arch="sm_90a")
    kernels = getattr(ck, "kernels", None) or [ck]
    assert all(_plain(k) for k in kernels)  # each runs on the interpreter
    return interpret(fd, xs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_empty_axis_beside_output_with_elements(name):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu")
    check_outputs(_interpreted(fd, xs), ref(*[to_double(x) for x in xs]), written=True)


SIZED = sorted(set(CASES) - {"942:41"})  # 942:41 fixes x4's axis of 0, and with it x1's


@pytest.mark.parametrize("name", SIZED)
def test_elements_then_empty(name):
    """One definition, run first with the axis of 5 elements (one kernel may
    take it all), then with 0: the second signature is checked again and
    segmented; a third call with elements still runs right."""
    fd, inputs, ref = build_case(CASES, name)
    for n in (5, 0, 3):
        xs = inputs("cpu", n)
        check_outputs(interpret(fd, xs), ref(*[to_double(x) for x in xs]), written=True)


def test_the_output_gets_a_kernel_of_its_own():
    """For an empty x1 the check names the output and the empty axis; the
    compile segments the fusion, neg(x2) in a kernel without x1's axis. With
    elements one kernel takes both."""
    fd, inputs, _ = build_case(CASES, "column")
    f = fd.fusion.clone()
    x1, _ = f.inputs
    env = _env(f, inputs("cpu"))
    why = unwritten_output(f, env)
    assert why is not None and f.outputs[0].name in why and "axis 1" in why and "extent 0" in why, why
    with pytest.raises(AxisExtentsDiffer, match="has elements"):
        prepare(f, env)
    assert unwritten_output(fd.fusion.clone(), {**env, x1.logical[1].extent.name: 4}) is None
    ck = fd.compile(inputs("cpu"), arch="sm_90a")
    assert len(ck.kernels) == 2, ck
    fd, inputs, _ = build_case(CASES, "column")
    assert fd.compile(inputs("cpu", 4), arch="sm_90a").name == "circbuf_pointwise"


def test_a_split_per_set_of_empty_sizes():
    """A fusion split for sizes with elements is split again for sizes of 0
    (the executor keeps a split per set of sizes that are 0, as nvFuser keys
    its concretized fusions by the extents that are 0); sizes with elements
    again take the first split."""
    fd, inputs, ref = build_case(CASES, "split")
    ex = fd._get_executor()
    counts = []
    for n in (5, 0, 3, 0):
        xs = inputs("cpu", n)
        check_outputs(interpret(fd, xs), ref(*[to_double(x) for x in xs]), written=True)
        counts.append(len(ex._segments[0]))
    assert counts == [3, 4, 3, 4], counts


def test_every_output_empty_is_one_kernel():
    """Outputs all empty: nothing to write, nothing to segment."""
    with cb.FusionDefinition() as fd:
        x1 = fd.define_tensor([-1, -1], dtype=D.Float)
        x2 = fd.define_tensor([-1, 1], dtype=D.Float)
        fd.add_output(fd.ops.mul(x1, x2))
        fd.add_output(fd.ops.neg(fd.ops.add(x1, x2)))
    xs = [torch.randn(13, 0), torch.randn(13, 1)]
    assert fd.compile(xs, arch="sm_90a").name == "circbuf_pointwise"
    check_outputs(interpret(fd, xs), [xs[0] * xs[1], -(xs[0] + xs[1])], written=True)


def test_expanded_to_empty_is_empty():
    """An output whose broadcast axis is expanded to the empty extent has no
    element: not an output the empty loop leaves unwritten."""
    with cb.FusionDefinition() as fd:
        x1 = fd.define_tensor([-1, -1], dtype=D.Float)
        x2 = fd.define_tensor([-1, 1], dtype=D.Float)
        fd.add_output(fd.ops.expand(x2, [13, 0]))
        fd.add_output(fd.ops.mul(x1, x2))
    xs = [torch.randn(13, 0), torch.randn(13, 1)]
    assert unwritten_output(fd.fusion.clone(), _env(fd.fusion, xs)) is None
    check_outputs(interpret(fd, xs), [xs[1].expand(13, 0), xs[0] * xs[1]], written=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    for n in (0, 5, 0) if name in SIZED else (0,):
        xs = inputs(DEV, n)
        check_outputs(fd.execute(xs), ref(*[to_double(x).cpu() for x in xs]), written=True)
