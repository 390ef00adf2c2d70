"""The interpreter's semantics of the peer-store nodes (issue 22,
:mod:`circbuf.lowering.peer_stores`), and the protocol rules the checker
holds them to.

- ``PeerTmaStore``: a TMA store (it lands at a random later step, like any
  other) into the peer's buffer, remembered with its tile index.
- ``PeerSignal``: the bulk-group wait, then ``+1`` on each peer's flag
  (release). A flag released while a store of its tile is still in flight
  ("flag before the data": a missing or too-weak ``wait_group``) is an
  error, and so is a store of a tile whose flag was already released (the
  signal placed before the tile's stores).
- ``FlagWait``: blocks until the flag reaches the target (acquire); a flag
  no writer will release is a deadlock naming the flag, the target and the
  value it holds (on the GPU: the wait's timeout), never a hang.
"""

from __future__ import annotations

from ..ir import CircbufError
from ..lowering import kir
from ..lowering.peer_stores import FlagWait, PeerSignal, PeerTileVar, PeerTmaStore
from .sched import Wait, Waitable


def _peer_store(th, n):
    from .machine import _tma_store

    yield from _tma_store(th, n)
    tile = th.env[n.tile.name]
    op = th.bulk.open[-1]
    released = th.__dict__.setdefault("peer_released", set())
    if tile in released:
        raise CircbufError(
            f"{th.cta.kernel_name}: {th.who()} stores tile {tile} to peer {n.peer} ({op.geo.name}) after "
            f"that tile's flag was released: a peer may read the tile before its data (the flag must "
            "follow the tile's stores)"
        )
    th.__dict__.setdefault("peer_ops", []).append((tile, n.peer, op))


def _peer_tile_var(th, n):
    th.env[n.var.name] = -1


def _peer_signal(th, n):
    from .machine import _bulk_wait

    wait = n.__dict__.get("_wait")
    if wait is None:
        wait = n._wait = kir.BulkWaitGroup(n.pending, read=False)
        n._index = n.index()
    yield from _bulk_wait(th, wait)
    env = th.env
    prev = env[n.prev.name]
    if prev >= 0:
        ops = th.__dict__.get("peer_ops", [])
        for tile, peer, op in ops:
            if tile == prev and not op.done:
                raise CircbufError(
                    f"{th.cta.kernel_name}: {th.who()} releases the flag of tile {prev} while its TMA "
                    f"store to peer {peer} ({op.geo.name}) is still in flight: the peer may read the tile "
                    "before its data lands (wait for the tile's bulk groups before the release)"
                )
        th.peer_ops = [x for x in ops if not x[2].done]
        idx = th.prog.sc(n._index)(env)
        glob = th.cta.glob
        for f in n.flags:
            vals, off, span = glob.data(f.name)
            if not 0 <= idx < span:
                raise CircbufError(
                    f"{th.cta.kernel_name}: {th.who()} releases flag {f.name}[{idx}] of {span}"
                )
            vals[off + idx] += 1
            glob.mark(f.name)
        th.__dict__.setdefault("peer_released", set()).add(prev)
    if n.tile is not None:
        env[n.prev.name] = th.prog.sc(n.tile)(env)


class FlagReached(Wait):
    def __init__(self, vals, pos, target, name, idx):
        self.obj = Waitable()  # nothing in this launch moves it: only another rank's kernel
        self.vals, self.pos, self.target, self.name, self.idx = vals, pos, target, name, idx

    def ready(self, task) -> bool:
        return ((self.vals[self.pos] - self.target + 2**31) % 2**32) - 2**31 >= 0

    def describe(self) -> str:
        return (
            f"waits on flag {self.name}[{self.idx}] >= {self.target} (acquire) and it holds "
            f"{self.vals[self.pos]}: the tile's writer never released it (a flag wait that never "
            "completes; on the GPU, the wait's timeout)"
        )


def _flag_wait(th, n):
    env, sc = th.env, th.prog.sc
    idx, target = sc(n.index)(env), sc(n.target)(env)
    vals, off, span = th.cta.glob.data(n.flags.name)
    if not 0 <= idx < span:
        raise CircbufError(f"{th.cta.kernel_name}: {th.who()} waits on flag {n.flags.name}[{idx}] of {span}")
    w = FlagReached(vals, off + idx, target, n.flags.name, idx)
    if not w.ready(th):
        yield w


HANDLERS = {
    PeerTmaStore: (_peer_store, None),
    PeerTileVar: (None, _peer_tile_var),
    PeerSignal: (_peer_signal, None),
    FlagWait: (_flag_wait, None),
}
