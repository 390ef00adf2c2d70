"""What the heuristics know about the inputs of one compile: sizes, strides,
pointer alignment. Built by the runtime from torch tensors; plain ints here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorInfo:
    sizes: tuple
    strides: tuple
    itemsize: int
    align: int  # largest power of two (<= 16) dividing the data pointer, in bytes


@dataclass(frozen=True)
class InputInfo:
    tensors: tuple  # TensorInfo or None (scalar), one per fusion input
    extents: dict  # symbolic extent name -> value
    sm_count: int = 132  # of the target GPU (an H100/H200 when compiling without one)
    smem_per_block: int = 232448  # opt-in dynamic shared memory limit per block, bytes

    def __hash__(self):
        return hash(self.tensors)
