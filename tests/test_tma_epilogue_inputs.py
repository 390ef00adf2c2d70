"""Epilogue inputs the producer loads by TMA (a residual tile of the output's
shape): a second TMA ring beside the operands', filled by the same producer
lane under one tile loop, a tile's sub-tiles per ring. On the CPU: which
inputs qualify, the kernel's rings, the interpreter's results against float64
torch and the protocol checker (with a mutation it must name)."""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import check, check_kernel, interpret, launch_args
from circbuf.lowering import kir
from tests.test_gpu_matmul import epilogue_input
from tests.test_interpret import ONE_SM, _remove, _wait

BF = torch.bfloat16


@pytest.fixture(autouse=True)
def _production_kernels(monkeypatch):
    monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)


@pytest.mark.parametrize(
    "what, m, n, by_tma",
    [
        ("residual", 1000, 1032, True),
        ("residual", 1000, 1031, False),  # rows of 2062 bytes: no tensor map (and no TMA store)
        ("residual_t", 1000, 1032, False),  # M-major: not the output's layout
        ("bias_n", 1000, 1032, False),  # a row, loaded in pairs by the epilogue
    ],
)
def test_which_inputs_are_loaded_by_tma(what, m, n, by_tma):
    fd, ins, _ = epilogue_input(what, m, n, 136)
    p = fd.compile(ins, arch="sm_90a").params
    assert (p.tma_inputs == (False, False, True)) == by_tma
    if by_tma:  # the ring takes the second staging buffer's shared memory; no pair loads
        assert p.store_buffers == 1 and p.vectorize_inputs == () and "epilogue input(s) by TMA" in p.brief()


def test_fp32_residual_is_read_by_the_epilogue():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        r = fd.define_tensor([-1, -1], dtype=cb.DataType.Float)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.linear(a, b), r), cb.DataType.BFloat16))
    ins = [torch.randn(256, 128, dtype=BF), torch.randn(512, 128, dtype=BF), torch.randn(256, 512)]
    assert fd.compile(ins, arch="sm_90a").params.tma_inputs == ()


def test_two_rings_one_producer_lane():
    fd, ins, _ = epilogue_input("residual", 8192, 8192, 1024)
    ck = fd.compile(ins, arch="sm_90a")
    k = ck.kernel
    ops, res = k.rings
    assert (ops.fill, res.fill) == ("tma", "tma") and ops.producer == res.producer == "producer"
    assert ops.buffers != res.buffers and (ops.stages, res.stages) == (3, 4)
    assert res.empty_arrivals == 256  # every consumer thread reads both warpgroups' halves of a stage
    lane = []
    kir.walk(k.body, lambda n, _s: lane.append(n) if isinstance(n, kir.ElectOne) and n.then and
             isinstance(n.then[0], kir.Comment) and "producer" in n.then[0].text else None)  # fmt: skip
    tiles = [n for n in lane[0].then if isinstance(n, kir.ForLoop)]
    assert len(tiles) == 1  # one tile loop: the operands' k steps, then the input's sub-tiles
    inner = [n for n in tiles[0].body if isinstance(n, kir.ForLoop)]
    assert len(inner) == 2
    assert f"{res.name}_full" in ck.cuda and "cb::tma_load(&" + res.buffers[0] in ck.cuda


@pytest.mark.parametrize("m, n, k", [(256, 520, 192), (130, 136, 72), (200, 264, 64)])
def test_interpreter_results(m, n, k):
    fd, ins, ref = epilogue_input("residual", m, n, k)
    out = interpret(fd, ins, target=ONE_SM)[0]
    assert fd.last_params().tma_inputs == (False, False, True)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    check(fd, ins, schedules=2, target=ONE_SM)


def test_checker_names_a_read_before_the_copy_landed():
    fd, ins, _ = epilogue_input("residual", 128, 512, 128)
    k, tensors, scalars, grid, block = launch_args(fd, ins, target=ONE_SM)
    check_kernel(k, [t.clone() for t in tensors], scalars, grid, block, schedules=1)
    res = k.rings[1]
    _remove(k, _wait(k, res.full))
    with pytest.raises(
        cb.CircbufError, match=rf"race: role consumers thread .* reads stage \d of {res.buffers[0]}"
    ):
        check_kernel(k, tensors, scalars, grid, block, schedules=2)


def test_the_role_keeps_reading_it_itself():
    fd, ins, _ = epilogue_input("residual", 1000, 1032, 136)
    fd.fusion.schedule(epilogue="role")
    assert fd.compile(ins, arch="sm_90a").params.tma_inputs == ()


PINGPONG = [
    ((300, 520, 128), dict(pingpong=True, tile=(64, 256, 64))),
    ((300, 520, 128), dict(pingpong=True, tile=(128, 128, 64))),  # two row blocks a warpgroup
    ((200, 264, 64), dict(pingpong=True, tile=(64, 256, 64), stages=3)),
    ((16, 4096, 256), {}),  # decode: the heuristic's ping-pong 64-row tiles
]


@pytest.mark.parametrize("shape, ov", PINGPONG)
def test_pingpong_loads_it_by_tma(shape, ov):
    """Ping-pong: the producer walks every tile (both warpgroups'), a tile's
    sub-tiles of the input after its k steps; each warpgroup reads its own
    tiles' stages, skipping the other's (as the operands' ring). Results equal
    the cooperative kernel's bit for bit; the checker passes."""
    fd, ins, ref = epilogue_input("residual", *shape)
    if ov:
        fd.fusion.schedule(**ov)
    out = interpret(fd, ins, target=ONE_SM)[0]
    p = fd.last_params()
    assert p.pingpong and p.tma_inputs == (False, False, True), p.brief()
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    coop, _, _ = epilogue_input("residual", *shape)
    coop.fusion.schedule(pingpong=False, tile=(128, 256, 64))
    assert torch.equal(interpret(coop, ins, target=ONE_SM)[0], out)
    check(fd, ins, schedules=2, target=ONE_SM)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, ov", PINGPONG + [((4096, 4096, 512), dict(pingpong=True))])
def test_gpu_pingpong_loads_it_by_tma(shape, ov):
    fd, ins, ref = epilogue_input("residual", *shape, device="cuda")
    if ov:
        fd.fusion.schedule(**ov)
    (out,) = fd.execute(ins)  # outputs NaN-poisoned before the launch (conftest)
    assert fd.last_params().tma_inputs == (False, False, True)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
