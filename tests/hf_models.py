"""Hugging Face transformers models built from configs with random weights (no
downloads), for the torch.compile backend's tests and benchmarks/models.py.
transformers is a test-only dependency (``pip install transformers==4.57.6``).

- ``llama(...)``: LlamaForCausalLM: GQA attention (scaled_dot_product_attention),
  RMSNorm, SiLU-gated MLP, rotary embeddings.
- ``gpt2(...)``: GPT2LMHeadModel: LayerNorm, fused qkv (Conv1D), GELU-tanh MLP;
  dropout 0 (dropout is random: it stays eager).
- ``vit(...)``: ViTForImageClassification: a patch embedding (a strided
  convolution: eager), LayerNorm, exact-GELU MLP, a [CLS] classifier head.

``model_inputs(name, model, batch, seq, device, labels)`` gives each its
keyword arguments: token ids (and labels: the ids) for the language models,
images of ``seq`` patches (and class labels) for the ViT.
"""

from __future__ import annotations

import torch


def llama(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=256, positions=2048):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=positions,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg)


def gpt2(hidden=64, layers=2, heads=4, vocab=256, positions=1024):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        vocab_size=vocab,
        n_positions=positions,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(cfg)


def vit(hidden=64, layers=2, heads=4, intermediate=128, image=32, patch=8, classes=10):
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        image_size=image,
        patch_size=patch,
        num_labels=classes,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    return ViTForImageClassification(cfg)


MODELS = {"llama": llama, "gpt2": gpt2, "vit": vit}


def model_inputs(name, model, batch, seq, device="cpu", labels=False, seed=0) -> dict:
    """Keyword arguments for ``model``: ``seq`` tokens per sequence (a ViT
    takes images of the config's size instead)."""
    cfg = model.config
    if name == "vit":
        g = torch.Generator().manual_seed(seed)
        side = cfg.image_size
        px = torch.randn(batch, cfg.num_channels, side, side, generator=g).to(device, model.dtype)
        out = {"pixel_values": px}
        if labels:
            out["labels"] = torch.randint(0, cfg.num_labels, (batch,), generator=g).to(device)
        return out
    ids = tokens(batch, seq, cfg.vocab_size, device, seed)
    return {"input_ids": ids, "labels": ids} if labels else {"input_ids": ids}


def tokens(batch, seq, vocab, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)
