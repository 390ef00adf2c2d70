"""Step 4: TMA loads and a TMA store (mbarrier completion).

    python examples/gemm_ladder/step04_tma_store.py [--shape M N K]

The loads have been TMA since step 1 (the only way circbuf feeds wgmma): one
elected producer thread issues ``cp.async.bulk.tensor`` per [128 x 64] box and
announces the bytes on the slot's ``full`` mbarrier (``arrive.expect_tx``);
the consumers wait on its phase. This step moves the store to TMA too: each
warpgroup casts a [64 x 64] sub-tile of its fragment to bf16 into a 128-byte
swizzled staging tile in shared memory (two, alternating), then one elected
thread stores it with ``cp.async.bulk.tensor`` (after ``fence.proxy.async``
and a named barrier; ``cp.async.bulk.wait_group.read`` before the buffer is
written again). The ``tma_store`` pass derives those fences and waits.

What changed from step 3:

    cs = d.cache_before(op="tma")          # the shared staging tile the TMA store reads
    cr = cs.cache_before()                 # the epilogue's last value, in registers
    epilogue(d, pos, buffers=2, box=True)  # d: a [64 x 64] box per store (Bulk axes)
    staging_tile(cs, epilogue(cs, pos, buffers=2))   # [B][64][64], 128B swizzle
    cr.inline_at(len(cr.loop) - 1)         # a bf16 pair per 4-byte shared store
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
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 4)
