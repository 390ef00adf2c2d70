"""The scheduler of one CTA's cooperating tasks.

Every thread is a generator that runs until its next synchronizing node and
yields a :class:`Wait` (or None: "let others run"). A seeded random choice
picks the next task among the runnable ones, and, now and then, an
asynchronous operation in flight (a TMA copy) to complete, so warp roles
really interleave and a copy lands at any point after its issue. A waiting
task is woken when the object it waits on changes and re-checks its
condition when picked (a wait that polls, as ``mbarrier.try_wait`` does:
a phase that completes and is overtaken before the waiter looks again is
missed, as on the device). When no task can run and nothing is in flight,
the live tasks are deadlocked: :class:`Deadlock` lists what each waits for.
"""

from __future__ import annotations

import random


class Wait:
    """What a blocked task waits for. ``obj`` is the object whose changes
    wake it (it has a ``waiters`` list); ``ready(task)`` is the condition;
    ``describe()`` says what it waits on, for a deadlock report."""

    obj = None

    def ready(self, task) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class Waitable:
    """An object tasks wait on: call :meth:`changed` when its state moves."""

    def __init__(self):
        self.waiters: list = []
        self.sched = None

    def changed(self):
        if self.waiters:
            ws, self.waiters = self.waiters, []
            for t in ws:
                t.sched_wake()


class Deadlock(Exception):
    """Every live task waits and nothing is in flight; ``blocked`` lists the tasks."""

    def __init__(self, blocked):
        super().__init__("deadlock")
        self.blocked = blocked


class Scheduler:
    """Runs ``tasks`` (objects with ``gen``, ``done``, ``waiting``) to the end.
    ``async_ops``: objects with ``complete()`` put in flight by the tasks
    (:meth:`start`). ``async_p``: the chance, at each step, of completing
    one of them rather than running a task."""

    def __init__(self, seed=0, async_p=0.25):
        self.rng = random.Random(seed)
        self.async_p = async_p
        self.runnable: list = []
        self.in_flight: list = []
        self.tasks: list = []
        self.steps = 0

    def add(self, task):
        task.sched = self
        self.tasks.append(task)
        self.runnable.append(task)

    def start(self, op):
        """An asynchronous operation is in flight; it completes at a random later step."""
        self.in_flight.append(op)

    def finish_all(self):
        """Complete everything still in flight (the CTA's end)."""
        while self.in_flight:
            self._complete(self.rng.randrange(len(self.in_flight)))

    def _complete(self, k):
        ops = self.in_flight
        op = ops[k]
        ops[k] = ops[-1]
        ops.pop()
        op.complete()

    def run(self):
        rng, runnable, ops = self.rng, self.runnable, self.in_flight
        while True:
            if ops and (not runnable or rng.random() < self.async_p):
                self._complete(rng.randrange(len(ops)))
                continue
            if not runnable:
                break
            k = rng.randrange(len(runnable))
            t = runnable[k]
            runnable[k] = runnable[-1]
            runnable.pop()
            w = t.waiting
            if w is not None:
                if not w.ready(t):
                    w.obj.waiters.append(t)
                    continue
                t.waiting = None
            self.steps += 1
            try:
                w = next(t.gen)
            except StopIteration:
                t.done = True
                t.on_exit()
                continue
            t.waiting = w
            if w is None or w.ready(t):
                runnable.append(t)
            else:
                w.obj.waiters.append(t)
        blocked = [t for t in self.tasks if not t.done]
        if blocked:
            raise Deadlock(blocked)
