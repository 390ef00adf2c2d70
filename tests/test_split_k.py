"""Small-M tiles and split-K (issue 18 section 2), on the CPU: the heuristic's
choices for the decode shapes, the overrides' errors, and the kernels run by
the interpreter at small shapes (M = 1, primes, splits that do not divide the
k steps, an M-major A) against float64 torch with NaN-poisoned outputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.scheduler.waves import small_m_bn
from circbuf.target import H100, H200
from tests.test_gpu_matmul import mm_fusion
from tests.util import D

BF = torch.bfloat16


def _fd(kind, bias=False, epilogue=None, **ov):
    fd = mm_fusion(kind, D.BFloat16, bias=bias, epilogue=epilogue)
    if ov:
        fd.fusion.schedule(**ov)
    return fd


def _inputs(kind, m, n, k, bias=False, a_major="K", seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, dtype=BF, generator=g)
    if a_major == "M":  # an M-major A: the transpose of a [K, M] tensor
        a = a.t().contiguous().t()
    b = torch.randn((n, k) if kind == "linear" else (k, n), dtype=BF, generator=g)
    return [a, b] + ([torch.randn(n, dtype=BF, generator=g)] if bias else [])


def _ref(kind, ins, epilogue=None):
    a, b = ins[0].double(), ins[1].double()
    y = a @ (b.T if kind == "linear" else b)
    if len(ins) > 2:
        y = y + ins[2].double()
    if epilogue == "gelu":
        y = torch.nn.functional.gelu(y)
    return y


def _check(out, ref):
    assert torch.isfinite(out).all(), "an unwritten (NaN-poisoned) element"
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


def _splits(ck) -> int:
    """K's splits in a compile: the GEMM kernel's own (summed in the kernel) or
    the reduction plan's (partials, then a reduction kernel); 1: none."""
    if hasattr(ck, "split_k"):
        return ck.split_k.splits
    return ck.params.split_k


def _compiled(kind, m, n, k, target=H100, **ov):
    fd = _fd(kind, **ov)
    a = torch.empty(m, k, dtype=BF)
    b = torch.empty((n, k) if kind == "linear" else (k, n), dtype=BF)
    return fd.compile([a, b], target=target)


# ------------------------------------------------------------ heuristics
def test_small_m_bn_fills_the_sms():
    assert small_m_bn(1, 4096, 1, 132) == 64  # 64 tiles: one wave of the narrowest
    assert small_m_bn(1, 14336, 1, 132) == 128  # 112 tiles = two waves of 224: the wider
    assert small_m_bn(1, 128256, 1, 132) == 256  # 501 tiles of 256, 4 waves
    assert small_m_bn(64, 100, 1, 132) == 64


@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize(
    "n, k, bn", [(4096, 4096, 64), (4096, 14336, 64), (14336, 4096, 128), (128256, 4096, 256)]
)
def test_decode_shapes_take_small_tiles(m, n, k, bn):
    """On an H100 (3.0 TB/s) the model splits N = 4096 in two, summed in the
    kernel: 64 CTAs of 64x64 keep 96 KB of B in flight each, 30 GB/s at a 3.2 us
    loaded latency (measured at M = 1: 27.7 us unsplit, 23.7 split; M = 64:
    23.2 / 23.6); wider N fills the SMs unsplit. The reduction-kernel variant
    splits only K = 14336 (its launch eats the gain at K = 4096)."""
    ck = _compiled("linear", m, n, k)
    p = ck.params
    assert p.tile[:2] == (64, bn) and p.pingpong and p.stages >= 4, p
    assert p.grid == min(-(-n // bn), 132), p  # not 16 CTAs of 128x256
    assert _splits(ck) == (2 if n == 4096 else 1), ck
    red = _compiled("linear", m, n, k, split_k_sum="reduction")
    assert _splits(red) == (2 if (n, k) == (4096, 14336) else 1), red


@pytest.mark.parametrize("m", [1, 16, 64])
def test_decode_splits_on_an_h200(m):
    """4.2 TB/s over 64 CTAs is 66 GB/s each, more than a ring keeps in flight:
    N = 4096 splits in four at K = 14336 (32 tiles of 64x128 x 4 chunks: 128 CTAs;
    H200: 45.6 us against 48.2 split in two) and in two at K = 4096; N = 14336
    (112 CTAs) does not."""
    ck = _compiled("linear", m, 4096, 14336, target=H200)
    # one kernel: 32 tiles x 4 chunks, the last CTA of each tile sums them
    assert ck.params.split_k == 4 and ck.params.tile[:2] == (64, 128) and ck.params.grid == 32, ck
    ck = _compiled("linear", m, 4096, 14336, target=H200, split_k_sum="reduction")
    assert len(ck.kernels) == 2 and "reduction" in ck.kernels[1].name, ck
    assert ck.kernels[0].params.tile[:2] == (64, 128) and ck.kernels[0].params.grid == 128
    assert _splits(_compiled("linear", m, 4096, 4096, target=H200)) == 2
    assert _splits(_compiled("linear", m, 14336, 4096, target=H200)) == 1


def test_large_m_keeps_the_cooperative_tile():
    ck = _compiled("matmul", 4096, 4096, 4096)
    assert ck.params.tile == (128, 256, 64) and not ck.params.pingpong
    assert _splits(ck) == 1


def test_few_large_tiles_split_k():
    """M = N = 256 with K = 65536: two tiles on 132 SMs; split-K spreads K."""
    ck = _compiled("matmul", 256, 256, 65536)
    assert _splits(ck) >= 8, ck
    assert ck.params.tile == (128, 256, 64) and ck.params.grid == 2


def test_split_follows_the_target():
    one = dataclasses.replace(H100, sm_count=1)
    assert _splits(_compiled("linear", 1, 4096, 14336, target=one)) == 1
    assert _splits(_compiled("linear", 1, 4096, 14336, target=H100)) == 2
    assert _splits(_compiled("linear", 1, 4096, 4096, target=H100)) == 2
    assert _splits(_compiled("linear", 1, 4096, 4096, target=H100, split_k_sum="reduction")) == 1
    assert _splits(_compiled("linear", 1, 4096, 4096, target=H200)) == 2
    # one small tile: the fix-up costs more (H200: 11.5 us unsplit, 14.5 split 2)
    assert _splits(_compiled("matmul", 128, 256, 512)) == 1


def test_split_k_one_and_explicit_tile_overrides():
    ck = _compiled("linear", 1, 4096, 4096, split_k=1)
    assert _splits(ck) == 1 and ck.params.tile == (64, 64, 64)
    ck = _compiled("linear", 1, 4096, 4096, tile=(128, 128, 64), split_k=2)
    assert ck.params.tile == (128, 128, 64) and ck.params.split_k == 2
    ck = _compiled("linear", 8, 4096, 4096, split_k=4, stages=3)
    assert ck.params.split_k == 4 and ck.params.stages == 3
    ck = _compiled("linear", 1, 4096, 4096, tile=(128, 128, 64), split_k=2, split_k_sum="reduction")
    assert ck.kernels[0].params.tile == (128, 128, 64)  # the partial kernel takes the other overrides
    ck = _compiled("linear", 8, 4096, 4096, split_k=4, stages=3, split_k_sum="reduction")
    assert ck.split_k.splits == 4 and ck.kernels[0].params.stages == 3


@pytest.mark.parametrize(
    "ov, why",
    [
        (dict(persistent=False), "a non-persistent grid"),
        (dict(epilogue="role"), "an epilogue role"),
        (dict(cluster=(1, 2)), "a thread-block cluster"),
        (dict(fill="cp.async"), "a cp.async operand fill"),
    ],
)
def test_split_k_sum_in_the_kernel_names_what_rules_it_out(ov, why):
    def compiled(**more):
        fd = mm_fusion("linear", D.BFloat16)
        fd.fusion.schedule(split_k=2, **ov, **more)  # (_fd's epilogue is the fusion's, not this override)
        return fd.compile([torch.empty(8, 4096, dtype=BF), torch.empty(4096, 4096, dtype=BF)], target=H100)

    with pytest.raises(cb.CircbufError, match=rf"split_k_sum='kernel'.*cannot sum.*\({why}\)"):
        compiled(split_k_sum="kernel")
    ck = compiled()  # the reduction kernel sums them there
    assert ck.split_k.splits == 2 and not ck.split_k.in_kernel


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "k, split, message",
    [
        (104, 3, r"split_k=3.*K = 104 is 2 k steps of 64; split_k must be at most 2"),
        (64, 2, r"split_k=2.*K = 64 is 1 k step of 64; split_k must be at most 1"),
    ],
)
def test_split_larger_than_the_k_steps_is_refused(k, split, message):
    with pytest.raises(cb.CircbufError, match=message):
        _compiled("matmul", 4, 64, k, split_k=split)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "2"])
def test_split_k_value_is_checked(bad):
    fd = mm_fusion("matmul")
    with pytest.raises(cb.CircbufError, match="split_k"):
        fd.fusion.schedule(split_k=bad)
        a, b = torch.empty(4, 256, dtype=BF), torch.empty(256, 64, dtype=BF)
        fd.compile([a, b], arch="sm_90a")


def test_split_k_on_the_simt_path_is_refused():
    fd = mm_fusion("matmul", D.Float)
    fd.fusion.schedule(split_k=2)
    with pytest.raises(cb.CircbufError, match=r"split_k.*SIMT path"):
        fd.compile([torch.empty(4, 256), torch.empty(256, 64)], arch="sm_90a")


def test_split_k_on_batched_operands_is_refused_by_the_reduction_kernel():
    fd = mm_fusion("matmul", arank=3, brank=3)
    fd.fusion.schedule(split_k=2, split_k_sum="reduction")
    a, b = torch.empty(2, 4, 256, dtype=BF), torch.empty(2, 256, 64, dtype=BF)
    with pytest.raises(cb.CircbufError, match=r"split_k=2.*3-D.*reduction kernel takes 2-D operands"):
        fd.compile([a, b], arch="sm_90a")


@pytest.mark.parametrize(
    "kind, ashape, bshape, split",
    [
        ("matmul", (3, 5, 700), (3, 700, 72), 3),  # a batch of three, chunks of 4 k steps (11 in all)
        ("linear", (2, 1, 1000), (64, 1000), 4),  # [B, S, K] @ W.T, as a decode step's linear
    ],
)
def test_split_in_the_kernel_on_batched_operands(kind, ashape, bshape, split):
    """The batch runs in the tile index; the K split does not care: one kernel,
    checked by the protocol checker, against float64 torch."""
    fd = mm_fusion(kind, D.BFloat16, arank=len(ashape), brank=len(bshape))
    fd.fusion.schedule(split_k=split)
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(*ashape, dtype=BF, generator=g), torch.randn(*bshape, dtype=BF, generator=g)
    out = interpret(fd, [a, b], check=2)[0]
    assert fd._get_executor().last.params.split_k == split
    _check(out, a.double() @ (b.double().T if kind == "linear" else b.double()))


def test_a_decode_linear_of_rank_3_splits_like_rank_2():
    """x [1, 1, K] @ W.T (a decode step as torch writes it) splits as x [1, K]
    does: the heuristic counts the batch's tiles (H200: split 2 at 4096 x 4096)."""
    for shape in ([1, 1, 4096], [1, 4096]):
        fd = mm_fusion("linear", D.BFloat16, arank=len(shape))
        ck = fd.compile([torch.empty(*shape, dtype=BF), torch.empty(4096, 4096, dtype=BF)], target=H200)
        assert ck.params.split_k == 2, (shape, ck.params)


# ------------------------------------------------------- the interpreter
CASES = [
    # kind, m, n, k, split_k, bias, epilogue, a_major (in the kernel: chunks of ceil(steps / S)
    # k steps, the last ones zero-filled past K; the reduction kernel: as said per case)
    ("linear", 1, 136, 200, 3, True, "gelu", "K"),  # 4 steps: chunks 64, 64 + a tail of 72; 2+2+0
    ("matmul", 5, 64, 256, 2, False, None, "K"),  # even chunks, no tail
    ("matmul", 17, 64, 1000, 5, False, "gelu", "K"),  # 16 steps over 5: 4 x 192 + 232; 4x4 + 0
    ("matmul", 8, 64, 384, 6, False, None, "M"),  # one step per split, an M-major A
    ("linear", 3, 72, 448, 7, True, None, "K"),  # N not a multiple of 64, one step each
    ("matmul", 200, 136, 700, 4, False, "gelu", "K"),  # cooperative 128x256 tiles, 11 steps: 3+3+3+2
]


@pytest.mark.parametrize("where", ["kernel", "reduction"])
@pytest.mark.parametrize("kind, m, n, k, split, bias, epilogue, a_major", CASES)
def test_split_k_matches_torch(kind, m, n, k, split, bias, epilogue, a_major, where):
    fd = _fd(kind, bias=bias, epilogue=epilogue, split_k=split, split_k_sum=where)
    ins = _inputs(kind, m, n, k, bias, a_major)
    out = interpret(fd, ins)[0]  # outputs NaN-poisoned, each element stored once
    ck = fd._get_executor().last
    assert _splits(ck) == split and (where == "kernel") == (not hasattr(ck, "split_k"))
    _check(out, _ref(kind, ins, epilogue))
    again = interpret(fd, ins)[0]
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))  # the same bits


def test_execute_under_circbuf_interpret_runs_the_split(monkeypatch):
    monkeypatch.setenv("CIRCBUF_INTERPRET", "1")
    fd = _fd("linear", split_k=2)
    ins = _inputs("linear", 2, 64, 512)
    out = fd.execute(ins)[0]
    _check(out, _ref("linear", ins))
    assert fd.last_params().split_k == 2  # one kernel
    fd = _fd("linear", split_k=2, split_k_sum="reduction")
    _check(fd.execute(ins)[0], _ref("linear", ins))
    assert len(fd.last_params()) == 2  # the partials' kernel, then the reduction's


def test_small_m_tile_runs_a_deep_ring():
    """M = 2 without a split: a [64 x 64] ping-pong tile, 25 k steps through the
    12-slot ring (it wraps twice)."""
    fd = _fd("linear", split_k=1)
    ins = _inputs("linear", 2, 64, 1600)
    out = interpret(fd, ins)[0]
    p = fd._get_executor().last.params
    assert p.tile == (64, 64, 64) and p.stages == 12 and p.pingpong
    _check(out, _ref("linear", ins))


def test_heuristic_split_runs_in_the_interpreter():
    """No override: M = 1 with K = 2048 (32 steps) on 132 SMs splits 7 ways in
    the kernel (chunks of 5 steps, the last of 2: within 2% of 8 in the model,
    and the fewer wins); the reduction kernel's split, whole steps only, 8 ways
    (K = 1600 no longer does: ~7 us of streaming beside a kernel's fixed ~10 us)."""
    fd = _fd("linear", bias=True)
    ins = _inputs("linear", 1, 64, 2048, bias=True)
    out = interpret(fd, ins)[0]
    assert _splits(fd._get_executor().last) == 7
    _check(out, _ref("linear", ins))
    fd = _fd("linear", bias=True, split_k_sum="reduction")
    out = interpret(fd, ins)[0]
    assert _splits(fd._get_executor().last) == 8
    _check(out, _ref("linear", ins))


def test_split_k_kernels_pass_the_protocol_checker_on_two_sms():
    """Six partial tiles over 2 CTAs (each warpgroup several tiles, the ring
    wrapping across tiles), every kernel checked under 2 random schedules."""
    two = dataclasses.replace(H100, sm_count=2)
    fd = _fd("linear", bias=True, split_k=2, split_k_sum="reduction")
    ins = _inputs("linear", 3, 192, 512, bias=True)
    out = interpret(fd, ins, check=2, target=two)[0]
    ck = fd._get_executor().last
    assert ck.split_k.splits == 2 and ck.kernels[0].params.grid == 2
    _check(out, _ref("linear", ins))


@pytest.mark.parametrize("pingpong", [True, False])
def test_split_in_the_kernel_passes_the_protocol_checker(pingpong):
    """Three tiles over a 4-SM target split 3 ways (grid 1 x 3: one CTA walks
    every tile of its chunk; ping-pong warpgroups alternate them), every chunk
    of the tiles checked under 3 random schedules; the sum is the last CTA's."""
    four = dataclasses.replace(H100, sm_count=4)
    fd = _fd(
        "linear",
        bias=True,
        split_k=3,
        pingpong=pingpong,
        tile=(128, 64, 64) if not pingpong else (64, 64, 64),
    )
    ins = _inputs("linear", 70 if pingpong else 130, 192 if pingpong else 64, 640, bias=True)
    out = interpret(fd, ins, check=3, target=four)[0]
    p = fd._get_executor().last.params
    assert p.split_k == 3 and p.grid == 1 and p.pingpong == pingpong
    _check(out, _ref("linear", ins))


def test_split_in_the_kernel_same_bits_in_any_cta_order():
    """Whichever CTA of a tile counts last sums the chunks in chunk order: the
    launch's CTAs run forwards, backwards and shuffled give the same bits."""
    import random

    from circbuf.interpret import launch_args
    from circbuf.interpret.machine import Launch

    fd = _fd("matmul", epilogue="gelu", split_k=4)
    ins = _inputs("matmul", 70, 136, 900)
    k, tensors, scal, grid, block = launch_args(fd, ins)
    assert grid[1] == 4 and k.split_k["chunks"] == 4
    outs = []
    for order in ("forward", "backward", "shuffled"):
        ts = [t.clone() for t in tensors]
        launch = Launch(k, ts, scal, grid, block)
        ctas = launch.ctas()
        if order == "backward":
            ctas = ctas[::-1]
        elif order == "shuffled":
            random.Random(7).shuffle(ctas)
        launch.run(ctas=ctas)
        outs.append(ts[-1])
    _check(outs[0], _ref("matmul", ins, "gelu"))
    assert all(torch.equal(outs[0].view(torch.int16), o.view(torch.int16)) for o in outs[1:])


@pytest.mark.parametrize("k, split", [(1000, 2), (1000, 3), (512, 2)])
def test_split_k_plan_first_and_later_calls(monkeypatch, k, split):
    """The launch plan execute() builds (SplitKPlan): the first call's general
    path, then later calls through its recorded views (one chunk before a
    tail, several, no tail), on operands at another storage offset; its
    steps' plans are the interpreter's here (CIRCBUF_INTERPRET=1)."""
    from circbuf.split_k import SplitKPlan

    monkeypatch.setenv("CIRCBUF_INTERPRET", "1")
    fd = _fd("linear", bias=True, split_k=split, split_k_sum="reduction")
    ins = _inputs("linear", 3, 64, k, bias=True)
    ex = fd._get_executor()
    info, _ = ex._bind(ins, need_cuda=False)
    sk = ex._split_k(info)
    assert sk.splits == split and bool(sk.tail) == (k == 1000)
    plan = SplitKPlan(ex._split_runner(), sk, [])
    _check(plan.run(ins)[0], _ref("linear", ins))
    big = torch.randn(11, k, dtype=BF)
    moved = [big[8:], ins[1], ins[2]]  # the same signature, 8 rows into another buffer
    _check(plan.run(moved)[0], _ref("linear", moved))
    assert len(fd.last_params()) == 2 + bool(sk.tail)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 300),
    n8=st.integers(1, 300),
    k8=st.integers(1, 600),
    split=st.integers(1, 12),
    kind=st.sampled_from(["matmul", "linear"]),
    a_t=st.booleans(),
    b_t=st.booleans(),
    where=st.sampled_from(["kernel", "reduction"]),
)
def test_hypothesis_split_k_compiles(m, n8, k8, split, kind, a_t, b_t, where):
    """Every split of every layout compiles to tensor-core kernels (or, for a
    split past the k steps, is refused by name); summed in the kernel, one
    kernel with no stack frame (nothing spilled)."""
    from circbuf.runtime.cubin import frame_bytes

    n, k = 8 * n8, 8 * k8
    fd = _fd(kind, split_k=split, split_k_sum=where)
    a = torch.empty(k, m, dtype=BF).t() if a_t and m % 8 == 0 else torch.empty(m, k, dtype=BF)
    shape = (n, k) if kind == "linear" else (k, n)
    b = torch.empty(shape[::-1], dtype=BF).t() if b_t else torch.empty(shape, dtype=BF)
    steps = -(-k // 64)
    if split > steps:
        with pytest.raises(cb.CircbufError, match=f"split_k must be at most {steps}"):
            fd.compile([a, b], arch="sm_90a")
        return
    ck = fd.compile([a, b], arch="sm_90a")
    if split == 1:
        assert ck.params.simt is None
        return
    if where == "kernel":
        assert ck.params.split_k == split and ck.params.simt is None
        assert frame_bytes(ck.cubin) == 0, ck.params
        return
    assert ck.split_k.splits == split
    mms = [q for q in ck.kernels if q.name == "circbuf_matmul"]
    assert len(mms) == len(ck.kernels) - 1 and all(q.params.simt is None for q in mms)


def test_split_k_epilogue_with_a_scalar_and_a_residual():
    """The reduction fusion keeps the epilogue's other inputs (a fusion scalar,
    a residual tile) and, as the MMA path, runs its math on the fp32 sum."""
    a, b = torch.randn(2, 256, dtype=BF), torch.randn(256, 64, dtype=BF)
    fd = mm_fusion("matmul", D.BFloat16, epilogue="scale")
    fd.fusion.schedule(split_k=3, split_k_sum="reduction")
    out = interpret(fd, [a, b, 0.5])[0]
    assert fd._get_executor().last.split_k.tail == 128
    _check(out, 0.5 * (a.double() @ b.double()))
    r = torch.randn(2, 64, dtype=BF)
    for where in ("reduction", "kernel"):
        fd = mm_fusion("matmul", D.BFloat16, epilogue="residual")
        fd.fusion.schedule(split_k=2, split_k_sum=where)
        out = interpret(fd, [a, b, r])[0]
        want = a.double() @ b.double() + r.double()
        _check(out, want)
        assert (out.double() - want).abs().max() <= want.abs().max() * 2**-8  # one bf16 rounding, not two


@pytest.mark.parametrize("pingpong", [True, False])
def test_split_k_pass_sums_after_the_k_loop_and_guards_the_epilogue(pingpong):
    """The split_k lowering pass: after the k loop's last wgmma wait, the sum
    over the tile's chunks, then the epilogue under ``split_last``; the kernel
    takes the workspace (partials and flags) after its tensor maps. A kernel
    whose K is not split is left as it was."""
    fd = _fd("linear", bias=True, epilogue="gelu", split_k=4, pingpong=pingpong)
    ck = fd.compile(_inputs("linear", 200, 256, 1024, bias=True), arch="sm_90a")
    k = ck.kernel
    text = str(k)
    assert text.count("SPLIT_K_SUM") == 1 and "IF split_last" in text, text
    before, after = text.split("SPLIT_K_SUM")
    assert "WGMMA_WAIT_GROUP 0" in before and "TMA_STORE" not in before
    assert "TMA_STORE" in after.split("IF split_last", 1)[1]
    bm, bn = ck.params.tile[:2]
    threads = 128 if pingpong else 256
    assert k.split_k["chunks"] == 4
    assert f"cb::split_k_sum<{bm * bn // threads}, {threads}>(&acc[0], cb_partials + " in ck.cuda
    assert "float* __restrict__ cb_partials" in ck.cuda and "int* __restrict__ cb_tile_flags" in ck.cuda
    from circbuf.ir import evaluate

    env = {"i0": 200, "i1": 1024, "i2": 256}
    tiles = -(-200 // bm) * -(-256 // bn)
    assert evaluate(k.split_k["flags"], env) == tiles
    assert evaluate(k.split_k["partials"], env) == tiles * 4 * bm * bn
    plain = _fd("linear", bias=True, epilogue="gelu", split_k=1, pingpong=pingpong)
    pk = plain.compile(_inputs("linear", 200, 256, 1024, bias=True), arch="sm_90a")
    assert pk.kernel.split_k is None and "SPLIT_K_SUM" not in str(pk.kernel) and "cb_partials" not in pk.cuda


@pytest.mark.parametrize("pingpong", [True, False])
def test_split_in_the_kernel_with_the_row_store(pingpong):
    """An odd N stores 16-bit rows from the staging tile (store='rows'): the
    epilogue under ``split_last`` keeps its shared-memory syncs (the sync pass
    looks inside a branch every thread of the group takes alike; without them
    the checker saw a race and 31 of 63 outputs stayed NaN). M = 1, N = 63,
    K = 2048: the heuristic's own split (7)."""
    fd = _fd("linear", bias=True, **({} if pingpong else dict(pingpong=False, tile=(128, 64, 64), split_k=4)))
    ins = _inputs("linear", 1 if pingpong else 130, 63, 2048, bias=True)
    out = interpret(fd, ins, check=2)[0]
    p = fd._get_executor().last.params
    assert p.store == "rows" and p.split_k == (7 if pingpong else 4) and p.pingpong == pingpong, p
    assert "RAW on" in fd._get_executor().last.cuda
    _check(out, _ref("linear", ins))


def test_every_small_and_vector_matmul_compiles():
    """The split-K decision on 1-D operands and every dtype (a GPU run found
    the in-kernel check reading a vector's strides as a matrix's): the trust
    suite's small and vector matmuls all compile for sm_90a."""
    import tests.test_trust_frontend as T

    for dtype in T.MM_DTYPES:
        for op, cases in [("matmul", T.MM_SHAPES), ("linear", T.LINEAR_SHAPES)]:
            for shapes in cases:
                xs = T._mm_inputs(shapes, dtype, "cpu")
                for fixed in (False, True):
                    T._mm_fusion(op, shapes, dtype, fixed).compile(xs, arch="sm_90a")
