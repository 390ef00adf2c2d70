"""Warp roles and rings as kernel IR: the circular-buffer, mbarriers and
sync passes run on kernels built by hand, printing, and the compiled
kernels' roles and rings."""

import pytest
import torch

import circbuf as cb
from circbuf.ir import Const, MemoryType, ParallelType, Var, WarpSpecialized
from circbuf.lowering.circular_buffer import circular_buffer
from circbuf.lowering.codegen import codegen
from circbuf.lowering.kir import (
    Allocate,
    Assign,
    BlockReduce,
    BlockSync,
    ElectOne,
    ForLoop,
    Kernel,
    MBarrierArrive,
    MBarrierInit,
    MBarrierWait,
    Ring,
    RingAdvance,
    RingInit,
    Role,
    RoleSwitch,
    SetMaxNReg,
    TensorRef,
    TmaLoad,
    walk,
)
from circbuf.lowering.mbarriers import setup_mbarriers
from circbuf.lowering.roles import assign_roles
from circbuf.lowering.sync import insert_syncs
from tests.util import D, manual_ws_exp

P = ParallelType


def nodes(body, kind):
    out = []
    walk(body, lambda n, s: out.append(n) if isinstance(n, kind) else None)
    return out


def _tvs():
    with cb.FusionDefinition() as fd:
        buf = fd.define_tensor([-1], dtype=D.BFloat16)
        reg = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.exp(buf))
    return buf, reg


def hand_ws_kernel(stages=3, prefetch=2, registers=(40, 232), rows=2):
    """A tiny warp-specialized kernel: a shared buffer filled by TMA in a
    loop nest of its own (``FOR j0``), read by ``rows`` rows of 128 threads
    in theirs (``FOR j1``), which sync after the read."""
    buf, reg = _tvs()
    buf.memory_type = MemoryType.Shared
    buf.circular = (stages, prefetch, WarpSpecialized(registers=registers))
    buf.compute_at_pos = 0
    E = Var("E")
    loads = ForLoop(Var("j0"), E, [TmaLoad(TensorRef(buf, Const(0)), 0, [Var("j0") * 64], 2048)], key=7)
    read = Assign(TensorRef(reg, Const(0), vector=8), None, [TensorRef(buf, Var("threadIdx.x") * 8)])
    reader = ForLoop(Var("j1"), E, [read, BlockSync("the readers meet")], key=8)
    k = Kernel(
        name="hand",
        body=[Allocate(buf, Const(1024), MemoryType.Shared, stages=stages, offset=Const(0)), loads, reader],
        tensor_params=[],
        scalar_params=[E],
        launch={P.TIDx: Const(128), P.TIDy: Const(rows)},
        extent_bindings={},
        strides={},
        max_threads=128 * rows,
    )
    k.circular_loops = {buf.name: 7}
    return k, buf


def test_circular_buffer_pass_builds_two_roles_and_one_ring():
    k, buf = hand_ws_kernel()
    k = circular_buffer(assign_roles(k))
    producer, consumers = k.roles
    assert (producer.name, producer.cond, producer.threads, producer.registers, producer.increase) == (
        "producer",
        Var("threadIdx.y").eq(2),
        128,
        40,
        False,
    )
    assert (consumers.name, consumers.lo, consumers.hi, consumers.threads, consumers.registers) == (
        "consumers",
        0,
        2,
        256,
        232,
    )
    assert k.launch[P.TIDy] == Const(3) and k.max_threads == 384 and k.min_blocks == 1
    (ring,) = k.rings
    assert (ring.name, ring.stages, ring.prefetch, ring.fill, ring.producer, ring.consumers) == (
        buf.name,
        3,
        2,
        "tma",
        "producer",
        ["consumers"],
    )
    # one expect_tx arrival fills a stage; every consumer thread releases it
    assert ring.barriers() == [(f"{buf.name}_full", 3, 1), (f"{buf.name}_empty", 3, 256)]
    (switch,) = [n for n in k.body if isinstance(n, RoleSwitch)]
    assert switch.roles == [producer, consumers]
    prod, cons = switch.bodies
    assert isinstance(prod[0], SetMaxNReg) and not prod[0].increase and prod[0].count == 40
    assert isinstance(cons[0], SetMaxNReg) and cons[0].increase and cons[0].count == 232
    # the producer side: one elected lane waits for an empty slot, fills, advances
    (elect,) = nodes(prod, ElectOne)
    assert isinstance(elect.then[1], RingInit) and elect.then[1].ring is ring.load
    (ploop,) = nodes(prod, ForLoop)
    kinds = [type(n).__name__ for n in ploop.body]
    assert kinds[0] == "MBarrierWait" and kinds[-1] == "RingAdvance" and "MBarrierArriveExpectTx" in kinds
    assert ploop.body[0].bar.name == ring.empty and ploop.body[-1].ring is ring.load
    # the consumer side: wait full at the top, release after the last read, advance last
    (cloop,) = nodes(cons, ForLoop)
    assert isinstance(cloop.body[0], MBarrierWait) and cloop.body[0].bar.name == ring.full
    assert cloop.body[0].parity == ring.use.phase
    release = next(j for j, n in enumerate(cloop.body) if isinstance(n, MBarrierArrive))
    read = next(j for j, n in enumerate(cloop.body) if isinstance(n, Assign))
    assert release == read + 1 and cloop.body[release].bar.name == ring.empty
    assert isinstance(cloop.body[-1], RingAdvance) and cloop.body[-1].ring is ring.use
    assert cloop.body[read].operands[0].index == Var("threadIdx.x") * 8 + ring.use.stage * 1024


def test_mbarriers_and_sync_passes_read_the_ring_and_the_roles():
    k, buf = hand_ws_kernel()
    k = insert_syncs(setup_mbarriers(circular_buffer(assign_roles(k))))
    inits = {(i.bar.name, i.bar.stage.value): i.arrivals for i in nodes(k.body, MBarrierInit)}
    assert inits[(f"{buf.name}_full", 2)] == Const(1) and inits[(f"{buf.name}_empty", 0)] == Const(256)
    assert k.barrier_names == [f"{buf.name}_full", f"{buf.name}_empty"]
    (switch,) = nodes(k.body, RoleSwitch)
    # the consumers' sync is their role's named barrier; the producer never syncs
    syncs = nodes(switch.bodies[1], BlockSync)
    bar = k.named_barrier("consumers")
    assert [s.barrier for s in syncs] == [(bar, 256)] and k.roles[1].barrier == (bar, 256)
    assert not nodes(switch.bodies[0], BlockSync) and k.roles[0].barrier is None
    src = codegen(k)
    assert "constexpr int bar_consumers = 1;  // consumers" in src
    assert "cb::sync_threads(bar_consumers, 256);  // the readers meet" in src
    assert "  } else {  // consumers: threadIdx.y in 0..2 (256 threads), setmaxnreg.inc 232" in src
    assert "if ((((index_t)threadIdx.y) == 2)) {  // producer: threadIdx.y == 2 (128 threads)" in src


def test_each_role_syncs_on_its_own_barrier():
    """Three roles built by hand: each one's syncs and block reductions get
    its own named barrier id; a role of two sync groups gets one id per group."""
    buf, _ = _tvs()
    roles = [
        Role("producer", 3, 4, 128, 40, increase=False),
        Role("mma", 0, 2, 256, 232, groups=2),
        Role("epilogue", 2, 3, 128),
    ]
    red = BlockReduce(None, {}, (P.TIDx,))
    bodies = [[BlockSync("p")], [BlockSync("m"), red], [BlockSync("e")]]
    k = Kernel("k", [RoleSwitch(roles, bodies)], [], [], {P.TIDx: Const(128), P.TIDy: Const(4)}, {}, {})
    k.roles = roles
    insert_syncs(k)
    assert bodies[0][0].barrier == (Var("bar_producer"), 128)
    assert bodies[1][0].barrier == (Var("threadIdx.y") + Var("bar_mma"), 128)
    assert red.barrier == bodies[1][0].barrier
    assert bodies[2][0].barrier == (Var("bar_epilogue"), 128)
    assert k.named_barriers == {"producer": (1, 1), "mma": (2, 2), "epilogue": (4, 1)}
    k.body[0].bodies[1].remove(red)  # a reduction without a fusion expr has no CUDA
    src = codegen(k)
    assert "constexpr int bar_mma = 2;  // mma: ids 2..3, one per sync group" in src
    assert "constexpr int bar_epilogue = 4;  // epilogue" in src
    assert "cb::sync_threads((((index_t)threadIdx.y) + bar_mma), 128);  // m" in src
    assert "} else if ((((index_t)threadIdx.y) < 2)) {  // mma:" in src
    assert "} else {  // epilogue: threadIdx.y == 2 (128 threads)" in src


def test_a_role_that_syncs_needs_whole_warps():
    k = Kernel("k", [], [], [], {}, {}, {})
    with pytest.raises(cb.CircbufError, match="the odd role synchronizes, which needs whole warps"):
        k.role_barrier(Role("odd", 0, 1, 48))


def test_ring_fill_kinds_and_printing():
    with pytest.raises(cb.CircbufError, match="fill 'dma' is not tma, threads, cp.async or multicast"):
        Ring("X", 2, 1, ["X"], fill="dma")
    r = Ring("X", 2, 1, ["X"], fill="threads", empty_arrivals=4)
    r.has_empty = False
    assert str(r) == (
        "ring X: stages=2 prefetch=1 fill=threads thread0->block (pipelined) full=X_full[2] empty=block_sync"
    )
    assert r.barriers() == [("X_full", 2, 1)]


def test_print_kernel_lists_roles_and_rings():
    k, buf = hand_ws_kernel()
    text = str(circular_buffer(assign_roles(k)))
    lines = text.splitlines()
    assert lines[1] == "  role producer: threadIdx.y == 2 (128 threads), setmaxnreg.dec 40"
    assert lines[2] == "  role consumers: threadIdx.y in 0..2 (256 threads), setmaxnreg.inc 232"
    assert lines[3] == (
        f"  ring {buf.name}: stages=3 prefetch=2 fill=tma producer->consumers "
        f"full={buf.name}_full[3] empty={buf.name}_empty[3]"
    )
    assert (
        "  ROLES" in lines
        and "    ROLE consumers: threadIdx.y in 0..2 (256 threads), setmaxnreg.inc 232" in lines
    )


def test_compiled_kernels_carry_roles_and_rings(monkeypatch):
    monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)
    ck = manual_ws_exp(128, 3).compile([torch.randn(37, 1000, dtype=torch.bfloat16)], arch="sm_90a")
    assert [r.name for r in ck.kernel.roles] == ["producer", "consumers"]
    (ring,) = ck.kernel.rings
    # every consumer thread releases a stage it has read
    assert ring.stages == 3 and ring.producer == "producer"
    assert ring.barriers()[1][2] == ck.kernel.roles[1].threads == 256


def test_pingpong_consumers_are_two_sync_groups(monkeypatch):
    from tests.test_gpu_matmul import mm_fusion

    monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)
    fd = mm_fusion("matmul")
    fd.fusion.schedule(pingpong=True)
    ck = fd.compile(
        [torch.randn(1000, 520, dtype=torch.bfloat16), torch.randn(520, 1032, dtype=torch.bfloat16)],
        arch="sm_90a",
    )
    prod, cons = ck.kernel.roles
    assert cons.groups == 2 and cons.threads == 256 and prod.registers and cons.increase
    (ring,) = ck.kernel.rings
    assert ring.barriers()[1][2] == 4  # one elected lane per warp of one warpgroup releases a stage
    # the warpgroups take turns on the MMAs and the epilogue: one barrier per group per phase,
    # set up with the ring's; the kernel IR lists the order with the roles and rings
    (order,) = ck.kernel.turn_orders
    assert (order.role, order.groups, order.phases, order.arrivals) == ("consumers", 2, ["mma", "epi"], 128)
    names = ck.kernel.barrier_names
    assert names[:2] == [order.barrier("mma"), order.barrier("epi")] and names[2:] == [ring.full, ring.empty]
    assert f"  {order}" in ck.kernel_ir.splitlines()[:6]


def test_hang_record_names_the_ring_barriers(monkeypatch):
    monkeypatch.setenv("CIRCBUF_DEBUG_HANG", "1000")
    ck = manual_ws_exp(128, 3).compile([torch.randn(37, 1000, dtype=torch.bfloat16)], arch="sm_90a")
    (ring,) = ck.kernel.rings
    assert ck.kernel.hang_record and ck.kernel.barrier_names == [ring.full, ring.empty]
    # each bounded wait names its barrier array by its index in barrier_names
    assert f"cb::mbar_wait_bounded(&{ring.empty}[" in ck.cuda and ", 1, (int)(" in ck.cuda


def test_roles_pass_partitions_the_threads_before_the_ring_exists():
    """The roles pass alone: the producer row is added to the launch, the
    consumers' branch holds the whole loop nest, the producer's only its
    register setting (the circular-buffer pass moves the copies there)."""
    k, buf = hand_ws_kernel()
    loads, reader = k.body[1], k.body[2]
    k = assign_roles(k)
    assert k.launch[P.TIDy] == Const(3) and k.max_threads == 384 and k.min_blocks == 1 and not k.rings
    (switch,) = nodes(k.body, RoleSwitch)
    prod, cons = switch.bodies
    assert [type(n).__name__ for n in prod] == ["SetMaxNReg"]
    assert cons[1:] == [loads, reader] and k.roles[1].groups == 1
    with pytest.raises(cb.CircbufError, match="needs the roles pass first"):
        circular_buffer(hand_ws_kernel()[0])


def test_roles_pass_gives_rows_that_split_the_ring_a_sync_group_each():
    """Readers whose tile loop starts at a threadIdx.y-dependent tile (ping-pong
    warpgroups, each its own tiles) make the consumers two sync groups, and
    the ring agrees: one row's threads release a position, and each row
    starts its ring a tile (K positions) later and skips the other's tiles."""
    k, buf = hand_ws_kernel()
    T, K = Var("T"), Var("K")
    (load,) = k.body[1].body
    k.body[1] = ForLoop(Var("t0"), T, [ForLoop(Var("k0"), K, [load], key=7)])
    read = k.body[2].body[0]
    rows = ForLoop(Var("t1"), T, [ForLoop(Var("k1"), K, [read])])
    rows.start, rows.step = Var("threadIdx.y", hi=Const(2)), Const(2)
    k.body[2] = rows
    k = assign_roles(k)
    assert k.roles[1].groups == 2
    k = circular_buffer(k)
    assert k.rings[0].barriers()[1] == (f"{buf.name}_empty", 3, 128)
    (init,) = [n for n in nodes(k.body, RingInit) if n.ring is k.rings[0].use]
    assert str(init.position) in ("(threadIdx.y * K)", "(K * threadIdx.y)")


def test_tma_store_in_a_role_syncs_per_warpgroup_on_named_constants():
    """A TMA store inside the consumers' branch whose box depends on
    threadIdx.y: each row (warpgroup) fills and stores its own box, on its
    own named barrier ``bar_consumers_store_<buffer> + threadIdx.y``; one
    lane of each row's first warp issues it, and the final wait ends the
    consumers' branch, not the kernel (the producer returned early)."""
    from circbuf.lowering.kir import BulkWaitGroup, Fence, TmaStore
    from circbuf.lowering.tma_store import tma_stores

    buf, reg = _tvs()
    buf.memory_type = MemoryType.Shared
    ty = Var("threadIdx.y", hi=Const(2))
    fill = Assign(TensorRef(buf, ty * 128 + Var("threadIdx.x")), None, [TensorRef(reg, Const(0))])
    store = TmaStore(TensorRef(buf, ty * 128), 0, [Const(0), ty * 64], 256)
    tile = ForLoop(Var("j0"), Var("E"), [fill, store])
    roles = [Role("producer", 2, 3, 128), Role("consumers", 0, 2, 256)]
    switch = RoleSwitch(roles, [[], [tile]])
    k = Kernel("k", [switch], [], [], {P.TIDx: Const(128), P.TIDy: Const(3)}, {}, {})
    k.roles = roles
    k = tma_stores(k)
    bar = (ty + Var("bar_consumers_store_" + buf.name), 128)
    syncs = nodes(tile.body, BlockSync)
    assert [s.barrier for s in syncs] == [bar, bar]  # WAR before the fill, RAW before the store
    assert k.named_barriers == {f"consumers store {buf.name}": (1, 2)}
    assert isinstance(tile.body[-2], BlockSync) and isinstance(tile.body[-3], Fence)
    issue = tile.body[-1]
    assert isinstance(issue, ElectOne) and issue.warp == Var("threadIdx.x").lt(32)
    last = switch.bodies[1][-1]
    assert isinstance(last, ElectOne) and isinstance(last.then[0], BulkWaitGroup)
    assert not switch.bodies[0] and k.body == [switch]


def _hand_turns_kernel():
    """Two ping-pong warpgroups' tile loop by hand: ``FOR t { FOR k { WGMMA } ;
    WGMMA_WAIT 0 ; epilogue }``, the accumulator marked to take turns on
    threadIdx.y, the consumers role of two sync groups."""
    from circbuf.lowering.kir import MmaOperand, Wgmma, WgmmaWait

    buf, acc = _tvs()
    acc.turns = P.TIDy
    op = MmaOperand(buf, Const(0), 16, 1024, 128, False)
    mma = Wgmma(TensorRef(acc, Const(0)), op, op, (64, 128, 16), Var("k"))  # scale_d: 0 at k = 0
    k_loop = ForLoop(Var("k"), Var("K"), [mma], key=2)
    epilogue = Assign(TensorRef(buf, Const(0)), None, [TensorRef(acc, Const(0))])
    tile = ForLoop(Var("t"), Var("T"), [k_loop, WgmmaWait(0), epilogue], key=1)
    k = Kernel(
        name="turns",
        body=[tile],
        tensor_params=[],
        scalar_params=[Var("K"), Var("T")],
        launch={P.TIDx: Const(128), P.TIDy: Const(3)},
        extent_bindings={},
        strides={},
        max_threads=384,
    )
    k.roles = [
        Role("consumers", lo=0, hi=2, threads=256, groups=2),
        Role("producer", lo=2, hi=3, threads=128),
    ]
    return k, tile, k_loop, epilogue


def test_turns_pass_places_the_turn_barriers_by_hand():
    """The MMA turn is waited for before the k loop and handed over right
    after it (before the drain); the epilogue's turn after the drain, handed
    over after the epilogue; one order of 2 groups x 2 phases, 128 arrivals."""
    from circbuf.lowering.kir import WgmmaWait
    from circbuf.lowering.turns import take_turns

    k, tile, k_loop, epilogue = _hand_turns_kernel()
    take_turns(k)
    (order,) = k.turn_orders
    assert order.barriers() == [(f"{order.name}_mma_turn", 2, 128), (f"{order.name}_epi_turn", 2, 128)]
    kinds = [type(n).__name__ for n in tile.body if type(n).__name__ != "Comment"]
    assert kinds == [
        "MBarrierWait",  # my MMA turn
        "ForLoop",  # the k loop
        "MBarrierArrive",  # the other's MMAs may go (before the drain)
        "WgmmaWait",
        "MBarrierWait",  # my epilogue turn
        "Assign",  # the epilogue
        "MBarrierArrive",  # the other's epilogue may go
        "RingAdvance",
    ]
    body = [n for n in tile.body if type(n).__name__ != "Comment"]
    assert body[1] is k_loop and body[5] is epilogue and isinstance(body[3], WgmmaWait)
    waits, arrives = (nodes([tile], MBarrierWait), nodes([tile], MBarrierArrive))
    assert [w.bar.name for w in waits] == [order.barrier("mma"), order.barrier("epi")]
    assert [a.bar.name for a in arrives] == [order.barrier("mma"), order.barrier("epi")]
    # a group waits on its own barrier (threadIdx.y) and arrives on the other's (1 - threadIdx.y)
    assert all("threadIdx.y" in str(w.bar.stage) and "1 -" not in str(w.bar.stage) for w in waits)
    assert all("(1 - threadIdx.y)" in str(a.bar.stage) for a in arrives)
    # the turn's phase starts at the other group's position: group 0 goes first
    (init,) = nodes(k.body, RingInit)
    assert k.body.index(init) < k.body.index(tile)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda k, tile: tile.body.remove(tile.body[1]), "never waited for"),
        (lambda k, tile: setattr(k.roles[0], "groups", 1), "each read their own tiles"),
        (lambda k, tile: k.roles.pop(0), "ring's readers only"),
        (lambda k, tile: k.body.__setitem__(0, tile.body[0]), "tile loop around the k loop"),
    ],
)
def test_turns_pass_refuses_what_it_cannot_order(change, message):
    from circbuf.lowering.turns import take_turns

    k, tile, _k_loop, _epi = _hand_turns_kernel()
    change(k, tile)
    with pytest.raises(cb.CircbufError, match=message):
        take_turns(k)
