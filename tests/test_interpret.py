"""The kernel interpreter and the pipeline protocol checker (circbuf.interpret), on the CPU.

Every scheduler's kernels at small shapes: the interpreter's results match
float64 torch (each output element stored exactly once) and the checker
passes them. Then real kernels are mutated the way pipelines break (an
arrive dropped, a parity flipped, a stage released early, a ping-pong turn
handed over before the MMAs, a TMA store buffer rewritten without its
wait_group.read, ...) and the checker must name each bug.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import circbuf as cb
from circbuf.interpret import check, check_kernel, interpret, launch_args, run_kernel, stored_once
from circbuf.ir import Bin, Const, MemoryType, Var
from circbuf.lowering import kir
from circbuf.target import H100
from tests.test_gpu_matmul import mm_fusion
from tests.util import (
    OUTER_TORCH,
    D,
    axpy_fusion,
    manual_ring_exp,
    manual_ws_exp,
    norm_fusion,
    norm_inputs,
    norm_reference,
    outer_fusion,
)

BF, H = torch.bfloat16, torch.float16
TD = {BF: D.BFloat16, H: D.Half, torch.float32: D.Float}
# a GPU of one SM: a persistent kernel's one CTA runs every tile (several
# tiles and ring wraps at small shapes)
ONE_SM = dataclasses.replace(H100, sm_count=1)
TWO_SM = dataclasses.replace(H100, sm_count=2)
ONE_CTA = dataclasses.replace(H100, sm_count=1, max_threads_per_sm=256)  # one 256-thread CTA at a time


def _pw(rank, shape, dtype=BF, **ov):
    fd = axpy_fusion(TD[dtype], rank)
    if ov:
        fd.fusion.schedule(**ov)
    a, b = torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)
    return fd, [a, b], lambda: a.double() * b.double() + 1


def _norm(kind, rows, cols, dtype=BF, **ov):
    fd = norm_fusion(kind, TD[dtype])
    if ov:
        fd.fusion.schedule(**ov)
    ins = norm_inputs(kind, rows, cols, dtype, "cpu")
    return fd, ins, lambda: norm_reference(kind, ins)


def _outer(op, shape, axes, weight=False, **ov):
    fd = outer_fusion(op, D.Half, len(shape), axes, weight)
    if ov:
        fd.fusion.schedule(**ov)
    ins = [torch.randn(*shape, dtype=H)]
    if weight:
        ins.append(torch.randn(*shape[len(axes) :], dtype=H))

    def ref():
        x = ins[0].double()
        if weight:
            x = x * ins[1].double()
        return OUTER_TORCH[op](x, list(axes))

    return fd, ins, ref


def _mm(kind, m, n, k, dtype=BF, bias=False, epilogue=None, **ov):
    fd = mm_fusion(kind, TD[dtype], bias=bias, epilogue=epilogue)
    if ov:
        fd.fusion.schedule(**ov)
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn((n, k) if kind == "linear" else (k, n), dtype=dtype)
    ins = [a, b] + ([torch.randn(n, dtype=dtype)] if bias else [])

    def ref():
        y = a.double() @ (b.double().T if kind == "linear" else b.double())
        if bias:
            y = y + ins[2].double()
        if epilogue == "gelu":
            y = torch.nn.functional.gelu(y)
        return y

    return fd, ins, ref


def _manual(ring, rows=5, cols=296):
    x = torch.randn(rows, cols, dtype=BF)
    fd = manual_ws_exp(128, 3) if ring == "ws" else manual_ring_exp(128, 3)
    return fd, [x], lambda: x.double().exp()


def _segmented():
    """layer_norm(linear(x, w)): a matmul segment, then a normalization one."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        g = fd.define_tensor([-1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.layer_norm(fd.ops.linear(x, w), g, b, 1e-5), D.BFloat16))
    ins = [torch.randn(64, 64, dtype=BF), torch.randn(128, 64, dtype=BF)]
    ins += [torch.randn(128, dtype=BF), torch.randn(128, dtype=BF)]

    def ref():
        y = (ins[0].double() @ ins[1].double().T).to(BF).double()  # the segments hand bf16 over
        return torch.nn.functional.layer_norm(y, (128,), ins[2].double(), ins[3].double(), 1e-5)

    return fd, ins, ref


def _mm_role():
    """linear + bias + gelu through the epilogue role (its hand-off ring); ``_mm``'s
    ``epilogue`` names the activation, so the override goes to schedule() here."""
    fd, ins, ref = _mm("linear", 130, 264, 72, bias=True, epilogue="gelu")
    fd.fusion.schedule(epilogue="role")
    return fd, ins, ref


def _mm_residual():
    """linear + a residual the producer loads by TMA (a second ring)."""
    from tests.test_gpu_matmul import epilogue_input

    fd, ins, ref = epilogue_input("residual", 130, 136, 72)
    return fd, ins, lambda: ref


CASES = {
    "pointwise": lambda: _pw(2, (33, 200)),
    "pointwise_tma": lambda: _pw(2, (40, 512), stages=3),
    "pointwise_tma_store": lambda: _pw(2, (40, 512), stages=3, tma_store=True),
    "pointwise_tma_ws": lambda: _pw(3, (3, 7, 512), H, stages=4, warp_specialized=True),
    "manual_pipelined_ring": lambda: _manual("pipelined", rows=6),
    "manual_ws_setmaxnreg": lambda: _manual("ws"),
    "norm_softmax_tma": lambda: _norm("softmax", 6, 512, staging="tma"),
    "norm_softmax_registers": lambda: _norm("softmax", 6, 512, staging="registers"),
    "norm_layer_norm_plain": lambda: _norm("layer_norm", 5, 200, tma=False),
    "norm_layer_norm_ws": lambda: _norm("layer_norm", 6, 512, warp_specialized=True, stages=3),
    "norm_rms_tma_mbarrier": lambda: _norm("rms_norm", 9, 256, stages=4, war="mbarrier"),
    "outer_max_pipelined": lambda: _outer("max", (20, 3, 64), (0,), stages=3, warp_specialized=False),
    "outer_sum_weight_ws": lambda: _outer("sum", (99, 136), (0,), True, stages=3, warp_specialized=True),
    "outer_sum_plain": lambda: _outer("sum", (20, 3, 64), (0,), tma=False),
    "matmul_simt": lambda: _mm("matmul", 17, 20, 30, torch.float32),  # fp32 operands: the SIMT path
    "matmul_cooperative": lambda: _mm("matmul", 128, 256, 128),
    # both operands' rows 2-byte aligned: the cp.async fill, asked for (opt-in)
    "matmul_cp_async_odd_k": lambda: _mm("matmul", 100, 130, 127, fill="cp.async"),
    "matmul_pingpong_bias_gelu": lambda: _mm(
        "linear", 100, 136, 72, bias=True, epilogue="gelu", pingpong=True
    ),
    "matmul_epilogue_role": _mm_role,
    "matmul_residual_by_tma": _mm_residual,
    "segmented_linear_layer_norm": _segmented,
}


def _kind(p) -> str:
    """The kernel a scheduler's params describe, as :data:`KINDS` names them."""
    name = type(p).__name__
    if p is None:
        return "manual"  # scheduled by hand
    if name == "MatmulParams":
        if p.simt is not None:
            return "matmul simt"
        kind = "matmul ping-pong" if p.pingpong else "matmul cooperative"
        if p.epilogue == "role":
            kind += " epilogue role"
        if any(p.tma_inputs):
            kind += " inputs by tma"
        if "cp.async" in p.fill:
            kind += " cp.async"
        return kind
    if name == "NormalizationParams":
        return f"normalization {p.staging}" + (" warp-specialized" if p.warp_specialized else "")
    if name in ("PointwiseTmaParams", "OuterReductionParams"):
        base = "pointwise tma" if name == "PointwiseTmaParams" else "outer reduction"
        return (
            base
            + (" warp-specialized" if p.warp_specialized else "")
            + (" tma store" if getattr(p, "tma_store", False) else "")
        )
    return {"PointwiseParams": "pointwise", "ReductionParams": "reduction"}[name]


# every kernel kind the schedulers emit; each must have a case above (a new
# scheduler or variant without one fails test_every_scheduler_has_a_case)
KINDS = {
    "pointwise", "pointwise tma", "pointwise tma tma store", "pointwise tma warp-specialized",
    "normalization registers", "normalization tma", "normalization tma warp-specialized", "reduction",
    "outer reduction", "outer reduction warp-specialized", "matmul simt", "matmul cooperative",
    "matmul ping-pong", "matmul cooperative epilogue role", "matmul cooperative inputs by tma",
    "matmul cooperative cp.async", "segmented",
}  # fmt: skip


def _kinds_of(fd, ins):
    """The kernel kinds and the schedulers (by name) of the fusion's kernels."""
    ck = fd.compile(fd._flat_inputs(ins), arch="sm_90a")
    got = fd.last_params()
    kinds = {"segmented"} | {_kind(p) for p in got} if isinstance(got, list) else {_kind(got)}
    return kinds, {k.name.removeprefix("circbuf_") for k in ck.kernels}


def test_every_scheduler_has_a_case():
    """The cases above run every scheduler and variant the registry has
    (pointwise and its TMA ring, normalization in both stagings, the plain
    and outer reductions, matmul cooperative, ping-pong and SIMT, segmented
    plans): each case compiles to the kernel its name says."""
    from circbuf.scheduler.registry import SCHEDULERS

    seen: dict = {}
    ran = set()
    for name, make in CASES.items():
        fd, ins, _ = make()
        kinds, scheds = _kinds_of(fd, ins)
        ran |= scheds
        for k in kinds:
            seen.setdefault(k, []).append(name)
    assert KINDS <= set(seen), f"no case runs {sorted(KINDS - set(seen))} ({seen})"
    names = {s.name for s, _ in SCHEDULERS}
    assert names <= ran, f"schedulers without a case: {sorted(names - ran)}"


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_torch_and_pass_the_checker(name):
    fd, ins, ref = CASES[name]()
    out = interpret(fd, ins)[0]  # every output element stored exactly once, too
    want = ref()
    tol = 2e-2 if out.dtype in (BF, H) else 1e-5
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    check(fd, ins, schedules=2)


def test_matmul_through_the_interpreter_on_one_sm():
    """[128, 256, 128] ping-pong on a one-SM GPU: one CTA, both warpgroups
    taking turns over two tiles, the ring wrapping; then checked."""
    fd, ins, ref = _mm("matmul", 128, 256, 128, pingpong=True)
    out = interpret(fd, ins, target=ONE_SM)[0]
    torch.testing.assert_close(out.double(), ref(), rtol=2e-2, atol=2e-2)
    check(fd, ins, schedules=2, target=ONE_SM)


def _output_stores(k):
    found = []
    kir.walk(
        k.body,
        lambda n, _s: (
            found.append(n)
            if isinstance(n, kir.Assign) and n.lhs.tv.memory_type == MemoryType.Global
            else None
        ),
    )
    return found


def test_stores_are_counted_per_element():
    """The interpreter counts the stores to each output element: the kernel
    as built writes each once; one written twice, a CTA left out of the
    grid, or a grid-stride loop that ignores its start and step (every CTA
    runs every row block: the stores are idempotent, the values right) are
    errors naming the output."""
    fd, ins, ref = _pw(2, (33, 200))
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    launch = run_kernel(k, tensors, scalars, grid, block)
    out = k.tensor_params[-1].tv.name
    assert grid[0] > 1 and set(launch.glob.counts[out]) == {1}
    assert len(launch.glob.counts[out]) == 33 * 200
    torch.testing.assert_close(tensors[-1].double(), ref(), rtol=2e-2, atol=2e-2)

    def counts(k, tensors, grid):
        launch = run_kernel(k, tensors, scalars, grid, block)
        return torch.tensor(launch.glob.counts[k.tensor_params[-1].tv.name])

    store = _output_stores(k)[0]
    kir.insert_after(k.body, store, [store])
    with pytest.raises(cb.CircbufError, match=r"output T\d+: 6600 addresses .* exactly once.* stored \[2, 2"):
        stored_once(k.name, out, tensors[-1], counts(k, tensors, grid))
    fd, ins, _ = _pw(2, (33, 200))  # a fresh kernel (launch_args hands out the compiled one)
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    with pytest.raises(cb.CircbufError, match=r"not stored exactly once .* stored \[0, 0, 0, 0\] times"):
        stored_once(k.name, out, tensors[-1], counts(k, tensors, (grid[0] - 1, 1, 1)))

    fd, ins, ref = _norm("rms_norm", 9, 256, staging="registers")
    k, tensors, scalars, grid, block = launch_args(fd, ins, target=TWO_SM)
    loop = _find(k, lambda n: isinstance(n, kir.ForLoop) and n.strided)
    assert grid[0] == 2 and str(loop.start) == "blockIdx.x" and str(loop.step) == "2", loop
    loop.start, loop.step = Const(0), Const(1)
    c = counts(k, tensors, grid)
    torch.testing.assert_close(tensors[-1].double(), ref(), rtol=2e-2, atol=2e-2)  # right values
    with pytest.raises(
        cb.CircbufError, match=r"2304 addresses of 2304 elements not stored exactly once .* stored \[2, 2"
    ):
        stored_once(k.name, "y", tensors[-1], c)


def test_circbuf_interpret_runs_execute_on_cpu_tensors(monkeypatch):
    fd, ins, ref = CASES["norm_layer_norm_ws"]()
    with pytest.raises(cb.CircbufError, match="execute needs CUDA tensors"):
        fd.execute(ins)
    monkeypatch.setenv("CIRCBUF_INTERPRET", "1")
    out = fd.execute(ins)[0]
    torch.testing.assert_close(out.double(), ref(), rtol=2e-2, atol=2e-2)


def test_circbuf_check_env_runs_the_checker(monkeypatch):
    fd, ins, _ = _manual("ws")
    monkeypatch.setenv("CIRCBUF_CHECK", "2")
    interpret(fd, ins)
    monkeypatch.setenv("CIRCBUF_CHECK", "yes")
    with pytest.raises(cb.CircbufError, match="CIRCBUF_CHECK"):
        interpret(fd, ins)


# ------------------------------------------------------------ mutations
def _find(k, pred, nth=0):
    found = []
    kir.walk(k.body, lambda n, _s: found.append(n) if pred(n) else None)
    return found[nth]


def _remove(k, node):
    kir.parent_list(k.body, node).remove(node)


def _arrive(k, suffix, nth=0):
    return _find(k, lambda n: isinstance(n, kir.MBarrierArrive) and n.bar.name.endswith(suffix), nth)


def _wait(k, suffix, nth=0):
    return _find(k, lambda n: isinstance(n, kir.MBarrierWait) and n.bar.name.endswith(suffix), nth)


def drop_release(k):
    _remove(k, _arrive(k, "_empty"))


def flip_full_parity(k):
    w = _wait(k, "_full")
    w.parity = Bin("^", w.parity, Const(1))


def flip_empty_parity(k):
    w = _wait(k, "_empty")
    w.parity = Bin("^", w.parity, Const(1))


def drop_full_wait(k):
    _remove(k, _wait(k, "_full"))


def half_the_releases(k):
    """The empty barriers count half the consumers: a release completes two phases."""
    for n in k.body:
        if isinstance(n, kir.IfThenElse):
            for init in n.then:
                if isinstance(init, kir.MBarrierInit) and init.bar.name.endswith("_empty"):
                    init.arrivals = Const(128)


def release_before_read(k):
    a = _arrive(k, "_empty")
    _remove(k, a)
    kir.insert_after(k.body, _wait(k, "_full"), [a])


def drop_expect_tx(k):
    _remove(k, _find(k, lambda n: isinstance(n, kir.MBarrierArriveExpectTx)))


def restart_ring_each_row(k):
    """The nested-ring bug: the ring's stage and phase start over in each
    iteration of the enclosing loop (the barriers do not)."""
    inits = [n for n in k.body if isinstance(n, kir.RingInit)]
    outer = next(n for n in k.body if isinstance(n, kir.ForLoop))
    for n in inits:
        k.body.remove(n)
    outer.body[0:0] = inits


def release_current_stage(k):
    """The matmul releases the stage its wgmmas still read (one step early)."""
    a = _arrive(k, "_empty")
    a.bar = kir.MBarrierRef(a.bar.name, k.rings[0].use.stage)


def wait_group_too_loose(k):
    _find(k, lambda n: isinstance(n, kir.WgmmaWait) and n.pending == 1).pending = 2


def drop_last_wgmma_wait(k):
    """The epilogue reads the accumulators while the last wgmmas may still write them."""
    _remove(k, _find(k, lambda n: isinstance(n, kir.WgmmaWait) and n.pending == 0))


def turn_before_mmas(k):
    a, w = _arrive(k, "_mma_turn"), _wait(k, "_mma_turn")
    _remove(k, a)
    kir.insert_after(k.body, w, [a])


def drop_turn_arrive(k):
    _remove(k, _arrive(k, "_epi_turn"))


def drop_store_war_wait(k):
    w = _find(k, lambda n: isinstance(n, kir.BulkWaitGroup) and n.read)
    _remove(k, _find(k, lambda n: isinstance(n, kir.ElectOne) and w in n.then))


def drop_proxy_fence(k):
    _remove(k, _find(k, lambda n: isinstance(n, kir.Fence) and n.kind == "proxy_async"))


def split_named_barrier(k):
    """Half the block syncs 64 threads on named barrier 1, half 128."""
    s = _find(k, lambda n: isinstance(n, kir.BlockSync) and "WAR" in n.reason)
    lst = kir.parent_list(k.body, s)
    half = Var("threadIdx.y").lt(2)
    lst[lst.index(s)] = kir.IfThenElse(half, [kir.BlockSync("a", (1, 64))], [kir.BlockSync("b", (1, 128))])


def too_many_registers(k):
    _find(k, lambda n: isinstance(n, kir.SetMaxNReg) and n.increase).count = 256


def registers_one_pool_over(k):
    """48 + 2 x 232 fit an SM's 65536 but not the 64512 a 384-thread CTA is launched
    with: the hang of fuzz 784:30 on an H100."""
    _find(k, lambda n: isinstance(n, kir.SetMaxNReg) and not n.increase).count = 48


def release_before_wgmma_wait(k):
    """The matmul releases the previous stage one step early: before the
    wgmma.wait_group that retires the wgmmas reading it."""
    rel = _find(
        k,
        lambda n: (
            isinstance(n, kir.IfThenElse)
            and any(
                isinstance(x, kir.ElectOne) and any(isinstance(y, kir.MBarrierArrive) for y in x.then)
                for x in n.then
            )
        ),
    )
    _remove(k, rel)
    w = _find(k, lambda n: isinstance(n, kir.WgmmaWait) and n.pending == 1)
    lst = kir.parent_list(k.body, w)
    lst.insert(lst.index(w), rel)


def epi_turn_before_stores(k):
    """A ping-pong warpgroup hands the epilogue turn over as it takes it,
    before its stores."""
    a, w = _arrive(k, "_epi_turn"), _wait(k, "_epi_turn")
    _remove(k, a)
    kir.insert_after(k.body, w, [a])


WS = lambda: _manual("ws", rows=5)  # noqa: E731  (9 positions on a 3-stage ring)
PIPELINED = lambda: _manual("pipelined", rows=6)  # noqa: E731
COOP = lambda: _mm("matmul", 128, 512, 256)  # noqa: E731  (2 tiles x 4 k steps on a 4-stage ring)
PINGPONG = lambda: _mm("matmul", 128, 256, 256, pingpong=True)  # noqa: E731
TMA_STORE = lambda: _pw(2, (40, 512), stages=3, tma_store=True)  # noqa: E731
# each scheduler's warp-specialized ring with more positions per CTA than stages
# (on ONE_CTA: one SM that holds one CTA of 256 threads)
PW_WS = lambda: _pw(2, (48, 512), H, stages=2, warp_specialized=True)  # noqa: E731  (6 tiles)
OUTER_WS = lambda: _outer("sum", (300, 136), (0,), True, stages=2, warp_specialized=True)  # noqa: E731
NORM_MBAR = lambda: _norm("rms_norm", 48, 256, stages=2, war="mbarrier")  # noqa: E731
NESTED = lambda: _manual("pipelined", rows=4, cols=1000)  # noqa: E731  (the issue-7 shape)

MUTATIONS = [
    # (kernel, mutation, what the report must say)
    (
        WS,
        drop_release,
        r"deadlock.*role producer.*waits on x_empty\[0\] for parity 0.*256 of 256 arrivals pending",
    ),
    (
        WS,
        flip_full_parity,
        r"role consumers thread .* x_use position 0 \(stage 0, phase 0\) passed its wait on x_full\[0\] \(parity 1\).*wrong phase",
    ),
    (
        WS,
        flip_empty_parity,
        r"deadlock.*role producer: 1 thread .*x_load position 0.*waits on x_empty\[0\] for parity 0",
    ),
    (
        WS,
        drop_full_wait,
        r"race: role consumers thread .* reads stage 0 of x_stage .* before any copy into it completed",
    ),
    (
        WS,
        half_the_releases,
        r"deadlock.*waits on x_empty\[0\] for parity 0 \(the barrier is in phase 2 .* for the release of "
        r"position 0, which completes phase 1",
    ),
    (
        WS,
        release_before_read,
        r"race: the TMA copy into x_stage .*role producer.*overwrites stage \d of x_stage.*read by role consumers",
    ),
    (WS, drop_expect_tx, r"deadlock.*x_full\[0\].*-512 transaction bytes"),
    (PIPELINED, restart_ring_each_row, r"race: .*stage \d of x_stage \(ring x"),
    (COOP, release_current_stage, r"deadlock.*role producer.*waits on ab_empty\[0\]"),
    (
        COOP,
        wait_group_too_loose,
        r"race: the TMA copy into a_stage .*overwrites stage 0 of a_stage .*while the wgmmas of warpgroup 0",
    ),
    (
        COOP,
        drop_store_war_wait,
        r"race: role consumers thread .* overwrites out_stage\[\d+\], read by the TMA store of out_stage",
    ),
    (
        COOP,
        drop_last_wgmma_wait,
        r"role consumers thread .* reads accumulator acc while wgmmas still write it",
    ),
    (COOP, drop_proxy_fence, r"out_stage\[\d+\] is written by role consumers .* no fence.proxy.async"),
    (COOP, too_many_registers, r"the warp roles ask for 70656 registers .* launched with 64512"),
    (COOP, registers_one_pool_over, r"ask for 65536 registers .* launched with 64512 \(384 threads x 168\)"),
    (
        PINGPONG,
        turn_before_mmas,
        r"role consumers group 0 thread .* issues a wgmma into acc outside its turn .*acc_mma_turn\[0\]",
    ),
    (
        PINGPONG,
        drop_turn_arrive,
        r"deadlock.*role consumers group 1: 128 threads .* wait on acc_epi_turn\[1\]",
    ),
    (TMA_STORE, split_named_barrier, r"named barrier 1"),
    # the list on each scheduler's kernels: drop an arrive, flip a phase,
    # release a stage one step early, the ping-pong turns handed over early,
    # the nested-ring hang
    (PW_WS, drop_release, r"deadlock.*role producer: 1 thread .*waits on xy_empty\[0\] for parity 0"),
    (OUTER_WS, drop_release, r"deadlock.*role producer: 1 thread .*waits on x_empty\[0\] for parity 0"),
    (COOP, drop_release, r"deadlock.*role producer: 1 thread .*waits on ab_empty\[0\] for parity 0"),
    (PW_WS, flip_empty_parity, r"deadlock.*role producer: 1 thread .*waits on xy_empty\[0\] for parity 0"),
    (
        NORM_MBAR,
        flip_full_parity,
        r"the block thread .* passed its wait on x_full\[0\] \(parity 1\) after 0 completed phases.*wrong phase",
    ),
    (
        COOP,
        flip_full_parity,
        r"role consumers thread .* passed its wait on ab_full\[0\] \(parity 1\) after 0 completed phases.*wrong phase",
    ),
    (
        PINGPONG,
        flip_empty_parity,
        r"deadlock.*role producer: 1 thread .*waits on ab_empty\[0\] for parity 0",
    ),
    (
        PW_WS,
        release_before_read,
        r"race: the TMA copy into x_stage .*role producer.*overwrites stage 0 of x_stage \(ring xy.*read by role consumers",
    ),
    (
        OUTER_WS,
        release_before_read,
        r"race: the TMA copy into x_stage .*role producer.*overwrites stage 0 of x_stage \(ring x.*read by role consumers",
    ),
    (
        COOP,
        release_before_wgmma_wait,
        r"race: the TMA copy into a_stage .*overwrites stage 0 of a_stage .*read by the wgmmas of warpgroup \d \(role "
        r"consumers\), with nothing ordering that read before it",
    ),
    (
        PINGPONG,
        epi_turn_before_stores,
        r"role consumers group \d thread .* outside its epilogue turn \(acc_epi_turn\[\d\]\)",
    ),
    (  # the GPU hung on T4_full[0], now x_full[0]; the checker names the wait that passed on a stale phase first
        NESTED,
        restart_ring_each_row,
        r"the block thread .* x_use position 0 \(stage 0, phase 0\) passed its wait on x_full\[0\] \(parity 0\) "
        r"after 3 completed phases; it waits for the fill of position 0, phase 1: the barrier had already run past it",
    ),
]


def _mutation_id(make, mutate):
    names = {WS: "ws", PIPELINED: "pipelined", COOP: "coop", PINGPONG: "pingpong", TMA_STORE: "tma_store"}
    names.update({PW_WS: "pointwise_ws", OUTER_WS: "outer_ws", NORM_MBAR: "norm_mbarrier", NESTED: "nested"})
    return f"{names[make]}-{mutate.__name__}"


@pytest.mark.parametrize(
    "make, mutate, message", MUTATIONS, ids=[_mutation_id(m, f) for m, f, _ in MUTATIONS]
)
def test_checker_catches_injected_bug(make, mutate, message):
    fd, ins, _ = make()
    k, tensors, scalars, grid, block = launch_args(fd, ins, target=ONE_CTA if make is PW_WS else ONE_SM)
    check_kernel(
        k, [t.clone() for t in tensors], scalars, grid, block, schedules=1
    )  # the kernel as built passes
    mutate(k)
    with pytest.raises(cb.CircbufError, match=message):
        check_kernel(k, tensors, scalars, grid, block, schedules=2)


def test_wrong_swizzle_gives_a_wrong_result():
    """The interpreter applies the tensor map's swizzle and the wgmma
    descriptor's: a box copied unswizzled is read wrongly by the MMAs."""
    fd, ins, ref = _mm("matmul", 64, 256, 64)
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    run_kernel(k, tensors, scalars, grid, block)
    torch.testing.assert_close(tensors[-1].double(), ref(), rtol=2e-2, atol=2e-2)
    k, tensors, scalars, grid, block = launch_args(fd, ins)
    a_map = next(m for m in k.tensor_maps if m.param == 0)
    a_map.swizzle = 0
    run_kernel(k, tensors, scalars, grid, block)
    assert not torch.allclose(tensors[-1].double(), ref(), rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------ python -m circbuf.check, CIRCBUF_CHECK on a GPU run
_SCRIPT = """
import torch
from tests.util import manual_ws_exp

fd = manual_ws_exp(128, 3)
torch.manual_seed(0)
x = torch.randn(5, 296, dtype=torch.bfloat16)
{mutate}
(y,) = fd.execute([x])
ref = x.double().exp()
print("max error", ((y.double() - ref).abs() / ref).max().item())  # relative: bf16 keeps 2^-9
"""

_DROP_RELEASE = """
from circbuf.lowering import kir
from tests.test_interpret import drop_release

fd.compile([x], arch="sm_90a")
drop_release(fd._get_executor().last.kernel)
"""


def _check_cli(tmp_path, mutate="", *args):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT.format(mutate=mutate))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CIRCBUF_INTERPRET", None)
    return subprocess.run(
        [sys.executable, "-m", "circbuf.check", *args, str(script)],
        capture_output=True, text=True, timeout=600, env=env, cwd=root,
    )  # fmt: skip


def test_check_cli_runs_a_script_with_the_checker(tmp_path):
    """``python -m circbuf.check script.py``: the script's CPU tensors run in
    the interpreter, each kernel checked first; the report lists them."""
    r = _check_cli(tmp_path, "", "--schedules", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "max error 0.0" in r.stdout
    assert "circbuf.check: 1 kernel launch checked (1 kernel" in r.stdout, r.stdout
    assert "circbuf_manual: grid (1, 1, 1), block (128, 3, 1), 2 schedules of 1 CTAs" in r.stdout


def test_check_cli_names_the_protocol_error(tmp_path):
    r = _check_cli(tmp_path, _DROP_RELEASE, "--schedules", "2")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    assert "circbuf.check: protocol error: circbuf_manual: deadlock" in r.stderr, r.stderr[-3000:]
    assert "waits on x_empty[0] for parity 0" in r.stderr and "protocol checker: schedule seed 0" in r.stderr


def test_circbuf_check_before_a_gpu_launch(monkeypatch):
    """What ``CIRCBUF_CHECK`` runs before the launch of a GPU execute: the
    checker on CPU copies of the inputs (here CPU inputs stand in)."""
    from circbuf.interpret import CHECKED, ProtocolError, check_executor

    fd, ins, _ = _manual("ws")
    ex = fd._get_executor()
    monkeypatch.setenv("CIRCBUF_CHECK", "2")
    n = len(CHECKED)
    check_executor(ex, ins)
    assert (
        len(CHECKED) == n + 1 and CHECKED[-1]["kernel"] == "circbuf_manual" and CHECKED[-1]["schedules"] == 2
    )
    drop_release(ex.last.kernel)
    with pytest.raises(ProtocolError, match=r"deadlock.*x_empty\[0\].*protocol checker: schedule seed 0"):
        check_executor(ex, ins)


@pytest.mark.gpu
def test_gpu_circbuf_check_runs_the_checker_before_the_launch(monkeypatch):
    from circbuf.interpret import CHECKED

    fd, ins, ref = _norm("layer_norm", 6, 512, warp_specialized=True, stages=3)
    monkeypatch.setenv("CIRCBUF_CHECK", "2")
    n = len(CHECKED)
    out = fd.execute([x.cuda() for x in ins])[0]
    assert len(CHECKED) == n + 1 and CHECKED[-1]["kernel"] == "circbuf_normalization"
    torch.testing.assert_close(out.double().cpu(), ref(), rtol=2e-2, atol=2e-2)
