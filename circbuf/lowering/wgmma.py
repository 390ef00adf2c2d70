"""Pass: order warpgroup MMAs against their accumulators.

Requires: indexed; provides: wgmma_synced.

wgmmas run asynchronously: a ``wgmma.fence`` hands the accumulator
registers to the tensor cores before a k step's instructions, a commit
closes them into one group, and ``wgmma.wait_group N`` waits until at most
``N`` groups are in flight. One group per k step, one group kept in flight
(the next step's loads overlap this step's math); all groups are done
before anything reads the accumulators. The k loop is the outermost loop
whose index decides ``scale_d`` (the first k step of a tile overwrites the
accumulator).

Before::

    FOR t in blockIdx.x..T step gridDim.x
      FOR k in 0..K
        FOR kw in 0..4
          WGMMA acc += A[k, kw] x B[k, kw] scale_d=!(k == 0 && kw == 0)
      ... epilogue reads acc ...

After::

    FOR t in blockIdx.x..T step gridDim.x
      FOR k in 0..K
        WGMMA_FENCE
        FOR kw in 0..4
          WGMMA ...
        WGMMA_COMMIT_GROUP
        WGMMA_WAIT_GROUP 1            // the previous k step's group is done
      WGMMA_WAIT_GROUP 0              // every group is done before the epilogue
      ... epilogue reads acc ...
"""

from __future__ import annotations

from ..ir.scalar import free_vars
from .kir import ForLoop, Kernel, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait, insert_after, insert_before, walk

IN_FLIGHT = 1  # wgmma groups left running at the end of a k step


def k_loop_of(w: Wgmma, loops: list):
    """The loop among ``loops`` whose index the wgmma's scale_d reads (its
    first k step overwrites the accumulator): the k loop, or None when the
    whole reduction is one k step."""
    names = set(free_vars(w.scale_d))
    return next((lp for lp in loops if lp.index.name in names), None)


def wgmma_sync(kernel: Kernel) -> Kernel:
    """Entry: fences, commits and waits around the wgmmas of each k loop."""
    found = []  # (wgmma, enclosing loops)
    walk(kernel.body, lambda n, s: found.append((n, list(s))) if isinstance(n, Wgmma) else None)
    done = set()
    for w, stack in found:
        k_loop = k_loop_of(w, [lp for lp in stack if isinstance(lp, ForLoop)])
        if k_loop is not None:
            if id(k_loop) in done:
                continue
            done.add(id(k_loop))
            k_loop.body = [WgmmaFence(), *k_loop.body, WgmmaCommit(), WgmmaWait(IN_FLIGHT)]
            insert_after(kernel.body, k_loop, [WgmmaWait(0)])
            continue
        # the whole reduction is one k step: one group, waited for at once
        insert_before(kernel.body, w, [WgmmaFence()])
        insert_after(kernel.body, w, [WgmmaCommit(), WgmmaWait(0)])
    return kernel
