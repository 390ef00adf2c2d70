"""GPU tests of the epilogue role (``schedule(epilogue="role")``): an epilogue
warpgroup fed the fp32 accumulator through a shared-memory ring. Every
epilogue and dtype against float64 torch (outputs NaN-poisoned by conftest),
the same bits as the inline epilogue, ragged shapes by hypothesis, and a
broken hand-off that raises under CIRCBUF_DEBUG_HANG instead of hanging."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_gpu_matmul import ROOT, check, epilogue_input, mm_fusion, ref_epilogue
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
    if fd.last_params().simt is None:
        assert fd.last_params().epilogue == "role"
    check(out, torch.nn.functional.silu(y))


HANDOFF_BROKEN = textwrap.dedent(
    """
    import torch, circbuf as cb
    import circbuf.lowering as L
    from circbuf.lowering.kir import MBarrierArrive, rewrite
    import dataclasses
    k = [i for i, p in enumerate(L.PASSES) if p.name == "circular_buffer"][0]
    orig = L.PASSES[k].fn
    def broken(kernel):  # the consumers never say a hand-off slot is full: the epilogue waits for ever
        kernel = orig(kernel)
        full = {r.full for r in kernel.rings if r.fill == "threads"}
        drop = lambda n: [] if isinstance(n, MBarrierArrive) and n.bar.name in full else None
        kernel.body = rewrite(kernel.body, drop)
        return kernel
    L.PASSES[k] = dataclasses.replace(L.PASSES[k], fn=broken)
    from tests.test_gpu_matmul import mm_fusion
    fd = mm_fusion("matmul")
    fd.fusion.schedule(epilogue="role")
    a = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    try:
        fd.execute([a, b])
        torch.cuda.synchronize()
        print("NO ERROR")
    except cb.CircbufError as e:
        print("CIRCBUF_ERROR:", e)
    """
)


def test_broken_handoff_raises_instead_of_hanging():
    env = dict(os.environ, CIRCBUF_DEBUG_HANG="20000", CIRCBUF_CACHE_DIR="")
    r = subprocess.run(
        [sys.executable, "-c", HANDOFF_BROKEN], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert "CIRCBUF_ERROR:" in r.stdout, r.stdout + r.stderr
    assert "_full[" in r.stdout and "gave up" in r.stdout
