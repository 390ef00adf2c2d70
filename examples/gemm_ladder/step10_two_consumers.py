"""Step 10: two consumer warpgroups: the final kernel, the one the heuristic produces.

    python examples/gemm_ladder/step10_two_consumers.py [--pingpong] [--shape M N K]

Two MMA warpgroups share the tensor cores. Cooperative (the default, and what
``fd.fusion.schedule()``'s heuristic picks for this fusion): the tile grows to
[128 x 256] and the warpgroups split its rows (``threadIdx.y``, 64 rows each),
so each B tile in shared memory feeds twice the MMAs. ``--pingpong``: each
warpgroup owns whole [128 x 128] tiles, every other one, and they take turns
(``acc.take_turns(TIDy)``): one runs its MMAs while the other runs its epilogue.

What changed from step 8:

    BM, BN = 128, 256                             # cooperative
    accumulator(acc, pos, BK, warpgroups=2)       # threadIdx.y splits the rows
    epilogue(tv, pos, warpgroups=2, buffers=2)    # and the epilogue's
    # ping-pong instead: tiles split by 2 over threadIdx.y, acc.take_turns(P.TIDy)

The epilogue role of steps 7-8 is gone again: measured on an H100 it was slower
than the MMA warpgroups running the epilogue themselves (NOTES.md, issue on
warp roles: 512 threads compile at 128 registers each), so the heuristic keeps
the epilogue inline, and so does this step. No cluster (step 9) either: the
heuristic does not use one today. Stages, grid, raster group and registers are
the heuristic's rules, written out here for this shape (``heuristic_knobs``).

``same_as_heuristic(M, N, K)`` compiles this schedule and the heuristic's for
the same shape and compares the CUDA source (kernel name aside):
``tests/test_gemm_ladder.py`` checks it is identical.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
from ladder import P, accumulator, epilogue, mma_form, operand_boxes, staging_tile  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (8192, 8192, 8192), (384, 512, 256)
SMEM_RESERVED = 1024  # barriers and alignment


def heuristic_knobs(M, N, K, target, pingpong=False):
    """The matmul heuristic's choices for this fusion, written out: tile, ring
    stages (as many as shared memory holds beside the output staging, at most
    7), persistent grid (one CTA per SM), raster (M fastest where N >= M) and
    band (8, 4 or 2 tiles where the bands leave under 5% holes)."""
    BM, BN, BK = (128, 128, 64) if pingpong or N <= 128 else (128, 256, 64)
    buffers = 2 if (BN // 64) % 2 == 0 else 1
    staging = buffers * 2 * 64 * 64 * 2  # [B][2 warpgroups][64][64] bf16
    stages = min((target.smem_per_block - SMEM_RESERVED - staging) // ((BM + BN) * BK * 2), 7)
    tm, tn = -(-M // BM), -(-N // BN)
    raster = "M" if N >= M else "N"
    along = tm if raster == "M" else tn
    group = next((g for g in (8, 4, 2) if along >= g and -(-along // g) * g - along <= 0.05 * along), 1)
    return dict(tile=(BM, BN, BK), stages=stages, grid=min(tm * tn, target.sm_count), raster=raster, group=group,
                buffers=buffers)  # fmt: skip


def build(M, N, K, target=cb.target.DEFAULT, pingpong=None):
    if pingpong is None:
        pingpong = "--pingpong" in sys.argv
    knobs = heuristic_knobs(M, N, K, target, pingpong)
    (BM, BN, BK), G, group = knobs["tile"], knobs["grid"], knobs["group"]
    W = 1 if pingpong else 2  # warpgroups per tile
    fd = ladder.linear_fusion(M, N, K)
    f = fd.fusion
    acc, As, Bs = mma_form(f)
    d = f.outputs[0]
    cs = d.cache_before(op="tma")  # the shared staging tile the TMA store reads
    cr = cs.cache_before()  # the epilogue's last value, in registers

    def tiles(tv, split_turns=pingpong):
        tv.split(0, BM).split(2, BN).reorder([0, 2, 1, 3] + list(range(4, len(tv.loop))))
        if knobs["raster"] == "M":  # bands of `group` M tiles, M fastest inside a band
            tv.split(0, group).reorder([0, 2, 1] + list(range(3, len(tv.loop))))
        else:
            tv.split(1, group).reorder([1, 0, 2] + list(range(3, len(tv.loop))))
        tv.merge(0).merge(0)
        tv.split(0, G)  # [T/G, G, ..]
        if split_turns:  # ping-pong: the warpgroups take every other tile
            tv.split(0, 2)  # [T/G/2, W, G, ..]
            tv.axis(1).parallelize(P.TIDy)
            tv.axis(2).parallelize(P.BIDx)
            return 3
        tv.axis(1).parallelize(P.BIDx)
        return 2

    for xs, mn_first in ((As, True), (Bs, False)):
        ring = operand_boxes(xs, tiles(xs, split_turns=False), BK, mn_first)
        xs.circular_buffer(knobs["stages"], knobs["stages"] - 1,
                           cb.WarpSpecialized(on=P.TIDy, registers=(40, 232)), axis=ring)  # fmt: skip
    for tv in f.used_tvs():
        if tv.is_input or tv in (As, Bs):
            continue
        pos = tiles(tv)
        if tv is acc:
            accumulator(acc, pos, BK, warpgroups=W, rows=BM)
        elif tv is d:
            epilogue(d, pos, warpgroups=W, rows=BM, buffers=knobs["buffers"], box=True)
        elif tv is cs:
            staging_tile(cs, epilogue(cs, pos, warpgroups=W, rows=BM, buffers=knobs["buffers"]))
        else:
            epilogue(tv, pos, warpgroups=W, rows=BM, buffers=knobs["buffers"])
            tv.set_memory_type(cb.MemoryType.Local)
    acc.inline_at(3)  # the tile loop, the grid and the warpgroup
    if pingpong:
        acc.take_turns(P.TIDy)
    cr.inline_at(len(cr.loop) - 1)  # a bf16 pair for one vector store
    return fd


def same_as_heuristic(M, N, K, pingpong=False):
    """(this step's CUDA source, the heuristic's), kernel names made equal."""
    import torch

    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(N, K, dtype=torch.bfloat16)
    mine = build(M, N, K, pingpong=pingpong).compile([a, b], arch="sm_90a").cuda
    fd = ladder.linear_fusion(M, N, K)
    if pingpong:
        fd.fusion.schedule(pingpong=True)
    theirs = fd.compile([a, b], arch="sm_90a").cuda
    return mine.replace("circbuf_manual", "circbuf_matmul"), theirs


if __name__ == "__main__":
    if "--same" in sys.argv:
        mine, theirs = same_as_heuristic(*SHAPE, pingpong="--pingpong" in sys.argv)
        print("same CUDA source as the heuristic's:", mine == theirs)
        sys.exit(0 if mine == theirs else 1)
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 10)
