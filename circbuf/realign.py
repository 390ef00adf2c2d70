"""The realigned run of a matmul fusion (:mod:`circbuf.scheduler.realign`
says which operands and why): each such operand copied into a buffer whose
rows a tensor map can describe, then the fusion's own plan for the copies'
signature (the TMA path). The copies are new tensors from torch's caching
allocator on every call (the same blocks, call after call), written by one
launch of circbuf's row copy (:mod:`circbuf.runtime.row_copy`: 16-byte
loads and stores) where it takes them, else by torch's ``copy_``."""

from __future__ import annotations

from .scheduler.realign import realigned_strides


def realigned(x, copy: bool = True, unit: int | None = None):
    """``x``'s values (with ``copy=False``, its shape only) in a buffer whose
    rows are 16-byte aligned (``unit``: the axis, -1 or -2, made contiguous)."""
    import torch

    y = torch.empty_strided(x.shape, realigned_strides(tuple(x.shape), x.stride(), x.element_size(), unit),
                            dtype=x.dtype, device=x.device)  # fmt: skip
    return y.copy_(x) if copy else y


def substitute(inputs, positions, copy: bool = True) -> list:
    """``inputs`` with the operands ``positions`` names (scheduler.realign.choose's
    ``(position, unit)`` pairs) copied."""
    new = list(inputs)
    for j, unit in positions:
        new[j] = realigned(inputs[j], copy, unit)
    return new


class RealignPlan:
    """The launch plan for one input signature: copy the operands at
    ``positions``, then run the executor's plan for the copies' signature."""

    __slots__ = ("ex", "positions", "scalar_slots", "inner", "names", "strides", "rows", "copy")

    def __init__(self, ex, positions, scalar_slots):
        self.ex, self.positions, self.scalar_slots = ex, positions, scalar_slots
        self.names = tuple(
            ex.fusion.inputs[j].name for j, _ in positions
        )  # what ex.realigned says after a run
        self.inner = None  # the plan of the realigned signature, once made
        self.strides = None  # each copy's strides: one signature (sizes, strides) per plan
        self.rows = ()  # which copies the row copy makes (indices into positions) ...
        self.copy = None  # ... in this launch, bound at the first call

    def run(self, inputs, finish=True):
        import torch

        from .runtime.executor import SegmentedPlan

        if self.strides is None:
            self.strides = [
                realigned_strides(tuple(inputs[j].shape), inputs[j].stride(), inputs[j].element_size(), unit)
                for j, unit in self.positions
            ]
        new = list(inputs)
        pairs = []
        for (j, _), st in zip(self.positions, self.strides):
            x = inputs[j]
            new[j] = torch.empty_strided(x.shape, st, dtype=x.dtype, device=x.device)
            pairs.append((x, new[j]))
        if self.copy is None:
            self.rows, self.copy = _row_copy(pairs)
        for k, (x, y) in enumerate(pairs):
            if k not in self.rows:
                y.copy_(x)
        if self.rows:
            self.copy([pairs[k] for k in self.rows])
        if self.inner is None:
            self.inner = self.ex._plan(new)
        if isinstance(self.inner, SegmentedPlan):
            out = self.inner.run(new)  # (a segmented plan finishes its outputs itself)
        else:
            out = self.inner.run(new, finish)
        self.ex.realigned = self.names  # (after the run: a compile on the way resets it)
        return out


def _row_copy(pairs) -> tuple:
    """``(indices, launch)``: which of the ``(src, dst)`` copies circbuf's row
    copy makes, and its launch bound to their shapes (``((), False)``: none;
    torch's ``copy_`` makes the rest)."""
    from . import knobs
    from .runtime import driver, row_copy

    if not knobs.row_copy() or not pairs or not all(x.is_cuda for x, _ in pairs):
        return (), False
    jobs = [(k, row_copy.job_of(x, y)) for k, (x, y) in enumerate(pairs)]
    jobs = [(k, j) for k, j in jobs if j is not None][: row_copy.MAX_JOBS]
    if not jobs:
        return (), False
    index = driver.device_index(pairs[0][0].device)
    return tuple(k for k, _ in jobs), row_copy.copier(index).bind([j for _, j in jobs])
