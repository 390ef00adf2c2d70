"""Step 2: a k loop accumulating in registers.

    python examples/gemm_ladder/step02_k_loop.py [--shape 128 128 K]

D[128, 128] = A[128, K] @ B[128, K].T: still one tile and one CTA, but K is
now any multiple of 64: ``accumulator`` splits K into [K/64 (the k loop), 1,
4 x k16], the fp32 fragment stays in registers across the loop (the first
wgmma of the tile starts from zero: its scale-d operand is ``k == 0 ? 0 : 1``),
and the operand ring turns: slot ``k % 2``, its phase bit flipped at each wrap.

What changed from step 1: nothing in the schedule, only K. The split of K by
``BK`` that step 1 wrote with one trip now makes the loop:

    SHAPE = (128, 128, 8192)               # was (128, 128, 64)
    accumulator(acc, tiles(acc), BK)       # K -> [K/BK, BK/64, 4, 16]: the k loop is K/BK trips

Because circbuf's wgmma operands come through a warp-specialized ring (step 1),
the producer warp already loads k step ``k + 1`` while the wgmmas of step ``k``
run: the overlap the seed adds at step 5 is here from this step on.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
from ladder import P, accumulator, epilogue, mma_form, operand_boxes  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (128, 128, 8192), (128, 128, 256)
BM, BN, BK = 128, 128, 64


def build(M, N, K, target=cb.target.DEFAULT):
    if (M, N) != (BM, BN) or K % BK:
        raise cb.CircbufError(
            f"step 2 computes one {BM}x{BN} tile over K a multiple of {BK}, not {M}x{N}x{K}"
        )
    fd = ladder.linear_fusion(M, N, K)
    acc, As, Bs = mma_form(fd.fusion)
    d = fd.fusion.outputs[0]

    def tiles(tv):  # [M, N, K?] -> [tile, Mi, Ni, K?]: one tile, a loop of one trip
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3] + list(range(4, len(tv.loop))))
        tv.merge(0)
        return 1

    for xs, mn_first in ((As, True), (Bs, False)):
        ring = operand_boxes(xs, tiles(xs), BK, mn_first)
        xs.circular_buffer(2, 1, cb.WarpSpecialized(on=P.TIDy), axis=ring)
    accumulator(acc, tiles(acc), BK)  # the k loop: K / BK trips
    acc.inline_at(1)
    epilogue(d, tiles(d))
    return fd


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 2)
