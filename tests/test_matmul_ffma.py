"""The FFMA path (scheduler/matmul_ffma.py): fp32 and fp64 matmul / linear on
the CUDA cores, register-tiled, issue 18. The interpreter runs each kernel on
the CPU against float64 torch (outputs NaN-poisoned, every element stored
once); NVRTC compiles it for sm_90a and the SASS is read back (FFMA
dominates the loop, 16-byte operand loads, no local-memory spills); the GPU
twins run the same cases with NaN-poisoned outputs."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.scheduler.params import FfmaParams
from circbuf.target import DEFAULT
from tests.util import D, seeded

DEV = "cuda"
TORCH = {D.Float: torch.float32, D.Double: torch.float64}


def _fusion(
    kind="matmul", dtype=D.Float, arank=2, brank=2, bias=False, epilogue=None, out_dtype=None, bshape=None
):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1] * arank, dtype=dtype)
        b = fd.define_tensor(bshape or [-1] * brank, dtype=dtype)
        if kind == "linear":
            bb = fd.define_tensor([-1], dtype=dtype) if bias else None
            c = fd.ops.linear(a, b, bb)
        else:
            c = fd.ops.matmul(a, b)
        if epilogue == "relu":
            c = fd.ops.relu(c)
        elif epilogue == "gelu":
            c = fd.ops.gelu(c)
        elif epilogue == "two outputs":
            fd.add_output(c)
            c = fd.ops.mul(fd.ops.sigmoid(c), c)
        elif epilogue == "column-major":  # stored through its strides, element by element
            c = fd.ops.stride_order(c, [0, 1])
        if out_dtype is not None:
            c = fd.ops.cast(c, out_dtype)
        fd.add_output(c)
    return fd


def _ref(kind, a, b, bias=None, epilogue=None):
    c = a @ (b.transpose(-1, -2) if kind == "linear" else b)
    if bias is not None:
        c = c + bias
    if epilogue == "relu":
        return [torch.relu(c)]
    if epilogue == "gelu":
        return [torch.nn.functional.gelu(c)]
    if epilogue == "two outputs":
        return [c, torch.sigmoid(c) * c]
    return [c]


def _operands(kind, m, n, k, batch=(), bbatch=(), dtype=torch.float32, a_major="K", b_major=None, seed=0):
    g = seeded(seed + m * 7 + n * 13 + k)
    if a_major == "M":
        a = torch.randn(*batch, k, m, generator=g, dtype=dtype).transpose(-1, -2)
    else:
        a = torch.randn(*batch, m, k, generator=g, dtype=dtype)
    if kind == "linear":
        b = (
            torch.randn(k, n, generator=g, dtype=dtype).T
            if b_major == "N"
            else torch.randn(n, k, generator=g, dtype=dtype)
        )
    elif b_major == "K":
        b = torch.randn(*bbatch, n, k, generator=g, dtype=dtype).transpose(-1, -2)
    else:
        b = torch.randn(*bbatch, k, n, generator=g, dtype=dtype)
    return a, b


def _close(out, ref, k, dtype):
    """fp32 accumulation over k terms: torch's own fp32 error is about
    sqrt(k) ulp of the sum of |a||b|; allowed a few times that."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not out.isnan().any(), "an output element was never written"
    eps = 2.0**-23 if dtype == torch.float32 else 2.0**-52
    tol = 8 * eps * max(k, 1) ** 0.5 * (ref.abs().max().item() + 1)
    err = (out.double() - ref).abs().max().item()
    assert err <= tol, (err, tol)


def _check_case(kind, m, n, k, device="cpu", **kw):
    dtype = kw.pop("dtype", torch.float32)
    epilogue = kw.pop("epilogue", None)
    bias = kw.pop("bias", False)
    batch, bbatch = kw.pop("batch", ()), kw.pop("bbatch", ())
    a_major, b_major = kw.pop("a_major", "K"), kw.pop("b_major", None)
    offset = kw.pop("offset", False)
    target = kw.pop("target", None)
    smem, check = kw.pop("smem", False), kw.pop("check", None)
    assert not kw, kw
    a, b = _operands(kind, m, n, k, batch, bbatch, dtype, a_major, b_major)
    xs = [a, b]
    if bias:
        xs.append(torch.randn(n, generator=seeded(n), dtype=dtype))
    # on the device with the same strides (a transposed view stays one)
    xs = [torch.empty_strided(x.shape, x.stride(), dtype=dtype, device=device).copy_(x) for x in xs]
    if offset:  # A's data pointer 4 bytes past a 16-byte boundary
        a = xs[0]
        xs[0] = torch.cat([torch.zeros(1, dtype=dtype, device=device), a.reshape(-1)])[1:].view(a.shape)
    dt = D.Float if dtype == torch.float32 else D.Double
    bshape = [1 if d == 1 else -1 for d in bbatch] + [-1, -1]  # a batch axis of 1 broadcasts
    fd = _fusion(kind, dt, a.ndim, b.ndim, bias=bias, epilogue=epilogue, bshape=bshape)
    if smem:
        fd.fusion.schedule(ffma_smem=True)
    refs = [r.cpu() for r in _ref(kind, *[x.double() for x in xs], epilogue=epilogue)]
    if device == "cpu":
        outs = interpret(fd, xs, target=target, check=check)
    else:
        outs = [o.cpu() for o in fd.execute(xs)]
    for o, r in zip(outs, refs):
        assert o.dtype == dtype
        _close(o, r, k, dtype)
    return fd


CASES = [
    # (kind, m, n, k, extra)
    ("matmul", 64, 96, 32, {}),
    ("matmul", 130, 132, 36, {}),  # ragged edges, vectorizable
    ("matmul", 37, 53, 29, {}),  # primes: scalar loads
    ("matmul", 1, 1, 1, {}),
    ("matmul", 1, 129, 7, {}),
    ("matmul", 129, 1, 8, {}),
    ("matmul", 17, 19, 1, {}),
    ("linear", 70, 40, 64, {}),
    ("linear", 33, 65, 31, {"bias": True}),
    ("linear", 48, 24, 16, {"bias": True, "epilogue": "gelu"}),
    ("matmul", 40, 72, 20, {"epilogue": "relu"}),
    ("matmul", 40, 36, 24, {"epilogue": "two outputs"}),
    ("matmul", 36, 40, 24, {"epilogue": "column-major"}),
    ("matmul", 33, 40, 12, {"batch": (3,)}),  # batched A, 2-D B
    ("matmul", 24, 20, 16, {"batch": (2,), "bbatch": (2,)}),
    ("matmul", 9, 12, 8, {"batch": (2, 3), "bbatch": (1, 3)}),  # broadcast batch
    ("matmul", 64, 48, 40, {"a_major": "M"}),  # A an M-major view
    ("matmul", 36, 64, 40, {"b_major": "K"}),  # B a K-major view
    ("matmul", 35, 45, 41, {"a_major": "M", "b_major": "K"}),  # views, ragged
    ("linear", 32, 32, 32, {"b_major": "N"}),  # weight an N-major view
    ("matmul", 32, 32, 32, {"offset": True}),  # A's pointer 4 bytes off 16
    ("matmul", 45, 50, 20, {"dtype": torch.float64}),
    ("linear", 24, 18, 14, {"dtype": torch.float64, "bias": True}),
]


def _id(c):
    kind, m, n, k, kw = c
    return f"{kind}-{m}x{n}x{k}" + "".join(f"-{k_}={v}" for k_, v in kw.items())


# one SM: every output of these small cases makes more tiles than SMs, so they run the
# [128 x 128] tiles of 8 x 8 a thread that large outputs get (H100: [64 x 64] of 4 x 4)
ONE_SM = dataclasses.replace(DEFAULT, sm_count=1)


@pytest.mark.parametrize("thread_tile", [8, 4])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_interpreted(case, thread_tile):
    kind, m, n, k, kw = case
    fd = _check_case(kind, m, n, k, target=ONE_SM if thread_tile == 8 else None, **kw)
    p = fd.last_params()
    assert isinstance(p.simt, FfmaParams) and p.simt.thread_tile == (thread_tile,) * 2, p
    if kw.get("offset"):  # 16-byte loads need a 16-byte aligned pointer
        assert (p.simt.vectorize_a, p.simt.vectorize_b) == ("", "N"), p


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["matmul", "linear"]),
    m=st.sampled_from([1, 2, 3, 5, 8, 13, 31, 64, 67, 129]),
    n=st.sampled_from([1, 2, 4, 7, 16, 33, 61, 128, 131]),
    k=st.sampled_from([1, 3, 4, 5, 8, 11, 16, 37]),
    a_major=st.sampled_from(["K", "M"]),
    b_major=st.sampled_from([None, "K", "N"]),
    batch=st.sampled_from([(), (2,)]),
    extra=st.sampled_from([{}, {"bias": True}, {"epilogue": "relu"}, {"epilogue": "two outputs"}]),
    one_sm=st.booleans(),
)
def test_interpreted_shapes(kind, m, n, k, a_major, b_major, batch, extra, one_sm):
    if kind == "linear":
        b_major = None if b_major == "K" else b_major
    elif b_major == "N":
        b_major = None
    if extra.get("bias") and kind != "linear":
        extra = {}
    _check_case(
        kind,
        m,
        n,
        k,
        a_major=a_major,
        b_major=b_major,
        batch=batch,
        target=ONE_SM if one_sm else None,
        **extra,
    )


def _edge(kind):
    """Fusions around the matmul that the FFMA path schedules whole: (build, shapes, reference)."""

    def build(fd):
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        if kind == "column scale":  # an epilogue input broadcast along N
            c = fd.define_tensor([-1, 1])
            fd.add_output(fd.ops.mul(fd.ops.matmul(a, b), c))
        elif kind == "in place":  # the output written into the residual it reads
            r = fd.define_tensor([-1, -1])
            fd.add_output(fd.ops.add(fd.ops.matmul(a, b), r), alias_input=r)
        elif kind == "prologue":  # operands computed in the fusion: element loads
            fd.add_output(fd.ops.matmul(fd.ops.relu(a), fd.ops.mul(b, 2.0)))

    shapes = {"column scale": [(37, 20), (20, 41), (37, 1)], "in place": [(36, 20), (20, 44), (36, 44)]}
    shapes["prologue"] = [(36, 20), (20, 40)]

    def ref(a, b, *rest):
        if kind == "column scale":
            return [(a @ b) * rest[0]]
        if kind == "in place":
            return [a @ b + rest[0]]
        return [torch.relu(a) @ (b * 2)]

    return build, shapes[kind], ref


EDGES = ["column scale", "in place", "prologue"]


def _check_edge(kind, device):
    build, shapes, ref = _edge(kind)
    with cb.FusionDefinition() as fd:
        build(fd)
    g = seeded(len(kind))
    xs = [torch.randn(*s, generator=g).to(device) for s in shapes]
    refs = [r.cpu() for r in ref(*[x.double() for x in xs])]  # (before the in-place output)
    outs = interpret(fd, xs) if device == "cpu" else [o.cpu() for o in fd.execute(xs)]
    for o, r in zip(outs, refs):
        _close(o, r, shapes[0][1], torch.float32)
    assert isinstance(fd.last_params().simt, FfmaParams)


@pytest.mark.parametrize("kind", EDGES)
def test_interpreted_around_the_matmul(kind):
    _check_edge(kind, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", EDGES)
def test_gpu_around_the_matmul(monkeypatch, kind):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    _check_edge(kind, DEV)


def test_k_zero_is_a_fill():
    """K = 0: no products to sum, a pointwise fill for those sizes
    (scheduler/empty_k.py), whatever the dtype."""
    fd = _fusion()
    out = interpret(fd, [torch.randn(5, 0), torch.randn(0, 7)])[0]
    assert torch.equal(out, torch.zeros(5, 7))
    assert [type(q).__name__ for q in fd.last_params()] == ["PointwiseParams"]


def test_a_matrix_vector_product_keeps_the_sum_of_products():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.Float)
        v = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.matmul(a, v))
    a, v = torch.randn(37, 20), torch.randn(20)
    (out,) = interpret(fd, [a, v])
    _close(out, a.double() @ v.double(), 20, torch.float32)
    p = fd.last_params()
    assert p.simt is not None and not isinstance(p.simt, FfmaParams)


def test_a_batch_past_the_grid_keeps_the_sum_of_products():
    # blockIdx.z takes 65535 batches at most
    fd = _fusion(arank=3, brank=3)
    ck = fd.compile([torch.empty(65536, 2, 3), torch.empty(65536, 3, 2)], arch="sm_90a")
    assert ck.params.simt is not None and not isinstance(ck.params.simt, FfmaParams)
    fd = _fusion(arank=3, brank=3)
    ck = fd.compile([torch.empty(65535, 2, 3), torch.empty(65535, 3, 2)], arch="sm_90a")
    assert isinstance(ck.params.simt, FfmaParams)


def test_overrides():
    a, b = torch.empty(4096, 4096), torch.empty(4096, 4096)
    for ov, want in [
        (dict(thread_tile=4), dict(thread_tile=(4, 4), tile=(64, 64, 16), smem=False)),
        # the register-only kernel (ffma_smem=False): a k step of 8 spills at 128 registers
        (dict(k_step=8, ffma_smem=False), dict(thread_tile=(8, 8), tile=(128, 128, 8), blocks_per_sm=0)),
        (dict(blocks_per_sm=1, k_step=4, ffma_smem=False), dict(tile=(128, 128, 4), blocks_per_sm=1)),
        # the shared-memory tiles (the default for 8 x 8): one k's values in registers, two CTAs
        (dict(k_step=8), dict(thread_tile=(8, 8), tile=(128, 128, 8), blocks_per_sm=2, smem=True)),
    ]:
        fd = _fusion()
        fd.fusion.schedule(**ov)
        p = fd.compile([a, b], arch="sm_90a").params.simt
        assert isinstance(p, FfmaParams) and all(getattr(p, k) == v for k, v in want.items()), (ov, p)
    fd = _fusion()
    fd.fusion.schedule(k_step=2)
    with pytest.raises(cb.CircbufError, match=r"^schedule\(k_step=2\): a k step is whole 16-byte loads"):
        fd.compile([a, b], arch="sm_90a")
    fd = _fusion()
    fd.fusion.schedule(stages=3, k_step=8)
    with pytest.raises(
        cb.CircbufError,
        match=r"^schedule\(stages\): this matmul runs on the SIMT path \(.*; the FFMA kernel\), which takes "
        r"thread_tile, k_step, blocks_per_sm",
    ):
        fd.compile([a, b], arch="sm_90a")
    # a bf16 matmul (the tensor cores) does not use them
    from tests.test_gpu_matmul import mm_fusion

    fd = mm_fusion("matmul")
    fd.fusion.schedule(thread_tile=4)
    with pytest.raises(cb.CircbufError, match=r"thread_tile=4\): the kernel chosen, matmul \(tensor cores\)"):
        fd.compile([a.bfloat16(), b.bfloat16()], arch="sm_90a")


def test_interpreted_with_overrides():
    fd = _fusion("linear")
    fd.fusion.schedule(thread_tile=8, k_step=16, blocks_per_sm=1)
    a, b = torch.randn(40, 48), torch.randn(24, 48)
    (out,) = interpret(fd, [a, b])
    _close(out, a.double() @ b.double().T, 48, torch.float32)
    p = fd.last_params().simt
    assert p.thread_tile == (8, 8) and p.tile[2] == 16 and p.blocks_per_sm == 1, p


def test_variant_and_printing():
    from circbuf.scheduler.matmul import MatmulScheduler

    fd = _fusion()
    fd.compile([torch.randn(256, 64), torch.randn(64, 256)], arch="sm_90a", target=ONE_SM)
    p = fd.last_params()
    assert MatmulScheduler.variant(p) == "ffma"
    assert p.brief() == (
        "FFMA tile 128x128x16, 8x8 per thread, 256 threads; operand tiles in shared memory (2 stages; "
        "A cp.async element copies; B cp.async 16-byte copies); 2 CTAs/SM; compiled for M = 256, N = 256, K = 64"
    )
    assert "tile: (128, 128, 16)" in str(p) and "thread_tile: (8, 8)" in str(p) and "smem: True" in str(p)
    fd = _fusion()
    fd.fusion.schedule(ffma_smem=False)
    fd.compile([torch.randn(256, 64), torch.randn(64, 256)], arch="sm_90a", target=ONE_SM)
    assert fd.last_params().brief() == (
        "FFMA tile 128x128x4, 8x8 per thread, 256 threads; A 16-byte loads along K; B 16-byte loads along N; "
        "2 CTAs/SM; compiled for M = 256, N = 256, K = 64"
    )
    # four [128 x 128] tiles on an H100's 132 SMs: [64 x 64] tiles of 4 x 4 instead
    fd = _fusion()
    fd.compile([torch.randn(256, 64), torch.randn(64, 256)], arch="sm_90a")
    assert fd.last_params().brief() == (
        "FFMA tile 64x64x16, 4x4 per thread, 256 threads; A 16-byte loads along K; B 16-byte loads along N; "
        "compiled for M = 256, N = 256, K = 64"
    )


def _sass_ops(sass: str) -> Counter:
    ops = Counter()
    for line in sass.splitlines():
        mm = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if mm:
            ops[mm.group(1)] += 1
    return ops


def _loops(sass: str) -> tuple:
    """The kernel's instructions ``(address, opcode, operands)`` and its loops
    ``(label, back branch)`` (a branch to a lower address)."""
    ins = []
    for line in sass.splitlines():
        mm = re.search(r"/\*([0-9a-f]{4})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", line)
        if mm:
            ins.append((int(mm.group(1), 16), mm.group(2), mm.group(3)))
    back = [(int(r.split()[0], 16), a) for a, op, r in ins if op == "BRA" and int(r.split()[0], 16) < a]
    return ins, back


def _k_loop(sass: str) -> Counter:
    """Instruction counts of the kernel's one loop (its label to its back branch)."""
    ins, back = _loops(sass)
    assert len(back) == 1, back
    lo, hi = back[0]
    return Counter(op for a, op, _ in ins if lo <= a <= hi)


@pytest.mark.parametrize(
    "kind, a_major, b_major",
    [("matmul", "K", "N"), ("linear", "K", "K"), ("matmul", "M", "K")],
)
def test_sass_ffma_dominates(kind, a_major, b_major):
    m = n = k = 4096
    a = torch.empty(m, k) if a_major == "K" else torch.empty(k, m).T
    if kind == "linear":
        b = torch.empty(n, k)
    else:
        b = torch.empty(k, n) if b_major == "N" else torch.empty(n, k).T
    fd = _fusion(kind)
    fd.fusion.schedule(ffma_smem=False)  # the register-only kernel (test_smem_sass: the default's)
    ck = fd.compile([a, b], arch="sm_90a")
    p = ck.params.simt
    assert isinstance(p, FfmaParams), ck.params
    assert (p.vectorize_a, p.vectorize_b) == (a_major, b_major), p
    ops = _sass_ops(ck.sass())
    assert not any(o.startswith(("LDL", "STL")) for o in ops), ops  # no local-memory spills
    bm, bn, bk = p.tile
    tm, tn = p.thread_tile
    assert ops["FFMA"] >= tm * tn * bk, ops  # the unrolled k step: every product an FFMA
    # one 16-byte load per four operand values of a k step (A's [tm x bk], B's [bk x tn])
    assert ops["LDG.E.128"] == (tm + tn) * bk // 4, ops
    assert ops["STG.E.128"] == tm * tn // 4, ops
    # whole tiles: compiled for M, N, K, the loop has no bounds checks (no zeroed registers
    # for guarded loads): 256 FFMA of 281-285 instructions (the 474 of a symbolic shape)
    assert p.extents == (m, n, k), p
    loop = _k_loop(ck.sass())
    assert loop["FFMA"] == tm * tn * bk and "CS2R" not in loop, loop
    assert loop["FFMA"] >= 0.88 * sum(loop.values()), loop


def test_scalar_loads_where_rows_do_not_allow_vectors():
    fd = _fusion()
    ck = fd.compile([torch.empty(64, 37), torch.empty(37, 61)], arch="sm_90a")
    p = ck.params.simt
    assert (p.vectorize_a, p.vectorize_b) == ("", ""), p
    ops = _sass_ops(ck.sass())
    tm, tn = p.thread_tile
    assert "LDG.E.128" not in ops and ops["FFMA"] >= tm * tn * p.tile[2], ops


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gpu(monkeypatch, case):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    kind, m, n, k, kw = case
    fd = _check_case(kind, m, n, k, device=DEV, **kw)
    assert isinstance(fd.last_params().simt, FfmaParams)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1000, 700, 304), (2049, 1023, 517)])
def test_gpu_large(monkeypatch, m, n, k):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    _check_case("matmul", m, n, k, device=DEV)


# ------------------------------------------------- operand tiles in shared memory
# ``schedule(ffma_smem=True)``: A's and B's [k_step x 128] tiles copied by every
# thread (cp.async: 16 bytes along a contiguous M or N, else one element a copy,
# consecutive threads along K) into a two-slot ring in shared memory, read back
# 16 bytes at a time (LDS.128: 4 consecutive M of A, 4 consecutive N of B)


def _smem_params(fd):
    p = fd.last_params().simt
    assert isinstance(p, FfmaParams) and p.smem and p.stages == 2, p
    return p


# the protocol checker (races on the ring's slots, copies read before they land) on
# the small cases; the rest checked against float64 only
CHECKED = {
    "matmul-64x96x32",
    "matmul-130x132x36",
    "linear-33x65x31-bias=True",
    "matmul-35x45x41-a_major=M-b_major=K",
}


@pytest.mark.parametrize("thread_tile", [8, 4])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_interpreted_smem(case, thread_tile):
    kind, m, n, k, kw = case
    check = 2 if _id(case) in CHECKED else 0
    fd = _check_case(kind, m, n, k, target=ONE_SM if thread_tile == 8 else None, smem=True, check=check, **kw)
    p = _smem_params(fd)
    item = 8 if kw.get("dtype") == torch.float64 else 4
    assert p.thread_tile == (thread_tile,) * 2 and p.tile[2] == 4 * 16 // item, p  # four 16-byte k loads


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["matmul", "linear"]),
    m=st.sampled_from([1, 3, 13, 64, 67, 129]),
    n=st.sampled_from([1, 4, 7, 33, 128, 131]),
    k=st.sampled_from([1, 5, 16, 17, 37]),
    a_major=st.sampled_from(["K", "M"]),
    b_major=st.sampled_from([None, "K", "N"]),
    batch=st.sampled_from([(), (2,)]),
    one_sm=st.booleans(),
)
def test_interpreted_shapes_smem(kind, m, n, k, a_major, b_major, batch, one_sm):
    if kind == "linear":
        b_major = None if b_major == "K" else b_major
    elif b_major == "N":
        b_major = None
    fd = _check_case(
        kind,
        m,
        n,
        k,
        a_major=a_major,
        b_major=b_major,
        batch=batch,
        target=ONE_SM if one_sm else None,
        smem=True,
    )
    _smem_params(fd)


@pytest.mark.parametrize("kind", ["column scale", "in place"])
def test_interpreted_smem_around_the_matmul(kind):
    build, shapes, ref = _edge(kind)
    with cb.FusionDefinition() as fd:
        build(fd)
    fd.fusion.schedule(ffma_smem=True)
    xs = [torch.randn(*s, generator=seeded(len(kind))) for s in shapes]
    refs = ref(*[x.double() for x in xs])
    for o, r in zip(interpret(fd, xs), refs):
        _close(o, r, shapes[0][1], torch.float32)
    _smem_params(fd)


def test_smem_needs_input_operands():
    build, shapes, _ = _edge("prologue")
    with cb.FusionDefinition() as fd:
        build(fd)
    fd.fusion.schedule(ffma_smem=True)
    with pytest.raises(cb.CircbufError, match=r"ffma_smem=True\): operand A .* is computed in the fusion"):
        fd.compile([torch.empty(*s) for s in shapes], arch="sm_90a")


def test_smem_default_for_fp32_8x8_tiles():
    """On by default for fp32 8 x 8 thread tiles of fusion inputs (measured
    faster on an H200); off for 4 x 4 tiles (few output tiles) and fp64."""
    fd = _fusion()
    ck = fd.compile([torch.empty(2048, 256), torch.empty(256, 2048)], arch="sm_90a")
    assert ck.params.simt.thread_tile == (8, 8) and ck.params.simt.smem
    assert "cp_async" in ck.cuda.split("end of prelude")[1]
    fd = _fusion()
    ck = fd.compile([torch.empty(256, 64), torch.empty(64, 256)], arch="sm_90a")
    assert ck.params.simt.thread_tile == (4, 4) and not ck.params.simt.smem
    assert "cp_async" not in ck.cuda.split("end of prelude")[1]
    fd = _fusion()
    fd.fusion.schedule(ffma_smem=False)
    ck = fd.compile([torch.empty(2048, 256), torch.empty(256, 2048)], arch="sm_90a")
    assert not ck.params.simt.smem


@pytest.mark.parametrize("kind, b_major", [("matmul", None), ("linear", None), ("matmul", "K")])
def test_smem_sass(kind, b_major):
    """4096^3: the k loop reads each k's 8 A and 8 B values with 4 LDS.128 (64 a
    k step of 16), runs 1024 FFMAs on them, copies the next step's tiles (LDGSTS:
    16 bytes along N, one element along K) and syncs the block once; no local
    memory, two CTAs an SM (128 registers). The copies (prologue and ring loop)
    are 16-byte along N, else one element a copy."""
    fd = _fusion(kind)
    fd.fusion.schedule(ffma_smem=True)
    m = n = k = 4096
    bshape = (n, k) if kind == "linear" else (k, n)
    bt = torch.empty(*bshape) if b_major is None else torch.empty(bshape[::-1]).T
    ck = fd.compile([torch.empty(m, k), bt], arch="sm_90a")
    p = ck.params.simt
    assert p.smem and p.tile == (128, 128, 16) and p.blocks_per_sm == 2 and p.extents == (m, n, k), p
    sass = ck.sass()
    ops = _sass_ops(sass)
    assert not any(o.startswith(("LDL", "STL")) for o in ops), ops
    assert ck.resource_usage()["LOCAL"] == 0
    loop = _main_loop(sass)
    assert loop["FFMA"] == 8 * 8 * 16 and loop["LDS.128"] == (8 + 8) // 4 * 16, loop
    assert loop["BAR.SYNC.DEFER_BLOCKING"] == 1, loop
    assert any(op.startswith("LDGSTS") for op in loop), loop  # the next step's copies
    # A [16 x 128] by element; B [16 x 128] by 16 bytes along N (matmul), else by element
    src = ck.cuda.split("end of prelude")[1]
    b16 = kind == "matmul" and b_major is None
    assert src.count("cb::cp_async<16>") == (2 if b16 else 0) and src.count("cb::cp_async<4>") == (
        2 if b16 else 4
    )
    # (the k loop: 1024 FFMA of 1260 instructions for matmul, 1307 for linear, sm_90a)
    assert loop["FFMA"] >= 0.75 * sum(loop.values()), loop


def _main_loop(sass: str) -> Counter:
    """Instruction counts of the kernel's longest loop (the k loop; the mbarrier
    waits are loops of their own)."""
    ins, back = _loops(sass)
    lo, hi = max(back, key=lambda x: x[1] - x[0])
    return Counter(op for a, op, _ in ins if lo <= a <= hi)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gpu_smem(monkeypatch, case):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    kind, m, n, k, kw = case
    fd = _check_case(kind, m, n, k, device=DEV, smem=True, **kw)
    _smem_params(fd)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kind, m, n, k, kw",
    [
        ("matmul", 4096, 4096, 4096, {}),
        ("linear", 4096, 4096, 4096, {}),
        ("matmul", 2049, 1023, 517, {}),
        ("linear", 1000, 700, 304, {"bias": True, "epilogue": "gelu"}),
        ("matmul", 1031, 997, 1009, {"a_major": "M", "b_major": "K"}),
        ("matmul", 257, 263, 269, {"batch": (3,)}),
        ("matmul", 512, 512, 512, {"dtype": torch.float64}),
    ],
)
def test_gpu_smem_large(monkeypatch, kind, m, n, k, kw):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd = _check_case(kind, m, n, k, device=DEV, smem=True, **kw)
    _smem_params(fd)


@pytest.mark.parametrize("ashape,bshape", [([-1, 1], [1, -1]), ([-1, 1], [-1, -1]), ([-1, -1], [1, -1])])
def test_k_fixed_to_one_keeps_the_register_kernel(ashape, bshape):
    """K defined as 1 (a broadcast axis, as torch.compile's static shapes define
    it): the shared-memory tiles' cp.async box would step that axis (a lowering
    check refused it once the tiles became the default); the register kernel
    takes it, and ``ffma_smem=True`` is refused by name. Found by review."""

    def fusion():
        with cb.FusionDefinition() as fd:
            a = fd.define_tensor(ashape, dtype=D.Float)
            b = fd.define_tensor(bshape, dtype=D.Float)
            fd.add_output(fd.ops.matmul(a, b))
        return fd

    g = torch.Generator().manual_seed(17)
    big = [torch.randn(1536, 1, generator=g), torch.randn(1, 1536, generator=g)]
    fd = fusion()
    ck = fd.compile(big, arch="sm_90a")
    assert isinstance(ck.params.simt, FfmaParams) and not ck.params.simt.smem, ck.params
    fd = fusion()
    fd.fusion.schedule(ffma_smem=True)
    with pytest.raises(cb.CircbufError, match=r"ffma_smem=True\): operand [AB]'s K axis is a broadcast"):
        fd.compile(big, arch="sm_90a")
    small = [torch.randn(70, 1, generator=g), torch.randn(1, 90, generator=g)]
    (out,) = interpret(fusion(), small)
    assert torch.allclose(out.double(), small[0].double() @ small[1].double(), rtol=1e-6, atol=1e-6)
