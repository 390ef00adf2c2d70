"""Step 1: one 128x128x64 tile: operands in shared memory, one warpgroup's wgmmas.

    python examples/gemm_ladder/step01_one_tile.py

D[128, 128] = A[128, 64] @ B[128, 64].T: no loops at all. The operand tiles
are staged in 128-byte swizzled shared memory (``operand_boxes``: [128 x 64]
boxes, a 128-byte row per M or N index), one warpgroup (128 threads) issues
``wgmma.m64n128k16`` (2 row blocks x 4 k16 slices) into fp32 registers laid out
as the wgmma fragment (``accumulator``), and each thread casts its fragment to
bf16 and stores it straight to global memory (``epilogue``).

The schedule:

    acc, As, Bs = mma_form(fd.fusion)          # acc = mma(As, Bs): As, Bs in shared memory
    def tiles(tv):                             # [M, N, K?] -> [tile{1}, Mi{128}, Ni{128}, K?]
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3, ...]).merge(0)
    for xs in (As, Bs):
        tiles(xs); ring = operand_boxes(xs, 1, BK, ...)  # [tile, Ko{1}, Kc{1}, MN, -, K64]: TMA boxes
        xs.circular_buffer(2, 1, cb.WarpSpecialized(on=P.TIDy), axis=ring)
    tiles(acc); accumulator(acc, 1, BK)        # threadIdx.x and the MMA registers
    acc.inline_at(1)                           # inside the (one-trip) tile loop
    tiles(d); epilogue(d, 1)                   # stored from the fragment registers

Not expressible in circbuf (the seed's step 1 loads synchronously with every
thread): circbuf feeds wgmma only from a shared buffer filled by TMA through a
warp-specialized ring: a producer warp (``threadIdx.y == 1``) issues the TMA
copies, completion is an mbarrier's transaction count, and the consumer
releases a slot after ``wgmma.wait_group``. A ``Pipelined`` ring is refused
for wgmma readers, and an operand written into shared memory by the threads'
own stores is refused by name (the lowering places no ``fence.proxy.async``
or barrier between those stores and the wgmmas, the async proxy, that read
them; README, "What circbuf cannot express").
So this step already has the TMA loads of step 4, a 2-slot ring and the
producer warp of step 7; with one k step and one tile nothing overlaps.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
from ladder import P, accumulator, epilogue, mma_form, operand_boxes  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (128, 128, 64), (128, 128, 64)
BM, BN, BK = 128, 128, 64


def build(M, N, K, target=cb.target.DEFAULT):
    if (M, N, K) != (BM, BN, BK):
        raise cb.CircbufError(f"step 1 computes exactly one {BM}x{BN}x{BK} tile, not {M}x{N}x{K}")
    fd = ladder.linear_fusion(M, N, K)
    acc, As, Bs = mma_form(fd.fusion)
    d = fd.fusion.outputs[0]

    def tiles(tv):  # [M, N, K?] -> [tile, Mi, Ni, K?]: one tile, a loop of one trip
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3] + list(range(4, len(tv.loop))))
        tv.merge(0)
        return 1

    for xs, mn_first in ((As, True), (Bs, False)):
        ring = operand_boxes(xs, tiles(xs), BK, mn_first)  # TMA boxes need split axes
        xs.circular_buffer(2, 1, cb.WarpSpecialized(on=P.TIDy), axis=ring)
    accumulator(acc, tiles(acc), BK)
    acc.inline_at(1)
    epilogue(d, tiles(d))
    return fd


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 1)
