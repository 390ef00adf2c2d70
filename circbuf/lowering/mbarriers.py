"""Pass: set up the mbarriers the kernel waits on, in one place.

Requires: rings, turns, turn_orders, launch; provides: mbarriers_allocated.

The circular-buffer pass describes each ring (``kernel.rings``: its full
and empty arrays and their arrival counts) and the turn-taking pass each
turn order (``kernel.turn_orders``); other arrays may be registered with
``kernel.mbarrier(name, count, arrivals)``. Those passes emit only the waits
and arrivals. This pass allocates every registered array, has one
thread initialize it and fence the initialization for the async proxy
(the TMA unit signals these barriers), and syncs the block before any
thread can wait. Where every thread runs to the end of the kernel (no warp
role returns early), the barriers are invalidated there after a last sync.

Before::

    RING_INIT T4_load at position 0
    FOR j in 0..E: ... MBARRIER_WAIT T4_full[T4_use_stage] ...

After::

    ALLOC mbarrier T4_full[3]
    IF threadIdx.x == 0:
      MBARRIER_INIT T4_full[0] arrivals=1   (... one per stage)
      FENCE mbarrier_init
    BLOCK_SYNC  // barriers initialized before any thread uses them
    RING_INIT T4_load at position 0
    FOR j in 0..E: ...
    BLOCK_SYNC  // every wait is done before the barriers go
    IF threadIdx.x == 0:
      MBARRIER_INVAL T4_full[0]   (... one per stage)
"""

from __future__ import annotations

from ..ir import Const
from ..ir.scalar import as_scalar
from .kir import (
    BlockSync,
    ClusterSync,
    Fence,
    IfThenElse,
    Kernel,
    MBarrierAlloc,
    MBarrierInit,
    MBarrierInval,
    MBarrierRef,
    Return,
    thread0_cond,
    walk,
)


def setup_mbarriers(kernel: Kernel) -> Kernel:
    """Entry: allocation, initialization and teardown of the registered
    mbarriers and the rings' (``kernel.all_mbarriers()``)."""
    arrays = kernel.all_mbarriers()
    if not arrays:
        return kernel
    thread0 = thread0_cond(kernel)
    refs = [(MBarrierRef(name, Const(s)), arrivals) for name, count, arrivals in arrays for s in range(count)]
    head = [MBarrierAlloc(name, count) for name, count, _ in arrays]
    cluster = kernel.cluster != (1, 1)
    head += [
        IfThenElse(thread0, [MBarrierInit(r, as_scalar(a)) for r, a in refs] + [Fence("mbarrier_init")]),
        # a cluster's peers arrive on these barriers and multicast into this CTA's
        # stages: its barriers initialized (fence.mbarrier_init.release.cluster) first
        ClusterSync("every CTA of the cluster has initialized its barriers before any peer uses them")
        if cluster
        else BlockSync("barriers initialized before any thread uses them"),
    ]
    returns = []
    walk(kernel.body, lambda n, _s: returns.append(n) if isinstance(n, Return) else None)
    tail = []
    if cluster:
        # a CTA must not exit (its shared memory and barriers gone) while a peer may
        # still multicast into it or arrive on its barriers
        assert not returns, f"{kernel.name}: a role returns early in a cluster kernel"
        tail = [
            ClusterSync(
                "no CTA exits while its peers may still write to its stages or arrive on its barriers"
            ),
            IfThenElse(thread0, [MBarrierInval(r) for r, _ in refs]),
        ]
    elif not returns:  # a role that returned early could not join the last sync
        tail = [
            BlockSync("every wait is done before the barriers go"),
            IfThenElse(thread0, [MBarrierInval(r) for r, _ in refs]),
        ]
    kernel.body = head + kernel.body + tail
    return kernel
