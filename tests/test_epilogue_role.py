"""The epilogue role on the CPU (``schedule(epilogue="role")``): a third
warp role reads the accumulator from a shared-memory ring the consumers fill.
The kernel IR (roles, rings, arrivals), its SASS, the override's errors, the
interpreter's results (the same bits as the inline epilogue, and float64
torch) and the protocol checker, which passes the kernel as built and names
each bug injected into the hand-off."""

from __future__ import annotations

import re

import pytest
import torch

import circbuf as cb
from circbuf.interpret import check, check_kernel, interpret, launch_args
from circbuf.ir import ParallelType
from circbuf.lowering import kir
from tests.test_gpu_matmul import mm_fusion
from tests.test_interpret import ONE_SM, _arrive, _remove, _wait
from tests.util import D

BF = torch.bfloat16


@pytest.fixture(autouse=True)
def _production_kernels(monkeypatch):
    monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)


def case(m, n, k, kind="linear", bias=True, act="gelu", dtype=BF, **ov):
    fd = mm_fusion(kind, D.BFloat16 if dtype == BF else D.Half, bias=bias, epilogue=act)
    fd.fusion.schedule(**ov)
    a = torch.randn(m, k, dtype=dtype) / 4
    b = torch.randn((n, k) if kind == "linear" else (k, n), dtype=dtype) / 4
    ins = [a, b]
    y = a.double() @ (b.double().T if kind == "linear" else b.double())
    if act == "residual":
        ins.append(torch.randn(m, n, dtype=dtype))
        y = y + ins[-1].double()
    if bias:
        ins.append(torch.randn(n, dtype=dtype))
        y = y + ins[-1].double()
    if act == "gelu":
        y = torch.nn.functional.gelu(y)
    elif act == "silu":
        y = torch.nn.functional.silu(y)
    return fd, ins, y


def test_the_kernel_has_three_roles_and_two_rings():
    fd, ins, _ = case(1000, 1032, 520)
    assert fd.compile(ins, arch="sm_90a").params.epilogue == "inline"  # the default
    fd.fusion.schedule(epilogue="role")
    ck = fd.compile(ins, arch="sm_90a")
    k = ck.kernel
    assert ck.params.epilogue == "role" and ck.params.tile == (128, 128, 64) and ck.params.registers is None
    assert [(r.name, r.lo, r.hi, r.threads) for r in k.roles] == [
        ("producer", 2, 3, 128),
        ("consumers", 0, 2, 256),
        ("epilogue", 3, 4, 128),
    ]
    assert k.launch[ParallelType.TIDy].value == 4 and k.max_threads == 512
    ops, handoff = k.rings
    assert (ops.fill, ops.producer, ops.consumers) == ("tma", "producer", ["consumers"])
    # every consumer thread arrives on a full slot, every epilogue thread on an empty one
    assert (handoff.fill, handoff.producer, handoff.consumers) == ("threads", "consumers", ["epilogue"])
    assert (handoff.stages, handoff.full_arrivals, handoff.empty_arrivals) == (2, 256, 128)
    assert "__launch_bounds__(512" in ck.cuda
    assert str(handoff).startswith(
        f"ring {handoff.name}: stages=2 prefetch=1 fill=threads consumers->epilogue"
    )
    # the epilogue role stores through its own staging tile and named barrier; the consumers never
    # touch a TMA store or the output
    switch = next(n for n in k.body if isinstance(n, kir.RoleSwitch))
    cons = switch.bodies[switch.roles.index(k.role("consumers"))]
    epi = switch.bodies[switch.roles.index(k.role("epilogue"))]
    found = lambda body, kind: [n for n in _nodes(body) if isinstance(n, kind)]  # noqa: E731
    assert not found(cons, kir.TmaStore) and found(epi, kir.TmaStore)
    assert found(cons, kir.Wgmma) and not found(epi, kir.Wgmma)
    assert "bar_epilogue" in ck.cuda


def _nodes(body):
    out = []
    kir.walk(body, lambda n, _s: out.append(n))
    return out


def test_role_sass_has_no_spills_and_vector_hand_off():
    fd, ins, _ = case(8192, 8192, 1024, act="silu", epilogue="role")
    ck = fd.compile(ins, arch="sm_90a")
    sass = ck.sass()
    assert set(re.findall(r"HGMMA\.64x(\d+)x16", sass)) == {"128"}
    for op in ("UTMALDG", "UTMASTG", "SYNCS", "STS.64"):
        assert op in sass, op
    assert "USETMAXREG" not in sass  # every role compiles at the 128 registers 512 threads start with
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert ck.resource_usage()["LOCAL"] == 0


@pytest.mark.parametrize(
    "ov, match",
    [
        (dict(epilogue="role", pingpong=True), r"an epilogue role is built for the cooperative kernel only"),
        (dict(epilogue="role", registers=(40, 232)), r"compile at 128 registers each"),
        (
            dict(epilogue="role", tile=(128, 256, 64)),
            r"128 accumulator registers per thread do not fit in 128",
        ),
        (dict(epilogue="role", stages=6), r"6 stages of 32768 bytes exceed .* hand-off ring"),
        (dict(epilogue="sideways"), r"epilogue"),
    ],
)
def test_role_overrides_are_validated(ov, match):
    fd, ins, _ = case(1000, 1032, 520)
    with pytest.raises(cb.CircbufError, match=match):
        fd.fusion.schedule(**ov)
        fd.compile(ins, arch="sm_90a")


@pytest.mark.parametrize(
    "shape, kw",
    [
        ((200, 264, 136), dict()),
        ((130, 136, 72), dict(act="silu", dtype=torch.float16)),
        ((256, 384, 192), dict(kind="matmul", bias=False, act="residual")),
        ((150, 200, 64), dict(bias=False, act=None, persistent=False)),
        ((130, 135, 72), dict(act="silu")),  # rows of 270 bytes: stored from registers, no TMA
    ],
)
def test_interpreter_results_are_the_inline_kernels_bits(shape, kw):
    kw = dict(kw)
    persistent = kw.pop("persistent", True)
    fd, ins, ref = case(*shape, epilogue="role", persistent=persistent, **kw)
    out = interpret(fd, ins, target=ONE_SM)[0]  # one SM: the rings wrap across tiles
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    fd2, _, _ = case(*shape, tile=(128, 128, 64), persistent=persistent, **kw)
    assert torch.equal(out, interpret(fd2, ins, target=ONE_SM)[0])
    check(fd, ins, schedules=2, target=ONE_SM)


def _handoff(k):
    return next(r for r in k.rings if r.fill == "threads")


def drop_handoff_full_arrive(k):
    _remove(k, _arrive(k, _handoff(k).full))


def release_handoff_before_reading(k):
    a = _arrive(k, _handoff(k).empty)
    _remove(k, a)
    kir.insert_after(k.body, _wait(k, _handoff(k).full), [a])


def drop_handoff_empty_wait(k):
    _remove(k, _wait(k, _handoff(k).empty))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            drop_handoff_full_arrive,
            r"deadlock.*role epilogue: 128 threads .* wait on acc_full\[0\] .*256 of 256 arrivals pending",
        ),
        (
            release_handoff_before_reading,
            r"race: role consumers thread .* overwrites stage 0 of acc_stage \(ring acc, .*read by role epilogue",
        ),
        (
            drop_handoff_empty_wait,
            r"race: role consumers thread .* overwrites stage 0 of acc_stage \(ring acc, .*read by role epilogue",
        ),
    ],
    ids=lambda x: getattr(x, "__name__", "msg"),
)
def test_checker_catches_broken_hand_off(mutate, message):
    fd, ins, _ = case(128, 512, 128, kind="matmul", bias=False, act=None, epilogue="role")
    k, tensors, scalars, grid, block = launch_args(fd, ins, target=ONE_SM)
    check_kernel(k, [t.clone() for t in tensors], scalars, grid, block, schedules=1)
    mutate(k)
    with pytest.raises(cb.CircbufError, match=message):
        check_kernel(k, tensors, scalars, grid, block, schedules=2)
