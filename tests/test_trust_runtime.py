"""Plans launch whenever some output has elements (issue 16: a reduction over
an empty axis next to an empty output was left unwritten; fuzz case 101:79)."""

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from tests.util import D, assert_close


def _sum_and_exp():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [0, 1]))
        fd.add_output(fd.ops.exp(x))
    return fd


@pytest.mark.parametrize("shape", [(0, 8), (5, 0)])
def test_reduction_of_an_empty_tensor_beside_an_empty_output_on_the_interpreter(shape, monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    x = torch.randn(*shape)
    outs = interpret(_sum_and_exp(), [x])
    for o, r in zip(outs, (x.double().sum(), x.double().exp())):
        assert_close(o, r)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 8), (5, 0), (0, 0)])
def test_reduction_of_an_empty_tensor_beside_an_empty_output_matches_torch(shape, monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    x = torch.randn(*shape, device="cuda")
    outs = _sum_and_exp().execute([x])
    for o, r in zip(outs, (x.double().sum(), x.double().exp())):
        assert_close(o, r)


def test_tensor_map_of_a_size_one_axis_takes_a_dense_stride():
    """A [1, 33] view of a [33, 1] tensor has stride 1 on its size-1 axis
    (fuzz 0:151: "globalStride[1] = 2 bytes is not a multiple of 16" when a
    matmul staged it by TMA); the map never steps along it, so it gets the
    dense stride rounded to 16 bytes."""
    from types import SimpleNamespace

    from circbuf.runtime.tensormap import check_map, map_geometry

    spec = SimpleNamespace(dims=[((1,), 64), ((0,), 128)])
    dims, gstr, box = map_geometry(spec, [1, 33], [1, 1], 2)
    assert dims == [33, 1] and gstr == [2, 80] and box == [64, 128]
    check_map("x", 256, dims, gstr, box, 2)


def _view_and_in_place(view_first):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        v = fd.ops.reshape(x, [-1])
        if view_first:
            fd.add_output(v)
        fd.add_output(fd.ops.add(x, 2.0), alias_input=x)
        if not view_first:
            fd.add_output(v)
    return fd


@pytest.mark.parametrize("view_first", [True, False])
def test_a_view_of_an_input_written_in_place_is_a_copy(view_first):
    """A reshape of x returned beside ``x += 2`` holds x's values as defined:
    a kernel copies it (an alias would show the new values; fuzz 302:222,
    301:135, 306:13, 300:29 on the GPU)."""
    fd = _view_and_in_place(view_first)
    assert "no kernel" not in fd.fusion.print_math()
    x = torch.randn(3, 5)
    want = x.double().reshape(-1).clone()
    (v,) = interpret(fd, [x])
    assert_close(v, want)
    assert_close(x, want.reshape(3, 5) + 2)


@pytest.mark.gpu
@pytest.mark.parametrize("view_first", [True, False])
def test_a_view_of_an_input_written_in_place_is_a_copy_on_the_gpu(view_first, monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    x = torch.randn(33, 130, device="cuda")
    want = x.double().reshape(-1).clone()
    (v,) = _view_and_in_place(view_first).execute([x])
    assert v.data_ptr() != x.data_ptr()
    assert_close(v, want)
    assert_close(x, want.reshape(33, 130) + 2)
