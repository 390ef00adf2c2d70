"""Step 5: a pipelined ring of 2 stages (prefetch while computing).

    python examples/gemm_ladder/step05_ring.py [--shape M N K]

The operand tiles go through a ring of 2 shared-memory slots: the producer
warp fills slot ``k % 2`` for k step ``k`` while the consumer warpgroup runs
the wgmmas of step ``k - 1`` on the other slot. Each slot has a ``full``
mbarrier (the producer's ``arrive.expect_tx``, the TMA's bytes complete it)
and an ``empty`` one (the consumer releases the slot once the wgmmas that
read it are retired by ``wgmma.wait_group 1`` one k step later); each side
keeps a stage index and a phase bit (``ab_load_stage``, ``ab_use_phase``).

What changed from step 4: nothing. circbuf cannot feed wgmma without this
ring (step 1's docstring says why), so steps 1-4 already ran it; the call that
asks for it is the same line since step 1:

    xs.circular_buffer(2, 1, cb.WarpSpecialized(on=P.TIDy), axis=ring)   # 2 slots, 1 copy ahead

A ``Pipelined`` ring (every thread computes, one thread issues copies ahead,
no producer warp: the seed's step 5) is refused for wgmma readers
(``circular_buffer`` pass: it would refill a slot the asynchronous wgmmas may
still read). ``tests/test_gemm_ladder.py`` checks that this kernel is step 4's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
from ladder import P, accumulator, epilogue, mma_form, operand_boxes, staging_tile  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (8192, 8192, 8192), (256, 384, 128)
BM, BN, BK = 128, 128, 64


def build(M, N, K, target=cb.target.DEFAULT):
    fd = ladder.linear_fusion(M, N, K)
    f = fd.fusion
    acc, As, Bs = mma_form(f)
    d = f.outputs[0]
    cs = d.cache_before(op="tma")
    cr = cs.cache_before()

    def tiles(tv):  # [M, N, K?] -> [tile (blockIdx.x), Mi, Ni, K?]
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3] + list(range(4, len(tv.loop))))
        tv.merge(0)
        tv.axis(0).parallelize(P.BIDx)
        return 1

    for xs, mn_first in ((As, True), (Bs, False)):
        ring = operand_boxes(xs, tiles(xs), BK, mn_first)
        xs.circular_buffer(2, 1, cb.WarpSpecialized(on=P.TIDy), axis=ring)
    accumulator(acc, tiles(acc), BK)
    acc.inline_at(1)
    epilogue(d, tiles(d), buffers=2, box=True)
    staging_tile(cs, epilogue(cs, tiles(cs), buffers=2))
    epilogue(cr, tiles(cr), buffers=2)
    cr.set_memory_type(cb.MemoryType.Local)
    cr.inline_at(len(cr.loop) - 1)
    return fd


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 5)
