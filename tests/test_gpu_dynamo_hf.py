"""torch.compile(model, backend=circbuf) on Hugging Face models with random
weights (tests/hf_models.py) on the GPU, in bfloat16: logits (inference) and
the loss and every parameter's gradient after one backward (training),
against eager torch, both measured against the same model run in float64.

Tolerances (bf16): the error of logits is max|out - ref64| / max|ref64|; of a
gradient, |g - g64| / |g64| in norm. circbuf's error must be at most twice
eager bf16 torch's on the same inputs plus a floor, 8e-3 for logits and the
loss (two bf16 ulps at 1), 2e-2 for gradients (a backward sums over the
batch and sequence in another order than eager's kernels)."""

from __future__ import annotations

import copy

import pytest
import torch

import circbuf.dynamo as cd

transformers = pytest.importorskip(
    "transformers", reason="transformers is a test-only dependency: pip install transformers==4.57.6"
)

from tests.hf_models import MODELS, model_inputs  # noqa: E402

pytestmark = pytest.mark.gpu

FLOOR_OUT, FLOOR_GRAD = 8e-3, 2e-2
SIZES = {
    "llama": dict(hidden=256, layers=2, heads=4, kv_heads=2, intermediate=688, vocab=1024),
    "gpt2": dict(hidden=256, layers=2, heads=4, vocab=1024),
    "vit": dict(hidden=256, layers=2, heads=4, intermediate=688, image=64, patch=8, classes=100),
}
BATCH, SEQ = 2, 128


def _max_err(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _norm_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _models(name):
    torch.manual_seed(0)
    model = MODELS[name](**SIZES[name]).cuda().to(torch.bfloat16)
    eager = copy.deepcopy(model)
    ref = copy.deepcopy(model).double()
    return model, eager, ref


def _all_ran(graphs):
    fusions = [f for g in graphs for f in g.fusions]
    assert fusions, "no fusion"
    bad = [(f.name, f.reason) for f in fusions if f.status != "ran"]
    assert not bad, f"fusions that fell back: {bad}\n" + "\n".join(str(g) for g in graphs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_inference_logits(name):
    model, eager, ref = _models(name)
    kw = model_inputs(name, model, BATCH, SEQ, "cuda")
    kw64 = {k: v.double() if v.is_floating_point() else v for k, v in kw.items()}
    for m in (model, eager, ref):
        m.eval()
    with torch.no_grad(), cd.capture() as graphs:
        out = torch.compile(model, backend=cd.backend, options={"strict": True})(**kw).logits
        want = eager(**kw).logits
        want64 = ref(**kw64).logits
    _all_ran(graphs)
    assert not torch.isnan(out).any()
    e_cb, e_eager = _max_err(out, want64), _max_err(want, want64)
    assert e_cb <= 2 * e_eager + FLOOR_OUT, f"logits: circbuf error {e_cb:.2e}, eager {e_eager:.2e}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_training_step_gradients(name):
    model, eager, ref = _models(name)
    kw = model_inputs(name, model, BATCH, SEQ, "cuda", labels=True)
    kw64 = {k: v.double() if v.is_floating_point() else v for k, v in kw.items()}
    with cd.capture() as graphs:
        out = torch.compile(model, backend=cd.backend, options={"strict": True})(**kw)
        out.loss.backward()
    _all_ran(graphs)
    assert {"forward", "backward"} <= {g.kind for g in graphs}
    want = eager(**kw)
    want.loss.backward()
    want64 = ref(**kw64)
    want64.loss.backward()
    for what, a, b, c in (
        ("loss", out.loss, want.loss, want64.loss),
        ("logits", out.logits, want.logits, want64.logits),
    ):
        e_cb, e_eager = _max_err(a.detach(), c.detach()), _max_err(b.detach(), c.detach())
        assert e_cb <= 2 * e_eager + FLOOR_OUT, f"{what}: circbuf error {e_cb:.2e}, eager {e_eager:.2e}"
    params = zip(model.named_parameters(), eager.parameters(), ref.parameters())
    for (n, p), q, r in params:
        assert p.grad is not None and not torch.isnan(p.grad).any(), n
        e_cb, e_eager = _norm_err(p.grad, r.grad), _norm_err(q.grad, r.grad)
        assert e_cb <= 2 * e_eager + FLOOR_GRAD, f"{n}: gradient error {e_cb:.2e}, eager {e_eager:.2e}"
