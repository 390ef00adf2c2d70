"""What the heuristics know about the inputs of one compile: sizes, strides,
pointer alignment, and the GPU (its Target). Built by the runtime from torch tensors;
plain ints here."""

from __future__ import annotations

from dataclasses import dataclass

from ..target import DEFAULT, Target


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
    target: Target = DEFAULT  # the GPU's limits (an H100 when compiling without one)
    # torch would run an fp32 matmul on TF32 tensor cores now (circbuf.runtime.precision);
    # read only for fusions with an fp32 matmul
    tf32: bool = False

    def __hash__(self):
        return hash(self.tensors)
