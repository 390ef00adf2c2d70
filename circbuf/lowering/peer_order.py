"""Pass: order a reduce-scatter's tiles so each peer's first tiles arrive first (issue 22).

Requires: peer_stores, peer, scalar_params, hoisted, synced; provides: peer_order.

Rank ``r`` of a reduce-scatter sends row block ``d`` of its partial to rank
``d``. Every rank walking the tiles from 0 would make all of them send to
rank 0 first and to rank ``world - 1`` last, so the last rank's reduction
waits for the end of every GEMM. Rotating rank ``r``'s tile order to start
at row block ``r + 1`` spreads the first tiles over the peers and leaves
the rank's own block (no NVLink) for last. The persistent tile loops (the
producer's and the consumers', which must agree) get a rotated index; the
loop body, unchanged, reads the rotated one. It runs last, after the
passes that name loop indices (hoisting puts its ``LET``\\ s first in the
body; the rotation goes before them). An all-gather's tiles go to every
peer, so its order stays.

Before (the names pass has named the tile loop's index and coordinates)::

    FOR tile in blockIdx.x..T step grid
      LET tile_n = ... tile ...

After::

    FOR tile_it in blockIdx.x..T step grid
      LET tile = ((tile_it + ((cb_rank + 1) % W) * (T / W)) % T)
      LET tile_n = ... tile ...
"""

from __future__ import annotations

from ..ir import Var
from .kir import ForLoop, Kernel, Let, walk


def peer_order(kernel: Kernel) -> Kernel:
    """Entry: rotate a reduce-scatter kernel's tile loops by its rank (see the module doc)."""
    peer = kernel.peer
    if peer is None or peer["kind"] != "reduce_scatter":
        return kernel
    world = peer["world"]
    rank = next(v for v in kernel.scalar_params if v.name == "cb_rank")
    loops = []
    walk(kernel.body, lambda n, _s: loops.append(n) if isinstance(n, ForLoop) and n.strided else None)
    for loop in loops:
        tiles = loop.extent
        shift = ((rank + 1) % world) * (tiles // world)
        it = Var(f"{loop.index.name}_it", dtype=loop.index.dtype, lo=loop.index.lo, hi=loop.index.hi)
        loop.body.insert(0, Let(loop.index, (it + shift) % tiles))
        loop.index = it
    return kernel
