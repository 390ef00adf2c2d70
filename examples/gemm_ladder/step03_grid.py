"""Step 3: a grid of CTAs over M and N.

    python examples/gemm_ladder/step03_grid.py [--shape M N K]

Any M and N now: the output is cut into [128 x 128] tiles, one CTA per tile.
The tile loop that steps 1-2 ran once is bound to ``blockIdx.x`` (M tiles
outer, N tiles inner: consecutive CTAs share an A panel), in every tensor
alike: the operands' TMA boxes, the accumulator and the output. Ragged edges
need nothing: TMA zero-fills loads past the edge and the stores are predicated
(rows must be 16-byte aligned for the tensor maps: K and N multiples of 8).

What changed from step 2:

    def tiles(tv):
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3, ...]).merge(0)
        tv.axis(0).parallelize(P.BIDx)     # new: one CTA per tile
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
from ladder import P, accumulator, epilogue, mma_form, operand_boxes  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (8192, 8192, 8192), (256, 384, 128)
BM, BN, BK = 128, 128, 64


def build(M, N, K, target=cb.target.DEFAULT):
    fd = ladder.linear_fusion(M, N, K)
    acc, As, Bs = mma_form(fd.fusion)
    d = fd.fusion.outputs[0]

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
    epilogue(d, tiles(d))
    return fd


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 3)
