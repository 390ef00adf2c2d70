"""The cp.async fill of the matmul's operand ring (issue 18, section 1):
operands whose strides or data pointer a tensor map cannot describe (an odd
K, a pointer one element off, B's rows of 50257 bf16) are copied into the
same swizzled ring stages by the producer warpgroup's threads, and the same
wgmma consumers run; never the SIMT path for bf16/fp16.

CPU: the fill chosen per operand and the copy width from the alignment;
the ``fill=`` override and its errors; the kernel interpreter's results
against float64 torch (shared memory starts as NaN there, outputs poisoned,
every output element stored once) and its protocol checker, including
injected bugs; NVRTC for sm_90a read back as SASS (LDGSTS, no spills).
GPU (``-m gpu``): hypothesis over odd shapes and pointer offsets, bf16 and
fp16, NaN-poisoned outputs against float64 torch.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import check, check_kernel, interpret, launch_args, run_kernel
from circbuf.ir import Const
from circbuf.lowering import kir
from circbuf.target import H100
from tests.test_gpu_matmul import check as gpu_check
from tests.test_gpu_matmul import mm_fusion
from tests.util import D

BF, H = torch.bfloat16, torch.float16
TD = {BF: D.BFloat16, H: D.Half}
ONE_SM = dataclasses.replace(H100, sm_count=1)


@pytest.fixture(autouse=True)
def _production_kernels(monkeypatch):
    # the heuristic's cp.async fill is opt-in (CIRCBUF_CP_ASYNC) until it runs right on a GPU
    monkeypatch.setenv("CIRCBUF_CP_ASYNC", "1")
    if not torch.cuda.is_available():  # on a GPU, a hang stays a named error (CIRCBUF_DEBUG_HANG)
        monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)


def operands(m, n, k, kind="matmul", dtype=BF, a_off=0, b_off=0, device="cpu", empty=False):
    """A [m, k] and B ([k, n], or [n, k] for linear), each a view ``off``
    elements into a flat buffer (``flat[1:1 + m * k].view(m, k)``: a pointer
    one element off)."""
    make = torch.empty if empty else torch.randn

    def view(shape, off):
        flat = make(shape[0] * shape[1] + off, dtype=dtype, device=device)
        return flat[off : off + shape[0] * shape[1]].view(*shape)

    return view((m, k), a_off), view((n, k) if kind == "linear" else (k, n), b_off)


def params_of(m, n, k, kind="matmul", a_off=0, b_off=0, dtype=BF, **ov):
    fd = mm_fusion(kind, TD[dtype])
    if ov:
        fd.fusion.schedule(**ov)
    a, b = operands(m, n, k, kind, dtype, a_off, b_off, empty=True)
    return fd.compile([a, b], arch="sm_90a")


# ------------------------------------------------------------ the scheduler
@pytest.mark.parametrize(
    "shape, kind, a_off, b_off, fill, vector, store",
    [
        ((2047, 2047, 2047), "matmul", 0, 0, ("cp.async", "cp.async"), (1, 1), ("rows", 1)),
        ((4097, 4096, 4095), "matmul", 0, 0, ("cp.async", "tma"), (1, 0), ("tma", 1)),
        ((4096, 50257, 768), "matmul", 0, 0, ("tma", "cp.async"), (0, 1), ("rows", 1)),
        ((4096, 4096, 4096), "matmul", 1, 0, ("cp.async", "tma"), (1, 0), ("tma", 1)),
        ((4096, 4096, 4096), "matmul", 2, 0, ("cp.async", "tma"), (2, 0), ("tma", 1)),  # 4-byte pointer
        ((4096, 4096, 4096), "matmul", 4, 0, ("cp.async", "tma"), (4, 0), ("tma", 1)),  # 8-byte pointer
        ((4096, 4096, 4096), "matmul", 8, 0, ("tma", "tma"), (0, 0), ("tma", 1)),
        ((4096, 4096, 4100), "matmul", 0, 0, ("cp.async", "tma"), (4, 0), ("tma", 1)),  # rows of 8200 bytes
        (
            (4096, 4098, 4098),
            "linear",
            0,
            0,
            ("cp.async", "cp.async"),
            (2, 2),
            ("rows", 1),
        ),  # even N, rows 4-byte aligned: the row store
        ((512, 4098, 512), "matmul", 0, 1, ("tma", "cp.async"), (0, 1), ("rows", 1)),
    ],
)
def test_fill_per_operand(shape, kind, a_off, b_off, fill, vector, store):
    """TMA where a tensor map describes the operand, else cp.async, as wide
    as the pointer and the strides allow (16/8/4 bytes; 1 element: through
    registers); outputs whose rows are not 16-byte aligned are stored from
    registers, a pair per store, where N is even, and by rows from a staging
    tile where N is odd (tests/test_matmul_rows_store.py)."""
    p = params_of(*shape, kind, a_off, b_off).params
    assert p.simt is None
    assert (p.fill, p.copy_vector, (p.store, p.store_vector)) == (fill, vector, store)
    assert p.registers == ((56, 224) if "cp.async" in fill else (40, 232))


def test_fill_override():
    p = params_of(1024, 1024, 1024, fill="cp.async").params
    assert p.fill == ("cp.async", "cp.async") and p.copy_vector == (8, 8)  # 16-byte copies
    assert params_of(1024, 1024, 1024, fill="tma").params.fill == ("tma", "tma")
    with pytest.raises(
        cb.CircbufError,
        match=r"schedule\(fill='tma'\): TMA cannot describe operand T0 \(strides .*\); use fill='cp.async'",
    ):
        params_of(256, 256, 255, fill="tma")
    with pytest.raises(
        cb.CircbufError, match=r"schedule\(fill='tma'\): TMA cannot describe operand T0 \(data pointer"
    ):
        params_of(256, 256, 256, a_off=1, fill="tma")
    with pytest.raises(cb.CircbufError, match=r"schedule\(fill='ldg'\): must be 'tma' or 'cp.async'"):
        mm_fusion().fusion.schedule(fill="ldg")


def test_only_non_16_bit_operands_take_the_simt_path():
    """bf16 and fp16 with any strides or pointer run on the tensor cores; fp32
    operands (and fp64, integers) are what the SIMT sum of products still takes."""
    for dtype in (BF, H):
        for a_off, k in ((1, 64), (0, 63), (3, 130)):
            assert params_of(96, 72, k, "matmul", a_off, 1, dtype).params.simt is None
    fd = mm_fusion("matmul", D.Float)
    ck = fd.compile([torch.randn(64, 63), torch.randn(63, 64)], arch="sm_90a")
    assert ck.params.simt is not None


# ------------------------------------------------------- the lowered kernel
def nodes(k, kind):
    out = []
    kir.walk(k.body, lambda n, _s: out.append(n) if isinstance(n, kind) else None)
    return out


@pytest.mark.parametrize(
    "shape, a_off, ov, arrivals, fence",
    [
        ((130, 136, 127), 0, {}, 129, False),  # A through registers + B by TMA (the elected lane)
        ((100, 130, 132), 0, {}, 128, True),  # A 8-byte, B 4-byte cp.asyncs
        ((128, 130, 130), 1, {}, 256, True),  # A through registers, B 4-byte cp.asyncs
        ((128, 128, 128), 0, {"fill": "cp.async"}, 128, True),
    ],
)
def test_ring_structure(shape, a_off, ov, arrivals, fence):
    """One ring, fill cp.async: every producer thread waits for the slot and
    copies its chunks; the full barrier counts one arrival per thread per
    kind of copy (+1 for an expect_tx where a buffer is a TMA box); the
    consumers fence the proxies after the full wait where cp.asyncs wrote
    the stage (the wgmmas read it through the async proxy)."""
    k = params_of(*shape, "matmul", a_off, **ov).kernel
    (ring,) = k.rings
    assert ring.fill == "cp.async" and ring.full_arrivals == arrivals
    boxes = nodes(k, kir.CpAsyncBox)
    assert boxes and all(b.threads == 128 and b.bar.name == ring.full for b in boxes)
    (switch,) = nodes(k, kir.RoleSwitch)
    producer, consumers = (switch.bodies[switch.roles.index(k.role(r))] for r in ("producer", "consumers"))
    assert any(isinstance(n, kir.RingInit) for n in producer)  # every thread, no elected lane
    assert bool(nodes(k, kir.CpAsyncArrive)) == any(b.is_async for b in boxes)
    waits = []
    kir.walk(consumers, lambda n, _s: waits.append(n) if isinstance(n, kir.MBarrierWait) else None)
    waits = [w for w in waits if w.bar.name == ring.full]
    assert waits
    for w in waits:
        lst = kir.parent_list(consumers, w)
        after = lst[lst.index(w) + 1]
        assert (isinstance(after, kir.Fence) and after.kind == "proxy_async") == fence


# ------------------------------------------------------ the interpreter
def case(m, n, k, kind="matmul", a_off=0, b_off=0, dtype=BF, bias=False, act=None, arank=2, **ov):
    fd = mm_fusion(kind, TD[dtype], arank=arank, bias=bias, epilogue=act)
    if ov:
        fd.fusion.schedule(**ov)
    if arank == 3:
        flat = torch.randn(2 * m * k + a_off, dtype=dtype)
        a = flat[a_off : a_off + 2 * m * k].view(2, m, k)
        b = operands(m, n, k, kind, dtype, 0, b_off)[1]
    else:
        a, b = operands(m, n, k, kind, dtype, a_off, b_off)
    ins = [a, b] + ([torch.randn(n, dtype=dtype)] if bias else [])

    def ref():
        y = a.double() @ (b.double().T if kind == "linear" else b.double())
        if bias:
            y = y + ins[2].double()
        if act == "gelu":
            y = torch.nn.functional.gelu(y)
        return y

    return fd, ins, ref


def sliced_case():
    """A = x[:, :130] of x [100, 136] (aligned rows, 16-byte copies) with
    fill="cp.async": each row's last chunk holds 2 elements in range, the src
    size zero-fills its other 6."""
    fd = mm_fusion("matmul")
    fd.fusion.schedule(fill="cp.async")
    a = torch.randn(100, 136, dtype=BF)[:, :130]
    b = torch.randn(130, 72, dtype=BF)
    return fd, [a, b], lambda: a.double() @ b.double()


CASES = {
    "sliced_k_partial_chunks": sliced_case,
    "odd_k": lambda: case(130, 136, 127),
    "pointer_one_element_off": lambda: case(130, 136, 128, a_off=1),
    "cp_async_8_and_4_bytes": lambda: case(100, 130, 132),
    "linear_b_offset_fp16": lambda: case(100, 136, 130, "linear", b_off=1, dtype=H),
    "cp_async_16_bytes_forced": lambda: case(64, 128, 128, fill="cp.async"),
    "pingpong_odd_n": lambda: case(70, 131, 127, a_off=1, pingpong=True),
    "linear_bias_gelu_direct_pairs": lambda: case(100, 130, 127, "linear", bias=True, act="gelu"),
    "batched_a": lambda: case(40, 72, 127, arank=3, a_off=3),
    "n_major_b_odd_rows": lambda: case(64, 129, 64, b_off=0),
    "epilogue_role": lambda: case(130, 136, 127, "linear", a_off=1, act="gelu", epilogue="role"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_float64_torch(name):
    fd, ins, ref = CASES[name]()
    p = fd.compile(ins, arch="sm_90a").params
    assert p.simt is None and "cp.async" in p.fill
    out = interpret(fd, ins)[0]  # every output element stored exactly once, too
    torch.testing.assert_close(out.double(), ref(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["odd_k", "cp_async_8_and_4_bytes", "pingpong_odd_n"])
def test_checker_passes(name):
    fd, ins, _ = CASES[name]()
    check(fd, ins, schedules=2, target=ONE_SM)


def test_one_sm_wraps_the_ring():
    """One CTA walks every tile (the ring wraps several times)."""
    fd, ins, ref = case(200, 136, 255, a_off=1)
    out = interpret(fd, ins, target=ONE_SM)[0]
    torch.testing.assert_close(out.double(), ref(), rtol=2e-2, atol=2e-2)


# injected bugs: the checker (or the result) must catch each
def _find(k, pred):
    found = []
    kir.walk(k.body, lambda n, _s: found.append(n) if pred(n) else None)
    return found[0]


def _remove(k, node):
    kir.parent_list(k.body, node).remove(node)


def drop_cp_async_arrive(k):
    _remove(k, _find(k, lambda n: isinstance(n, kir.CpAsyncArrive)))


def drop_producer_fence(k):
    _remove(k, _find(k, lambda n: isinstance(n, kir.Fence) and n.kind == "proxy_async"))


def arrive_before_copies_land(k):
    """A plain arrive instead of cp.async.mbarrier.arrive: the stage is
    announced full while the thread's cp.asyncs are still in flight."""
    a = _find(k, lambda n: isinstance(n, kir.CpAsyncArrive))
    lst = kir.parent_list(k.body, a)
    lst[lst.index(a)] = kir.MBarrierArrive(a.bar)


def wait_group_one_too_few(k):
    """commit + wait_group 1 + arrive: the newest group (this stage's copies)
    may still be in flight when the stage is announced."""
    a = _find(k, lambda n: isinstance(n, kir.CpAsyncArrive))
    lst = kir.parent_list(k.body, a)
    j = lst.index(a)
    lst[j : j + 1] = [kir.CpAsyncCommit(), kir.CpAsyncWait(1), kir.MBarrierArrive(a.bar)]


def full_counts_one_warp(k):
    for n in k.body:
        if isinstance(n, kir.IfThenElse):
            for init in n.then:
                if isinstance(init, kir.MBarrierInit) and init.bar.name.endswith("_full"):
                    init.arrivals = Const(32)


MUTATIONS = [
    ("cp_async_8_and_4_bytes", drop_cp_async_arrive, r"deadlock.*ab_full"),
    ("odd_k", drop_producer_fence, r"written by role producer .* no fence.proxy.async"),
    ("cp_async_8_and_4_bytes", arrive_before_copies_land, r"race: .*(cp.async|before any copy)"),
    ("cp_async_8_and_4_bytes", wait_group_one_too_few, r"race: .*(cp.async|before any copy)"),
    ("cp_async_8_and_4_bytes", full_counts_one_warp, r"race|arrivals already|deadlock"),
]


@pytest.mark.parametrize("name, mutate, message", MUTATIONS, ids=[m.__name__ for _, m, _ in MUTATIONS])
def test_checker_catches_injected_bug(name, mutate, message):
    fd, ins, _ = CASES[name]()
    k, tensors, scalars, grid, block = launch_args(fd, ins, target=ONE_SM)
    check_kernel(k, [t.clone() for t in tensors], scalars, grid, block, schedules=1)
    mutate(k)
    with pytest.raises(cb.CircbufError, match=message):
        check_kernel(k, tensors, scalars, grid, block, schedules=3)


def test_commit_and_wait_group_then_arrive_is_a_valid_protocol():
    """cp.async.commit_group; cp.async.wait_group 0; mbarrier.arrive (the
    thread waits for its own copies, then announces them) in place of
    arrive.noinc: the interpreter's groups complete them in order, and the
    checker passes it."""
    fd, ins, ref = CASES["cp_async_8_and_4_bytes"]()
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    a = _find(k, lambda n: isinstance(n, kir.CpAsyncArrive))
    lst = kir.parent_list(k.body, a)
    j = lst.index(a)
    lst[j : j + 1] = [kir.CpAsyncCommit(), kir.CpAsyncWait(0), kir.MBarrierArrive(a.bar)]
    check_kernel(k, [t.clone() for t in tensors], scalars, grid, block, schedules=2)
    run_kernel(k, tensors, scalars, grid, block)
    torch.testing.assert_close(tensors[-1].double(), ref(), rtol=2e-2, atol=2e-2)


def test_ragged_edges_must_be_zero_filled(monkeypatch):
    """Without the zero fill of what lies past K (a row's last 16-byte copy
    reads 6 elements past its 130: the padding of the sliced rows), the result is wrong: the interpreter's
    copies honour the src-size operand."""
    fd, ins, ref = CASES["sliced_k_partial_chunks"]()
    assert fd.compile(ins, arch="sm_90a").params.copy_vector == (8, 8)
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    run_kernel(k, tensors, scalars, grid, block)
    torch.testing.assert_close(tensors[-1].double(), ref(), rtol=2e-2, atol=2e-2)
    parts = kir.CpAsyncBox.parts

    def no_zero_fill(self, chunk):
        dst, gidx, cond, _inner = parts(self, chunk)
        return dst, gidx, cond, Const(self.vector)

    monkeypatch.setattr(kir.CpAsyncBox, "parts", no_zero_fill)
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    with pytest.raises((AssertionError, cb.CircbufError)):
        run_kernel(k, tensors, scalars, grid, block)
        torch.testing.assert_close(tensors[-1].double(), ref(), rtol=2e-2, atol=2e-2)


def test_a_misaligned_cp_async_is_an_error():
    """The interpreter checks each cp.async's global address against its size."""
    fd, ins, _ = CASES["cp_async_8_and_4_bytes"]()
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    box = _find(k, lambda n: isinstance(n, kir.CpAsyncBox) and n.vector == 4)
    box.dims[0] = (box.dims[0][0], box.dims[0][1], box.dims[0][2] + 2, *box.dims[0][3:])
    with pytest.raises(cb.CircbufError, match="misaligned cp.async"):
        run_kernel(k, tensors, scalars, grid, block)


# ------------------------------------------------------------------ SASS
@pytest.mark.parametrize(
    "shape, kind, a_off, ov, ldgsts",
    [
        ((2047, 2047, 2047), "matmul", 0, {}, False),
        ((4096, 50257, 768), "matmul", 0, {}, False),
        ((4096, 4096, 4096), "matmul", 1, {}, False),
        ((4096, 4096, 4100), "matmul", 0, {}, True),
        ((4096, 4098, 4098), "linear", 0, {}, True),
        ((4096, 4096, 4096), "matmul", 0, {"fill": "cp.async"}, True),
        ((4096, 4096, 4096), "matmul", 0, {"fill": "cp.async", "pingpong": True}, True),
        ((4096, 4096, 4100), "linear", 0, {"epilogue": "role"}, True),
    ],
)
def test_sass(shape, kind, a_off, ov, ldgsts):
    """NVRTC for sm_90a: the wgmmas, LDGSTS (cp.async) with its barrier
    arrival where copies are 4 bytes or more, no spills."""
    ck = params_of(*shape, kind, a_off, **ov)
    sass = ck.sass()
    assert re.search(r"HGMMA\.64x\d+x16\.F32\.(BF16|F16)", sass)
    assert bool(re.search(r"\bLDGSTS\b", sass)) == ldgsts
    assert bool(re.search(r"\bARRIVES\.LDGSTSBAR", sass)) == ldgsts
    if "tma" not in ck.params.fill:
        assert "UTMALDG" not in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory (spills)"
    use = ck.resource_usage()
    assert use["LOCAL"] == 0 and use["STACK"] == 0


# ------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, kind, a_off, b_off",
    [
        ((2047, 2047, 2047), "matmul", 0, 0),
        ((4097, 4096, 4095), "matmul", 0, 0),
        ((4096, 50257, 768), "matmul", 0, 0),
        ((4096, 4096, 4096), "matmul", 1, 0),
        ((1000, 4098, 4100), "linear", 2, 4),
    ],
)
def test_gpu_issue_shapes(shape, kind, a_off, b_off):
    fd = mm_fusion(kind)
    a, b = operands(*shape, kind, BF, a_off, b_off, device="cuda")
    (out,) = fd.execute([a, b])
    assert fd.last_params().simt is None
    gpu_check(out, a.double() @ (b.double().T if kind == "linear" else b.double()))


@pytest.mark.gpu
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 700),
    n=st.integers(1, 700),
    k=st.integers(1, 700),
    a_off=st.integers(0, 8),
    b_off=st.integers(0, 8),
    kind=st.sampled_from(["matmul", "linear"]),
    dtype=st.sampled_from([BF, H]),
    pingpong=st.booleans(),
)
def test_gpu_hypothesis_odd_shapes_and_offsets(m, n, k, a_off, b_off, kind, dtype, pingpong):
    fd = mm_fusion(kind, TD[dtype])
    if pingpong:
        fd.fusion.schedule(pingpong=True)
    a, b = operands(m, n, k, kind, dtype, a_off, b_off, device="cuda")
    (out,) = fd.execute([a, b])  # outputs NaN-poisoned before the launch (conftest)
    assert out.dtype == dtype and fd.last_params().simt is None
    gpu_check(out, a.double() @ (b.double().T if kind == "linear" else b.double()))


@pytest.mark.gpu
@pytest.mark.parametrize("fill", ["tma", "cp.async"])
def test_gpu_forced_fill_matches(fill):
    fd = mm_fusion("linear", bias=True, epilogue="gelu")
    fd.fusion.schedule(fill=fill)
    a, w = operands(1000, 1032, 520, "linear", BF, device="cuda")
    bias = torch.randn(1032, device="cuda", dtype=BF)
    (out,) = fd.execute([a, w, bias])
    assert fd.last_params().fill == (fill, fill)
    gpu_check(out, torch.nn.functional.gelu(a.double() @ w.double().T + bias.double()))
