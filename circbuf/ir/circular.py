"""Kinds of circular buffering a shared-memory buffer can ask for.

>>> Pipelined(war="mbarrier"), WarpSpecialized(registers=(40, 232))
(Pipelined(war='mbarrier'), WarpSpecialized(on=TIDy, registers=(40, 232)))
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CircbufError
from .iterdomain import ParallelType


@dataclass(frozen=True)
class Pipelined:
    """Every thread loads and computes: one elected thread issues the copies
    ``prefetch`` iterations ahead; ``war`` says how a slot is known free again:
    ``"block_sync"`` (a __syncthreads at the end of each iteration) or
    ``"mbarrier"`` (consumers arrive on an ``empty[stage]`` barrier)."""

    war: str = "block_sync"

    def __post_init__(self):
        if self.war not in ("block_sync", "mbarrier"):
            raise CircbufError(f"Pipelined(war={self.war!r}): war must be 'block_sync' or 'mbarrier'")

    def __repr__(self):
        return f"Pipelined(war={self.war!r})"


# setmaxnreg's operand: a register count per thread of a warpgroup
REGISTERS_RULE = "two multiples of 8 in [24, 256] (setmaxnreg)"


@dataclass(frozen=True)
class WarpSpecialized:
    """A producer row of threads (``on``) only issues copies; the rest compute.
    ``registers=(producer, consumer)`` rebalances registers with setmaxnreg.

    ``fill="threads"``: the buffer is written by the threads that compute
    (a matmul's accumulator handed over a sub-tile at a time) and read by a
    role of its own, ``readers`` (one more row of threads: an epilogue
    warpgroup), each stage passed over by a full/empty mbarrier pair; its
    ``registers`` (one count, or None) is the readers' setmaxnreg.

    >>> WarpSpecialized(fill="threads", readers="epilogue")
    WarpSpecialized(on=TIDy, registers=None, fill='threads', readers='epilogue')
    """

    on: ParallelType = ParallelType.TIDy
    registers: tuple | None = None
    fill: str = "tma"
    readers: str | None = None

    def __post_init__(self):
        if self.on not in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz):
            raise CircbufError(f"WarpSpecialized(on={self.on}): must be a thread parallel type")
        if self.fill not in ("tma", "threads"):
            raise CircbufError(f"WarpSpecialized(fill={self.fill!r}): fill must be 'tma' or 'threads'")
        if (self.fill == "threads") != (self.readers is not None):
            raise CircbufError(
                "WarpSpecialized: fill='threads' names its readers' role (readers=...), tma does not"
            )
        if self.fill == "threads":
            r = self.registers
            if r is not None and not (isinstance(r, int) and 24 <= r <= 256 and r % 8 == 0):
                raise CircbufError(
                    f"WarpSpecialized(registers={r!r}): a threads-filled ring's readers take one count, "
                    "a multiple of 8 in [24, 256] (setmaxnreg)"
                )
        elif self.registers is not None:
            r = self.registers
            ok = (
                isinstance(r, (tuple, list))
                and len(r) == 2
                and all(isinstance(x, int) and 24 <= x <= 256 and x % 8 == 0 for x in r)
            )
            if not ok:
                raise CircbufError(f"WarpSpecialized(registers={r!r}): {REGISTERS_RULE}")

    def __repr__(self):
        more = f", fill={self.fill!r}, readers={self.readers!r}" if self.fill != "tma" else ""
        return f"WarpSpecialized(on={self.on.name}, registers={self.registers}{more})"
