"""nvFuser parity, issue 16 part 4: fusions nvFuser runs that circbuf once
refused.

Each fusion below is written once against a FusionDefinition-like object:
circbuf's, or :class:`_Torch`, which runs the same definition eagerly in
float64 for the reference. CPU tests compile for sm_90a and run the
kernels on the kernel interpreter (circbuf.interpret); GPU tests
compare with the float64 reference on fresh random inputs (outputs
poisoned with NaN).
"""

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from tests.test_segmentation import run_here
from tests.util import D, assert_close

DEV = "cuda"


class _Torch:
    """The FusionDefinition calls the fusions here use, run eagerly in
    float64 on given inputs (casts keep float64: the reference rounds
    nothing but the inputs)."""

    def __init__(self, inputs):
        self._inputs = [
            x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
        ]
        self.outputs = []
        self.ops = self

    def define_tensor(self, shape, contiguity=None, dtype=None, stride_order=None):
        return self._inputs.pop(0)

    def define_scalar(self, value=None, dtype=None):
        return self._inputs.pop(0) if value is None else value

    def add_output(self, t, alias_input=None):
        self.outputs.append(t)

    def cast(self, t, dtype):
        return t

    def broadcast_in_dim(self, t, shape, broadcast_dims):
        view = [1] * len(shape)
        for k, d in enumerate(broadcast_dims):
            view[d] = t.shape[k]
        return t.reshape(view).expand(shape)

    def sum(self, t, dims, keepdim=False):
        return t.sum(dims, keepdim=keepdim)

    def reshape(self, t, new_shape):
        return t.reshape(new_shape)

    def permute(self, t, dims):
        return t.permute(dims)

    add = staticmethod(lambda a, b: a + b)
    sub = staticmethod(lambda a, b: a - b)
    mul = staticmethod(lambda a, b: a * b)
    pow = staticmethod(lambda a, b: a**b)
    neg = staticmethod(lambda a: -a)
    reciprocal = staticmethod(lambda a: 1 / a)


def _reference(build, inputs):
    t = _Torch(inputs)
    build(t)
    return t.outputs


def _fusion(build):
    with cb.FusionDefinition() as fd:
        build(fd)
    return fd


# ---------------------------------------------------------------------------
# 1. statistics broadcast back over a differently sized tensor (nvFuser's
#    warp-specialized TMA normalization tests, from model traces)


def rms_norm_backward(rows, hidden, scale_input=False):
    """An RMSNorm backward as model traces give it: the weight gradient sums
    over rows; rstd ([1, R, 1], its last axis broadcast) is cubed and
    multiplied by a row statistic, the product summed over that broadcast
    axis (extent 1), and rstd is also expanded to the hidden size: one axis
    of the fusion with extents 1 and H."""

    def build(fd):
        w = fd.define_tensor([hidden], dtype=D.BFloat16)
        g2d = fd.define_tensor([rows, hidden], dtype=D.BFloat16)
        x = fd.define_tensor([1, rows, hidden], dtype=D.BFloat16)
        rstd = fd.define_tensor([1, rows, 1], dtype=D.Float)
        resid = fd.define_tensor([1, rows, hidden], dtype=D.BFloat16)
        scale = fd.define_scalar(dtype=D.Double) if scale_input else None
        g = fd.ops.cast(fd.ops.reshape(g2d, [1, rows, hidden]), D.Float)
        wf = fd.ops.add(1.0, fd.ops.cast(w, D.Float))
        gw = fd.ops.mul(fd.ops.broadcast_in_dim(wf, [1, rows, hidden], [2]), g)
        xf = fd.ops.cast(x, D.Float)
        dot = fd.ops.sum(fd.ops.mul(xf, gw), [0, 2])
        t = fd.ops.mul(
            fd.ops.mul(-0.5, fd.ops.broadcast_in_dim(dot, [1, rows, 1], [1])), fd.ops.pow(rstd, 3.0)
        )
        t = fd.ops.sum(fd.ops.mul(t, 1.0 / hidden), [0, 2])  # over the broadcast axis: extent 1
        t = fd.ops.broadcast_in_dim(
            fd.ops.broadcast_in_dim(t, [1, rows, 1], [1]), [1, rows, hidden], [0, 1, 2]
        )
        r = fd.ops.broadcast_in_dim(rstd, [1, rows, hidden], [0, 1, 2])  # the same axis, extent H
        xt = fd.ops.mul(xf, t)
        dx = fd.ops.add(fd.ops.add(fd.ops.mul(r, gw), xt), xt)
        dx = fd.ops.add(fd.ops.cast(resid, D.Float), dx)
        if scale_input:
            dx = fd.ops.mul(dx, scale)
        dw = fd.ops.sum(fd.ops.mul(fd.ops.mul(xf, r), g), [0, 1])
        fd.add_output(fd.ops.cast(dw, D.BFloat16))
        dxb = fd.ops.cast(dx, D.BFloat16)
        fd.add_output(dxb)
        if not scale_input:
            flat = fd.ops.reshape(dxb, [rows, hidden])
            fd.add_output(fd.ops.permute(flat, [1, 0]))

    def inputs(device="cpu"):
        bf = torch.bfloat16
        ins = [
            torch.randn(hidden, dtype=bf, device=device),
            torch.randn(rows, hidden, dtype=bf, device=device),
            torch.randn(1, rows, hidden, dtype=bf, device=device),
            torch.rand(1, rows, 1, device=device) + 0.5,
            torch.randn(1, rows, hidden, dtype=bf, device=device),
        ]
        return ins + [0.75] if scale_input else ins

    return build, inputs


def layer_norm_backward(a, b, hidden):
    """A LayerNorm backward over [A, B, H] with mean [A, B] and rstd
    [A, B, 1]: a row statistic made [A, B, 1] is summed over its broadcast
    axis (extent 1) while rstd is expanded to H along the same axis."""

    def build(fd):
        g2d = fd.define_tensor([a * b, hidden], dtype=D.BFloat16)
        w = fd.define_tensor([hidden], dtype=D.BFloat16)
        mean = fd.define_tensor([a, b], dtype=D.Float)
        x = fd.define_tensor([a, b, hidden], dtype=D.BFloat16)
        rstd = fd.define_tensor([a, b, 1], dtype=D.Float)
        full = [a, b, hidden]
        g = fd.ops.cast(fd.ops.reshape(g2d, full), D.Float)
        gw = fd.ops.mul(fd.ops.cast(fd.ops.broadcast_in_dim(w, full, [2]), D.Float), g)
        xc = fd.ops.sub(fd.ops.cast(x, D.Float), fd.ops.broadcast_in_dim(mean, full, [0, 1]))
        r = fd.ops.broadcast_in_dim(rstd, full, [0, 1, 2])
        s1 = fd.ops.broadcast_in_dim(fd.ops.sum(fd.ops.mul(xc, gw), [2]), [a, b, 1], [0, 1])
        v = fd.ops.sum(fd.ops.mul(fd.ops.mul(-0.5, s1), fd.ops.pow(rstd, 3.0)), [2])
        rg = fd.ops.mul(r, gw)
        s2 = fd.ops.broadcast_in_dim(fd.ops.sum(fd.ops.neg(rg), [2]), [a, b, 1], [0, 1])
        m = fd.ops.sum(s2, [2])  # over the broadcast axis: extent 1
        dv = fd.ops.mul(fd.ops.mul(2.0, fd.ops.broadcast_in_dim(v, full, [0, 1])), xc)
        dm = fd.ops.mul(1.0 / hidden, fd.ops.broadcast_in_dim(m, full, [0, 1]))
        dx = fd.ops.add(rg, fd.ops.add(fd.ops.mul(dv, 1.0 / hidden), dm))
        dxb = fd.ops.cast(dx, D.BFloat16)
        fd.add_output(fd.ops.reshape(dxb, [a * b, hidden]))
        fd.add_output(dxb)
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(fd.ops.mul(xc, r), g), [0, 1]), D.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.sum(dx, [0, 1]), D.BFloat16))

    def inputs(device="cpu"):
        bf = torch.bfloat16
        return [
            torch.randn(a * b, hidden, dtype=bf, device=device),
            torch.randn(hidden, dtype=bf, device=device),
            torch.randn(a, b, device=device),
            torch.randn(a, b, hidden, dtype=bf, device=device),
            torch.rand(a, b, 1, device=device) + 0.5,
        ]

    return build, inputs


def _bcast_two_extents(fixed):
    """nvFuser's test_bcast_different_extent: one [1, 2, 3] tensor added to a
    [1, 4, 2, 3] and a [1, 5, 2, 3] one."""

    def build(fd):
        t0 = fd.define_tensor([1, 4, 2, 3] if fixed else [1, -1, -1, -1], dtype=D.Float)
        t1 = fd.define_tensor([1, 5, 2, 3] if fixed else [1, -1, -1, -1], dtype=D.Float)
        t2 = fd.define_tensor([1, 2, 3] if fixed else [1, -1, -1], dtype=D.Float)
        b = fd.ops.broadcast_in_dim(t2, [1, 1, 2, 3], [0, 2, 3])  # one broadcast joins both
        fd.add_output(fd.ops.add(t0, b))
        fd.add_output(fd.ops.add(t1, b))

    def inputs(device="cpu"):
        return [
            torch.randn(1, 4, 2, 3, device=device),
            torch.randn(1, 5, 2, 3, device=device),
            torch.randn(1, 2, 3, device=device),
        ]

    return build, inputs


# (name, case maker, small sizes for the interpreter, model-trace sizes for the GPU)
NORM_CASES = {
    "rms_norm_backward": (rms_norm_backward, (6, 40), (4096, 3072)),
    "rms_norm_backward_scaled": (lambda r, h: rms_norm_backward(r, h, True), (5, 24), (4096, 3072)),
    "layer_norm_backward": (layer_norm_backward, (2, 3, 40), (288, 512, 128)),
    "bcast_two_extents": (lambda: _bcast_two_extents(True), (), ()),
    "bcast_two_extents_symbolic": (lambda: _bcast_two_extents(False), (), ()),
}


def _check(outs, refs):
    """Outputs against float64 references: sums of bf16 products in fp32,
    rounded to bf16, are good to a fraction of the output's scale."""
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        r = r.to(torch.float64)
        assert_close(o, r, atol=max(1e-2, 1e-2 * r.abs().max().item()))


@pytest.mark.parametrize("name", sorted(NORM_CASES))
def test_axes_of_two_extents_are_segmented_on_the_interpreter(name):
    make, small, _ = NORM_CASES[name]
    build, inputs = make(*small)
    fd = _fusion(build)
    torch.manual_seed(0)
    ins = inputs()
    outs = run_here(fd, ins)
    assert len(fd._get_executor()._segments[0]) >= 2
    _check(outs, _reference(build, ins))


@pytest.mark.parametrize("name", ["rms_norm_backward", "layer_norm_backward"])
def test_model_trace_sizes_compile_for_sm90a(name):
    """At the traces' sizes (TMA and normalization kernels the interpreter
    cannot run): segmented, every kernel built."""
    make, _, big = NORM_CASES[name]
    build, inputs = make(*big)
    ck = _fusion(build).compile(inputs(), arch="sm_90a")
    assert len(ck.kernels) >= 3 and all(k.cubin for k in ck.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(NORM_CASES))
def test_axes_of_two_extents_match_torch(name):
    make, _, big = NORM_CASES[name]
    build, inputs = make(*big)
    fd = _fusion(build)
    torch.manual_seed(1)
    ins = inputs(DEV)
    _check(fd.execute(ins), _reference(build, [x.cpu() if isinstance(x, torch.Tensor) else x for x in ins]))


# ---------------------------------------------------------------------------
# 3. contiguity of expanded (stride-0) axes, as nvFuser gives it

EXPANDED = [
    ([True, None], lambda dev: torch.randn(8, device=dev).unsqueeze(1).expand(8, 4)),
    ([None, True], lambda dev: torch.randn(4, device=dev).unsqueeze(0).expand(8, 4)),
    ([True, None, True], lambda dev: torch.randn(3, 1, 5, device=dev).expand(3, 4, 5)),
]


def _expanded_fusion(contiguity):
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(contiguity), contiguity=contiguity, dtype=D.Float)
        fd.add_output(fd.ops.mul(t, 2.0))
        fd.add_output(fd.ops.sum(t, [len(contiguity) - 1]))
    return fd


@pytest.mark.parametrize("k", range(len(EXPANDED)))
def test_expanded_axes_have_no_contiguity_on_the_interpreter(k):
    contiguity, make = EXPANDED[k]
    x = make("cpu")
    a, b = interpret(_expanded_fusion(contiguity), [x])
    assert_close(a, 2 * x.double())
    assert_close(b, x.double().sum(-1))


def test_an_expanded_axis_declared_contiguous_is_refused():
    x = torch.randn(8).unsqueeze(1).expand(8, 4)
    with pytest.raises(cb.CircbufError, match="axis 1 is defined contiguous but its stride is 0, not 1"):
        _expanded_fusion([True, True]).compile([x], arch="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("k", range(len(EXPANDED)))
def test_expanded_axes_match_torch(k):
    contiguity, make = EXPANDED[k]
    x = make(DEV)
    a, b = _expanded_fusion(contiguity).execute([x])
    assert_close(a, 2 * x.double())
    assert_close(b, x.double().sum(-1))


# ---------------------------------------------------------------------------
# 4/5. outputs that are inputs, or reshapes / squeezes of inputs: no kernel


def _views_fusion(with_kernel):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        y = fd.define_tensor([-1, 1], dtype=D.Float)
        fd.add_output(y)
        fd.add_output(fd.ops.squeeze(y, [1]))
        fd.add_output(fd.ops.reshape(x, [-1]))
        fd.add_output(fd.ops.reshape(fd.ops.reshape(x, [1, -1]), [fd.ops.size(x, 1), fd.ops.size(x, 0)]))
        if with_kernel:
            fd.add_output(fd.ops.exp(fd.ops.squeeze(y, [1])))
    return fd


def _check_views(outs, x, y):
    assert outs[0] is y
    for o, ref in zip(outs[1:4], [y.reshape(-1), x.reshape(-1), x.reshape(x.shape[1], x.shape[0])]):
        assert o.shape == ref.shape and torch.equal(o, ref)
        assert o.data_ptr() == ref.data_ptr()  # a view of the input, never a copy


@pytest.fixture
def cpu_execute(monkeypatch):
    """``execute`` on CPU tensors, for fusions that launch no kernel."""
    from circbuf.compiler import FusionExecutor

    bind = FusionExecutor._bind
    monkeypatch.setattr(FusionExecutor, "_bind", lambda self, inputs, need_cuda: bind(self, inputs, False))


def test_every_output_an_input_or_a_view_of_one_runs_no_kernel(cpu_execute):
    fd = _views_fusion(False)
    assert not fd.fusion.outputs and "a view of input T0, no kernel" in str(fd.fusion)
    x, y = torch.randn(3, 4), torch.randn(5, 1)
    for _ in range(2):  # the plan made, then the plan found
        _check_views(fd.execute([x, y]), x, y)


def test_views_of_inputs_next_to_a_kernel_output_are_aliases():
    fd = _views_fusion(True)
    assert len(fd.fusion.outputs) == 1  # only exp(y) is computed
    x, y = torch.randn(3, 4), torch.randn(5, 1)
    outs = interpret(fd, [x, y])
    _check_views(outs, x, y)
    assert_close(outs[4], y.double().squeeze(1).exp())


def test_an_expanded_broadcast_of_an_input_is_computed_not_viewed():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.reshape(fd.ops.broadcast_in_dim(x, [2, fd.ops.size(x, 0)], [1]), [-1]))
    assert len(fd.fusion.outputs) == 1 and not fd.fusion.input_views
    x = torch.randn(3)
    (out,) = interpret(fd, [x])
    assert_close(out, x.double().expand(2, 3).reshape(-1))


@pytest.mark.gpu
@pytest.mark.parametrize("with_kernel", [False, True])
def test_views_of_inputs_are_aliases_on_the_gpu(with_kernel):
    fd = _views_fusion(with_kernel)
    x, y = torch.randn(3, 4, device=DEV), torch.randn(5, 1, device=DEV)
    for _ in range(2):
        outs = fd.execute([x, y])
        _check_views(outs, x, y)
        if with_kernel:
            assert_close(outs[4], y.double().squeeze(1).exp())


# ---------------------------------------------------------------------------
# 2. an input written in place that is also read through a broadcast, a
#    reduction or a permutation: its readers run before the writing segment


def _alias_bias_update():
    """y = a + b (b of [1, C], read by every row) and b *= 0.5 in place."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.Float)
        b = fd.define_tensor([1, -1], dtype=D.Float)
        fd.add_output(fd.ops.add(a, b))
        fd.add_output(fd.ops.mul(b, 0.5), alias_input=b)
    return fd, lambda a, b: [a + b], lambda a, b: 0.5 * b


def _alias_center_rows():
    """x -= mean(x, 1): x read through a reduction and a broadcast of it."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        m = fd.ops.broadcast_in_dim(fd.ops.mean(x, [1]), [fd.ops.size(x, 0), fd.ops.size(x, 1)], [0])
        fd.add_output(fd.ops.sub(x, m), alias_input=x)
    return fd, lambda x: [], lambda x: x - x.mean(1, keepdim=True)


def _alias_transpose():
    """x = 2 x^T for a square x: the output's axes are x's, reordered."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.mul(fd.ops.permute(x, [1, 0]), 2.0), alias_input=x)
    return fd, lambda x: [], lambda x: 2 * x.T


ALIAS_CASES = {
    "bias_update": (
        _alias_bias_update,
        lambda dev, n: [torch.randn(n, 7, device=dev), torch.randn(1, 7, device=dev)],
    ),
    "center_rows": (_alias_center_rows, lambda dev, n: [torch.randn(n, 9, device=dev)]),
    "transpose": (_alias_transpose, lambda dev, n: [torch.randn(n, n, device=dev)]),
}


@pytest.mark.parametrize("name", sorted(ALIAS_CASES))
def test_aliased_inputs_read_otherwise_are_written_last(name):
    make, inputs = ALIAS_CASES[name]
    fd, outs_ref, new_ref = make()
    ins = inputs("cpu", 6)
    before = [x.clone() for x in ins]
    outs = run_here(fd, ins)
    seg = fd._get_executor()._segments[0]
    assert len(seg) >= 2 and seg.segments[-1].fusion.aliases  # the write comes last
    _check(outs, outs_ref(*[x.double() for x in before]))
    assert_close(ins[-1], new_ref(*[x.double() for x in before]))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(ALIAS_CASES))
def test_aliased_inputs_read_otherwise_match_torch(name):
    make, inputs = ALIAS_CASES[name]
    fd, outs_ref, new_ref = make()
    ins = inputs(DEV, 4099)  # many blocks: a write racing a read would show
    before = [x.double() for x in ins]
    _check(fd.execute(ins), outs_ref(*before))
    assert_close(ins[-1], new_ref(*before))


# ---------------------------------------------------------------------------
# 4. a 0-dim statistic (over all axes) feeding later ops across segments


def _zero_dim_stat(kind):
    """x minus a statistic over all of x, summed over rows (another kernel),
    and the statistic itself."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        shape = [fd.ops.size(x, 0), fd.ops.size(x, 1)]
        if kind == "mean":
            s = fd.ops.mean(x, [0, 1])
        elif kind == "var_mean":
            s = fd.ops.var_mean(x, [0, 1])[0]
        elif kind == "welford":
            s = fd.ops.welford(x, [0, 1])[1]  # M2: the sum of squared deviations
        else:  # layer_norm over both axes; its statistics stay inside
            fd.add_output(fd.ops.sum(fd.ops.layer_norm(x, None, None, 1e-5, normalized_ndim=2), [0]))
            return fd
        fd.add_output(fd.ops.sum(fd.ops.sub(x, fd.ops.broadcast_in_dim(s, shape, [])), [0]))
        fd.add_output(s)
    return fd


def _zero_dim_ref(kind, x):
    if kind == "layer_norm":
        return [torch.nn.functional.layer_norm(x, x.shape, eps=1e-5).sum(0)]
    s = {"mean": x.mean(), "var_mean": x.var(), "welford": x.var(unbiased=False) * x.numel()}[kind]
    return [(x - s).sum(0), s]


ZERO_DIM = ["mean", "var_mean", "welford", "layer_norm"]


@pytest.mark.parametrize("kind", ZERO_DIM)
def test_zero_dim_statistics_cross_segments_on_the_interpreter(kind):
    fd = _zero_dim_stat(kind)
    x = torch.randn(5, 7)
    outs = run_here(fd, [x])
    seg = fd._get_executor()._segments[0]
    # the statistic's 0-dim division joins its reduction's kernel (no scheduler takes it alone)
    assert not any(all("div" in m or "broadcast" in m for m in s.math) for s in seg.segments), str(seg)
    _check(outs, _zero_dim_ref(kind, x.double()))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ZERO_DIM)
@pytest.mark.parametrize("shape", [(5, 7), (1000, 3000)])
def test_zero_dim_statistics_match_torch(kind, shape):
    fd = _zero_dim_stat(kind)
    x = torch.randn(*shape, device=DEV)
    _check(fd.execute([x]), _zero_dim_ref(kind, x.double()))


# ---------------------------------------------------------------------------
# 4. shapes from scalar arithmetic, define_vector


def _reshape_from_scalars():
    """nvFuser-style dynamic shapes: [s0 * 192 / s1, -1] from scalar inputs."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        s0 = fd.define_scalar(dtype=D.Int64)
        s1 = fd.define_scalar(dtype=D.Int64)
        n = fd.ops.div(fd.ops.mul(s0, 192), s1)
        fd.add_output(fd.ops.exp(fd.ops.reshape(x, [n, -1])))
    return fd


def _define_vector_fusion():
    """A shape vector of tensor sizes, and a run-time vector input."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
        b = fd.define_tensor([-1], dtype=D.Float)
        v = fd.define_vector([fd.ops.mul(x.size(0), x.size(1)), x.size(2)], dtype=D.Int64)
        y = fd.ops.add(
            fd.ops.reshape(x, v), fd.ops.broadcast_in_dim(b, fd.define_vector([1, x.size(2)]), [1])
        )
        w = fd.define_vector(3)
        fd.add_output(y)
        fd.add_output(fd.ops.sum(fd.ops.reshape(fd.ops.neg(x), w), [2]))
    return fd


def test_reshape_to_scalar_arithmetic_on_the_interpreter():
    fd = _reshape_from_scalars()
    x = torch.randn(4, 96)
    for s0, s1 in ((2, 4), (1, 2)):
        (out,) = interpret(fd, [x, s0, s1])
        assert_close(out, x.double().reshape(s0 * 192 // s1, -1).exp())
    with pytest.raises(cb.CircbufError, match="384 elements"):
        fd.compile([x, 1, 5], arch="sm_90a")  # 38 rows do not divide 384 elements


def test_define_vector_on_the_interpreter():
    fd = _define_vector_fusion()
    x, b = torch.randn(2, 3, 4), torch.randn(4)
    y, s = interpret(fd, [x, b, [4, 3, 2]])
    assert_close(y, x.double().reshape(6, 4) + b.double())
    assert_close(s, -x.double().reshape(4, 3, 2).sum(2))
    with pytest.raises(cb.CircbufError, match=r"input 2 is a vector of 3 sizes"):
        fd.compile([x, b, [4, 6]], arch="sm_90a")
    with pytest.raises(cb.CircbufError, match="define_vector: entry 1"):
        cb.FusionDefinition().define_vector([2, 1.5])


@pytest.mark.gpu
def test_scalar_shapes_and_vectors_match_torch():
    x = torch.randn(64, 96, device=DEV)
    (out,) = _reshape_from_scalars().execute([x, 8, 4])
    assert_close(out, x.double().reshape(384, -1).exp())
    fd = _define_vector_fusion()
    x, b = torch.randn(20, 30, 40, device=DEV), torch.randn(40, device=DEV)
    for w in ([40, 30, 20], (600, 2, 20)):
        y, s = fd.execute([x, b, w])
        assert_close(y, x.double().reshape(600, 40) + b.double())
        assert_close(s, -x.double().reshape(w).sum(2))


# ---------------------------------------------------------------------------
# 4. a matmul next to a reduction, K = 0 or not a multiple of 8 (the SIMT
#    sum-of-products path) and K = 64 (tensor cores, on the GPU)


def _matmul_and_reduction(variant):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        c = fd.ops.matmul(a, b)
        if variant == "input_row_sums":
            fd.add_output(c)
            fd.add_output(fd.ops.sum(fd.ops.cast(a, D.Float), [1]))
        else:
            fd.add_output(c)
            fd.add_output(fd.ops.sum(fd.ops.cast(c, D.Float), [1 if variant == "row_sums" else 0]))
    return fd


def _matmul_refs(variant, a, b):
    c = (a.double() @ b.double()).to(torch.bfloat16)  # the reduction reads c as written, in bf16
    s = {"input_row_sums": a.double().sum(1), "row_sums": c.double().sum(1), "col_sums": c.double().sum(0)}
    return [c.double(), s[variant]]


MM_VARIANTS = ["input_row_sums", "row_sums", "col_sums"]


@pytest.mark.parametrize("variant", MM_VARIANTS)
@pytest.mark.parametrize("k", [0, 12, 13])
def test_matmul_next_to_a_reduction_with_odd_k_on_the_interpreter(variant, k):
    """K = 12 and 13 (rows of 24 and 26 bytes: no tensor map's) run on the
    tensor cores with a cp.async fill since issue 18 (8-byte copies, and
    through registers), K = 0 on the SIMT path: the kernel interpreter runs
    the segmented plan."""
    fd = _matmul_and_reduction(variant)
    a, b = torch.randn(33, k, dtype=torch.bfloat16), torch.randn(k, 20, dtype=torch.bfloat16)
    outs = interpret(fd, [a, b])
    c, s = _matmul_refs(variant, a, b)
    assert_close(outs[0], c)  # K = 0: zeros, as torch
    assert_close(outs[1], s, atol=1e-3 * (1 + s.abs().max().item()))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", MM_VARIANTS)
@pytest.mark.parametrize("k", [0, 12, 13, 64, 1000])
def test_matmul_next_to_a_reduction_matches_torch(variant, k):
    fd = _matmul_and_reduction(variant)
    a, b = (
        torch.randn(300, k, dtype=torch.bfloat16, device=DEV),
        torch.randn(k, 200, dtype=torch.bfloat16, device=DEV),
    )
    outs = fd.execute([a, b])
    c, s = _matmul_refs(variant, a.cpu(), b.cpu())
    assert_close(outs[0], c)
    assert_close(outs[1], s, atol=1e-2 * (1 + s.abs().max().item()))
