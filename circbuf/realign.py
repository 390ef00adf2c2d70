"""The realigned run of a matmul fusion (:mod:`circbuf.scheduler.realign`
says which operands and why): each such operand copied into a buffer whose
rows a tensor map can describe, then the fusion's own plan for the copies'
signature (the TMA path). The copies are new tensors from torch's caching
allocator on every call (the same blocks, call after call)."""

from __future__ import annotations

from .scheduler.realign import realigned_strides


def realigned(x, copy: bool = True):
    """``x``'s values (with ``copy=False``, its shape only) in a buffer whose
    rows are 16-byte aligned."""
    import torch

    y = torch.empty_strided(x.shape, realigned_strides(tuple(x.shape), x.stride(), x.element_size()),
                            dtype=x.dtype, device=x.device)  # fmt: skip
    return y.copy_(x) if copy else y


def substitute(inputs, positions, copy: bool = True) -> list:
    new = list(inputs)
    for j in positions:
        new[j] = realigned(inputs[j], copy)
    return new


class RealignPlan:
    """The launch plan for one input signature: copy the operands at
    ``positions``, then run the executor's plan for the copies' signature."""

    __slots__ = ("ex", "positions", "scalar_slots", "inner")

    def __init__(self, ex, positions, scalar_slots):
        self.ex, self.positions, self.scalar_slots = ex, positions, scalar_slots
        self.inner = None  # the plan of the realigned signature, once made

    def run(self, inputs, finish=True):
        from .runtime.executor import SegmentedPlan

        new = substitute(inputs, self.positions)
        if self.inner is None:
            self.inner = self.ex._plan(new)
            self.ex.realigned = tuple(self.ex.fusion.inputs[j].name for j in self.positions)
        if isinstance(self.inner, SegmentedPlan):
            return self.inner.run(new)  # (a segmented plan finishes its outputs itself)
        return self.inner.run(new, finish)
