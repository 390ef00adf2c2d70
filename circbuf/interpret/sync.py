"""Synchronization objects of one CTA: mbarriers with their phases,
named barriers (and the collectives built on them: block reductions, a
warpgroup's wgmma), each thread's bulk async-groups.

mbarrier semantics (PTX ISA, "mbarrier"): ``init(count)`` starts phase 0
with ``count`` pending arrivals and a transaction count of 0; ``arrive``
takes one pending arrival, ``expect_tx(b)`` adds ``b`` bytes to the
transaction count and the copies' ``complete_tx`` takes them off; the
phase completes when both reach zero, and the next begins with ``count``
pending arrivals. ``try_wait.parity(p)`` returns once the phase of parity
``p`` has completed, which is to say while the current phase's parity is
not ``p`` (a fresh barrier is in phase 0: a wait on parity 1 returns at
once, as the phase "before" it counts as complete).
"""

from __future__ import annotations

from ..ir import CircbufError
from .race import Accum
from .sched import Wait, Waitable


class MBarrier(Waitable):
    def __init__(self, cta, name: str, stage: int):
        super().__init__()
        self.cta, self.name, self.stage = cta, name, stage
        self.count = None  # None: not initialized
        self.pending = 0
        self.tx = 0
        self.phase = 0  # phases completed
        self.invalid = False
        self.acc = Accum() if cta.checker is not None else None
        self.done: dict = {}  # phase -> the clock its completion hands to waiters
        self.init_by = None

    @property
    def label(self) -> str:
        return f"{self.name}[{self.stage}]"

    def _usable(self, th, what):
        if self.count is None or self.invalid:
            state = "invalidated" if self.invalid else "not initialized"
            raise CircbufError(f"{self.cta.kernel_name}: {th.who()} {what} {self.label}, which is {state}")
        if self.init_by is not None and self.cta.checker is not None:
            cid, clk = self.init_by
            if not th.sees(cid, clk):
                raise CircbufError(
                    f"{self.cta.kernel_name}: {th.who()} {what} {self.label} before its initialization "
                    "is visible to it (no fence and barrier after mbarrier.init)"
                )

    def init(self, th, count: int):
        if count <= 0:
            raise CircbufError(f"{self.cta.kernel_name}: {self.label} initialized with {count} arrivals")
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0
        self.invalid = False
        self.init_by = (th.cid, th.clk)

    def inval(self, th):
        self._usable(th, "invalidates")
        if self.waiters:
            raise CircbufError(
                f"{self.cta.kernel_name}: {th.who()} invalidates {self.label} while threads wait on it"
            )
        self.invalid = True

    def arrive(self, th, tx: int = 0):
        self._usable(th, "arrives on")
        if self.acc is not None:
            self.acc.add(th.vc, th.cid, th.clk)
        self.tx += tx
        self.pending -= 1
        if self.pending < 0:
            raise CircbufError(
                f"{self.cta.kernel_name}: {th.who()} arrives on {self.label} in phase {self.phase}, "
                f"which has had its {self.count} arrivals already"
            )
        self._maybe_complete()

    def arrive_async(self, ops):
        """One arrival made by the cp.async unit for a thread
        (``cp.async.mbarrier.arrive.noinc``) once ``ops`` have landed: it
        carries their clocks, not the thread's."""
        if self.count is None or self.invalid:
            raise CircbufError(
                f"{self.cta.kernel_name}: a cp.async arrival on {self.label}, which is not initialized"
            )
        if self.acc is not None:
            for op in ops:
                self.acc.add(op.vc, op.cid, op.clk)
        self.pending -= 1
        if self.pending < 0:
            raise CircbufError(
                f"{self.cta.kernel_name}: a cp.async arrival on {self.label} in phase {self.phase}, "
                f"which has had its {self.count} arrivals already"
            )
        self._maybe_complete()

    def complete_tx(self, op, nbytes: int):
        if self.count is None or self.invalid:
            raise CircbufError(
                f"{self.cta.kernel_name}: {op.who()} completes on {self.label}, which is not initialized"
            )
        if self.acc is not None:
            self.acc.add(op.vc, op.cid, op.clk)
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            if self.acc is not None:
                self.done[self.phase] = self.acc.freeze()
                self.done.pop(self.phase - 2, None)
            self.phase += 1
            self.pending = self.count
            self.changed()

    def state(self) -> str:
        if self.count is None:
            return "not initialized"
        tx = f", {self.tx} transaction bytes outstanding" if self.tx else ""
        return (
            f"in phase {self.phase} (parity {self.phase & 1}), {self.pending} of {self.count} "
            f"arrivals pending{tx}"
        )


class MBarrierWait(Wait):
    __slots__ = ("obj", "parity")

    def __init__(self, bar: MBarrier, parity: int):
        self.obj, self.parity = bar, parity

    def ready(self, task) -> bool:
        return (self.obj.phase & 1) != self.parity

    def describe(self) -> str:
        return f"waits on {self.obj.label} for parity {self.parity} (the barrier is {self.obj.state()})"


class Barrier(Waitable):
    """A named barrier ``bar.sync id, threads`` (id 0 with the block's
    thread count: ``__syncthreads``), or a collective of a fixed group of
    threads (``hb``: whether passing it orders the threads' accesses).
    Arrivals may carry a payload (a reduction's value); ``release``
    computes the results from them."""

    def __init__(self, cta, label: str, hb: bool = True):
        super().__init__()
        self.cta, self.label, self.hb = cta, label, hb
        self.expected = None
        self.arrived: list = []
        self.generation = 0
        self.acc = Accum() if (cta.checker is not None and hb) else None
        self.results: dict = {}  # generation -> {thread lin: result}
        self.release = None  # payload combiner of the open instance
        self.where = None  # the node of a collective (a reduction, a wgmma); None: a plain sync

    def arrive(self, th, threads: int, payload=None, release=None, where=None):
        if self.expected is None:
            self.expected, self.release, self.where = threads, release, where
        elif threads != self.expected:
            first = self.arrived[0][0]
            raise CircbufError(
                f"{self.cta.kernel_name}: {self.label} is reached by {first.who()} expecting "
                f"{self.expected} threads and by {th.who()} expecting {threads}"
            )
        elif where is not self.where:
            first = self.arrived[0][0]
            raise CircbufError(
                f"{self.cta.kernel_name}: {self.label} is reached by {first.who()} at {self.where} and by "
                f"{th.who()} at {where}: one barrier instance, two different synchronizations"
            )
        self.arrived.append((th, payload))
        if self.acc is not None:
            self.acc.add(th.vc, th.cid, th.clk)
        gen = self.generation
        if len(self.arrived) == self.expected:
            arrived, release = self.arrived, self.release
            self.arrived, self.expected, self.release, self.where = [], None, None, None
            if self.acc is not None:
                d = self.acc.freeze()
                for t, _ in arrived:
                    t.vc = d
            if release is not None:
                self.results[gen] = [release(arrived), len(arrived)]
            self.generation += 1
            self.changed()
        return BarrierWait(self, gen)

    def result(self, gen: int, th):
        """The payload result of instance ``gen`` for thread ``th``."""
        r = self.results[gen]
        r[1] -= 1
        if r[1] == 0:
            del self.results[gen]
        return r[0][th.lin]


class BarrierWait(Wait):
    __slots__ = ("obj", "gen")

    def __init__(self, bar: Barrier, gen: int):
        self.obj, self.gen = bar, gen

    def ready(self, task) -> bool:
        return self.obj.generation > self.gen

    def describe(self) -> str:
        b = self.obj
        n = len(b.arrived)
        return f"waits at {b.label} ({n} of {b.expected} threads arrived)"


class BulkGroup:
    """One committed bulk async-group of a thread (its TMA stores)."""

    __slots__ = ("seq", "ops", "left", "ep")

    def __init__(self, seq, ops):
        self.seq, self.ops, self.left = seq, ops, sum(1 for op in ops if not op.done)
        self.ep = None


class BulkWait(Wait):
    __slots__ = ("obj", "upto")

    def __init__(self, th, upto: int):
        self.obj, self.upto = th.bulk, upto

    def ready(self, task) -> bool:
        return all(g.left == 0 for g in self.obj.groups[: self.upto])

    def describe(self) -> str:
        left = sum(1 for g in self.obj.groups[: self.upto] if g.left)
        return f"waits for {left} bulk async-group(s) (cp.async.bulk.wait_group)"


class BulkState(Waitable):
    """A thread's bulk async-groups: the open one and those committed."""

    def __init__(self):
        super().__init__()
        self.open: list = []
        self.groups: list = []

    def op_done(self, op):
        g = op.group
        if g is not None:
            g.left -= 1
            if g.left == 0:
                self.changed()


class CpAsyncState(Waitable):
    """A thread's cp.asyncs: those in flight, in commit groups (the open one
    last); ``cp.async.mbarrier.arrive`` tracks every one in flight."""

    def __init__(self):
        super().__init__()
        self.open: list = []
        self.groups: list = []  # committed: lists of ops
        self.landed: list = []  # landed since the thread's last cp.async.mbarrier.arrive

    def issue(self, op):
        self.open.append(op)

    def in_flight(self) -> list:
        return [op for g in self.groups for op in g if not op.done] + [op for op in self.open if not op.done]

    def for_arrival(self) -> list:
        """The copies a ``cp.async.mbarrier.arrive`` waits for and whose writes it
        carries: those in flight and those landed since the thread's last arrive
        (a copy that landed before the arrive still happens before its phase)."""
        ops = self.landed + self.in_flight()
        self.landed = []
        return ops

    def commit(self):
        self.groups.append(self.open)
        self.open = []

    def op_done(self, op):
        self.landed.append(op)
        self.changed()


class CpAsyncWaitGroup(Wait):
    """``cp.async.wait_group N``: all but the newest ``N`` committed groups landed."""

    __slots__ = ("obj", "upto")

    def __init__(self, state: CpAsyncState, pending: int):
        self.obj, self.upto = state, max(len(state.groups) - pending, 0)

    def ready(self, task) -> bool:
        return all(op.done for g in self.obj.groups[: self.upto] for op in g)

    def retired(self) -> list:
        ops = [op for g in self.obj.groups[: self.upto] for op in g]
        self.obj.groups = self.obj.groups[self.upto :]
        return ops

    def describe(self) -> str:
        left = sum(1 for g in self.obj.groups[: self.upto] if any(not op.done for op in g))
        return f"waits for {left} cp.async group(s) (cp.async.wait_group)"
