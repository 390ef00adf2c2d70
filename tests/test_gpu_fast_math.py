"""GPU tests of the fast variants (circbuf/lowering/fast_math.py, the
prelude's cb::fast_*): every finite bf16 and fp16 input through a pointwise
fusion (16-bit in, same 16-bit type out), against torch eager's own result
and a float64 reference (tests/ulp.py for the rules):

- per element, circbuf's error is at most torch's (or 0.5 ulp) plus the
  allowance of the variant's bound (REL_ERROR: 2^-15 relative for exp,
  sigmoid, silu, gelu, i.e. 2^-7 bf16 / 2^-4 fp16 ulp; 2^-11 for
  tanh.approx, 1/8 bf16 ulp), plus 1/256 ulp;
- circbuf's result is within 0.5 ulp + that allowance of exact everywhere
  (gelu: above x = -13.1, where torch's is 0 already; the tanh form of gelu,
  accurate math in both: from x = -1 up, below which 1 + tanh(u) cancels);
- the largest absolute error is at most torch's plus one ulp at the largest value;
- the kernel calls the variant the pass should pick, and the fp16 tanh, the
  tanh form of gelu (1 + tanh(u) cancels) and fp32 outputs keep CUDA's
  accurate math: bitwise the same output as with CIRCBUF_FAST_MATH=0.

Run with ``-s`` to see the measured worst errors (ulps, absolute) next to torch's.
"""

import pytest
import torch

import circbuf as cb
from circbuf.lowering.fast_math import REL_ERROR, hides
from tests import ulp
from tests.test_fast_math import calls
from tests.util import D, unary_fusion

pytestmark = pytest.mark.gpu
DEV = "cuda"
CB = {torch.bfloat16: D.BFloat16, torch.float16: D.Half}
ACCURATE_REL_ERROR = -20  # CUDA's expf, tanhf, erff, IEEE division: a few fp32 ulps


def gelu_tanh_fusion(dtype):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch's gelu(approximate="tanh") orders it."""
    with cb.FusionDefinition() as fd:
        x16 = fd.define_tensor([-1], dtype=dtype)
        x = fd.ops.cast(x16, D.Float)
        cube = fd.ops.mul(fd.ops.mul(x, x), x)
        inner = fd.ops.mul(fd.ops.add(x, fd.ops.mul(cube, 0.044715)), 0.7978845608028654)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(x, 0.5), fd.ops.add(fd.ops.tanh(inner), 1.0)), dtype))
    return fd


def fusion(op, dtype):
    return gelu_tanh_fusion(CB[dtype]) if op == "gelu_tanh" else unary_fusion(op, CB[dtype], rank=1)


def _cuda(fd, x):
    """The kernel's source (a compile for sm_90a: the same math the launch ran)."""
    return fd.compile([x.cpu()], arch="sm_90a").cuda


def run(op, dtype, x):
    """circbuf's result and the cb:: transcendentals its kernel calls."""
    fd = fusion(op, dtype)
    (out,) = fd.execute([x])
    return out, calls(_cuda(fd, x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["exp", "sigmoid", "silu", "gelu", "tanh", "gelu_tanh"])
def test_every_input_no_worse_than_torch(op, dtype, monkeypatch):
    x = ulp.finite_values(dtype, DEV)
    ref = ulp.reference(op, x)
    theirs = ulp.torch_result(op, x)
    ours, used = run(op, dtype, x)
    fast = op != "gelu_tanh" and hides(CB[dtype], REL_ERROR[op])
    if op == "gelu_tanh":
        assert used == {"tanh"}
    else:
        assert used == {f"fast_{op}" if fast else op}
    allow = ulp.allowance(REL_ERROR[op] if fast else ACCURATE_REL_ERROR, dtype)
    if op == "gelu_tanh":
        # torch and circbuf both compute 1 + tanh(u) in fp32, which cancels as x falls: at x = -1
        # it magnifies an fp32 error 3.2 times (allowance 2^-18), at -2 22 times, below -5.5 it is
        # 0 or garbage of each one's own. The per-element rules hold from -1 up.
        allow = ulp.allowance(ACCURATE_REL_ERROR + 2, dtype)
        stats = ulp.no_worse_than_torch(x, ours, theirs, ref, dtype, allow, mask=x >= -1)
        stats["accurate_max_ulp"] = ulp.accurate(x, ours, ref, dtype, allow, mask=x >= -1)
    else:
        stats = ulp.no_worse_than_torch(x, ours, theirs, ref, dtype, allow)
        stats["accurate_max_ulp"] = ulp.accurate(
            x, ours, ref, dtype, allow, (x > -13.1) if op == "gelu" else None
        )
    print(f"\n{op} {dtype} {'fast' if fast else 'accurate'}: {stats}")
    if not fast:  # the accurate math, as with the knob off
        monkeypatch.setenv("CIRCBUF_FAST_MATH", "0")
        off, used_off = run(op, dtype, x)
        assert used_off == used and torch.equal(ours, off)


@pytest.mark.parametrize("op", ["exp", "sigmoid", "silu", "gelu", "tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_outputs_keep_accurate_math(op, dtype, monkeypatch):
    x = ulp.finite_values(dtype, DEV)
    fd = unary_fusion(op, CB[dtype], rank=1, out_dtype=D.Float)
    (on,) = fd.execute([x])
    assert on.dtype == torch.float32 and calls(_cuda(fd, x)) == {op}
    monkeypatch.setenv("CIRCBUF_FAST_MATH", "0")
    (off,) = unary_fusion(op, CB[dtype], rank=1, out_dtype=D.Float).execute([x])
    assert torch.equal(on, off)  # bitwise (NaN-free: finite inputs, these ops)


def test_a_value_that_also_feeds_a_sum_keeps_accurate_math(monkeypatch):
    def build():
        with cb.FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
            s = fd.ops.silu(x)
            fd.add_output(fd.ops.cast(s, D.BFloat16))
            fd.add_output(fd.ops.sum(s, [1]))
        return fd

    x = torch.randn(256, 4096, device=DEV, dtype=torch.bfloat16) * 4
    on_y, on_s = build().execute([x])
    monkeypatch.setenv("CIRCBUF_FAST_MATH", "0")
    off_y, off_s = build().execute([x])
    assert torch.equal(on_s, off_s)  # the sum's silu is the accurate one either way
    ref = ulp.reference("silu", x)
    ulp.no_worse_than_torch(
        x.flatten(),
        on_y.flatten(),
        torch.nn.functional.silu(x).flatten(),
        ref.flatten(),
        torch.bfloat16,
        ulp.allowance(REL_ERROR["silu"], torch.bfloat16),
    )
