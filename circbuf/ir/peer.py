"""Where a fusion output goes besides its own buffer: peer GPUs (issue 22).

A :class:`PeerStore` on an output TensorView says that the tensor this rank
computes is one shard of a collective over ``world`` ranks (torch's
symmetric memory maps the peers' buffers into this GPU's address space):

- ``"all_gather"``: column-parallel ``linear``: this rank's ``[M, N/world]``
  output is stored into columns ``[rank*N/world, (rank+1)*N/world)`` of every
  rank's ``[M, N]`` buffer;
- ``"reduce_scatter"``: row-parallel ``linear``: this rank's ``[M, N]``
  partial sum is cut into ``world`` row blocks of ``M/world`` rows; block
  ``d`` goes to slot ``rank`` of rank ``d``'s ``[world, M/world, N]``
  staging buffer, which rank ``d`` sums in slot order.

It is a fact about the tensor (like nvFuser's device-mesh sharding), not a
schedule: the matmul scheduler and the lowering read it.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class PeerStore:
    kind: str
    world: int

    def __post_init__(self):
        assert self.kind in KINDS and self.world >= 2, self
