"""Errors in ulps of a 16-bit float type, for the fast-math tests: a result
against torch's own result of the same dtype, both against a float64
reference accurate in the tails.

The comparison (:func:`no_worse_than_torch`), over every finite input:

- per element: ``err(ours) <= max(err(torch), 0.5) + allowance`` in ulps of
  the dtype at the reference value (0.5: a correctly rounded result is that
  far; torch's own fp32 math is sometimes farther). A result from fp32 math
  with relative error 2^e, rounded once, is at most 0.5 + 2^(e + bits) ulps
  off (bits: 8 for bf16, 11 for fp16), so ``allowance(e, dtype)`` is that
  term plus 1/256;
- the largest absolute error (the measure issue 17 names) at most torch's
  plus one ulp at the largest reference value;
- where the reference rounds to an infinity, the same infinity as torch.

Where torch's own result is poor (gelu's 1 + erf(x / sqrt 2) is 0 below
x = -5.5), the first rule allows as much; :func:`accurate` holds a result to
0.5 ulp + allowance of the exact value regardless of torch.
"""

from __future__ import annotations

import math

import torch

BITS = {torch.bfloat16: 8, torch.float16: 11}  # significand bits, the implicit one included
EMIN = {torch.bfloat16: -126, torch.float16: -14}  # exponent of the smallest normal


def finite_values(dtype, device="cpu") -> torch.Tensor:
    """Every finite value of a 16-bit float type (both zeros), one each."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype)
    return x[torch.isfinite(x)].to(device)


def ulp(ref: torch.Tensor, dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at ``|ref|`` (float64): 2^(e - bits + 1) for
    |ref| in [2^e, 2^(e+1)), the subnormal spacing below the smallest normal."""
    a = ref.abs()
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a))))
    e = torch.where(a > 0, e, torch.full_like(a, EMIN[dtype])).clamp_min(EMIN[dtype])
    return torch.exp2(e - BITS[dtype] + 1)


def allowance(rel_error_log2: float, dtype) -> float:
    """Ulps a relative error of 2^rel_error_log2 in the fp32 value adds to the rounded result."""
    return 2.0 ** (rel_error_log2 + BITS[dtype]) + 1 / 256


def reference(op: str, x: torch.Tensor) -> torch.Tensor:
    """float64 values of ``op`` at ``x`` (any float dtype), accurate in the tails
    (gelu through erfc, the tanh form of gelu through a sigmoid: no 1 + f
    cancelling in float64)."""
    x = x.double()
    if op == "exp":
        return torch.exp(x)
    if op == "sigmoid":
        return torch.sigmoid(x)
    if op == "silu":
        return x * torch.sigmoid(x)
    if op == "gelu":
        return 0.5 * x * torch.special.erfc(-x / math.sqrt(2))
    if op == "tanh":
        return torch.tanh(x)
    if op == "gelu_tanh":  # 0.5 x (1 + tanh(u)) = x sigmoid(2u)
        u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        return x * torch.sigmoid(2 * u)
    raise ValueError(op)


def torch_result(op: str, x: torch.Tensor) -> torch.Tensor:
    """torch eager's own result in x's dtype."""
    f = torch.nn.functional
    fns = {
        "exp": torch.exp,
        "sigmoid": torch.sigmoid,
        "silu": f.silu,
        "gelu": f.gelu,
        "tanh": torch.tanh,
        "gelu_tanh": lambda t: f.gelu(t, approximate="tanh"),
    }
    return fns[op](x)


def no_worse_than_torch(x, ours, theirs, ref, dtype, allow: float, mask=None) -> dict:
    """Assert the comparison of the module docstring for ``ours`` against
    ``theirs`` (torch's result), both of ``dtype``, over the elements of ``mask``
    (all by default) for the per-element rule; returns the worst errors."""
    x, ours, theirs, ref = (t.detach().cpu() for t in (x, ours, theirs, ref))
    assert ours.dtype == theirs.dtype == dtype and ours.shape == ref.shape
    rounded = ref.to(dtype)
    fin = torch.isfinite(rounded)
    # beyond the range: the same infinity as torch (and as the reference)
    assert torch.equal(ours[~fin].double(), theirs[~fin].double()), (
        "an overflowing result differs from torch's"
    )
    o, t = ours.double(), theirs.double()
    assert torch.isfinite(o[fin]).all(), (
        f"non-finite result at x = {x[fin][~torch.isfinite(o[fin])][:5].tolist()}"
    )
    u = ulp(ref, dtype)
    e_o = ((o - ref).abs() / u)[fin]
    e_t = ((t - ref).abs() / u)[fin]
    sel = fin if mask is None else fin & mask.cpu()
    bound = torch.clamp_min(((t - ref).abs() / u)[sel], 0.5) + allow
    worse = ((o - ref).abs() / u)[sel] > bound
    if worse.any():
        k = torch.nonzero(worse)[:5, 0]
        xs, os_, ts, rs = (v[sel][k].tolist() for v in (x.double(), o, t, ref))
        raise AssertionError(
            f"{int(worse.sum())} results farther than torch's + {allow:.4f} ulp: x {xs}, ours {os_}, "
            f"torch {ts}, exact {rs}"
        )
    abs_o = (o - ref).abs()[fin].max().item()
    abs_t = (t - ref).abs()[fin].max().item()
    top = ulp(ref[fin].abs().max().reshape(1), dtype).item()
    assert abs_o <= abs_t + top, (abs_o, abs_t, top)
    return {
        "max_ulp": e_o.max().item(),
        "torch_max_ulp": e_t.max().item(),
        "max_abs": abs_o,
        "torch_max_abs": abs_t,
    }


def accurate(x, ours, ref, dtype, allow: float, mask=None) -> float:
    """Assert ``ours`` within 0.5 + ``allow`` ulps of ``ref`` wherever ``ref``
    rounds to a finite value (and ``mask`` holds); returns the largest error."""
    x, ours, ref = (t.detach().cpu() for t in (x, ours, ref))
    sel = torch.isfinite(ref.to(dtype))
    if mask is not None:
        sel &= mask.cpu()
    err = ((ours.double() - ref).abs() / ulp(ref, dtype))[sel]
    bad = ~(err <= 0.5 + allow)  # NaN too
    if bad.any():
        k = torch.nonzero(bad)[:5, 0]
        raise AssertionError(
            f"{int(bad.sum())} results farther than 0.5 + {allow:.4f} ulp from exact: x {x[sel][k].tolist()}, "
            f"ours {ours[sel][k].tolist()}, exact {ref[sel][k].tolist()}"
        )
    return err.max().item()
