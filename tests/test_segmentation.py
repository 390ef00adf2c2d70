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


def close(out, ref):
    """fp32 sums of up to a few hundred terms in another order than torch's."""
    assert_close(out, ref, rtol=1e-4, atol=1e-4)


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
    # the new value also feeds the reader of the old one: the old value's
    # broadcast is written first, then the in-place update, then the reader
    fd = new_and_old_running_sum()
    seg = segment(fd.fusion)
    assert [s.math[0].split(" = ")[1].split("(")[0] for s in seg.segments] == [
        "broadcast",
        "sum",
        "broadcast",
    ]
    assert ("input", 1) not in seg.segments[2].inputs and "T3" in seg.segments[1].outputs
    assert len(fd.compile([torch.randn(8, 16), torch.randn(16)], arch="sm_90a").kernels) == 3


def new_and_old_running_sum():
    """rm += sum(x, 0) in place, and sum(x * (new rm + old rm), 1)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        rm = fd.define_tensor([-1], dtype=D.Float)
        new = fd.ops.add(rm, fd.ops.sum(x, [0]))
        fd.add_output(new, alias_input=rm)
        shape = [x.size(0), x.size(1)]
        both = fd.ops.add(fd.ops.broadcast_in_dim(new, shape, [1]), fd.ops.broadcast_in_dim(rm, shape, [1]))
        fd.add_output(fd.ops.sum(fd.ops.mul(x, both), [1]))
    return fd


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


def run_here(fd, inputs):
    """``fd.execute`` without a GPU: the segmented plan the executor makes,
    each segment's kernel run by the kernel interpreter (circbuf.interpret;
    TMA rings off: plain kernels interpret quicker)."""
    from circbuf.interpret import interpret_executor

    fd.fusion.schedule(tma=False)
    ex = fd._get_executor()
    ex.compile(inputs, arch="sm_90a")
    assert ex._segments is not None
    info, _ = ex._bind(inputs, need_cuda=False)
    plan = ex._segmented_plan(info)
    subs = ex._segments[1]

    def make(i, args):
        run = lambda a, finish, sub=subs[i]: interpret_executor(sub, list(a), finish)  # noqa: E731
        plan.steps[i][0] = run
        return type("Interpreted", (), {"run": staticmethod(run)})

    plan.make = make
    return plan.run(inputs)


def reshape_across_boundary():
    """A flattening reshape, then sums over both axes of the result: the
    reshape's derived size is carried by the tensor between segments (not
    passed twice)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        r = fd.ops.reshape(x, [fd.ops.mul(x.size(0), x.size(1)), x.size(2)])
        e = fd.ops.exp(r)
        fd.add_output(fd.ops.sum(e, [0]))
        fd.add_output(fd.ops.sum(e, [1]))
    return fd


def scalar_reshape_of_a_reduction():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        n = fd.define_scalar(dtype=D.Int64)
        s = fd.ops.reshape(fd.ops.sum(x, [0]), [n, fd.ops.div(x.size(1), n)])
        fd.add_output(fd.ops.sum(s, [1]))
        fd.add_output(fd.ops.sum(x, [1]))
    return fd


def running_mean_and_two_row_sums():
    """rm = 0.9 rm + 0.1 mean(x, 0) in place; row sums of x - mean and of x * rm (old rm)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        rm = fd.define_tensor([-1], dtype=D.Float)
        m = fd.ops.mean(x, [0])
        fd.add_output(fd.ops.add(fd.ops.mul(rm, 0.9), fd.ops.mul(m, 0.1)), alias_input=rm)
        shape = [x.size(0), x.size(1)]
        fd.add_output(fd.ops.sum(fd.ops.sub(x, fd.ops.broadcast_in_dim(m, shape, [1])), [1]))
        fd.add_output(fd.ops.sum(fd.ops.mul(x, fd.ops.broadcast_in_dim(rm, shape, [1])), [1]))
    return fd


def sums_and_in_place_add():
    """Sums over both axes of x, and x + 1 written into x: the write runs last."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.add(x, 1.0), alias_input=x)
    return fd


def test_interpreted_segmented_runs_match_torch():
    torch.manual_seed(0)
    x = torch.randn(5, 7)
    close(run_here(two_axes(), [x])[1], x.double().sum(1))
    (out,) = run_here(row_sum_back_then_column_sum(), [x])
    close(out, (x.double() - x.double().sum(1, keepdim=True)).sum(0))
    x3 = torch.randn(2, 3, 4)
    a, b = run_here(reshape_across_boundary(), [x3])
    e = x3.double().reshape(6, 4).exp()
    close(a, e.sum(0))
    close(b, e.sum(1))
    x = torch.randn(3, 8)
    a, b = run_here(scalar_reshape_of_a_reduction(), [x, 4])
    close(a, x.double().sum(0).reshape(4, 2).sum(1))
    close(b, x.double().sum(1))
    rm0 = torch.randn(8)
    rm = rm0.clone()
    a, b = run_here(running_mean_and_two_row_sums(), [x, rm])
    m = x.double().mean(0)
    close(rm, 0.9 * rm0.double() + 0.1 * m)
    close(a, (x.double() - m).sum(1))
    close(b, (x.double() * rm0.double()).sum(1))
    x0 = x.clone()
    a, b = run_here(sums_and_in_place_add(), [x])
    close(a, x0.double().sum(1))
    close(b, x0.double().sum(0))
    close(x, x0.double() + 1)


def test_cast_of_an_input_is_recomputed_not_passed():
    """bf16 x cast to fp32 and summed over both axes: the second kernel reads
    x (2 bytes an element) and casts it again, not the first one's fp32 copy."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        f = fd.ops.cast(x, D.Float)
        fd.add_output(fd.ops.sum(f, [0]))
        fd.add_output(fd.ops.sum(f, [1]))
    seg = segment(fd.fusion)
    assert [s.inputs for s in seg.segments] == [[("input", 0)], [("input", 0)]]
    assert seg.segments[1].math[0] == "T1 = cast(T0, Float) (recomputed from an input)"


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
    ins2 = inputs(m, n, k, "cuda")
    outs2 = fd.execute(ins2)  # the cached plan, fresh inputs
    for o, w in zip(outs2, ref(*[t.double() for t in ins2])):
        assert_close(o, w.to(o.dtype).double() if o.dtype != torch.float32 else w, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_one_kernel_cases_match_torch():
    x = torch.randn(300, 136, device="cuda") * 2 + 1
    dy = torch.randn(300, 136, device="cuda")
    (bn,) = batch_norm().execute([x])
    xd = x.double()
    close(bn, (xd - xd.mean(0)) * torch.rsqrt(xd.var(0, correction=0) + 1e-5))
    (dx,) = softmax_backward().execute([x, dy])
    y = torch.softmax(xd, 1)
    close(dx, y * (dy.double() - (dy.double() * y).sum(1, keepdim=True)))


@pytest.mark.gpu
def test_gpu_boundary_cases():
    x3 = torch.randn(5, 6, 40, device="cuda")
    a, b = reshape_across_boundary().execute([x3])
    e = x3.double().reshape(30, 40).exp()
    close(a, e.sum(0))
    close(b, e.sum(1))
    x = torch.randn(33, 64, device="cuda")
    a, b = scalar_reshape_of_a_reduction().execute([x, 8])
    close(a, x.double().sum(0).reshape(8, 8).sum(1))
    close(b, x.double().sum(1))
    with cb.FusionDefinition() as fd:  # a segment with no inputs
        y = fd.define_tensor([-1], dtype=D.Float)
        f = fd.ops.full([4, 8], 2.0, D.Float)
        fd.add_output(fd.ops.sum(f, [0]))
        fd.add_output(fd.ops.sum(f, [1]))
        fd.add_output(fd.ops.sum(y, [0]))
    y = torch.randn(50, device="cuda")
    a, b, c = fd.execute([y])
    close(a, torch.full((8,), 8.0, dtype=torch.float64))
    close(b, torch.full((4,), 16.0, dtype=torch.float64))
    close(c, y.double().sum())
    rm0 = torch.randn(64, device="cuda")
    rm = rm0.clone()
    a, b = running_mean_and_two_row_sums().execute([x, rm])
    m = x.double().mean(0)
    close(rm, 0.9 * rm0.double() + 0.1 * m)
    close(a, (x.double() - m).sum(1))
    close(b, (x.double() * rm0.double()).sum(1))
    x0 = x.clone()
    a, b = sums_and_in_place_add().execute([x])
    close(a, x0.double().sum(1))
    close(b, x0.double().sum(0))
    close(x, x0.double() + 1)


@pytest.mark.gpu
def test_gpu_in_place_after_readers():
    fd = running_sum_and_row_sums()
    x = torch.randn(200, 72, device="cuda")
    rm = torch.randn(72, device="cuda")
    old = rm.clone()
    (rows,) = fd.execute([x, rm])
    close(rows, (x.double() + old.double()).sum(1))
    close(rm, old.double() + x.double().sum(0))
    rm = old.clone()
    (rows,) = new_and_old_running_sum().execute([x, rm])
    new = old.double() + x.double().sum(0)
    close(rm, new)
    close(rows, (x.double() * (new + old.double())).sum(1))


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
