"""Pass: ping-pong warpgroups take turns on the tensor cores.

Requires: allocated, wgmma_synced, roles; provides: turns, turn_orders.

Each of two warpgroups (``threadIdx.y`` 0 and 1: the two sync groups of the
``consumers`` role) owns whole tiles. An MMA
output marked ``take_turns(TIDy)`` orders them with two pairs of mbarriers:
a warpgroup waits for its turn before issuing a tile's MMAs and hands the
turn over as soon as they are issued (before waiting for them to drain);
its epilogue likewise waits for, and then hands over, the epilogue turn.
So one warpgroup's epilogue overlaps the other's MMAs, and the two never
compete for the tensor cores. Warpgroup 0 goes first: its phase starts at
1, which a fresh barrier has already passed. Waits are mbarrier waits, so
``CIRCBUF_DEBUG_HANG`` bounds them like the ring's.

Before::

    FOR t in blockIdx.x + threadIdx.y * G..T step 2 * G   // the tile loop
      FOR k in 0..K: ... WGMMA ...                          // the k loop
      WGMMA_WAIT_GROUP 0
      ... epilogue ...

After::

    TURNS acc: the 2 sync groups of role consumers in order, mma acc_mma_turn[2], epi acc_epi_turn[2]
    RING acc_turn (stages=1) at position (1 - threadIdx.y)
    FOR t ...
      MBARRIER_WAIT acc_mma_turn[threadIdx.y] parity=acc_turn_phase
      FOR k in 0..K: ... WGMMA ...
      MBARRIER_ARRIVE acc_mma_turn[1 - threadIdx.y]         // the other's MMAs may go
      WGMMA_WAIT_GROUP 0
      MBARRIER_WAIT acc_epi_turn[threadIdx.y] parity=acc_turn_phase
      ... epilogue ...
      MBARRIER_ARRIVE acc_epi_turn[1 - threadIdx.y]
      RING_ADVANCE acc_turn by 1
"""

from __future__ import annotations

from ..ir import CircbufError, Const, ParallelType, Var
from .kir import (
    Comment,
    ForLoop,
    Kernel,
    MBarrierArrive,
    MBarrierRef,
    MBarrierWait,
    RingAdvance,
    RingInit,
    TurnOrder,
    Wgmma,
    WgmmaWait,
    insert_before,
    walk,
)
from .wgmma import k_loop_of


def take_turns(kernel: Kernel) -> Kernel:
    """Entry: turn barriers around the MMAs and epilogues of turn-taking outputs."""
    found = []
    walk(
        kernel.body,
        lambda n, s: found.append((n, list(s))) if isinstance(n, Wgmma) and n.acc.tv.turns else None,
    )
    role = next((r for r in kernel.roles if r.name == "consumers"), None)
    if found and role is None:
        raise CircbufError(
            f"{found[0][0].acc.tv.name}: warpgroups take turns on a warp-specialized ring's readers only"
        )
    done = set()
    for w, stack in found:
        tv = w.acc.tv
        if tv.name in done:
            continue
        done.add(tv.name)
        pt = tv.turns
        groups = role.hi - role.lo if pt == role.axis else kernel.launch.get(pt)
        if pt != ParallelType.TIDy or groups != 2:
            raise CircbufError(
                f"{tv.name}: two warpgroups on threadIdx.y take turns, not {groups} on {pt.value}"
            )
        if role.groups != 2:
            raise CircbufError(
                f"{tv.name}: the warpgroups that take turns must each read their own tiles of the ring"
            )
        loops = [lp for lp in stack if isinstance(lp, ForLoop)]
        k_loop = k_loop_of(w, loops)
        if k_loop is None or k_loop is loops[0]:
            raise CircbufError(f"{tv.name}: taking turns needs a tile loop around the k loop")
        tile = loops[loops.index(k_loop) - 1]
        body = tile.body
        k = body.index(k_loop)
        tail = next((j for j in range(k + 1, len(body)) if isinstance(body[j], WgmmaWait)), None)
        if tail is None:
            raise CircbufError(f"{tv.name}: the k loop's wgmmas are never waited for")
        threads = role.threads // role.groups  # a warpgroup's every thread arrives
        order = TurnOrder(tv.name, role.name, 2, ["mma", "epi"], threads)
        kernel.turn_orders.append(order)
        mine = Var(pt.value, lo=0, hi=Const(2))
        other = Const(1) - mine
        mma, epi, turn = order.barrier("mma"), order.barrier("epi"), order.side
        body[tail + 1 : tail + 1] = [
            Comment("the epilogue's turn"),
            MBarrierWait(MBarrierRef(epi, mine), turn.phase),
        ]
        body[k + 1 : k + 1] = [
            Comment("the MMAs are issued: the other warpgroup's MMAs may go"),
            MBarrierArrive(MBarrierRef(mma, other)),
        ]
        body[k:k] = [
            Comment("this warpgroup's turn on the tensor cores"),
            MBarrierWait(MBarrierRef(mma, mine), turn.phase),
        ]
        body += [MBarrierArrive(MBarrierRef(epi, other)), RingAdvance(turn, Const(1))]
        insert_before(kernel.body, tile, [RingInit(turn, other)])
    return kernel
