"""Step 9: a 2-CTA cluster with TMA multicast.

    python examples/gemm_ladder/step09_cluster.py [--shape M N K]

Two CTAs of a thread-block cluster take two neighbouring M tiles that share
their B tile: each loads half of that B tile and multicasts it to both
(``cp.async.bulk.tensor ... .multicast::cluster`` with a CTA mask), so B
crosses L2 once per pair; each CTA's ``full`` barrier expects the bytes its
peer sends, a consumer releases a slot to both producers (``mapa`` +
``mbarrier.arrive.shared::cluster``), and cluster barriers guard start and exit.

What changed from step 8 / 10: the cluster shape, asked of the matmul
scheduler, which builds the multicast ring fill:

    fd.fusion.schedule(cluster=(2, 1))     # new: 2 CTAs along M share each B tile

The hand-written steps have no cluster primitive of their own to call, so
this step goes through the scheduler's override on the heuristic's kernel
(step 10's cooperative kernel): the scheduler binds a slice of B's tile to the
cluster parallel type ``CIDx`` and the lowering builds the ring's multicast
fill from it (issue 21, NOTES "Issue 21: clusters and TMA multicast").
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402

import circbuf as cb  # noqa: E402

SHAPE, INTERP_SHAPE = (8192, 8192, 8192), (512, 512, 256)
CLUSTER = (2, 1)


def build(M, N, K, target=cb.target.DEFAULT):
    fd = ladder.linear_fusion(M, N, K)
    fd.fusion.schedule(cluster=CLUSTER)
    return fd


if __name__ == "__main__":
    ladder.run(build, SHAPE, INTERP_SHAPE, __doc__, 9)
