"""GPU tests of the epilogue role (``schedule(epilogue="role")``): an epilogue
warpgroup fed the fp32 accumulator through a shared-memory ring. Every
epilogue and dtype against float64 torch (outputs NaN-poisoned by conftest),
the same bits as the inline epilogue, ragged shapes by hypothesis, and a
broken hand-off that raises under CIRCBUF_DEBUG_HANG instead of hanging."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_gpu_matmul import check, epilogue_input, mm_fusion, ref_epilogue, run_broken_kernel
from tests.util import TORCH, D

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("epilogue", ["gelu", "silu", "relu", "tanh_gelu", "scale", "residual", None])
@pytest.mark.parametrize("dtype", [D.BFloat16, D.Half])
def test_role_epilogues_match_torch_and_the_inline_kernel(epilogue, dtype):
    m, n, k = 384, 520, 256
    td = TORCH[dtype]
    a = torch.randn(m, k, device=DEV, dtype=td) / 4
    b = torch.randn(k, n, device=DEV, dtype=td) / 4
    extra, inputs = None, [a, b]
    if epilogue == "scale":
        extra = 0.37
        inputs.append(extra)
    if epilogue == "residual":
        extra = torch.randn(m, n, device=DEV, dtype=td)
        inputs.append(extra)
    outs = []
    for ov in (dict(epilogue="role"), dict(tile=(128, 128, 64))):
        fd = mm_fusion("matmul", dtype, epilogue=epilogue)
        fd.fusion.schedule(**ov)
        (out,) = fd.execute(inputs)
        outs.append(out)
    assert fd.last_params().epilogue == "inline"
    check(outs[0], ref_epilogue(a.double() @ b.double(), epilogue, extra))
    # the same fp32 values reach the same math: the same bits as the inline epilogue
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("what", ["bias_n", "bias_m", "residual"])
@pytest.mark.parametrize("m, n, k", [(1000, 8191, 136), (8192, 1024, 1024), (130, 136, 72)])
def test_role_epilogue_inputs(what, m, n, k):
    fd, inputs, ref = epilogue_input(what, m, n, k, DEV)
    fd.fusion.schedule(epilogue="role")
    (out,) = fd.execute(inputs)
    assert fd.last_params().epilogue == "role"
    check(out, ref)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 700),
    n=st.integers(1, 700),
    k8=st.integers(1, 80),
    kind=st.sampled_from(["matmul", "linear"]),
    persistent=st.booleans(),
)
def test_role_hypothesis_shapes(m, n, k8, kind, persistent):
    k = 8 * k8
    if kind == "matmul":  # B [K, N] with rows of N % 8 != 0 takes the SIMT path, which takes no overrides
        n = -(-n // 8) * 8
    fd = mm_fusion(kind, bias=kind == "linear", epilogue="silu")
    fd.fusion.schedule(epilogue="role", persistent=persistent)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device=DEV, dtype=torch.bfloat16)
    inputs = [a, b]
    y = a.double() @ (b.double().T if kind == "linear" else b.double())
    if kind == "linear":
        bias = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        inputs.append(bias)
        y = y + bias.double()
    (out,) = fd.execute(inputs)
    assert fd.last_params().epilogue == "role"
    check(out, torch.nn.functional.silu(y))


def test_broken_handoff_raises_instead_of_hanging():
    out = run_broken_kernel(
        "circular_buffer",
        "{r.full for r in kernel.rings if r.fill == 'threads'}",
        "the consumers never say a hand-off slot is full: the epilogue waits for ever",
        dict(epilogue="role"),
    )
    assert "CIRCBUF_ERROR:" in out, out
    assert "_full[" in out and "gave up" in out
