"""Realign (issue 18): a bf16/fp16 matmul operand a tensor map cannot describe
(an odd K, a pointer one element off, B's rows of 50257 bf16) is copied into
16-byte-aligned rows and the TMA path runs on the copy; never the SIMT path.

CPU: which operands are copied, their strides; the kernels compiled are the
TMA path's; the kernel interpreter's results against float64 torch (outputs
NaN-poisoned); what is never copied (an operand written in place, a fill
asked for, ``realign=False``). GPU (``-m gpu``): the issue's shapes and
hypothesis over odd shapes and offsets against float64 torch.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.scheduler.realign import realigned_strides
from tests.test_gpu_matmul import check as gpu_check
from tests.test_gpu_matmul import mm_fusion
from tests.test_matmul_cp_async import operands
from tests.util import D

BF, H = torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def _default_heuristic(monkeypatch):
    monkeypatch.delenv("CIRCBUF_CP_ASYNC", raising=False)


def ref(a, b, kind):
    return a.double() @ (b.double().T if kind == "linear" else b.double())


@pytest.mark.parametrize(
    "sizes, strides, want",
    [
        ((2047, 2047), (2047, 1), (2048, 1)),
        ((4096, 4096), (4096, 1), (4096, 1)),  # (an aligned shape: the same strides)
        ((768, 50257), (1, 768), (1, 768)),  # column-major stays column-major
        ((7, 130), (130, 1), (136, 1)),
        ((3, 128, 7), (7, 21, 1), (1024, 8, 1)),  # batches dense, outermost
        ((5, 1), (1, 1), (8, 1)),
    ],
)
def test_realigned_strides(sizes, strides, want):
    assert realigned_strides(sizes, strides, 2) == want


@pytest.mark.parametrize(
    "shape, kind, a_off, b_off, copied",
    [
        ((2047, 2047, 2047), "matmul", 0, 0, ("T0", "T1")),
        ((4097, 4096, 4095), "matmul", 0, 0, ("T0",)),  # B's rows of 4096 are aligned
        ((4096, 50257, 768), "matmul", 0, 0, ("T1",)),
        ((4096, 4096, 4096), "matmul", 1, 0, ("T0",)),  # a pointer one element off
        ((1000, 4098, 4100), "linear", 2, 4, ("T0", "T1")),
    ],
)
def test_compiled_kernel_is_the_tma_path(shape, kind, a_off, b_off, copied):
    fd = mm_fusion(kind)
    a, b = operands(*shape, kind, BF, a_off, b_off, empty=True)
    fd.compile([a, b], arch="sm_90a")
    p = fd.last_params()
    assert p.simt is None and p.fill == ("tma", "tma")
    assert fd._get_executor().realigned == copied


@pytest.mark.parametrize(
    "shape, kind, a_off, b_off, dtype",
    [
        ((130, 70, 67), "matmul", 0, 0, BF),
        ((129, 66, 64), "linear", 1, 0, H),
        ((64, 130, 72), "matmul", 0, 3, BF),
        ((1, 9, 5), "linear", 0, 0, BF),
    ],
)
def test_interpreter_matches_float64_torch(monkeypatch, shape, kind, a_off, b_off, dtype):
    monkeypatch.setenv("CIRCBUF_INTERPRET", "1")
    fd = mm_fusion(kind, {BF: D.BFloat16, H: D.Half}[dtype])
    a, b = operands(*shape, kind, dtype, a_off, b_off)
    (out,) = fd.execute([a, b])
    assert fd._get_executor().realigned and fd.last_params().fill == ("tma", "tma")
    gpu_check(out, ref(a, b, kind))


def test_batched_operand_with_odd_strides(monkeypatch):
    """Fuzz 784:30's operands: A [3, 128, 7] with strides (7, 21, 1)."""
    monkeypatch.setenv("CIRCBUF_INTERPRET", "1")
    with cb.FusionDefinition() as fd:
        x1 = fd.define_tensor([3, 128, -1], dtype=D.BFloat16)
        x2 = fd.define_tensor([7, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(x1, x2))
    a = torch.randn([128, 3, 7], dtype=BF).permute([1, 0, 2])
    b = torch.randn([7, 130], dtype=BF)
    (out,) = fd.execute([a, b])
    assert fd._get_executor().realigned == ("T0", "T1")
    gpu_check(out, a.double() @ b.double())


def test_what_is_never_copied():
    a, b = operands(130, 70, 67, "matmul", BF, empty=True)
    for ov in (dict(realign=False), dict(fill="cp.async")):
        fd = mm_fusion("matmul")
        fd.fusion.schedule(**ov)
        fd.compile([a, b], arch="sm_90a")
        assert fd._get_executor().realigned == ()
    assert fd.last_params().fill == ("cp.async", "cp.async")
    fd = mm_fusion("matmul")
    fd.fusion.schedule(realign=False)
    fd.compile([a, b], arch="sm_90a")
    # no copy: the producer's cp.asyncs fill the ring (never the SIMT sum of products)
    assert fd.last_params().simt is None and fd.last_params().fill == ("cp.async", "cp.async")


def test_an_operand_written_in_place_is_not_copied():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.matmul(x, w), D.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.add(x, x), D.BFloat16), alias_input=x)
    a, b = operands(70, 67, 67, "matmul", BF, empty=True)
    fd.compile([a, b], arch="sm_90a")
    assert "T0" not in fd._get_executor().realigned


def test_realign_override_is_checked():
    fd = mm_fusion("matmul")
    with pytest.raises(cb.CircbufError, match=r"schedule\(realign='yes'\): must be True or False"):
        fd.fusion.schedule(realign="yes")


# ------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, kind, a_off, b_off",
    [
        ((2047, 2047, 2047), "matmul", 0, 0),
        ((4097, 4096, 4095), "matmul", 0, 0),
        ((4096, 50257, 768), "matmul", 0, 0),
        ((4096, 4096, 4096), "matmul", 1, 0),
        ((1000, 4098, 4100), "linear", 2, 4),
    ],
)
def test_gpu_issue_shapes(shape, kind, a_off, b_off):
    fd = mm_fusion(kind)
    a, b = operands(*shape, kind, BF, a_off, b_off, device="cuda")
    (out,) = fd.execute([a, b])
    assert fd.last_params().simt is None and fd._get_executor().realigned
    gpu_check(out, ref(a, b, kind))
    (again,) = fd.execute([a, b])  # the cached plan: the copies made again
    assert torch.equal(again, out)


@pytest.mark.gpu
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 700),
    n=st.integers(1, 700),
    k=st.integers(1, 700),
    a_off=st.integers(0, 8),
    b_off=st.integers(0, 8),
    kind=st.sampled_from(["matmul", "linear"]),
    dtype=st.sampled_from([BF, H]),
)
def test_gpu_hypothesis_odd_shapes_and_offsets(m, n, k, a_off, b_off, kind, dtype):
    fd = mm_fusion(kind, {BF: D.BFloat16, H: D.Half}[dtype])
    a, b = operands(m, n, k, kind, dtype, a_off, b_off, device="cuda")
    (out,) = fd.execute([a, b])  # outputs NaN-poisoned before the launch (conftest)
    assert fd.last_params().simt is None
    gpu_check(out, ref(a, b, kind))


def test_an_operand_returned_is_not_copied():
    """An input also returned as is stays the caller's tensor (only B is copied)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(x, w))
        fd.add_output(x)
    a, b = operands(70, 67, 67, "matmul", BF, empty=True)
    fd.compile([a, b], arch="sm_90a")
    assert fd._get_executor().realigned == ("T1",)


def test_checker_and_launch_args_take_realigned_inputs():
    """circbuf.interpret.check / launch_args compile for the copies and launch on them."""
    from circbuf.interpret import check, launch_args

    fd = mm_fusion("matmul")
    a, b = operands(130, 70, 67, "matmul", BF)
    check(fd, [a, b], schedules=2)
    _k, tensors, _s, _g, _b = launch_args(fd, [a, b])
    assert [t.stride() for t in tensors[:2]] == [(72, 1), (72, 1)]
