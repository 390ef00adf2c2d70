"""Matmul outputs and operands in memory orders the matmul scheduler once
assumed away (the fourth session's GPU fuzz, seeds 820-831).

- fuzz 831:20 (a misaligned-address trap on an H100; the interpreter counts
  each address stored twice or never): an output allocated column-major
  (``stride_order``) was stored an accumulator pair at a time as if its rows
  were along N, and a TMA-stored one met a lowering check. Outputs not
  row-major are stored element by element through their strides now.
- fuzz 827:9 (a lowering check): an A of [2, 1, 128] whose batch axis has
  unit stride was realigned into a copy laid out M-major (its M of 1 given
  the unit stride), which ``_layout_of`` then read as row-major. The copy is
  row-major now, and a size-1 axis of unit stride under a non-unit innermost
  axis makes ``_layout_of`` order axes by stride.

The CPU test runs each fusion on the interpreter against float64 torch; the
GPU test runs it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

from circbuf.compiler import _layout_of
from circbuf.interpret import interpret
from tests.util import D, build_case, check_outputs, seeded, to_double

DEV = "cuda"


def _bf16(g, *shape):
    return torch.randn(*shape, generator=g).bfloat16()


def _column_major_output(m, n, k):
    def case(fd):
        x1 = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        x2 = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.stride_order(fd.ops.linear(x1, x2), [0, 1]))

        def inputs(device):
            g = seeded(m * n + k)
            return [_bf16(g, m, k).to(device), _bf16(g, n, k).to(device)]

        return inputs, lambda a, b: [a @ b.T]

    return case


def _fuzz_831_20(fd):
    """fuzz 831:20 as found: linear(x1[16, 1], x2[128, 1]) * x4, + an int
    column, stored column-major; an in-place update of another input beside."""
    x1 = fd.define_tensor([16, -1], dtype=D.BFloat16)
    x2 = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    x4 = fd.define_tensor([16, 128], dtype=D.Float)
    x7 = fd.define_tensor([-1, 1], dtype=D.Int64)
    x11 = fd.define_tensor([16, -1], dtype=D.BFloat16)
    t5 = fd.ops.mul(fd.ops.linear(x1, x2), x4)
    t9 = fd.ops.stride_order(fd.ops.add(fd.ops.set(t5), x7), [0, 1])
    fd.add_output(fd.ops.sub(t9, x11))
    fd.add_output(fd.ops.cast(fd.ops.add(x11, 2.0), D.BFloat16), alias_input=x11)

    def inputs(device):
        g = seeded(831)
        xs = [
            _bf16(g, 1, 16).permute(1, 0),
            _bf16(g, 128, 1),
            torch.randn(16, 128, generator=g),
            torch.randint(-9, 10, (16, 1), generator=g),
            _bf16(g, 128, 16).permute(1, 0),
        ]
        return [x.to(device) for x in xs]

    def ref(x1, x2, x4, x7, x11):
        # (the epilogue's float math reads the fp32 accumulator, not its bf16 cast:
        # matmul._finish_fp32; K = 1 makes it exact)
        return [(x1 @ x2.T) * x4 + x7 - x11]

    return inputs, ref


def _residual_column_major(fd):
    """linear + a column-major residual: the output inherits the residual's
    layout (as torch's elementwise ops keep it), so it is not row-major."""
    x1 = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    x2 = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    r = fd.define_tensor([-1, -1], dtype=D.BFloat16, stride_order=[0, 1])
    fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.linear(x1, x2), r), D.BFloat16))

    def inputs(device):
        g = seeded(7)
        return [_bf16(g, 128, 64).to(device), _bf16(g, 256, 64).to(device), _bf16(g, 256, 128).T.to(device)]

    return inputs, lambda a, b, r: [a @ b.T + r]


def _batch_innermost_a(strided):
    """fuzz 827:9: A [2, 1, 128] with its batch axis of unit stride (a
    permute), or an aligned M-major view of M = 1 (``strided``)."""

    def case(fd):
        x1 = fd.define_tensor([2, -1, 128], dtype=D.BFloat16)
        x2 = fd.define_tensor([128, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(x1, x2))

        def inputs(device):
            g = seeded(827)
            if strided:
                a = _bf16(g, 2, 128, 8)[:, :, :1].permute(0, 2, 1)
            else:
                a = _bf16(g, 1, 128, 2).permute(2, 0, 1)
            return [a.to(device), _bf16(g, 128, 3).to(device)]

        return inputs, lambda a, b: [a @ b]

    return case


CASES = {
    "column-major 128x128x64 (TMA-sized)": _column_major_output(128, 128, 64),
    "column-major 16x130x64 (pairs)": _column_major_output(16, 130, 64),
    "column-major 15x7x64": _column_major_output(15, 7, 64),
    "fuzz 831:20": _fuzz_831_20,
    "residual column-major": _residual_column_major,
    "fuzz 827:9 batch innermost": _batch_innermost_a(False),
    "M = 1 M-major, aligned": _batch_innermost_a(True),
}


def _check(outs, refs):
    # every element written once (NaN-poisoned on the GPU; the interpreter
    # counts each address's stores), each within bf16's rounding of the reference
    check_outputs(outs, refs, written=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreted(name):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu")
    refs = ref(*[to_double(x) for x in xs])  # (before an in-place output updates an input)
    _check(interpret(fd, xs), refs)


def test_layout_of_unit_stride_size_one_axis():
    # the realigned copy 827:9 met before the copy became row-major: M of 1, unit stride
    assert _layout_of((2, 1, 128), (1024, 1, 8)) == ((0, 2, 1), (True, True, False))
    # a unit-stride innermost axis keeps the row-major reading
    assert _layout_of((128, 1), (1, 1)) == ((0, 1), (True, True))
    assert _layout_of((2, 1, 128), (128, 128, 1)) == ((0, 1, 2), (True, True, True))


def test_column_major_output_not_tma_stored():
    fd, inputs, _ = build_case(CASES, "column-major 128x128x64 (TMA-sized)")
    fd.compile(inputs("cpu"), arch="sm_90a")
    p = fd.last_params()
    assert p.store == "direct" and p.store_vector == 1, p


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs(DEV)
    refs = ref(*[to_double(x).cpu() for x in xs])
    _check(fd.execute(xs), refs)


def test_fuzz_831_20_in_place_update():
    """The aliased output (x11 += 2, x11 column-major) lands in x11 itself,
    each element once (the interpreter counts stores per address)."""
    fd, inputs, _ = build_case(CASES, "fuzz 831:20")
    xs = inputs("cpu")
    before = xs[4].clone()
    interpret(fd, xs)
    assert torch.equal(xs[4], (before.float() + 2.0).bfloat16())
