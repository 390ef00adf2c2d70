"""GPU tests of the matmul scheduler against torch in float64: shapes
(1, primes, ragged), both operand layouts and transposed views, batches,
epilogues, every override set, and the SIMT path. Outputs are poisoned with
NaN before each launch (conftest), so an unwritten element fails."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from tests.util import TORCH, D

pytestmark = pytest.mark.gpu
DEV = "cuda"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check(out, ref, rel=1e-2):
    """‖out − ref‖ / ‖ref‖ below ``rel`` (bf16 operands land near 2e-3), every element finite."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    o = out.double()
    assert torch.isfinite(o).all(), "non-finite output (an unwritten element?)"
    err = ((o - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < rel, err


def mm_fusion(kind="matmul", dtype=D.BFloat16, arank=2, brank=2, bias=False, epilogue=None):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1] * arank, dtype=dtype)
        b = fd.define_tensor([-1] * brank, dtype=dtype)
        if kind == "linear":
            bb = fd.define_tensor([-1], dtype=dtype) if bias else None
            c = fd.ops.linear(a, b, bb)
        else:
            c = fd.ops.matmul(a, b)
        if epilogue == "gelu":
            c = fd.ops.cast(fd.ops.gelu(c), dtype)
        elif epilogue == "silu":
            c = fd.ops.cast(fd.ops.silu(c), dtype)
        elif epilogue == "relu":
            c = fd.ops.cast(fd.ops.relu(c), dtype)
        elif epilogue == "tanh_gelu":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            x = fd.ops.cast(c, D.Float)
            inner = fd.ops.mul(
                fd.ops.add(x, fd.ops.mul(fd.ops.mul(fd.ops.mul(x, x), x), 0.044715)), 0.7978845608028654
            )
            c = fd.ops.cast(fd.ops.mul(fd.ops.mul(x, 0.5), fd.ops.add(fd.ops.tanh(inner), 1.0)), dtype)
        elif epilogue == "scale":
            s = fd.define_scalar(dtype=D.Double)
            c = fd.ops.cast(fd.ops.mul(c, s), dtype)
        elif epilogue == "residual":
            r = fd.define_tensor([-1] * max(arank, brank), dtype=dtype)
            c = fd.ops.cast(fd.ops.add(c, r), dtype)
        fd.add_output(c)
    return fd


def ref_epilogue(c, epilogue, extra):
    if epilogue == "gelu":
        return torch.nn.functional.gelu(c)
    if epilogue == "silu":
        return torch.nn.functional.silu(c)
    if epilogue == "relu":
        return torch.relu(c)
    if epilogue == "tanh_gelu":
        return torch.nn.functional.gelu(c, approximate="tanh")
    if epilogue == "scale":
        return c * extra
    if epilogue == "residual":
        return c + extra.double()
    return c


SHAPES = [
    (128, 256, 64),
    (512, 512, 512),
    (1000, 700, 304),  # ragged M, N, K
    (1, 256, 256),  # M = 1
    (257, 129, 72),
    (8, 8, 8),
    (131, 1031, 1048),
    (2048, 2048, 1024),
]


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("kind", ["matmul", "linear"])
def test_matmul_shapes(m, n, k, kind):
    fd = mm_fusion(kind)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a, b])
    assert out.dtype == torch.bfloat16
    ref = a.double() @ (b.double().T if kind == "linear" else b.double())
    check(out, ref)
    # a tensor map needs 16-byte row strides: A needs K % 8 == 0, B [K, N] N % 8 == 0, [N, K] K % 8 == 0;
    # else the operand is copied to aligned rows first (circbuf.realign): never the SIMT path
    p = fd.last_params()
    b_tma = k % 8 == 0 if kind == "linear" else n % 8 == 0
    assert type(p).__name__ == "MatmulParams" and p.simt is None
    copied = (("T0",) if k % 8 else ()) + (() if b_tma else ("T1",))
    assert fd._get_executor().realigned == copied


@pytest.mark.parametrize("epilogue", ["gelu", "silu", "relu", "tanh_gelu", "scale", "residual"])
@pytest.mark.parametrize("dtype", [D.BFloat16, D.Half])
def test_epilogues(epilogue, dtype):
    m, n, k = 384, 520, 256
    fd = mm_fusion("matmul", dtype, epilogue=epilogue)
    td = TORCH[dtype]
    a = torch.randn(m, k, device=DEV, dtype=td) / 4
    b = torch.randn(k, n, device=DEV, dtype=td) / 4
    extra = None
    inputs = [a, b]
    if epilogue == "scale":
        extra = 0.37
        inputs.append(extra)
    if epilogue == "residual":
        extra = torch.randn(m, n, device=DEV, dtype=td)
        inputs.append(extra)
    (out,) = fd.execute(inputs)
    assert out.dtype == td
    check(out, ref_epilogue(a.double() @ b.double(), epilogue, extra))


def test_linear_bias_gelu():
    fd = mm_fusion("linear", bias=True, epilogue="gelu")
    x = torch.randn(777, 512, device=DEV, dtype=torch.bfloat16) / 8
    w = torch.randn(1040, 512, device=DEV, dtype=torch.bfloat16) / 8
    bias = torch.randn(1040, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([x, w, bias])
    ref = torch.nn.functional.gelu(x.double() @ w.double().T + bias.double())
    check(out, ref)


EPILOGUE_INPUTS = [
    "bias_n",  # linear's bias [N]: the same in every row of a tile
    "bias_n_row",  # a [1, N] input added to the output
    "bias_n_strided",  # [N] with stride 2: no pair loads
    "bias_n_offset",  # [N] starting one element into its storage: 2-byte aligned, no pair loads
    "bias_m",  # a [M, 1] input: the same in every column
    "bias_m_expanded",  # [M] broadcast_in_dim to [M, N] (an expanded axis)
    "residual",  # a full [M, N] tile
    "residual_t",  # a transposed [M, N] view (N not contiguous)
]


def epilogue_input(what, m, n, k, device="cpu", dtype=torch.bfloat16):
    """gelu(linear(x, w) + y) for an epilogue input ``y`` of EPILOGUE_INPUTS:
    (fd, inputs, float64 reference)."""
    d = D.BFloat16 if dtype == torch.bfloat16 else D.Half
    x = torch.randn(m, k, device=device, dtype=dtype) / 8
    w = torch.randn(n, k, device=device, dtype=dtype) / 8
    shape = {"bias_n_row": [1, -1], "bias_m": [-1, 1], "residual": [-1, -1], "residual_t": [-1, -1]}.get(
        what, [-1]
    )
    with cb.FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1], dtype=d), fd.define_tensor([-1, -1], dtype=d)
        y = fd.define_tensor(shape, dtype=d)
        if what in ("bias_n", "bias_n_strided", "bias_n_offset"):
            c = fd.ops.linear(a, b, y)
        elif what == "bias_m_expanded":
            c = fd.ops.add(fd.ops.linear(a, b), fd.ops.broadcast_in_dim(y, [m, n], [0]))
        else:
            c = fd.ops.add(fd.ops.linear(a, b), y)
        fd.add_output(fd.ops.cast(fd.ops.gelu(c), d))
    if what in ("bias_n", "bias_n_row"):
        y = torch.randn(n, device=device, dtype=dtype)
    elif what == "bias_n_strided":
        y = torch.randn(2 * n, device=device, dtype=dtype)[::2]
    elif what == "bias_n_offset":
        y = torch.randn(n + 1, device=device, dtype=dtype)[1:]
    elif what in ("bias_m", "bias_m_expanded"):
        y = torch.randn(m, device=device, dtype=dtype)
    elif what == "residual":
        y = torch.randn(m, n, device=device, dtype=dtype)
    else:
        y = torch.randn(n, m, device=device, dtype=dtype).T
    yd = y.double()
    ref = x.double() @ w.double().T + (yd[:, None] if what.startswith("bias_m") else yd)
    if what == "bias_n_row":
        y = y[None, :]
    elif what == "bias_m":
        y = y[:, None]
    return fd, [x, w, y], torch.nn.functional.gelu(ref)


@pytest.mark.parametrize("what", EPILOGUE_INPUTS)
@pytest.mark.parametrize(
    "m, n, k",
    [
        (1000, 8191, 264),  # N odd (no pair loads, direct stores), M ragged
        (777, 1040, 512),  # N a multiple of 16 but not of the 256-column tile
        (130, 8192, 128),  # M just past a tile
        (257, 1022, 72),  # both ragged, N even
    ],
)
def test_epilogue_inputs(what, m, n, k):
    """An input the epilogue reads beside the accumulator (a bias along N or M,
    a residual tile) is loaded once per value of a sub-tile (pairs along N where
    the layout allows): every element right at ragged edges, against float64."""
    fd, inputs, ref = epilogue_input(what, m, n, k, DEV)
    (out,) = fd.execute(inputs)
    check(out, ref)


@pytest.mark.parametrize("what", ["bias_n", "bias_m", "residual"])
@pytest.mark.parametrize(
    "ov", [dict(pingpong=True), dict(tile=(256, 128, 64)), dict(persistent=False), dict(epilogue="role")]
)
@pytest.mark.parametrize("m, n", [(1000, 8191), (520, 1022)])
def test_epilogue_inputs_overrides(what, ov, m, n):
    fd, inputs, ref = epilogue_input(what, m, n, 136, DEV)
    fd.fusion.schedule(**ov)
    (out,) = fd.execute(inputs)
    check(out, ref)


def test_epilogue_inputs_half():
    fd, inputs, ref = epilogue_input("bias_n", 333, 2050, 200, DEV, torch.float16)
    (out,) = fd.execute(inputs)
    assert out.dtype == torch.float16
    check(out, ref)


@pytest.mark.parametrize("kind", ["matmul", "linear"])
@pytest.mark.parametrize("ta, tb", [(False, True), (True, False), (True, True)])
def test_transposed_views(kind, ta, tb):
    m, n, k = 320, 384, 192
    fd = mm_fusion(kind)
    a = (
        torch.randn(k, m, device=DEV, dtype=torch.bfloat16).T
        if ta
        else torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    )
    bshape = (n, k) if kind == "linear" else (k, n)
    b = (
        torch.randn(bshape[::-1], device=DEV, dtype=torch.bfloat16).T
        if tb
        else torch.randn(bshape, device=DEV, dtype=torch.bfloat16)
    )
    (out,) = fd.execute([a, b])
    ref = a.double() @ (b.double().T if kind == "linear" else b.double())
    check(out, ref)
    p = fd.last_params()
    assert p.simt is None and p.a_major == ("M" if ta else "K")


@pytest.mark.parametrize(
    "ashape, bshape",
    [
        ((3, 256, 192), (3, 192, 320)),
        ((3, 256, 192), (192, 320)),
        ((1, 256, 192), (4, 192, 320)),
        ((2, 3, 130, 64), (2, 3, 64, 72)),
    ],
)
def test_batched(ashape, bshape):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([1 if s == 1 else -1 for s in ashape], dtype=D.BFloat16)
        b = fd.define_tensor([-1] * len(bshape), dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    a = torch.randn(ashape, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(bshape, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a, b])
    check(out, a.double() @ b.double())


OVERRIDES = [
    dict(persistent=False),
    dict(persistent=True, pingpong=True),
    dict(pingpong=True, tile=(64, 256, 64), registers=(24, 240)),
    dict(pingpong=True, tile=(64, 256, 64)),
    dict(tile=(128, 128, 64)),
    dict(tile=(256, 128, 64)),
    dict(tile=(128, 64, 64)),
    dict(tile=(128, 128, 128), stages=3),
    dict(tile=(128, 256, 64), stages=2),
    dict(tile=(128, 128, 64), stages=6),
    dict(tile=(128, 128, 64), stages=5, prefetch=2),
    dict(raster="N", group=2),
    dict(raster="M", group=1),
    dict(epilogue="role"),
    dict(epilogue="role", tile=(128, 192, 64)),
    dict(epilogue="role", persistent=False),
    dict(epilogue="inline"),
]


@pytest.mark.parametrize("ov", OVERRIDES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("kind", ["matmul", "linear"])
def test_overrides(ov, kind):
    m, n, k = 1000, 1032, 520
    fd = mm_fusion(kind)
    fd.fusion.schedule(**ov)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a, b])
    check(out, a.double() @ (b.double().T if kind == "linear" else b.double()))
    p = fd.last_params()
    for key, v in ov.items():
        assert getattr(p, key) == (tuple(v) if isinstance(v, list) else v)


def test_architecture_snippet():
    """The ARCHITECTURE.md example: matmul + gelu + cast under persistent=True, stages=4."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        c = fd.ops.matmul(a, b)
        fd.add_output(fd.ops.cast(fd.ops.gelu(c), cb.DataType.BFloat16))
    fd.fusion.schedule(persistent=True, stages=4)
    A = torch.randn(1024, 512, device=DEV, dtype=torch.bfloat16) / 8
    B = torch.randn(512, 768, device=DEV, dtype=torch.bfloat16) / 8
    (out,) = fd.execute([A, B])
    check(out, torch.nn.functional.gelu(A.double() @ B.double()))


@pytest.mark.parametrize(
    "what, ashape, bshape, dtype",
    [
        ("fp32", (300, 200), (200, 100), torch.float32),
        ("K odd (row stride 8190 B)", (257, 4095), (4095, 129), torch.bfloat16),
        ("1-D @ 2-D", (256,), (256, 64), torch.bfloat16),
        ("2-D @ 1-D", (64, 256), (256,), torch.bfloat16),
        ("1-D @ 1-D", (256,), (256,), torch.bfloat16),
        ("K = 0", (64, 0), (0, 32), torch.bfloat16),
        ("M = 0", (0, 64), (64, 32), torch.bfloat16),
    ],
)
def test_simt_path(what, ashape, bshape, dtype):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1] * len(ashape), dtype=D.Float if dtype == torch.float32 else D.BFloat16)
        b = fd.define_tensor([-1] * len(bshape), dtype=D.Float if dtype == torch.float32 else D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    a = torch.randn(ashape, device=DEV, dtype=dtype)
    b = torch.randn(bshape, device=DEV, dtype=dtype)
    (out,) = fd.execute([a, b])
    ref = a.double() @ b.double()
    assert out.dtype == dtype and out.shape == ref.shape
    if ref.numel() and ref.norm() > 0:
        check(out, ref, rel=1e-2 if dtype == torch.bfloat16 else 1e-5)
    else:
        assert torch.equal(out.double().cpu(), ref.cpu())


def expanded_operand(what, dtype):
    """A matmul/linear one of whose operands is expanded (``ops.expand``): the
    result has the expanded extent, as torch's (issue: the batch was 1)."""
    d = D.Float if dtype == torch.float32 else D.BFloat16
    with cb.FusionDefinition() as fd:
        if what == "batch":  # [1, M, K] -> [2, M, K], @ [K, N]
            a, b = fd.define_tensor([1, -1, -1], dtype=d), fd.define_tensor([-1, -1], dtype=d)
            fd.add_output(fd.ops.matmul(fd.ops.expand(a, [2, -1, -1]), b))
            shapes, ref = [(1, 6, 16), (16, 5)], lambda a, b: a.expand(2, 6, 16) @ b
        elif what == "rows":  # [1, K] -> [M, K]: every row of the product the same
            a, b = fd.define_tensor([1, -1], dtype=d), fd.define_tensor([-1, -1], dtype=d)
            fd.add_output(fd.ops.matmul(fd.ops.expand(a, [6, -1]), b))
            shapes, ref = [(1, 16), (16, 5)], lambda a, b: a.expand(6, 16) @ b
        else:  # linear of [1, S, K] -> [3, S, K]
            x, w = fd.define_tensor([1, -1, -1], dtype=d), fd.define_tensor([-1, -1], dtype=d)
            fd.add_output(fd.ops.linear(fd.ops.expand(x, [3, -1, -1]), w))
            shapes, ref = [(1, 4, 16), (5, 16)], lambda x, w: x.expand(3, 4, 16) @ w.T
    return fd, shapes, ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("what", ["batch", "rows", "linear"])
def test_expanded_operand(what, dtype):
    fd, shapes, ref = expanded_operand(what, dtype)
    inputs = [torch.randn(s, device=DEV, dtype=dtype) for s in shapes]
    (out,) = fd.execute(inputs)
    check(out, ref(*[x.double() for x in inputs]), rel=1e-2 if dtype == torch.bfloat16 else 1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 700),
    n=st.integers(1, 700).map(lambda x: x),
    k8=st.integers(1, 80),
    kind=st.sampled_from(["matmul", "linear"]),
)
def test_hypothesis_shapes(m, n, k8, kind):
    k = 8 * k8
    fd = mm_fusion(kind)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a, b])
    check(out, a.double() @ (b.double().T if kind == "linear" else b.double()))


BROKEN_KERNEL = textwrap.dedent(
    """
    import dataclasses, torch, circbuf as cb
    import circbuf.lowering as L
    from circbuf.lowering.kir import MBarrierArrive, rewrite
    k = [i for i, p in enumerate(L.PASSES) if p.name == {pass_name!r}][0]
    orig = L.PASSES[k].fn
    def broken(kernel):  # {why}
        kernel = orig(kernel)
        names = {names}
        drop = lambda n: [] if isinstance(n, MBarrierArrive) and n.bar.name in names else None
        kernel.body = rewrite(kernel.body, drop)
        return kernel
    L.PASSES[k] = dataclasses.replace(L.PASSES[k], fn=broken)
    from tests.test_gpu_matmul import mm_fusion
    fd = mm_fusion("matmul")
    fd.fusion.schedule(**{overrides!r})
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


def run_broken_kernel(pass_name: str, names: str, why: str, overrides: dict) -> str:
    """Run, in a subprocess under CIRCBUF_DEBUG_HANG, a matmul whose kernel lost
    the mbarrier arrives on the arrays ``names`` (a Python expression over the
    kernel, evaluated after pass ``pass_name``); its stdout."""
    src = BROKEN_KERNEL.format(pass_name=pass_name, names=names, why=why, overrides=overrides)
    env = dict(os.environ, CIRCBUF_DEBUG_HANG="20000", CIRCBUF_CACHE_DIR="")
    r = subprocess.run(
        [sys.executable, "-c", src], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    return r.stdout + r.stderr


def test_broken_pingpong_order_raises_instead_of_hanging():
    out = run_broken_kernel(
        "turns",
        "{o.barrier('mma') for o in kernel.turn_orders}",
        "the MMA turn is never handed over: the second warpgroup waits for ever",
        dict(pingpong=True),
    )
    assert "CIRCBUF_ERROR:" in out, out
    # the second warpgroup waits on its MMA turn from the start; the producer then waits on
    # the ring slots that warpgroup never frees: under load (12 test processes on one GPU)
    # either wait may give up first, and either names the stuck protocol
    assert ("_mma_turn[" in out or "ab_empty[" in out) and "gave up" in out, out
