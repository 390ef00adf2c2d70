"""torch.compile(model, backend=circbuf) on Hugging Face models with random
weights (tests/hf_models.py), in compile-only mode on the CPU: forward
(inference) and a training step (forward and backward graphs) are
partitioned, every fusion is translated and compiled for sm_90a, and the
graphs (run eagerly) give eager's logits and gradients.

The partition counts below are what the backend makes of these models
today; a change to the aten table or the partitioner that moves them
should update them on purpose (print ``circbuf.dynamo.explain(...)``)."""

from __future__ import annotations

import collections
import copy

import pytest
import torch

import circbuf.dynamo as cd

transformers = pytest.importorskip(
    "transformers", reason="transformers is a test-only dependency: pip install transformers==4.57.6"
)

from tests.hf_models import MODELS, model_inputs  # noqa: E402

OPTIONS = {"compile_only": True, "strict": True}
BATCH, SEQ = 2, 16
# bf16: AOTAutograd's decompositions (layer norm's backward, ...) round in other places than
# eager's kernels; the relative errors (in norm) seen are below 1e-2 for gradients, 2e-3 for logits
GRAD_TOL, LOGIT_TOL = 3e-2, 1e-2

# (fusions, eager ops) per graph, in the order dynamo compiles them; and the eager ops' kinds
EXPECTED = {
    ("llama", "inference"): {
        "graphs": [("inference", 20, 22)],
        "eager": {
            "aten.embedding.default",
            "aten.arange.start",
            "aten.arange.default",
            "aten.cat.default",
            "aten.slice.Tensor",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
        },
    },
    ("llama", "training"): {
        "graphs": [("forward", 21, 25), ("backward", 15, 24)],
        "eager": {
            "aten.embedding.default",
            "aten.arange.start",
            "aten.arange.default",
            "aten.cat.default",
            "aten.slice.Tensor",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten.constant_pad_nd.default",
            "aten.nll_loss_forward.default",
            "aten.nll_loss_backward.default",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
            "aten.slice_backward.default",
            "aten.embedding_dense_backward.default",
        },
    },
    ("gpt2", "inference"): {
        "graphs": [("inference", 8, 12)],
        "eager": {
            "aten.embedding.default",
            "aten.arange.start",
            "aten.arange.default",
            "aten.cat.default",
            "aten.split.Tensor",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
        },
    },
    # the loss is a graph of its own (a graph break in GPT2LMHeadModel's forward)
    ("gpt2", "training"): {
        "graphs": [("forward", 8, 12), ("forward", 2, 3), ("backward", 1, 1), ("backward", 16, 10)],
        "eager": {
            "aten.embedding.default",
            "aten.arange.start",
            "aten.arange.default",
            "aten.cat.default",
            "aten.split.Tensor",
            "aten.slice.Tensor",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten.constant_pad_nd.default",
            "aten.nll_loss_forward.default",
            "aten.nll_loss_backward.default",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
            "aten.embedding_dense_backward.default",
        },
    },
    # the patch embedding is a strided convolution (eager); the [CLS] token is selected
    ("vit", "inference"): {
        "graphs": [("inference", 4, 5)],
        "eager": {
            "aten.convolution.default",
            "aten.cat.default",
            "aten.select.int",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
        },
    },
    ("vit", "training"): {
        "graphs": [("forward", 4, 6), ("backward", 17, 7)],
        "eager": {
            "aten.convolution.default",
            "aten.convolution_backward.default",
            "aten.cat.default",
            "aten.select.int",
            "aten.select_backward.default",
            "aten.slice.Tensor",
            "aten.nll_loss_forward.default",
            "aten.nll_loss_backward.default",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
        },
    },
}


def _run(name, training):
    torch.manual_seed(0)
    model = MODELS[name]().to(torch.bfloat16)
    ref = copy.deepcopy(model)
    kw = model_inputs(name, model, BATCH, SEQ, labels=training)
    compiled = torch.compile(model, backend=cd.backend, options=OPTIONS)
    with cd.capture() as graphs:
        if training:
            out = compiled(**kw)
            out.loss.backward()
        else:
            model.eval()
            ref.eval()
            with torch.no_grad():
                out = compiled(**kw)
    if training:
        want = ref(**kw)
        want.loss.backward()
        torch.testing.assert_close(out.loss, want.loss, rtol=1e-2, atol=1e-2)
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            assert _rel(p.grad, q.grad) <= GRAD_TOL, (n, _rel(p.grad, q.grad))
    else:
        with torch.no_grad():
            want = ref(**kw)
    # compile-only: the graphs ran eagerly, so the logits are eager's (up to AOT's decompositions)
    assert _rel(out.logits, want.logits) <= LOGIT_TOL
    return graphs


def _rel(x, ref) -> float:
    """Relative error in norm, in float64."""
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _summary(graphs):
    return [(g.kind, len(g.fusions), len(g.fallbacks)) for g in graphs]


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_compiles_every_fusion_for_sm90a(name, training):
    graphs = _run(name, training)
    text = "\n".join(str(g) for g in graphs)
    fusions = [f for g in graphs for f in g.fusions]
    assert fusions, text
    for f in fusions:
        assert f.status == "compiled" and f.kernels >= 1, (f.name, f.status, f.reason, text)
    kinds = [g.kind for g in graphs]
    if training:
        assert "forward" in kinds and "backward" in kinds, kinds
    else:
        assert set(kinds) == {"inference"}, kinds
    # every matmul of the model is in a fusion (the linears and the LM head)
    eager_ops = collections.Counter(op for g in graphs for _, op, _ in g.fallbacks)
    assert not any(op.startswith(("aten.mm", "aten.addmm", "aten.bmm")) for op in eager_ops), eager_ops
    # attention stays eager (flash), and what else falls back is what the table lacks
    assert any("scaled_dot_product" in op for op in eager_ops), eager_ops
    reasons = {why for g in graphs for _, op, why in g.fallbacks if "scaled_dot_product" in op}
    assert reasons == {"scaled_dot_product_attention stays eager (circbuf has no attention kernel)"}
    expected = EXPECTED[(name, "training" if training else "inference")]
    assert _summary(graphs) == expected["graphs"], text
    assert set(eager_ops) == expected["eager"], text
