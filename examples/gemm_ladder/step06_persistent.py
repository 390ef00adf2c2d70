"""Step 6: persistent CTAs with a tile scheduler and an L2-friendly raster.

    python examples/gemm_ladder/step06_persistent.py [--shape M N K]

One CTA per SM (``G = min(tiles, SMs)``) walks the tiles ``blockIdx.x,
blockIdx.x + G, ...``: the tile loop is split into [T/G (serial), G
(blockIdx.x)]. The tile index is rasterized in bands of ``group`` M tiles:
inside a band M runs fastest, so the CTAs running at one time share a few B
panels and a few A panels in L2. The ring is one ring across the tile loop and
the k loop: the producer warp runs into the next tile's k steps while the
consumer finishes the last tile's, and the ring never drains between tiles.

What changed from step 5:

    def tiles(tv):
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3, ...])      # [Mo, No, Mi, Ni]
        tv.split(0, GROUP).reorder([0, 2, 1, ...])                   # new: [Mo/g, No, g]: bands of g M tiles
        tv.merge(0).merge(0)                                         # the tile index
        tv.split(0, G)                                               # new: [T/G, G]
        tv.axis(1).parallelize(P.BIDx)                               # new: G persistent CTAs
    acc.inline_at(2)                                                 # was 1: the tile loop and the grid
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


def build(M, N, K, target=cb.target.DEFAULT):
    tm, tn = -(-M // BM), -(-N // BN)
    G = min(tm * tn, target.sm_count)  # one CTA per SM
    group = next((g for g in (8, 4, 2) if tm % g == 0), 1)  # bands that tile M exactly
    fd = ladder.linear_fusion(M, N, K)
    f = fd.fusion
    acc, As, Bs = mma_form(f)
    d = f.outputs[0]
    cs = d.cache_before(op="tma")
    cr = cs.cache_before()

    def tiles(tv):  # [M, N, K?] -> [T/G, G (blockIdx.x), Mi, Ni, K?]
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3] + list(range(4, len(tv.loop))))
        tv.split(0, group).reorder([0, 2, 1] + list(range(3, len(tv.loop))))  # [Mo/g, No, g]
        tv.merge(0).merge(0)
        tv.split(0, G)
        tv.axis(1).parallelize(P.BIDx)
        return 2

    for xs, mn_first in ((As, True), (Bs, False)):
        ring = operand_boxes(xs, tiles(xs), BK, mn_first)
        xs.circular_buffer(2, 1, cb.WarpSpecialized(on=P.TIDy), axis=ring)
    accumulator(acc, tiles(acc), BK)
    acc.inline_at(2)
    epilogue(d, tiles(d), buffers=2, box=True)
    staging_tile(cs, epilogue(cs, tiles(cs), buffers=2))
    epilogue(cr, tiles(cr), buffers=2)
    cr.set_memory_type(cb.MemoryType.Local)
    cr.inline_at(len(cr.loop) - 1)
    return fd


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 6)
