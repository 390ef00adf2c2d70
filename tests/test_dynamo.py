"""circbuf as a torch.compile backend, on the CPU: partitioning and translation
of aten graphs (make_fx and AOTAutograd), every fusion compiled for sm_90a,
each fusion's numerics on the kernel interpreter against float64 torch,
explain(), the fallbacks, dynamic shapes and the entry point. The GPU runs
are in tests/test_gpu_dynamo.py."""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import circbuf as cb
import circbuf.dynamo as cd
from circbuf.dynamo.backend import CircbufFusion
from circbuf.interpret import interpret
from tests.dynamo_models import MODELS, GPT2Block, MLPBlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRICT = {"compile_only": True, "record_inputs": True, "strict": True}


def _double(args):
    return [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def check_fusion_numerics(graphs) -> int:
    """Each fusion (compiled, with its first arguments recorded) on the kernel
    interpreter, against its aten subgraph in float64 (NaN-poisoned outputs:
    the interpreter fills them first), plain kernels where a fusion has them
    (quicker to interpret than TMA rings); returns how many fusions were checked."""
    checked = 0
    for g in graphs:
        for f in g.fusions:
            assert f.status == "compiled", (g.kind, f.name, f.reason)
            assert f.kernels >= 1
            ins = f.fd_inputs(f.args)
            try:  # plain kernels where there are (a matmul's fp32 SIMT path has no TMA)
                f.fd.fusion.schedule(tma=False)
                f.fd.compile(ins, arch="sm_90a")
            except cb.CircbufError:  # no kernel of the fusion takes tma
                f.fd.fusion.schedule()
            outs = interpret(f.fd, ins)
            try:
                ref = f.fd_outputs(f.eager(*_double(f.args)))
            except RuntimeError:  # an explicit float32 in the graph meets a double
                ref = f.fd_outputs(f.eager(*f.args))
            narrow = any(
                isinstance(n.meta.get("val"), torch.Tensor)
                and n.meta["val"].dtype in (torch.bfloat16, torch.float16)
                for n in f.eager.graph.nodes
            )
            for o, r in zip(outs, ref):
                assert o.shape == r.shape, (f.name, o.shape, r.shape)
                if not o.is_floating_point():
                    assert torch.equal(o, r.to(o.dtype)), f.name
                    continue
                o, r = o.double(), r.double()
                assert not torch.isnan(o).any() or torch.isnan(r).any(), (
                    f"{f.name}: NaN (an unwritten element?)"
                )
                # 16-bit intermediates: the kernel rounds where the graph does, in another order
                tol = 1e-2 if narrow else 1e-5
                scale = r[torch.isfinite(r)].abs().max().item() if torch.isfinite(r).any() else 1.0
                torch.testing.assert_close(o, r, rtol=tol, atol=tol * max(scale, 1.0), equal_nan=True)
            checked += 1
    return checked


def aten_graph(fn, *inputs):
    """``fn``'s aten graph as the backend sees one: functional, with the backend's decompositions."""
    from torch.func import functionalize

    return make_fx(
        functionalize(fn, remove="mutations"),
        decomposition_table=cd.decompositions(),
        tracing_mode="fake",
    )(*inputs)


def run_graph(fn, inputs, **options):
    """Partition and translate ``fn``'s aten graph, compile each fusion, run it."""
    gm = aten_graph(fn, *inputs)
    with cd.capture() as graphs:
        compiled = cd.compile_aten_graph(gm, inputs, "inference", {**STRICT, **options})
        out = compiled(list(inputs))
    return (out if isinstance(out, (tuple, list)) else [out]), graphs


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


FUNCTIONS = {
    "pointwise": (
        lambda x, y: (
            torch.sigmoid(x) * torch.tanh(y)
            - torch.exp(-x.abs()) / (1 + y * y)
            + torch.rsqrt(x * x + 1)
            + torch.log1p(x.abs())
            + F.relu(y) ** 2
            - torch.sqrt(y.abs())
        ),
        [(8, 16), (8, 16)],
    ),
    "silu_gelu": (lambda x: F.silu(x) + F.gelu(x) + F.gelu(x, approximate="tanh"), [(8, 16)]),
    "where_clamp": (
        lambda x, y: torch.where(x > y, x.clamp(-0.5, 0.5), y.clamp_min(0)) + x.masked_fill(y < 0, 3.0),
        [(8, 16), (8, 16)],
    ),
    "reductions": (
        lambda x: x.sum(-1) + x.mean(-1) + x.amax(-1) - x.amin(-1) + x.var(-1) + x.var(-1, unbiased=False),
        [(8, 16)],
    ),
    "column_sum": (lambda x: (x * 2).sum(0), [(16, 8)]),
    "softmax": (lambda x: torch.softmax(x, -1) * 3 + torch.log_softmax(x, -1), [(8, 16)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b) * 2, [(8, 16), (16,), (16,)]),
    "casts": (
        lambda x: (x.to(torch.bfloat16) * 2).float() + x.to(torch.float16).sum(-1, keepdim=True).float(),
        [(8, 16)],
    ),
    "views": (
        lambda x: (
            (x.view(4, 2, 16).permute(1, 0, 2) * 2).reshape(2, 64).t().unsqueeze(0).expand(3, 64, 2).sum(0)
            + x.sum()
        ),
        [(8, 16)],
    ),
    "full": (
        lambda x: (
            x + torch.full((8, 16), 2.0) + torch.scalar_tensor(1.5) + torch.ones_like(x) * torch.zeros(16)
        ),
        [(8, 16)],
    ),
    "addmm": (lambda a, b, bias: torch.addmm(bias, a, b, beta=0.5) + (a @ b), [(8, 16), (16, 24), (24,)]),
    "bmm": (lambda a, b: torch.bmm(a, b).relu(), [(2, 8, 16), (2, 16, 8)]),
    "linear_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)), [(2, 4, 16), (24, 16), (24,)]),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_fuses_compiles_and_matches_float64_on_the_interpreter(name):
    torch.manual_seed(0)
    fn, shapes = FUNCTIONS[name]
    inputs = [r(*s) for s in shapes]
    out, graphs = run_graph(fn, inputs)
    (g,) = graphs
    assert g.fallbacks == [], g  # every aten op of these functions is in the table
    assert g.fusions
    torch.testing.assert_close(out[0], fn(*inputs))  # compile-only: the graph ran eagerly
    # each fusion runs on the interpreter (a constant fill, FullOp, too)
    assert check_fusion_numerics(graphs) == len(g.fusions)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_forward_backward_compile_only(name):
    """torch.compile(model) in compile-only mode: forward and backward graphs
    partitioned, every fusion translated and compiled for sm_90a, results and
    gradients those of eager (the graph ran eagerly), each fusion's kernels
    checked against float64 on the interpreter where it runs them."""
    torch.manual_seed(0)
    model = MODELS[name]()
    ref_model = copy.deepcopy(model)
    x = torch.randn(2, 4, 32, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    with cd.capture() as graphs:
        y = torch.compile(model, backend=cd.backend, options=STRICT)(x)
        y.sum().backward()
    yr = ref_model(xr)
    yr.sum().backward()
    torch.testing.assert_close(y, yr)
    torch.testing.assert_close(x.grad, xr.grad)
    for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
    assert [g.kind for g in graphs] == ["forward", "backward"]
    ops = {op for g in graphs for f in g.fusions for op in f.ops}
    assert "aten.mm.default" in ops  # the linears fuse (their transposed weights are views left to torch)
    assert check_fusion_numerics(graphs) >= 2


def test_gpt2_block_splits_around_split_and_cat():
    torch.manual_seed(0)
    e = cd.explain(GPT2Block(), torch.randn(2, 8, 32, requires_grad=True))
    text = str(e)
    assert "eager aten.split.Tensor: no circbuf translation" in text
    assert "eager aten.cat.default: no circbuf translation" in text
    ops = {op for f in e.fusions for op in f.ops}
    assert {
        "aten._softmax.default",
        "aten.bmm.default",
        "aten.native_layer_norm.default",
        "aten.gelu.default",
    } <= ops
    assert all(f.status == "compiled" for f in e.fusions), [f.reason for f in e.fusions]


def test_explain_names_fusions_ops_kernels_and_fallbacks():
    def fn(x, w):
        y = F.gelu(x @ w) * 2
        return torch.cumsum(y, 0) + y.exp()

    e = cd.explain(fn, torch.randn(8, 16), torch.randn(16, 8))
    text = str(e)
    assert text.startswith("circbuf: 1 aten graphs, ")
    assert "inference graph (compile-only" in text
    assert "eager aten.cumsum.default: no circbuf translation" in text
    assert "aten.mm.default" in text and "aten.gelu.default" in text
    assert "kernel" in text
    (g,) = e.graphs
    assert [op for _, op, _ in g.fallbacks] == ["aten.cumsum.default"]
    assert all(f.kernels >= 1 for f in e.fusions)
    assert e.fusions[0].ops[:2] == ["aten.mm.default", "aten.gelu.default"]


def test_env_knob_selects_compile_only(monkeypatch):
    monkeypatch.setenv("CIRCBUF_DYNAMO_COMPILE_ONLY", "1")
    x = torch.randn(4, 8)
    with cd.capture() as graphs:
        out = torch.compile(lambda t: torch.tanh(t) * 3, backend=cd.backend)(x)
    torch.testing.assert_close(out, torch.tanh(x) * 3)
    (g,) = graphs
    assert g.compile_only and g.fusions[0].status == "compiled" and g.fusions[0].kernels == 1
    monkeypatch.setenv("CIRCBUF_DYNAMO_COMPILE_ONLY", "2")
    with pytest.raises(cb.CircbufError, match="CIRCBUF_DYNAMO_COMPILE_ONLY='2'"):
        cd.backend(None, [], options=None)


def test_unknown_option_is_named():
    with pytest.raises(cb.CircbufError, match=r"unknown option\(s\) \['tile'\]"):
        cd.backend(None, [], options={"tile": 1})


# ------------------------------------------------------------- fallbacks
def _compiled_matches_eager(fn, *inputs, **options):
    with cd.capture() as graphs:
        out = torch.compile(fn, backend=cd.backend, options=options)(*inputs)
    ref = fn(*inputs)
    return out, ref, graphs


def _reasons(graphs):
    return {op: why for g in graphs for _, op, why in g.fallbacks}


def test_random_ops_fall_back():
    def fn(x):
        torch.manual_seed(1)
        return F.dropout(x, 0.5, training=True) * 2 + torch.rand_like(x)

    out, ref, graphs = _compiled_matches_eager(fn, torch.randn(8, 16), compile_only=True)
    assert out.shape == ref.shape
    why = _reasons(graphs)
    assert why["aten.rand_like.default"] == "random op"
    assert any(f.status == "compiled" for g in graphs for f in g.fusions)  # the arithmetic around them fuses


def test_complex_falls_back():
    fn = lambda x: (x.to(torch.complex64) * 2).real + 1  # noqa: E731
    out, ref, graphs = _compiled_matches_eager(fn, torch.randn(8, 4), compile_only=True)
    torch.testing.assert_close(out, ref)
    assert _reasons(graphs)["aten.mul.Tensor"] == "complex dtype torch.complex64"


def test_cpu_tensors_fall_back_without_compile_only():
    x = torch.randn(8, 16)
    out, ref, graphs = _compiled_matches_eager(lambda t: F.gelu(t) * 2 + torch.cumsum(t, 0), x)
    torch.testing.assert_close(out, ref)
    (g,) = graphs
    assert g.fusions == [] and not g.compile_only
    why = _reasons(graphs)
    assert why["aten.gelu.default"] == "a CPU tensor (circbuf runs on CUDA tensors)"
    assert why["aten.cumsum.default"] == "no circbuf translation"


def test_sdpa_stays_eager():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 2  # noqa: E731
    out, ref, graphs = _compiled_matches_eager(fn, q, k, v, compile_only=True)
    torch.testing.assert_close(out, ref)
    assert any("scaled_dot_product_attention stays eager" in why for why in _reasons(graphs).values())


def test_unsupported_dtype_falls_back():
    x = torch.randint(0, 100, (8, 16), dtype=torch.uint8)
    out, ref, graphs = _compiled_matches_eager(lambda t: t * 2 + 1, x, compile_only=True)
    torch.testing.assert_close(out, ref)
    assert _reasons(graphs)["aten.mul.Tensor"].startswith("dtype torch.uint8")


def test_in_place_update_of_an_input():
    def fn(x, buf):
        buf.add_(1)
        return x * buf

    x, buf = torch.randn(8), torch.zeros(8)
    with cd.capture() as graphs:
        out = torch.compile(fn, backend=cd.backend, options=STRICT)(x, buf)
    torch.testing.assert_close(out, x)
    torch.testing.assert_close(buf, torch.ones(8))  # AOTAutograd applies the mutation
    assert all(f.status == "compiled" for g in graphs for f in g.fusions)


def test_translation_failure_leaves_that_node_eager():
    fn = lambda x: (torch.div(x * 2, 3, rounding_mode="floor") + 1).exp()  # noqa: E731
    out, ref, graphs = _compiled_matches_eager(fn, torch.randn(8, 8), **STRICT)
    torch.testing.assert_close(out, ref)
    (g,) = graphs
    assert _reasons(graphs) == {
        "aten.div.Tensor_mode": "div with rounding_mode='floor' (only None and 'trunc' are translated)"
    }
    assert [f.ops for f in g.fusions] == [["aten.mul.Tensor"], ["aten.add.Tensor", "aten.exp.default"]]


def test_compile_failure_falls_back_with_the_reason(monkeypatch):
    def refuse(self, inputs, arch=None, target=None):
        raise cb.CircbufError("refused for the test")

    monkeypatch.setattr(cb.FusionDefinition, "compile", refuse)
    x = torch.randn(8, 8)
    out, ref, graphs = _compiled_matches_eager(lambda t: t.sin() + 1, x, compile_only=True)
    torch.testing.assert_close(out, ref)
    (f,) = graphs[0].fusions
    assert (f.status, f.reason) == ("eager", "compile: refused for the test")
    assert "runs eagerly: compile: refused for the test" in str(graphs[0])
    with pytest.raises(cb.CircbufError, match="refused for the test"):  # strict raises instead
        torch.compile(lambda t: t.cos() + 1, backend=cd.backend, options=STRICT)(x)


# ---------------------------------------------------------------- shapes
def test_dynamic_shapes_give_symbolic_extents():
    torch.manual_seed(0)
    model = MLPBlock()
    cm = torch.compile(model, backend=cd.backend, options=STRICT, dynamic=True)
    with cd.capture() as graphs, torch.no_grad():
        for n in (5, 7):
            x = torch.randn(n, 3, 32)
            torch.testing.assert_close(cm(x), model(x))
    (g,) = graphs  # one graph serves both sizes
    (f,) = g.fusions
    x_in = f.fd.fusion.inputs[0]
    extents = [ax.extent for ax in x_in.domain.no_reductions()]
    assert [isinstance(e, cb.ir.Const) for e in extents] == [False, False, True]  # [-1, -1, 32]
    assert check_fusion_numerics(graphs) == 1


def test_static_shapes_are_constants():
    with cd.capture() as graphs:
        torch.compile(lambda t: t.exp() * 2, backend=cd.backend, options=STRICT, dynamic=False)(
            torch.randn(6, 5)
        )
    x_in = graphs[0].fusions[0].fd.fusion.inputs[0]
    assert [e.extent.value for e in x_in.domain.no_reductions()] == [6, 5]


# ------------------------------------------------- execution, interpreted
def test_fused_calls_run_through_the_interpreter(monkeypatch):
    """The execute path of each fused call (inputs picked from the call, outputs
    put back where the graph uses them, laid out as the graph recorded, the
    graph reordered around the calls), with fd.execute replaced by the kernel
    interpreter: forward and backward of the GPT-2 block, its fusions between
    eager split and cat, match float64 torch; outputs the graph lays out
    transposed come back transposed."""
    init = CircbufFusion.__init__
    ran = {}

    def interpreted(self, rec, layouts, opts):
        init(self, rec, layouts, {**opts, "compile_only": False})
        fd = self.fd

        def execute(ins):
            try:
                fd.fusion.schedule(tma=False)
                fd.compile(ins, arch="sm_90a")
            except cb.CircbufError:
                fd.fusion.schedule()
            outs = interpret(fd, ins)
            ran[rec.name] = [o.stride() for o in outs]
            return outs

        fd.execute = execute
        fd.last_params = lambda: None

    monkeypatch.setattr(CircbufFusion, "__init__", interpreted)
    torch.manual_seed(0)
    model = GPT2Block()
    ref = copy.deepcopy(model).double()
    x = torch.randn(2, 4, 32, requires_grad=True)
    xr = x.detach().double().requires_grad_(True)
    with cd.capture() as graphs:
        y = torch.compile(model, backend=cd.backend, options={"compile_only": True})(x)
        y.sum().backward()
    yr = ref(xr)
    yr.sum().backward()
    fusions = [f for g in graphs for f in g.fusions]
    # every fusion ran on the interpreter, the causal mask's fill (FullOp) too
    assert [f.ops for f in fusions if f.status != "ran"] == []
    assert sum(f.status == "ran" for f in fusions) >= 8
    torch.testing.assert_close(y.double(), yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-5, atol=1e-5, msg=n)

    # a result the graph records transposed (the mul of a transposed view) feeds an eager op
    def fn(a):
        return torch.cumsum(a.t() * 2, 1)

    a = torch.randn(6, 4)
    ran.clear()
    with cd.capture() as graphs:
        out = torch.compile(fn, backend=cd.backend, options={"compile_only": True})(a)
    torch.testing.assert_close(out, fn(a))
    (f,) = graphs[0].fusions
    assert f.fd.fusion.outputs[0].domain.stride_order == [0, 1]  # allocated as the graph lays it out
    assert ran[f.name] == [(1, 4)]


# --------------------------------------------------------------- registry
def test_entry_point_resolves_through_torch(tmp_path):
    """pyproject.toml's torch_dynamo_backends entry point, installed as a
    distribution's metadata, is what torch.compile(backend="circbuf") finds."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        eps = tomllib.load(fh)["project"]["entry-points"]["torch_dynamo_backends"]
    assert eps == {"circbuf": "circbuf.dynamo:backend"}
    info = tmp_path / "circbuf_entry_point_check-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: circbuf-entry-point-check\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch_dynamo_backends]\ncircbuf = circbuf.dynamo:backend\n")
    code = textwrap.dedent(
        """
        import torch, circbuf.dynamo
        from torch._dynamo.backends.registry import lookup_backend, list_backends
        assert "circbuf" in list_backends(), list_backends()
        assert lookup_backend("circbuf") is circbuf.dynamo.backend
        f = torch.compile(lambda x: x.exp() + 1, backend="circbuf", options={"compile_only": True})
        x = torch.randn(4)
        assert torch.allclose(f(x), x.exp() + 1)
        print("resolved=" + circbuf.dynamo.records()[-1].fusions[0].status)
        """
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")])
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "resolved=compiled" in p.stdout


def test_reduce_overhead_without_a_gpu_runs_uncaptured():
    """mode="reduce-overhead" on CPU tensors: nothing to capture; the graph runs
    as compiled, and its record says why it was not captured."""
    import circbuf.dynamo.graphs as graphs_mod
    from circbuf.dynamo.explain import GraphRecord

    calls = []

    def fn(args):
        calls.append(len(args))
        return [args[0] * 2]

    rec = GraphRecord("inference", False)
    g = graphs_mod.GraphedCallable(fn, rec)
    assert rec.cuda_graph.startswith("not yet captured")
    x = torch.ones(3)
    for _ in range(3):
        (out,) = g([x])
        torch.testing.assert_close(out, x * 2)
    assert calls == [1, 1, 1]
    assert rec.cuda_graph in ("not captured: no CUDA device", "not captured: an input is not a CUDA tensor")
    assert "CUDA graph: not captured" in str(rec)
