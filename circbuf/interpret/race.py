"""Happens-before tracking of shared memory: the protocol checker's eyes.

Each thread carries a vector clock (``vc``: component -> clock, shared
between threads and never mutated once shared, plus its own ``clk``);
asynchronous agents (a TMA copy, a TMA store, a warpgroup's wgmmas) get
components of their own. Synchronization joins clocks: an mbarrier phase
collects its arrivals' (and its transactions') clocks and hands them to the
waiters that observe its completion, a named barrier joins its threads,
``cp.async.bulk.wait_group`` and ``wgmma.wait_group`` hand over the clocks
of the operations they retire.

Every shared element remembers its last write and the reads since then,
and the asynchronous operations in flight on it. An access that is not
ordered after a conflicting one is a race, reported as a ``CircbufError``
naming the buffer, the ring stage and the two agents (role, thread, ring
position): a producer refilling a stage a consumer has not released, a
consumer reading a stage before the copy into it completed, a TMA store
source rewritten while the store may still read it. Writes by threads that
a bulk copy reads must also be fenced (``fence.proxy.async``) by the writer.
"""

from __future__ import annotations

import bisect

from ..ir import CircbufError


def join(a: dict, b: dict) -> dict:
    """The pointwise maximum of two clocks (a new dict)."""
    if len(a) < len(b):
        a, b = b, a
    out = dict(a)
    for k, v in b.items():
        if out.get(k, 0) < v:
            out[k] = v
    return out


class Accum:
    """Clocks joined as they arrive (an mbarrier phase, a barrier instance).
    Shared clock dicts are merged once each (they are immutable)."""

    __slots__ = ("d", "seen")

    def __init__(self):
        self.d: dict = {}
        self.seen: dict = {}

    def add(self, vc: dict, cid, clk: int):
        if id(vc) not in self.seen:
            self.seen[id(vc)] = vc  # kept alive: the id stays this dict's
            d = self.d
            for k, v in vc.items():
                if d.get(k, 0) < v:
                    d[k] = v
        if self.d.get(cid, 0) < clk:
            self.d[cid] = clk

    def freeze(self) -> dict:
        out, self.d, self.seen = self.d, {}, {}
        return out


class Agent:
    """Something that accesses shared memory with a clock: a thread or an
    asynchronous operation (``vc`` as of its issue, its own ``cid``, ``clk``)."""

    cid = None
    clk = 0
    vc: dict = {}

    def sees(self, comp, clk) -> bool:
        if comp == self.cid:
            return clk <= self.clk
        return self.vc.get(comp, 0) >= clk

    def who(self, clk=None) -> str:
        raise NotImplementedError


class Shadow:
    """The access history of one shared buffer's elements."""

    __slots__ = ("name", "W", "R", "PW", "PR", "ring")

    def __init__(self, name: str, n: int, ring: bool = False):
        self.name, self.ring = name, ring
        self.W = [None] * n  # (comp, clk, agent) of the last write
        self.R = [None] * n  # {comp: (clk, agent)} of the reads since
        self.PW = [None] * n  # an asynchronous write in flight
        self.PR = [None] * n  # asynchronous reads in flight


class Checker:
    """The shadows of one CTA's shared buffers and the race reports.
    ``context``: the machine, which says where an element lies (buffer,
    ring, stage) and who an agent is (role, thread, ring positions)."""

    def __init__(self, context):
        self.ctx = context
        self.shadows: dict = {}
        self._memo: dict = {}

    def shadow(self, name: str, n: int, ring: bool = False) -> Shadow:
        """The shadow of shared buffer ``name`` of ``n`` elements (``ring``:
        a circular buffer's stages, which are never read before a fill)."""
        s = self.shadows.get(name)
        if s is None:
            s = self.shadows[name] = Shadow(name, n, ring)
        return s

    def join(self, a: dict, b: dict) -> dict:
        """``join(a, b)``, memoized: threads that share ``a`` and acquire the
        same ``b`` share the result (the clocks stay shared)."""
        key = (id(a), id(b))
        got = self._memo.get(key)
        if got is None:
            got = join(a, b)
            self._memo[key] = got
            self._memo[(key, "keep")] = (a, b)
        return got

    # ------------------------------------------------------------ threads
    def read(self, th, s: Shadow, i: int, n: int):
        W, R, PW = s.W, s.R, s.PW
        cid, clk = th.cid, th.clk
        for k in range(i, i + n):
            if PW[k] is not None:
                self.race("read", s, k, PW[k], th, pending=True)
            w = W[k]
            if w is None:
                if s.ring:  # a ring stage is read after its fill, always
                    raise CircbufError(
                        f"{self.ctx.kernel_name}: race: {th.who()} reads {self.ctx.where(s, k)} before any "
                        f"copy into it completed{self.ctx.ring_hint(s, k, th, th)}"
                    )
            elif not th.sees(w[0], w[1]):
                self.race("read", s, k, w[2], th, clk=w[1])
            r = R[k]
            if r is None:
                R[k] = {cid: (clk, th)}
            else:
                r[cid] = (clk, th)

    def write(self, th, s: Shadow, i: int, n: int):
        W, R, PW, PR = s.W, s.R, s.PW, s.PR
        for k in range(i, i + n):
            if PW[k] is not None:
                self.race("write", s, k, PW[k], th, pending=True)
            if PR[k]:
                self.race("write", s, k, PR[k][0], th, pending=True)
            w = W[k]
            if w is not None and not th.sees(w[0], w[1]):
                self.race("write", s, k, w[2], th, clk=w[1])
            r = R[k]
            if r:
                for comp, (c, agent) in r.items():
                    if not th.sees(comp, c):
                        self.race("write", s, k, agent, th, clk=c, prior="read")
            W[k] = (th.cid, th.clk, th)
            R[k] = None

    # ------------------------------------------------------- asynchronous
    def async_write_issue(self, op, s: Shadow, idx: list):
        """An asynchronous copy into ``idx`` is issued: everything before on
        those elements must be ordered before the issue."""
        W, R, PW, PR = s.W, s.R, s.PW, s.PR
        seen, ok = None, {}  # epochs already found ordered before the op
        for k in idx:
            if PW[k] is not None:
                self.race("write", s, k, PW[k], op, pending=True)
            if PR[k]:
                self.race("write", s, k, PR[k][0], op, pending=True)
            w = W[k]
            if w is not None and w is not seen:
                if not op.sees(w[0], w[1]):
                    self.race("write", s, k, w[2], op, clk=w[1])
                seen = w
            r = R[k]
            if r:
                for comp, e in r.items():
                    if id(e) not in ok:
                        if not op.sees(comp, e[0]):
                            self.race("write", s, k, e[1], op, clk=e[0], prior="read")
                        ok[id(e)] = e
            PW[k] = op

    def async_write_done(self, op, s: Shadow, idx: list):
        W, R, PW = s.W, s.R, s.PW
        ep = (op.cid, op.clk, op)
        for k in idx:
            W[k] = ep
            R[k] = None
            PW[k] = None

    def async_read_issue(self, op, s: Shadow, idx: list):
        """An asynchronous read of ``idx`` (a TMA store, a wgmma) is issued:
        the writes it reads must be ordered before it, and a thread's write
        fenced for the async proxy by its writer."""
        W, PW, PR = s.W, s.PW, s.PR
        seen = None
        for k in idx:
            if PW[k] is not None:
                self.race("read", s, k, PW[k], op, pending=True)
            w = W[k]
            if w is not None and w is not seen:
                seen = w
                if not op.sees(w[0], w[1]):
                    self.race("read", s, k, w[2], op, clk=w[1])
                writer = w[2]
                if getattr(writer, "is_thread", False):
                    f = writer.fences
                    j = bisect.bisect_right(f, w[1])
                    if j == len(f) or not op.sees(writer.cid, f[j]):
                        raise CircbufError(
                            f"{self.ctx.kernel_name}: {self.ctx.where(s, k)} is written by "
                            f"{writer.who(w[1])} and read by {op.who()} with no fence.proxy.async "
                            "between them: the bulk copy may read stale data"
                        )
            p = PR[k]
            if p is None:
                PR[k] = [op]
            else:
                p.append(op)

    def async_read_done(self, op, s: Shadow, idx: list):
        R, PR = s.R, s.PR
        ep = (op.clk, op)
        for k in idx:
            p = PR[k]
            if p is not None:
                p.remove(op)
                if not p:
                    PR[k] = None
            r = R[k]
            if r is None:
                R[k] = {op.cid: ep}
            else:
                r[op.cid] = ep

    # ------------------------------------------------------------ reports
    def race(self, kind, s, k, first, second, pending=False, clk=None, prior="write"):
        """Raise the race between ``first`` (an earlier access, or an
        operation still in flight) and ``second`` (the access now)."""
        ctx = self.ctx
        where = ctx.where(s, k)
        a = first.who(clk) if not pending else first.who()
        b = second.who()
        if pending:
            what = "reads" if kind == "read" else "overwrites"
            tail = f"while {a} is still in flight on it"
            if getattr(first, "kind", "") in ("tma_store", "wgmma") and kind != "read":
                tail = f"while {a} may still read it"
            elif getattr(first, "kind", "") == "tma_load":
                tail = f"before {a} into it completed"
            msg = f"{b} {what} {where} {tail}"
        elif kind == "read":
            msg = f"{b} reads {where} written by {a} with nothing ordering the write before the read"
        else:
            msg = f"{b} overwrites {where}, {'read' if prior == 'read' else 'written'} by {a}, with nothing ordering that {prior} before it"
        hint = ctx.ring_hint(s, k, first, second)
        raise CircbufError(f"{ctx.kernel_name}: race: {msg}{hint}")
