"""Fusion segmentation: fusions no one scheduler takes run as several kernels.

CPU: the segment structure of each fusion and every segment compiled for
sm_90a. GPU: results against torch in float64 on hypothesis shapes, outputs
poisoned with NaN (conftest)."""

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.scheduler.segmenter import segment
from tests.util import D, assert_close

F = torch.nn.functional


# ------------------------------------------------------------- fusions
# each: (definition, inputs(m, n, dtype, device), float64 reference, expected schedulers)


def two_axes():
    """Sums of one input over its rows and over its columns."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.sum(x, [1]))
    return fd


def softmax_then_column_sum():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        s = fd.ops.softmax(fd.ops.cast(x, D.Float), 1)
        fd.add_output(fd.ops.cast(fd.ops.sum(s, [0]), D.BFloat16))
    return fd


def batch_stats_then_layer_norm():
    """var_mean over axis 0 normalizes the columns; a layer norm then
    normalizes the rows of that."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        v, m = fd.ops.var_mean(x, [0], correction=0)
        shape = [x.size(0), x.size(1)]
        y = fd.ops.mul(
            fd.ops.sub(x, fd.ops.broadcast_in_dim(m, shape, [1])),
            fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast_in_dim(v, shape, [1]), 1e-5)),
        )
        fd.add_output(fd.ops.layer_norm(y, None, None, 1e-5))
    return fd


def batch_norm():
    """var_mean over axis 0, then the normalization it feeds: one kernel."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        v, m = fd.ops.var_mean(x, [0], correction=0)
        shape = [x.size(0), x.size(1)]
        fd.add_output(
            fd.ops.mul(
                fd.ops.sub(x, fd.ops.broadcast_in_dim(m, shape, [1])),
                fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast_in_dim(v, shape, [1]), 1e-5)),
            )
        )
    return fd


def softmax_backward():
    """dx = y * (dy - sum(dy * y, 1)), with y = softmax(x) recomputed."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        dy = fd.define_tensor([-1, -1], dtype=D.Float)
        y = fd.ops.softmax(x, 1)
        s = fd.ops.sum(fd.ops.mul(dy, y), [1], keepdim=True)
        fd.add_output(fd.ops.mul(y, fd.ops.sub(dy, s)))
    return fd


def row_sum_back_then_column_sum():
    """A reduction broadcast back and then reduced over the other axis."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        r = fd.ops.sum(x, [1])
        y = fd.ops.sub(x, fd.ops.broadcast_in_dim(r, [x.size(0), x.size(1)], [0]))
        fd.add_output(fd.ops.sum(y, [0]))
    return fd


def linear_layer_norm_gelu():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        bias = fd.define_tensor([-1], dtype=D.BFloat16)
        g = fd.define_tensor([-1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        y = fd.ops.linear(x, w, bias)
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.layer_norm(y, g, b, 1e-5)), D.BFloat16))
    return fd


def matmul_softmax():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.softmax(fd.ops.matmul(a, b), 1))
    return fd


def _rand(shape, dtype, device):
    return torch.randn(*shape, dtype=dtype, device=device)


def _layer_norm64(y, g=None, b=None):
    return F.layer_norm(y, y.shape[-1:], g, b, 1e-5)


CASES = {
    "two_axes": (
        two_axes,
        lambda m, n, k, dev: [_rand((m, n), torch.float32, dev)],
        lambda x: [x.sum(0), x.sum(1)],
        ["outer_reduction", "normalization"],
    ),
    "softmax_then_column_sum": (
        softmax_then_column_sum,
        lambda m, n, k, dev: [_rand((m, n), torch.bfloat16, dev)],
        lambda x: [torch.softmax(x, 1).sum(0)],
        ["normalization", "outer_reduction"],
    ),
    "batch_stats_then_layer_norm": (
        batch_stats_then_layer_norm,
        lambda m, n, k, dev: [_rand((m, n), torch.float32, dev) * 3 + 1],
        lambda x: [_layer_norm64((x - x.mean(0)) * torch.rsqrt(x.var(0, correction=0) + 1e-5))],
        ["reduction", "normalization"],  # the column statistics with the normalization they feed
    ),
    "row_sum_back_then_column_sum": (
        row_sum_back_then_column_sum,
        lambda m, n, k, dev: [_rand((m, n), torch.float32, dev)],
        lambda x: [(x - x.sum(1, keepdim=True)).sum(0)],
        ["normalization", "outer_reduction"],
    ),
    "linear_layer_norm_gelu": (
        linear_layer_norm_gelu,
        lambda m, n, k, dev: [
            _rand((m, k), torch.bfloat16, dev),
            _rand((n, k), torch.bfloat16, dev) / k**0.5,
            _rand((n,), torch.bfloat16, dev),
            _rand((n,), torch.bfloat16, dev),
            _rand((n,), torch.bfloat16, dev),
        ],
        # the linear's output is rounded to bf16 (torch and nvFuser do too)
        lambda x, w, bias, g, b: [
            F.gelu(_layer_norm64(F.linear(x, w, bias).to(torch.bfloat16).double(), g, b))
        ],
        ["matmul", "normalization"],
    ),
    "matmul_softmax": (
        matmul_softmax,
        lambda m, n, k, dev: [
            _rand((m, k), torch.bfloat16, dev),
            _rand((k, n), torch.bfloat16, dev) / k**0.5,
        ],
        lambda a, b: [torch.softmax((a @ b).to(torch.bfloat16).double(), 1)],
        ["matmul", "normalization"],
    ),
}


# ----------------------------------------------------------------- CPU
@pytest.mark.parametrize("case", sorted(CASES))
def test_segments_and_compile(case):
    make, inputs, _, scheds = CASES[case]
    fd = make()
    seg = segment(fd.fusion)
    assert [s.scheduler for s in seg.segments] == scheds
    ck = fd.compile(inputs(96, 136, 64, "cpu"), arch="sm_90a")
    assert len(ck.kernels) == len(scheds)
    for kern, sched in zip(ck.kernels, scheds):
        assert kern.name == f"circbuf_{sched}" and len(kern.cubin) > 0
    text = str(ck)
    assert text.startswith(f"{len(scheds)} kernels (the fusion is segmented):")
    assert all(f"circbuf_{s}" in text for s in scheds)
    with pytest.raises(AttributeError, match=r"use ck.kernels\[i\].cuda"):
        ck.cuda  # noqa: B018


@pytest.mark.parametrize("make", [batch_norm, softmax_backward])
def test_one_scheduler_takes_it_one_kernel(make):
    fd = make()
    assert len(segment(fd.fusion)) == 1
    ck = fd.compile([torch.randn(64, 96)] * len(fd.fusion.inputs), arch="sm_90a")
    assert ck.kernels == [ck] and str(ck).startswith("1 kernel: circbuf_")


def test_boundaries_keep_dtypes_and_cheapest_tensor():
    """linear -> layer_norm: the GEMM writes its bf16 output (with the bias
    added); the norm reads it and does its own cast to fp32 (not a fp32 copy
    written by the GEMM). softmax -> column sum: fp32 stays fp32."""
    seg = segment(linear_layer_norm_gelu().fusion)
    (mm, norm) = seg.segments
    assert mm.math[0].startswith("T5 = linear(T0, T1, T2)") and len(mm.math) == 1
    (kind, name), *_ = [s for s in norm.inputs if s[0] == "tensor"]
    boundary = [t for t in norm.fusion.inputs if getattr(t, "name", None) == name][0]
    assert boundary.dtype == D.BFloat16
    seg = segment(softmax_then_column_sum().fusion)
    between = [t for t in seg.segments[1].fusion.inputs if t.name in seg.segments[0].outputs]
    assert between and all(t.dtype == D.Float for t in between)


def test_segments_are_deterministic_and_free_dead_tensors():
    a, b = (str(segment(linear_layer_norm_gelu().fusion)) for _ in range(2))
    assert a == b
    seg = segment(row_sum_back_then_column_sum().fusion)
    (first, second) = seg.segments
    assert first.outputs == ["T1"] and ("tensor", "T1") in second.inputs
    assert seg.last_use == {"T1": 1}  # dropped after segment 1 reads it; outputs never


def test_overrides_go_to_the_segment_that_takes_them():
    fd = linear_layer_norm_gelu()
    fd.fusion.schedule(tile=(128, 128, 64))
    ins = CASES["linear_layer_norm_gelu"][1](256, 384, 128, "cpu")
    ck = fd.compile(ins, arch="sm_90a")
    assert ck.kernels[0].params.tile == (128, 128, 64)
    fd = two_axes()
    fd.fusion.schedule(tile=(128, 128, 64))  # a matmul override: no segment takes it
    with pytest.raises(cb.CircbufError, match=r"runs as 2 segments and no segment's scheduler takes tile"):
        fd.compile([torch.randn(8, 8)], arch="sm_90a")


def test_dump_segments(monkeypatch, capsys):
    monkeypatch.setenv("CIRCBUF_DUMP", "segments")
    two_axes().compile([torch.randn(8, 8)], arch="sm_90a")
    out = capsys.readouterr().out
    assert "CIRCBUF_DUMP segments" in out and "segment 1 (normalization): T2 = sum(T0" in out


def running_sum_and_row_sums():
    """rm += sum(x, 0) in place, and sum(x + rm, 1) with the old rm."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        rm = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.add(rm, fd.ops.sum(x, [0])), alias_input=rm)
        fd.add_output(
            fd.ops.sum(fd.ops.add(x, fd.ops.broadcast_in_dim(rm, [x.size(0), x.size(1)], [1])), [1])
        )
    return fd


def test_in_place_write_comes_after_the_readers():
    """An output written in place into an input runs after every segment
    that reads the input, whatever the exprs' order."""
    fd = running_sum_and_row_sums()
    seg = segment(fd.fusion)
    assert [s.scheduler for s in seg.segments] == ["normalization", "outer_reduction"]
    assert "T3" in seg.segments[1].outputs and ("input", 1) in seg.segments[0].inputs
    # each kernel is checked on its own: the in-place kernel reads only its own element
    assert len(fd.compile([torch.randn(8, 16), torch.randn(16)], arch="sm_90a").kernels) == 2
    # the new value feeding the reader of the old one: no order works
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        rm = fd.define_tensor([-1], dtype=D.Float)
        new = fd.ops.add(rm, fd.ops.sum(x, [0]))
        fd.add_output(new, alias_input=rm)
        shape = [x.size(0), x.size(1)]
        both = fd.ops.add(fd.ops.broadcast_in_dim(new, shape, [1]), fd.ops.broadcast_in_dim(rm, shape, [1]))
        fd.add_output(fd.ops.sum(fd.ops.mul(x, both), [1]))
    with pytest.raises(cb.CircbufError, match=r"T1 is written in place \(alias_input\) by a kernel whose"):
        segment(fd.fusion)


def test_readme_segmentation_snippet_runs(capsys):
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        text = f.read()
    start = text.index("```python\n", text.index("## Segmentation")) + len("```python\n")
    exec(compile(text[start : text.index("```", start)], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("2 kernels (the fusion is segmented):\n  kernel 0: circbuf_outer_reduction (")
    assert "kernel 1: circbuf_normalization" in out and "circbuf prelude" in out


def test_a_size_no_input_carries_comes_in_as_a_scalar():
    """A mean's division by the reduced length, cut off from the reduction:
    the segment gets the length as a scalar input from the fusion's sizes."""
    from circbuf.scheduler.segmenter import _cut

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.mean(x, [1]))
    exprs = [str(e) for e in fd.fusion.exprs()]
    assert exprs[1].startswith("T2 = div(T1, i1)")
    f2, sources, outs = _cut(fd.fusion, [1])
    assert sources == [("tensor", "T1"), ("extent", "i1")] and outs == ["T2"]
    from circbuf.compiler import FusionExecutor

    ck = FusionExecutor(f2, is_segment=True).compile([torch.randn(6), 4], arch="sm_90a")
    assert ck.name == "circbuf_pointwise"


def test_no_scheduler_even_alone_is_named():
    with cb.FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor([-1], dtype=D.Float), []))
    with pytest.raises(cb.CircbufError, match="reduces no axis"):
        fd.compile([torch.randn(8)], arch="sm_90a")


# ----------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each example compiles kernels
)
@given(m=st.integers(1, 700), n8=st.integers(1, 160), k8=st.integers(1, 64))
def test_gpu_segmented_matches_torch(case, m, n8, k8):
    make, inputs, ref, scheds = CASES[case]
    n, k = 8 * n8, 8 * k8  # matmul operands: rows 16-byte aligned for TMA
    fd = make()
    ins = inputs(m, n, k, "cuda")
    outs = fd.execute(ins)
    want = ref(*[t.double() for t in ins])
    assert len(outs) == len(want)
    for o, w in zip(outs, want):
        assert_close(o, w.to(o.dtype).double() if o.dtype != torch.float32 else w, rtol=2e-2, atol=2e-2)
    assert len(fd._executor.last.kernels) == len(scheds)
    outs2 = fd.execute(inputs(m, n, k, "cuda"))  # the cached plan, fresh inputs
    assert all(not torch.isnan(o).any() for o in outs2)


@pytest.mark.gpu
def test_gpu_one_kernel_cases_match_torch():
    x = torch.randn(300, 136, device="cuda") * 2 + 1
    dy = torch.randn(300, 136, device="cuda")
    (bn,) = batch_norm().execute([x])
    xd = x.double()
    assert_close(bn, (xd - xd.mean(0)) * torch.rsqrt(xd.var(0, correction=0) + 1e-5))
    (dx,) = softmax_backward().execute([x, dy])
    y = torch.softmax(xd, 1)
    assert_close(dx, y * (dy.double() - (dy.double() * y).sum(1, keepdim=True)))


@pytest.mark.gpu
def test_gpu_in_place_after_readers():
    fd = running_sum_and_row_sums()
    x = torch.randn(200, 72, device="cuda")
    rm = torch.randn(72, device="cuda")
    old = rm.clone()
    (rows,) = fd.execute([x, rm])
    assert_close(rows, (x.double() + old.double()).sum(1))
    assert_close(rm, old.double() + x.double().sum(0))


@pytest.mark.gpu
def test_gpu_segmented_dtype_and_cached_plan():
    fd = softmax_then_column_sum()
    x = torch.randn(300, 520, dtype=torch.bfloat16, device="cuda")
    (out,) = fd.execute([x])
    assert out.dtype == torch.bfloat16 and out.shape == (520,)
    assert_close(out, torch.softmax(x.double(), 1).sum(0), rtol=2e-2, atol=2e-2)
    ex = fd._executor
    n_plans = len(ex._plans)
    x2 = torch.randn(300, 520, dtype=torch.bfloat16, device="cuda")
    assert_close(fd.execute([x2])[0], torch.softmax(x2.double(), 1).sum(0), rtol=2e-2, atol=2e-2)
    assert len(ex._plans) == n_plans
