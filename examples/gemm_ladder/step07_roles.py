"""Step 7: warp specialization: a producer warp, a consumer warpgroup, an epilogue role.

    python examples/gemm_ladder/step07_roles.py [--shape M N K]

Three roles, one per row of 128 threads (``threadIdx.y``): the producer warp
(its elected lane issues the TMA loads; there since step 1), the consumer
warpgroup (wgmmas only) and, new, an epilogue warpgroup. The consumer hands
each finished [64 x 64] fp32 sub-tile of its accumulator to the epilogue
role through a ring of 2 shared-memory slots filled by its own threads
(``WarpSpecialized(fill="threads", readers="epilogue")``: full/empty mbarriers,
the consumer arrives after writing, the epilogue after reading) and goes on
to the next tile's MMAs while the epilogue role casts, stages and TMA-stores.

What changed from step 6:

    h = acc.cache_after()                  # new: the accumulator handed over in shared memory
    h.set_memory_type(cb.MemoryType.Shared)
    epilogue(h, tiles(h), buffers=2)       # a [64 x 64] fp32 sub-tile per slot
    x = index of h's threadIdx.x axis; j, hh, e = h.loop[x + 1 : x + 4]
    h.set_allocation([j, hh, h.loop[x], e])   # thread-major: no bank conflicts on either side
    e.parallelize(P.Vectorize)                # an accumulator pair per 8-byte store
    h.circular_buffer(2, 1, cb.WarpSpecialized(on=P.TIDy, fill="threads", readers="epilogue"), axis=x - 1)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
from ladder import P, accumulator, epilogue, mma_form, operand_boxes, staging_tile  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (8192, 8192, 8192), (384, 256, 256)
BM, BN, BK = 128, 128, 64
STAGES, REGISTERS, EPILOGUE_REGISTERS = 2, None, None


def build(M, N, K, target=cb.target.DEFAULT, stages=None, registers=None, epilogue_registers=None):
    stages = stages or STAGES
    tm, tn = -(-M // BM), -(-N // BN)
    G = min(tm * tn, target.sm_count)
    group = next((g for g in (8, 4, 2) if tm % g == 0), 1)
    fd = ladder.linear_fusion(M, N, K)
    f = fd.fusion
    acc, As, Bs = mma_form(f)
    d = f.outputs[0]
    h = acc.cache_after()
    h.set_memory_type(cb.MemoryType.Shared)
    cs = d.cache_before(op="tma")
    cr = cs.cache_before()

    def tiles(tv):  # [M, N, K?] -> [T/G, G (blockIdx.x), Mi, Ni, K?]
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3] + list(range(4, len(tv.loop))))
        tv.split(0, group).reorder([0, 2, 1] + list(range(3, len(tv.loop))))
        tv.merge(0).merge(0)
        tv.split(0, G)
        tv.axis(1).parallelize(P.BIDx)
        return 2

    for xs, mn_first in ((As, True), (Bs, False)):
        ring = operand_boxes(xs, tiles(xs), BK, mn_first)
        xs.circular_buffer(stages, stages - 1, cb.WarpSpecialized(on=P.TIDy, registers=registers), axis=ring)
    accumulator(acc, tiles(acc), BK)
    acc.inline_at(2)
    epilogue(h, tiles(h), buffers=2)
    x = next(k for k, a in enumerate(h.loop) if a.parallel_type == P.TIDx)
    j, hh, e = h.loop[x + 1 : x + 4]
    h.set_allocation([j, hh, h.loop[x], e])
    e.parallelize(P.Vectorize)
    handoff = cb.WarpSpecialized(on=P.TIDy, fill="threads", readers="epilogue", registers=epilogue_registers)
    h.circular_buffer(2, 1, handoff, axis=x - 1)
    epilogue(d, tiles(d), buffers=2, box=True)
    staging_tile(cs, epilogue(cs, tiles(cs), buffers=2))
    epilogue(cr, tiles(cr), buffers=2)
    cr.set_memory_type(cb.MemoryType.Local)
    cr.inline_at(len(cr.loop) - 1)
    return fd


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 7)
