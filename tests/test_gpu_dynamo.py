"""torch.compile(model, backend=circbuf) on the GPU: forward (inference) and a
training step of small models in plain torch.nn, against eager torch and a
float64 reference.

Tolerances: the error of a result is max|out - ref64| / max|ref64|, ref64
the same model run in float64. circbuf's error must be at most twice eager
torch's on the same inputs plus a floor: 1e-5 in float32 (TF32 off), 8e-3 in
bfloat16 (two bf16 ulps at 1: circbuf rounds where eager rounds, but
accumulates matmuls and reductions in another order)."""

import copy

import pytest
import torch

import circbuf.dynamo as cd
from tests.dynamo_models import AttentionScores, GPT2Block, LlamaMLP, MLPBlock

pytestmark = pytest.mark.gpu

FLOOR = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
DTYPES = [torch.float32, torch.bfloat16]


def _err(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _check(out, eager, ref, dtype, what=""):
    assert out.shape == ref.shape and out.dtype == eager.dtype
    assert not torch.isnan(out).any(), f"{what}: NaN"
    e_cb, e_eager = _err(out, ref), _err(eager, ref)
    assert e_cb <= 2 * e_eager + FLOOR[dtype], f"{what}: circbuf error {e_cb:.2e}, eager {e_eager:.2e}"


def _all_ran(graphs):
    fusions = [f for g in graphs for f in g.fusions]
    assert fusions, "no fusion"
    bad = [(f.name, f.reason) for f in fusions if f.status != "ran"]
    assert not bad, f"fusions that fell back: {bad}\n" + "\n".join(str(g) for g in graphs)


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_block_inference(dtype):
    """LayerNorm -> Linear -> GELU -> Linear (+ residual), under no_grad."""
    torch.manual_seed(0)
    model = MLPBlock(256, 1024).cuda().to(dtype).eval()
    ref_model = copy.deepcopy(model).double()
    x = torch.randn(4, 64, 256, device="cuda", dtype=dtype)
    with torch.no_grad(), cd.capture() as graphs:
        compiled = torch.compile(model, backend=cd.backend)
        out = compiled(x)
        out2 = compiled(x)  # the cached plans
        eager, ref = model(x), ref_model(x.double())
    _all_ran(graphs)
    _check(out, eager, ref, dtype, "mlp")
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    assert all(f.kernels >= 1 for g in graphs for f in g.fusions)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_scores_block(dtype):
    """softmax(q k^T / sqrt(d) + mask) v written out (no sdpa): bmm, scaling,
    additive mask, fp32 softmax, bmm."""
    torch.manual_seed(0)
    B, T, C = 2, 128, 256
    model = AttentionScores(C, 4).cuda().to(dtype)
    ref_model = copy.deepcopy(model).double()
    x = torch.randn(B, T, C, device="cuda", dtype=dtype)
    mask = torch.full((T, T), float("-inf"), device="cuda").triu(1).to(dtype)
    with torch.no_grad(), cd.capture() as graphs:
        out = torch.compile(model, backend=cd.backend)(x, mask)
        eager, ref = model(x, mask), ref_model(x.double(), mask.double())
    _all_ran(graphs)
    _check(out, eager, ref, dtype, "attention scores")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", [MLPBlock, LlamaMLP, GPT2Block], ids=["mlp", "llama_mlp", "gpt2_block"])
def test_training_step_gradients(cls, dtype):
    """Forward, backward and an SGD step: the loss, the input's and every
    parameter's gradient against eager and float64; the second step's loss too."""
    torch.manual_seed(0)
    model = cls(256, 4).cuda().to(dtype) if cls is GPT2Block else cls(256, 512).cuda().to(dtype)
    eager_model = copy.deepcopy(model)
    ref_model = copy.deepcopy(model).double()
    x = torch.randn(4, 64, 256, device="cuda", dtype=dtype)
    compiled = torch.compile(model, backend=cd.backend)
    xs = [x.clone().requires_grad_(True) for _ in range(2)] + [x.double().requires_grad_(True)]
    with cd.capture() as graphs:
        out = compiled(xs[0])
        (out.float() ** 2).mean().backward()
    out_e = eager_model(xs[1])
    (out_e.float() ** 2).mean().backward()
    out_r = ref_model(xs[2])
    (out_r**2).mean().backward()
    assert [g.kind for g in graphs] == ["forward", "backward"]
    _all_ran(graphs)
    _check(out, out_e, out_r, dtype, "output")
    _check(xs[0].grad, xs[1].grad, xs[2].grad, dtype, "input grad")
    params = zip(model.named_parameters(), eager_model.parameters(), ref_model.parameters())
    for (name, p), pe, pr in params:
        _check(p.grad, pe.grad, pr.grad, dtype, f"grad of {name}")
    # one SGD step each, then the next forward: the compiled graphs are reused
    with torch.no_grad():
        for p, pe, pr in zip(model.parameters(), eager_model.parameters(), ref_model.parameters()):
            p -= 0.1 * p.grad
            pe -= 0.1 * pe.grad
            pr -= 0.1 * pr.grad
    x2 = [x.clone().requires_grad_(True), x.double().requires_grad_(True)]
    with cd.capture() as again:
        out = compiled(x2[0])
    _check(out, eager_model(x), ref_model(x2[1]), dtype, "second step")
    assert again == []  # no recompile


def test_dynamic_shapes_one_fusion_serves_every_size():
    torch.manual_seed(0)
    model = MLPBlock(256, 1024).cuda().to(torch.bfloat16).eval()
    ref_model = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend=cd.backend, dynamic=True)
    with torch.no_grad(), cd.capture() as graphs:
        for rows in (17, 64, 300):
            x = torch.randn(rows, 3, 256, device="cuda", dtype=torch.bfloat16)
            _check(compiled(x), model(x), ref_model(x.double()), torch.bfloat16, f"{rows} rows")
    assert len(graphs) == 1  # one graph, its fusions of symbolic extents
    _all_ran(graphs)


def test_backend_by_name():
    """torch.compile(backend="circbuf") through the entry point (after
    ``pip install -e .`` of this checkout)."""
    from torch._dynamo.backends.registry import list_backends

    assert "circbuf" in list_backends(), "reinstall circbuf (pip install -e .) to register its entry point"
    x = torch.randn(1024, device="cuda")
    with cd.capture() as graphs:
        out = torch.compile(lambda t: torch.relu(t) * 2 + 1, backend="circbuf")(x)
    torch.testing.assert_close(out, torch.relu(x) * 2 + 1)
    _all_ran(graphs)


def test_fallbacks_on_the_gpu_keep_results():
    """Random ops, complex, sdpa and an op circbuf has no translation for run
    eagerly between circbuf's fusions; the results are eager's."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.bfloat16)

    def fn(q):
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q) * 2
        c = (q.float().to(torch.complex64) * 2).real
        return torch.cumsum(a.float() + c, -1).exp2() + torch.rand_like(c) * 0

    with torch.no_grad(), cd.capture() as graphs:
        out = torch.compile(fn, backend=cd.backend)(q)
    torch.testing.assert_close(out, fn(q), rtol=2e-2, atol=2e-2)
    reasons = {why for g in graphs for _, _, why in g.fallbacks}
    assert "random op" in reasons and any("scaled_dot_product_attention" in w for w in reasons)
    _all_ran(graphs)


def _graph_states(graphs):
    return [g.cuda_graph for g in graphs]


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_overhead_replays_a_cuda_graph(dtype):
    """mode="reduce-overhead": call 1 runs as compiled, call 2 captures, later
    calls replay; each call's result is its own (new inputs copied in, outputs
    cloned out of the graph's pool) and matches the uncaptured run."""
    torch.manual_seed(0)
    model = MLPBlock(256, 1024).cuda().to(dtype).eval()
    plain = torch.compile(copy.deepcopy(model), backend=cd.backend)
    xs = [torch.randn(4, 64, 256, device="cuda", dtype=dtype) for _ in range(4)]
    with torch.no_grad(), cd.capture() as graphs:
        compiled = torch.compile(model, backend=cd.backend, mode="reduce-overhead")
        outs = [compiled(x) for x in xs]
        again = compiled(xs[0])
    _all_ran(graphs)
    assert _graph_states(graphs) == ["captured (replayed from the second call)"]
    # bf16: the same bits as the uncaptured run; float32 differed in its last bits on an
    # H100 (cause not pinned down: a library kernel choosing another algorithm under capture?)
    tol = dict(rtol=0, atol=0) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, plain(x), **tol)
    torch.testing.assert_close(again, outs[0], rtol=0, atol=0)  # not overwritten by later replays
    with torch.no_grad():  # fresh inputs, each freed before the next: torch reuses their memory
        for _ in range(3):
            x = torch.randn(4, 64, 256, device="cuda", dtype=dtype)
            torch.testing.assert_close(compiled(x), plain(x), **tol)
            del x
    # a parameter updated in place is read by the graph (captured in place)
    with torch.no_grad():
        model.fc.weight.mul_(0.5)
        plain_model = copy.deepcopy(model)
        want = torch.compile(plain_model, backend=cd.backend)(xs[1])
        torch.testing.assert_close(compiled(xs[1]), want, **tol)


def test_reduce_overhead_training_step():
    """Forward and backward graphs captured; over steps with an SGD update in
    between, the gradients match the uncaptured run's."""
    torch.manual_seed(0)
    model = LlamaMLP(256, 512).cuda().to(torch.bfloat16)
    plain_model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=cd.backend, mode="reduce-overhead")
    plain = torch.compile(plain_model, backend=cd.backend)
    with cd.capture() as graphs:
        for step in range(4):
            x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
            for m in (model, plain_model):
                m.zero_grad(set_to_none=True)
            compiled(x).float().pow(2).mean().backward()
            plain(x).float().pow(2).mean().backward()
            for (n, p), q in zip(model.named_parameters(), plain_model.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=f"step {step}: {n}")
            with torch.no_grad():  # an SGD step on both: the captured graphs read the new weights
                for p, q in zip(model.parameters(), plain_model.parameters()):
                    p -= 0.1 * p.grad
                    q -= 0.1 * q.grad
    states = {g.kind: g.cuda_graph for g in graphs if g.cuda_graph is not None}
    assert set(states) == {"forward", "backward"}, states
    assert all(s.startswith("captured") for s in states.values()), states


def test_fusion_execute_under_stream_capture():
    """fd.execute inside torch.cuda.graph: circbuf's launches are captured and replay
    on new inputs copied into the captured buffers (CIRCBUF_DEBUG_HANG's synchronize
    is skipped while capturing)."""
    import circbuf as cb

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.linear(x, w)), cb.DataType.BFloat16))
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
    fd.execute([x, w])  # compile and make the plan outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        (static_out,) = fd.execute([x, w])
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        (want,) = fd.execute([x, w])
        torch.testing.assert_close(static_out, want, rtol=0, atol=0)
