"""The interpreter's semantics of split-K's fix-up (:mod:`circbuf.lowering.split_k`).

``SplitKSum``: each thread of the group publishes its accumulator as its
chunk's partial (a workspace the launch keeps, by tile, chunk and thread);
the group syncs on its named barrier; its thread 0 counts the chunk on the
tile's flag (the last count resets it); a second barrier hands every thread
the answer (``barrier.red.or``), and on the last CTA each thread sums the
chunks in chunk order as read back from the workspace, rounding each sum to
fp32 as the GPU's adds do. CTAs run one after another here, so the last CTA of a
tile in launch order is the one that sums; any order gives the same bits.
"""

from __future__ import annotations

from ..ir import CircbufError, DataType
from ..lowering.split_k import SplitKSum
from .values import converter

_F32 = converter(DataType.Float)


def _any_last(arrived):
    last = any(p[0] for _, p in arrived)
    return {t.lin: last for t, _ in arrived}


def _split_k_sum(th, n):
    env, sc = th.env, th.prog.sc
    if n.acc.name in th.acc_busy:
        th.check_acc(n.acc.name)
    partials, flags = th.cta.launch.split_k_ws
    tile, chunk, g, bid = (sc(x)(env) for x in (n.tile, n.chunk, n.gid, n.barrier))
    if not 0 <= chunk < n.chunks:
        raise CircbufError(f"{th.cta.kernel_name}: {th.who()} publishes chunk {chunk} of {n.chunks}")
    acc = th.local[n.acc.name]
    partials[(tile, chunk, g)] = list(acc[: n.n])
    b = th.cta.named(bid, n.threads, th)
    w = b.arrive(th, n.threads)
    th.tick()
    yield w
    last = False
    if g == 0:
        before = flags.get(tile, 0)
        last = before == n.chunks - 1
        flags[tile] = 0 if last else before + 1
    w = b.arrive(th, n.threads, payload=(last,), release=_any_last, where=n)
    th.tick()
    yield w
    last = b.result(w.gen, th)
    env[n.last.name] = last
    if not last:
        return
    total = None
    for c in range(n.chunks):  # every chunk read back from the workspace, its own too
        got = partials.get((tile, c, g))
        if got is None:
            raise CircbufError(
                f"{th.cta.kernel_name}: {th.who()} sums tile {tile} without chunk {c}'s partial"
            )
        total = list(got) if total is None else [_F32(x + y) for x, y in zip(total, got)]
    acc[: n.n] = total


HANDLERS = {SplitKSum: (_split_k_sum, None)}
