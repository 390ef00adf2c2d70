"""Small models in plain torch.nn for the torch.compile backend's tests
(tests/test_dynamo.py on the CPU, tests/test_gpu_dynamo.py on the GPU)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class MLPBlock(nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, with a residual."""

    def __init__(self, d=32, hidden=64):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, hidden)
        self.out = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.out(F.gelu(self.fc(self.ln(x))))


class RMSNorm(nn.Module):
    """Llama's RMSNorm: fp32 statistics, the weight applied in the input's dtype."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class LlamaMLP(nn.Module):
    """RMSNorm -> SiLU-gated MLP (gate, up, down without bias), with a residual."""

    def __init__(self, d=32, hidden=48):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        y = self.norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class GPT2Block(nn.Module):
    """GPT-2's block: LayerNorm, fused qkv, causal softmax attention written out
    (no scaled_dot_product_attention), GELU-tanh MLP, residuals."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn(self.ln1(x)).split(C, dim=2)
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class AttentionScores(nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v, written out (no sdpa)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (p(x).view(B, T, self.heads, hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd) + mask
        return torch.matmul(torch.softmax(s.float(), dim=-1).to(v.dtype), v)


MODELS = {"mlp": MLPBlock, "llama_mlp": LlamaMLP, "gpt2_block": GPT2Block}
