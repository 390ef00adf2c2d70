"""Step 8: a deeper ring (4+ stages) and setmaxnreg per role.

    python examples/gemm_ladder/step08_deep_ring.py [--shape M N K]

A 2-slot ring lets the producer run one k step ahead: one TMA latency hidden
behind one k step of wgmmas, which is not enough at full speed. Now the ring
holds as many [128 x 64] + [128 x 64] stages as shared memory keeps beside the
epilogue's staging and hand-off (at most 7; 4 or more), and the producer runs
``stages - 1`` copies ahead. The roles rebalance the register file with
``setmaxnreg``: the producer warpgroup drops to 40 registers a thread, the
consumer rises to 232 (its 64 accumulator registers and the wgmma operands),
the epilogue warpgroup takes 168 (what each thread started with:
384 threads x 168 fit an SM's 65536), within 128 x (40 + 232 + 168) registers.

What changed from step 7 (the schedule is step 7's ``build``):

    xs.circular_buffer(STAGES, STAGES - 1, cb.WarpSpecialized(on=P.TIDy, registers=(40, 232)), axis=ring)
    h.circular_buffer(2, 1, cb.WarpSpecialized(..., readers="epilogue", registers=168), axis=x - 1)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
import step07_roles  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (8192, 8192, 8192), (384, 256, 512)
BM, BN, BK = step07_roles.BM, step07_roles.BN, step07_roles.BK
REGISTERS, EPILOGUE_REGISTERS = (40, 232), 168


def stages(target) -> int:
    """As many operand stages as shared memory holds beside the output staging
    ([2][64][64] bf16) and the hand-off ring ([2][64][64] fp32), at most 7."""
    left = target.smem_per_block - 1024 - 2 * 64 * 64 * 2 - 2 * 64 * 64 * 4
    return min(left // ((BM + BN) * BK * 2), 7)


def build(M, N, K, target=cb.target.DEFAULT):
    return step07_roles.build(
        M, N, K, target, stages=stages(target), registers=REGISTERS, epilogue_registers=EPILOGUE_REGISTERS
    )


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 8)
