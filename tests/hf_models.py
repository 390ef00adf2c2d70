"""Hugging Face transformers models built from configs with random weights (no
downloads), for the torch.compile backend's tests and benchmarks/models.py.
transformers is a test-only dependency (``pip install transformers==4.57.6``).

- ``llama(...)``: LlamaForCausalLM: GQA attention (scaled_dot_product_attention),
  RMSNorm, SiLU-gated MLP, rotary embeddings.
- ``gpt2(...)``: GPT2LMHeadModel: LayerNorm, fused qkv (Conv1D), GELU-tanh MLP;
  dropout 0 (dropout is random: it stays eager).
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


MODELS = {"llama": llama, "gpt2": gpt2}


def tokens(batch, seq, vocab, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)
