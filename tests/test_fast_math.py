"""The fast_math lowering pass (circbuf/lowering/fast_math.py) and the fast
variants of the prelude, on the CPU: where the pass picks them and where it
keeps the accurate math; the generated CUDA, NVRTC's SASS for sm_90a; the
CIRCBUF_FAST_MATH knob; and an emulation of each variant in numpy fp32 with
its approximate instructions off by their documented bounds either way,
compared over every finite bf16/fp16 input with torch's own result
(tests/ulp.py). tests/test_gpu_fast_math.py runs the real kernels."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import circbuf as cb
from circbuf.lowering import lower
from circbuf.lowering.fast_math import REL_ERROR, hides
from circbuf.lowering.kir import Assign, walk
from tests import ulp
from tests.test_gpu_matmul import mm_fusion
from tests.util import TORCH, D, unary_fusion

OPS = ("exp", "sigmoid", "silu", "gelu", "tanh")


def fast_marks(fd, **kw) -> dict:
    """Lower ``fd`` unscheduled (fixed sizes): {output tensor name of each
    transcendental: whether the pass marked it fast}."""
    k = lower(fd.fusion, **kw)
    marks = {}

    def visit(n, _stack):
        if isinstance(n, Assign) and n.expr is not None and n.expr.op_name in OPS:
            marks[n.expr.out.name] = n.fast

    walk(k.body, visit)
    assert marks
    return marks


def calls(src: str) -> set:
    """The cb:: transcendentals the kernel body calls (the prelude calls none by cb::)."""
    return {name for name in (f"{f}{op}" for op in OPS for f in ("fast_", "")) if f"cb::{name}(" in src}


# ---------------------------------------------------------------- decisions
def _fusion(build, in_dtype=D.BFloat16, n_in=1):
    with cb.FusionDefinition() as fd:
        xs = [fd.define_tensor([4, 8], dtype=in_dtype) for _ in range(n_in)]
        build(fd, *xs)
    return fd


def test_bf16_output_gets_the_fast_variant():
    fd = _fusion(lambda fd, x: fd.add_output(fd.ops.cast(fd.ops.silu(x), D.BFloat16)))
    assert list(fast_marks(fd).values()) == [True]
    assert "fast_silu(" in str(lower(fd.fusion))  # the kernel IR shows it


def test_fp32_output_keeps_accurate_math():
    fd = _fusion(lambda fd, x: fd.add_output(fd.ops.silu(x)))
    assert list(fast_marks(fd).values()) == [False]


def test_a_value_that_also_feeds_a_sum_keeps_accurate_math():
    def build(fd, x):
        s = fd.ops.silu(x)
        fd.add_output(fd.ops.cast(s, D.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.sum(s, [1]), D.BFloat16))

    assert list(fast_marks(_fusion(build)).values()) == [False]


def test_a_value_that_is_also_an_fp32_output_keeps_accurate_math():
    def build(fd, x):
        s = fd.ops.exp(x)
        fd.add_output(fd.ops.cast(s, D.BFloat16))
        fd.add_output(s)

    assert list(fast_marks(_fusion(build)).values()) == [False]


def test_fast_math_off_keeps_accurate_math():
    fd = _fusion(lambda fd, x: fd.add_output(fd.ops.cast(fd.ops.silu(x), D.BFloat16)))
    assert list(fast_marks(fd, fast_math=False).values()) == [False]


@pytest.mark.parametrize("dtype, fast", [(D.BFloat16, True), (D.Half, False)])
def test_tanh_approx_only_where_a_bf16_rounding_hides_it(dtype, fast):
    fd = _fusion(lambda fd, x: fd.add_output(fd.ops.cast(fd.ops.tanh(x), dtype)))
    assert list(fast_marks(fd).values()) == [fast]


def test_paths_through_scaling_and_additive_ops():
    want = {}  # tensor -> fast?

    def build(fd, x, y):
        def mark(tv, fast):
            want[tv.name] = fast
            return tv

        # exp * sigmoid(y) + 1 -> bf16: fast (a sum counts 4 bits: 2^-15 + 4 hides under bf16)
        e = mark(fd.ops.exp(x), True)
        sg = mark(fd.ops.sigmoid(y), True)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(e, sg), 1.0), D.BFloat16))
        # a sum on the way to fp16, or two on the way to bf16: accurate
        e2 = mark(fd.ops.exp(y), False)
        fd.add_output(fd.ops.cast(fd.ops.add(e2, 1.0), D.Half))
        fd.add_output(fd.ops.cast(fd.ops.sub(fd.ops.add(e2, 1.0), x), D.BFloat16))
        # one sum, reached by two paths (scaled and not): fast
        e3 = mark(fd.ops.exp(fd.ops.neg(x)), True)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(e3, 2.0), e3), D.BFloat16))
        # ... and a diamond whose second path adds another sum: accurate
        e4 = mark(fd.ops.exp(fd.ops.abs(x)), False)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.add(fd.ops.mul(e4, 2.0), y), e4), D.BFloat16))
        # the tanh form of gelu: 1 + tanh(u) cancels, tanh.approx would show
        t = mark(fd.ops.tanh(y), False)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(y, 0.5), fd.ops.add(t, 1.0)), D.BFloat16))
        t2 = mark(fd.ops.tanh(x), True)  # tanh scaled: fine for bf16
        fd.add_output(fd.ops.cast(fd.ops.neg(fd.ops.mul(t2, y)), D.BFloat16))
        g = mark(fd.ops.gelu(y), True)  # a where's values pass, its condition does not
        fd.add_output(fd.ops.cast(fd.ops.where(fd.ops.gt(x, 0.0), g, 0.0), D.BFloat16))
        s = mark(fd.ops.silu(x), False)
        fd.add_output(fd.ops.cast(fd.ops.where(fd.ops.gt(s, 0.5), x, y), D.BFloat16))
        inner = mark(fd.ops.exp(y), False)  # feeds another transcendental: accurate
        outer = mark(fd.ops.sigmoid(inner), True)
        fd.add_output(fd.ops.cast(outer, D.BFloat16))

    fd = _fusion(build, n_in=2)
    marks = fast_marks(fd)
    assert {k: marks[k] for k in want} == want


def test_double_and_integer_casts_keep_accurate_math():
    def build(fd, x):
        fd.add_output(fd.ops.cast(fd.ops.exp(x), D.Double))
        fd.add_output(fd.ops.cast(fd.ops.sigmoid(x), D.Int32))
        fd.add_output(fd.ops.cast(fd.ops.exp(fd.ops.cast(x, D.Double)), D.BFloat16))  # fp64 math

    assert set(fast_marks(_fusion(build)).values()) == {False}


# ------------------------------------------------- CUDA, SASS and the knob
# per op: what the fast variant's SASS shows; what the accurate one's shows and the fast one's
# does not (CALL.REL: the slow path of IEEE division and reciprocal); what the fast one's shows and the accurate one's
# does not (CUDA's expf uses MUFU.EX2 too: there only the source tells them apart)
SASS = {
    "exp": ({"MUFU.EX2"}, set(), set()),
    "sigmoid": ({"MUFU.EX2", "MUFU.RCP"}, {"CALL.REL"}, set()),
    "silu": ({"MUFU.EX2", "MUFU.RCP"}, {"CALL.REL"}, set()),
    "gelu": ({"MUFU.EX2", "MUFU.RCP"}, set(), {"MUFU.RCP"}),
    "tanh": ({"MUFU.TANH"}, set(), {"MUFU.TANH"}),
}


def _compile(fd, dtype, shape=(64, 1024)):
    return fd.compile([torch.randn(*shape, dtype=TORCH[dtype])], arch="sm_90a")


@pytest.mark.parametrize("op", OPS)
def test_generated_cuda_and_sass(op):
    has, exact_only, fast_only = SASS[op]
    fast = _compile(unary_fusion(op, D.BFloat16), D.BFloat16)
    assert calls(fast.cuda) == {f"fast_{op}"}
    sass = fast.sass()
    assert all(i in sass for i in has | fast_only) and not any(i in sass for i in exact_only), op
    exact = _compile(unary_fusion(op, D.BFloat16, out_dtype=D.Float), D.BFloat16)
    assert calls(exact.cuda) == {op}
    sass = exact.sass()
    assert all(i in sass for i in exact_only) and not any(i in sass for i in fast_only), op


def test_fp16_tanh_is_accurate():
    ck = _compile(unary_fusion("tanh", D.Half), D.Half)
    assert calls(ck.cuda) == {"tanh"} and "MUFU.TANH" not in ck.sass()


def test_knob(monkeypatch):
    monkeypatch.setenv("CIRCBUF_FAST_MATH", "0")
    ck = _compile(unary_fusion("silu", D.BFloat16), D.BFloat16)
    assert calls(ck.cuda) == {"silu"} and "CALL.REL" in ck.sass()
    monkeypatch.setenv("CIRCBUF_FAST_MATH", "yes")
    with pytest.raises(cb.CircbufError, match="CIRCBUF_FAST_MATH='yes'"):
        _compile(unary_fusion("silu", D.BFloat16), D.BFloat16)


def test_the_knob_is_part_of_the_compiled_kernel_key(monkeypatch):
    fd = unary_fusion("exp", D.BFloat16)
    assert calls(_compile(fd, D.BFloat16).cuda) == {"fast_exp"}
    monkeypatch.setenv("CIRCBUF_FAST_MATH", "0")
    assert calls(_compile(fd, D.BFloat16).cuda) == {"exp"}


@pytest.mark.parametrize(
    "epilogue, want", [("silu", {"fast_silu"}), ("gelu", {"fast_gelu"}), ("tanh_gelu", {"tanh"})]
)
def test_matmul_epilogues(epilogue, want):
    fd = mm_fusion("linear", bias=True, epilogue=epilogue)
    m, n, k = 256, 512, 128
    ck = fd.compile(
        [
            torch.randn(m, k, dtype=torch.bfloat16),
            torch.randn(n, k, dtype=torch.bfloat16),
            torch.randn(n, dtype=torch.bfloat16),
        ],
        arch="sm_90a",
    )
    assert type(ck.params).__name__ == "MatmulParams" and calls(ck.cuda) == want


def test_the_interpreter_runs_a_fast_kernel():
    from circbuf.interpret import interpret

    fd = unary_fusion("gelu", D.BFloat16)
    x = torch.randn(8, 300, dtype=torch.bfloat16)
    assert calls(_compile(fd, D.BFloat16, (8, 300)).cuda) == {"fast_gelu"}
    (out,) = interpret(fd, [x])  # exact math there: the marks only change the CUDA
    ulp.no_worse_than_torch(
        x, out, torch.nn.functional.gelu(x), ulp.reference("gelu", x), torch.bfloat16, 1 / 256
    )


# ------------------------------------------------------ the error model
# Each variant as the prelude writes it, in numpy fp32 (one rounding per op, no
# FMA), its approximate instructions off by their documented bounds (PTX ISA):
# ex2.approx 2 ulp, rcp.approx 1 ulp, tanh.approx 2^-11 relative; d = -1, 0, +1
# picks the side.
F32 = np.float32


def _step(r, ulps):
    for _ in range(abs(ulps)):
        r = np.nextafter(r, F32(np.inf if ulps > 0 else -np.inf)).astype(F32)
    return r


def _ex2(t, d, ftz=False):
    with np.errstate(over="ignore"):
        r = np.exp2(t.astype(np.float64)).astype(F32)
    r = np.where(np.isfinite(r) & (r != 0), _step(r, 2 * d), r)
    return np.where(np.abs(r) < F32(2.0**-126), F32(0), r) if ftz else r


def _rcp(x, d):
    r = (1.0 / x.astype(np.float64)).astype(F32)
    return np.where(np.isfinite(r) & (r != 0), _step(r, d), r)


def _exp(x, d):
    return _ex2(x * F32(1.44269504088896341), d[0])


def _sigmoid(x, d):
    e = _exp(-np.abs(x), d)
    s = _rcp(F32(1) + e, d[1])
    return np.where(x >= 0, s, e * s)


def _silu(x, d):
    return x * _sigmoid(x, d)


_Q = [0.3300761282444, -1.023150086402893, 0.6845528483390808, 0.36708226799964905, 1.4686833620071411]
_Q += [-2.8272335529327393]


def _gelu(x, d):
    t = _rcp(np.abs(x) * F32(0.353553390593273762) + F32(1), d[1])
    q = F32(_Q[0])
    for c in _Q[1:]:
        q = q * t + F32(c)
    h = t * _ex2(q - (x * F32(0.721347520444482)) * x, d[0], ftz=True)
    return x * np.where(x >= 0, F32(1) - h, h)


def _tanh(x, d):
    return (np.tanh(x.astype(np.float64)) * (1 + d[0] * 2.0**-11)).astype(F32)


EMULATED = {"exp": _exp, "sigmoid": _sigmoid, "silu": _silu, "gelu": _gelu, "tanh": _tanh}


def test_the_emulation_matches_the_prelude_constants():
    import re

    from circbuf.lowering.prelude import PRELUDE

    def literals(fn):
        body = PRELUDE[PRELUDE.index(f"float {fn}(float x)") :]
        body = body[: body.index("__device__")]  # up to the next function
        return {F32(v) for v in re.findall(r"(\d+\.\d+(?:e-?\d+)?)f", body)}

    assert literals("fast_exp") == {F32(1.44269504088896341)}
    want = {F32(abs(c)) for c in _Q} | {F32(0.353553390593273762), F32(0.721347520444482), F32(1), F32(0)}
    assert literals("fast_gelu") == want


USED = [  # (op, dtype) where the pass uses the variant for a direct cast: all but fp16 tanh
    (op, dt)
    for op in OPS
    for dt, cbt in ((torch.bfloat16, D.BFloat16), (torch.float16, D.Half))
    if hides(cbt, REL_ERROR[op])
]


def test_the_variants_used_for_a_direct_cast():
    assert len(USED) == 9 and ("tanh", torch.float16) not in USED


@pytest.mark.parametrize("op, dtype", USED)
def test_error_model_no_worse_than_torch(op, dtype):
    """Where the pass uses a variant, its emulation at the documented worst cases,
    rounded to the output type, stays as close to the exact value as torch's own
    (CPU) result, within ulp.allowance of the variant's REL_ERROR."""
    x = ulp.finite_values(dtype)
    ref = ulp.reference(op, x)
    theirs = ulp.torch_result(op, x)
    xf = x.float().numpy()
    allow = ulp.allowance(REL_ERROR[op], dtype)
    for d in itertools.product((-1, 0, 1), repeat=2):
        with np.errstate(over="ignore", invalid="ignore"):
            ours = torch.from_numpy(EMULATED[op](xf, d)).to(dtype)
        ulp.no_worse_than_torch(x, ours, theirs, ref, dtype, allow)
        ulp.accurate(x, ours, ref, dtype, allow, ACCURATE_ON.get(op, lambda x: None)(x))


# where a variant is within 0.5 ulp + allowance of exact (elsewhere everywhere): gelu's h flushes to
# zero below x = -13.2 (2^-126 after the ex2), where torch's gelu is 0 already
ACCURATE_ON = {"gelu": lambda x: x > -13.1}


def test_ulp_helpers():
    assert ulp.ulp(torch.tensor([1.0, 1.5, 2.0, 0.0, 1e-40]), torch.bfloat16).tolist() == [
        2.0**-7,
        2.0**-7,
        2.0**-6,
        2.0**-133,
        2.0**-133,
    ]
    assert ulp.finite_values(torch.bfloat16).numel() == 65536 - 2 * 128  # no inf, no NaN
    assert ulp.finite_values(torch.float16).numel() == 65536 - 2 * 1024
    x = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    ref = torch.tensor([1.0 + 2.0**-8, 2.0], dtype=torch.float64)  # a tie: either neighbor is 0.5 ulp off
    ours = torch.tensor([1.0 + 2.0**-7, 2.0], dtype=torch.bfloat16)
    ulp.no_worse_than_torch(x, ours, x, ref, torch.bfloat16, 0.0)
    with pytest.raises(AssertionError, match="farther than torch's"):
        ulp.no_worse_than_torch(
            x, x + torch.tensor([0.0, 2**-6], dtype=torch.bfloat16), x, ref, torch.bfloat16, 0.4
        )
