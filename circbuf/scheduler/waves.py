"""Wave counts of a tile grid: the model the matmul heuristics use to pick
a narrow tile for a small M (decode) and a split-K count (few tiles).

A GEMM with M <= 64 is memory-bound: its time is that of streaming B (the
weight). With [64 x bn] tiles and one CTA per SM at a time, the SM that
runs the most tiles streams ``ceil(tiles / SMs) x bn`` columns of B, so the
best bn is the one that minimizes that product (ties to the wider tile:
fewer reloads of A, fewer epilogues).

>>> small_m_bn(1, 4096, 1, 132)      # 64 tiles of 64 columns: one wave
64
>>> small_m_bn(1, 14336, 1, 132)     # 112 tiles of 128 = 2 waves of 224 tiles of 64
128
>>> small_m_bn(1, 128256, 1, 132)    # 501 tiles of 256: 4 waves (95% full)
256
"""

from __future__ import annotations

SMALL_M = 64  # M up to one m64 wgmma: 64-row tiles, one warpgroup per tile (ping-pong)
NARROW_BN = (256, 128, 64)
# ring slots a small-M tile may take (shared memory permitting): 12 slots of a 64x64
# tile hold 96 KB of B in flight per SM, the 7 of a large tile's cap 56 KB
SMALL_M_STAGES = 12  # multiples of 64: one 128-byte swizzle atom of a 16-bit N-major B


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_count(m: int, n: int, batch: int, bm: int, bn: int) -> int:
    return batch * ceil_div(m, bm) * ceil_div(n, bn)


def small_m_bn(m: int, n: int, batch: int, sm_count: int) -> int:
    """The bn of a [64 x bn] tile for a small-M GEMM: least columns of B
    streamed by the busiest SM (``ceil(tiles / SMs) x bn``), ties to the wider."""
    best = None
    for bn in NARROW_BN:
        cost = ceil_div(tile_count(m, n, batch, 64, bn), sm_count) * bn
        if best is None or cost < best[0]:
            best = (cost, bn)
    return best[1]
