"""The semantics of kernel IR nodes, run by one CTA's threads.

A :class:`Launch` binds a lowered :class:`~circbuf.lowering.kir.Kernel` to
its tensors, scalars and launch geometry; each :class:`CTA` runs its threads
as cooperating tasks (:mod:`.sched`), every thread a generator walking the
kernel IR (:class:`Thread`). What a node does is written once here, next to
what codegen prints for it:

- loops honour start and step, ``IfThenElse`` its condition, ``Let`` binds;
  ``Assign`` computes (:mod:`.values`), a vector access moves ``vector``
  elements, each store rounds to the buffer's type;
- ``BlockSync`` arrives on a named barrier (``__syncthreads`` for id 0) and
  waits until its ``threads`` have arrived; ``BlockReduce`` is the same
  barrier carrying each thread's value, combined per row as
  ``cb::block_reduce_x``/``_y`` combine them;
- ``RoleSwitch`` sends each thread into its role's branch (the role is
  named in every report); ``ElectOne`` runs its body on lane 0 of each warp
  its condition selects (``elect.sync`` elects the same lane for the same
  mask every time, so the lane that commits a bulk group also waits on it);
  ``Return`` ends the thread;
- mbarriers, TMA copies (completing at a random later step), bulk groups,
  ring stage and phase variables, ``setmaxnreg``, wgmma (a collective of
  the warpgroup's 128 threads, reading both operands from shared memory
  through their descriptors and writing each thread's accumulator fragment).

With a :class:`~.race.Checker` the same run also checks the protocol:
shared-memory races, ring waits that pass on the wrong phase, ping-pong
warpgroups working outside their turn, bulk copies in flight at the CTA's end.
"""

from __future__ import annotations

import bisect
import operator

import torch

from ..ir import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    CircbufError,
    DataType,
    FullOp,
    LoadStoreOp,
    MemoryType,
    ParallelType,
    ReductionOp,
    TernaryOp,
    UnaryOp,
)
from ..ir.scalar import _eval_op, as_scalar
from ..lowering import kir
from ..lowering.kir import barrier_name, is_block_wide
from .memory import GlobalMemory
from .peer import HANDLERS as _PEER_HANDLERS
from .race import Accum, Agent, Checker
from .sched import Deadlock, Scheduler
from .split_k import HANDLERS as _SPLIT_K_HANDLERS
from .sync import (
    Barrier,
    BulkGroup,
    BulkState,
    BulkWait,
    CpAsyncState,
    CpAsyncWaitGroup,
    MBarrier,
    MBarrierWait,
)
from .tma import MapGeometry, fragment_index, operand_index
from .values import ScalarCache, binary, converter, reduction, unary

_ZERO = {DataType.Bool: False, DataType.Int32: 0, DataType.Int64: 0}


def _zero(dt: DataType):
    return _ZERO.get(dt, 0.0)


def _poison(dt: DataType):
    return float("nan") if dt.is_float else _zero(dt)


class _Return(Exception):
    """A thread's ``return``."""


# ------------------------------------------------------------ the kernel, once
class Program:
    """What the interpretation of one kernel computes once: compiled scalars
    and statements, which node lists synchronize, the rings' and turn
    orders' barriers."""

    def __init__(self, kernel: kir.Kernel):
        self.k = kernel
        self.sc = ScalarCache()
        self._steps: dict = {}
        self._assign: dict = {}
        self._sync: dict = {}
        self.ring_of_bar: dict = {}
        self.ring_of_buf: dict = {}
        for ring in kernel.rings:
            self.ring_of_bar[ring.full] = (ring, "full")
            if ring.has_empty:
                self.ring_of_bar[ring.empty] = (ring, "empty")
            for b in ring.buffers:
                self.ring_of_buf[b] = ring
        self.turn_of_bar: dict = {}
        self.turn_of_acc: dict = {}
        for t in kernel.turn_orders:
            self.turn_of_acc[t.name] = t
            for p in t.phases:
                self.turn_of_bar[t.barrier(p)] = (t, p)
        accs = set()
        kir.walk(kernel.body, lambda n, _s: accs.add(n.acc.tv.name) if isinstance(n, kir.Wgmma) else None)
        self.acc_tvs = accs

    # which lists and nodes yield to the scheduler
    def syncs(self, n) -> bool:
        got = self._sync.get(id(n))
        if got is None:
            if isinstance(n, list):
                got = any(self.syncs(x) for x in n)
            elif isinstance(n, _YIELDING):
                got = True
            else:
                got = any(self.syncs(sub) for sub in kir.children(n))
            self._sync[id(n)] = got
        return got

    def steps(self, nodes: list) -> list:
        """``(generator?, handler, node)`` for each node of a list."""
        got = self._steps.get(id(nodes))
        if got is None:
            got = []
            for n in nodes:
                h = _HANDLERS.get(type(n))
                if h is None:
                    raise CircbufError(
                        f"{self.k.name}: the interpreter has no semantics for {type(n).__name__}"
                    )
                gen, plain = h
                if gen is not None and (plain is None or self.syncs(n)):
                    got.append((True, gen, n))
                else:
                    got.append((False, plain, n))
            self._steps[id(nodes)] = (nodes, got)
            return got
        return got[1]

    def _memo(self, key, node, make):
        """The function compiled once for ``key`` (``node`` is kept alive, so
        its id stays unique while the cache holds it)."""
        f = self._assign.get(key)
        if f is None:
            f = self._assign[key] = make()
            self._assign[(key, "keep")] = node
        return f

    def assign(self, a: kir.Assign):
        return self._memo(id(a), a, lambda: _compile_assign(self, a))

    # ------------------------------------------------------------ memory access
    def reader(self, ref: kir.TensorRef, n: int = 1):
        return self._memo((id(ref), n, "r"), ref, lambda: self._reader(ref, n))

    def writer(self, ref: kir.TensorRef, n: int = 1):
        return self._memo((id(ref), n, "w"), ref, lambda: self._writer(ref, n))

    def _reader(self, ref: kir.TensorRef, n: int = 1):
        tv, idx = ref.tv, self.sc(ref.index)
        name, mt = tv.name, tv.memory_type
        if mt == MemoryType.Local:
            busy = name in self.acc_tvs
            if n == 1:

                def rd(th):
                    if busy and th.acc_busy:
                        th.check_acc(name)
                    return th.local[name][idx(th.env)]

                return rd

            def rdn(th):
                if busy and th.acc_busy:
                    th.check_acc(name)
                i = idx(th.env)
                return th.local[name][i : i + n]

            return rdn
        if mt == MemoryType.Shared:

            def rds(th):
                cta = th.cta
                i = idx(th.env)
                buf = cta.shared[name]
                if i < 0 or i + n > len(buf):
                    raise CircbufError(
                        f"{cta.kernel_name}: {th.who()} reads {name}[{i}] outside its {len(buf)} elements"
                    )
                if cta.checker is not None:
                    cta.checker.read(th, cta.shadow[name], i, n)
                return buf[i] if n == 1 else buf[i : i + n]

            return rds

        def rdg(th):
            vals, off, span = th.cta.glob.data(name)
            i = idx(th.env)
            if i < 0 or i + n > span:
                raise CircbufError(
                    f"{th.cta.kernel_name}: {th.who()} reads {name}[{i}] outside its {span} elements"
                )
            return vals[off + i] if n == 1 else vals[off + i : off + i + n]

        return rdg

    def _writer(self, ref: kir.TensorRef, n: int = 1):
        tv, idx = ref.tv, self.sc(ref.index)
        name, mt, cv = tv.name, tv.memory_type, converter(tv.dtype)
        if mt == MemoryType.Local:
            if n == 1:

                def wr(th, v):
                    th.local[name][idx(th.env)] = cv(v)

                return wr

            def wrn(th, vs):
                i = idx(th.env)
                th.local[name][i : i + n] = [cv(v) for v in vs]

            return wrn
        if mt == MemoryType.Shared:

            def wrs(th, v):
                cta = th.cta
                i = idx(th.env)
                buf = cta.shared[name]
                if i < 0 or i + n > len(buf):
                    raise CircbufError(
                        f"{cta.kernel_name}: {th.who()} writes {name}[{i}] outside its {len(buf)} elements"
                    )
                if n > 1 and i % n:
                    raise CircbufError(
                        f"{cta.kernel_name}: {th.who()} writes {n} elements of {name} at once at element {i}, "
                        f"not a multiple of {n} (a misaligned vector access)"
                    )
                if cta.checker is not None:
                    cta.checker.write(th, cta.shadow[name], i, n)
                if n == 1:
                    buf[i] = cv(v)
                else:
                    buf[i : i + n] = [cv(x) for x in v]

            return wrs

        def wrg(th, v):
            cta = th.cta
            vals, off, span = cta.glob.data(name)
            i = idx(th.env)
            if i < 0 or i + n > span:
                raise CircbufError(
                    f"{cta.kernel_name}: {th.who()} writes {name}[{i}] outside its {span} elements"
                )
            if cta.turns_epi is not None:
                th.check_turn_store(name)
            if n == 1:
                vals[off + i] = cv(v)
            else:
                vals[off + i : off + i + n] = [cv(x) for x in v]
            counts = cta.glob.counts.get(name)
            if counts is not None:
                for k in range(i, i + n):
                    counts[k] += 1
            cta.glob.mark(name)

        return wrg

    def value(self, x, dt: DataType):
        """An operand as a value of compute type ``dt`` (codegen's ``value``):
        a tensor element as stored, a scalar converted."""
        if isinstance(x, kir.TensorRef):
            return self.reader(x)
        f, cv = self.sc(x), converter(dt)
        return lambda th: cv(f(th.env))


def _operand_type(e) -> DataType:
    from ..ir import TensorView

    for x in e.inputs:
        if isinstance(x, TensorView):
            return x.dtype
    return e.out.dtype


def _compile_assign(p: Program, a: kir.Assign):
    lhs = a.lhs
    dt = lhs.tv.dtype
    if a.row is not None:
        return _compile_row_store(p, a)
    if lhs.vector > 1:
        rd, wr = p.reader(a.operands[0], lhs.vector), p.writer(lhs, lhs.vector)
        return lambda th: wr(th, rd(th))
    wr = p.writer(lhs)
    if a.init is not None:
        v = converter(dt)(a.init.value)
        return lambda th: wr(th, v)
    e, ops = a.expr, a.operands
    if isinstance(e, ReductionOp):
        f, acc, x = reduction(e.op_name, dt), p.reader(ops[0]), p.value(ops[1], dt)
        return lambda th: wr(th, f(acc(th), x(th)))
    if isinstance(e, CastOp):
        x = p.value(ops[0], e.inputs[0].dtype)
        return lambda th: wr(th, x(th))  # the store converts
    if isinstance(e, UnaryOp):
        f, x = unary(e.op_name, dt), p.value(ops[0], dt)
        return lambda th: wr(th, f(x(th)))
    if isinstance(e, BinaryOp):
        cdt = _operand_type(e)
        f, x, y = binary(e.op_name, cdt), p.value(ops[0], cdt), p.value(ops[1], cdt)
        return lambda th: wr(th, f(x(th), y(th)))
    if isinstance(e, TernaryOp):
        c, x, y = p.value(ops[0], DataType.Bool), p.value(ops[1], dt), p.value(ops[2], dt)
        return lambda th: wr(th, x(th) if c(th) else y(th))
    if isinstance(e, (LoadStoreOp, BroadcastOp, FullOp)) or getattr(e, "is_view", False):
        x = p.value(ops[0], dt)
        return lambda th: wr(th, x(th))
    raise CircbufError(f"the interpreter has no semantics for {type(e).__name__} ({e})")


def _compile_row_store(p: Program, a: kir.Assign):
    """``cb::row_store2`` (lowering/prelude.py): a staging row's pair at column
    ``col`` stored as one 4-byte piece where the output element's address is
    4-byte aligned (the interpreted tensor's own address decides), else the
    piece one element earlier (reading the staging element before the pair),
    the staging row's first and last elements alone; ``left`` elements of the
    output row are in range."""
    r = a.row
    rd, prev = p.reader(a.operands[0], 2), p.reader(r.prev)
    col, left = p.sc(r.col), p.sc(r.left)
    one, two = p.writer(a.lhs), p.writer(a.lhs, 2)
    name, width, size = a.lhs.tv.name, r.width, a.lhs.tv.dtype.size
    shift = {}  # the writers one element earlier (the shifted 4-byte piece) and one later (the tail)
    for k, d in (("prev", -1), ("next", 1)):
        ref = kir.TensorRef(a.lhs.tv, a.lhs.index + d)
        shift[k] = p.writer(ref, 2 if d < 0 else 1)
        p._assign[(id(a), k, "keep")] = ref

    def run(th):
        v = rd(th)
        c, n = col(th.env), left(th.env)
        base = th.cta.glob.params[name].data_ptr()  # the first element's address, as on the GPU
        if (base + a_index(th.env) * size) % 4 == 0:
            if n >= 2:
                two(th, v)
            else:
                one(th, v[0])
            return
        if c == 0:
            one(th, v[0])
        else:
            shift["prev"](th, [prev(th), v[0]])
        if n == 2 or (c + 2 == width and n > 2):
            shift["next"](th, v[1])

    a_index = p.sc(a.lhs.index)
    return run


# ------------------------------------------------------------ a launch
class Launch:
    """A kernel bound to its arguments: ``tensors`` in ``kernel.tensor_params``
    order (CPU torch tensors), ``scalars`` in ``kernel.scalar_params`` order,
    ``grid`` and ``block`` (x, y, z). ``check``: track happens-before and
    the protocol (:class:`~.race.Checker`); ``count``: count stores to the
    outputs (``GlobalMemory.counts``)."""

    def __init__(self, kernel, tensors, scalars=(), grid=(1, 1, 1), block=(1, 1, 1), check=False, count=True):
        self.k = kernel
        self.prog = Program(kernel)
        self.grid, self.block = tuple(grid), tuple(block)
        self.check = check
        if len(tensors) != len(kernel.tensor_params):
            raise CircbufError(f"{kernel.name} takes {len(kernel.tensor_params)} tensors, not {len(tensors)}")
        env = {}
        params = {}
        for p, t in zip(kernel.tensor_params, tensors):
            params[p.tv.name] = t
            for d in range(t.dim()):
                env[f"{p.tv.name}.stride[{d}]"] = t.stride(d)
        for name, (pi, d) in kernel.extent_bindings.items():
            env[name] = tensors[pi].shape[d]
        for v, x in zip(kernel.scalar_params, scalars):
            env[v.name] = x
        for purpose, (first, _n) in kernel.named_barriers.items():
            env[barrier_name(purpose)] = first
        for ax, n in zip(("x", "y", "z"), self.grid):
            env[f"gridDim.{ax}"] = n
        for ax, n in zip(("x", "y", "z"), self.block):
            env[f"blockDim.{ax}"] = n
        self.env = env
        outs = [p.tv.name for p in kernel.tensor_params if p.is_output] if count else []
        self.glob = GlobalMemory(params, outs)
        self.maps = []
        for spec in kernel.tensor_maps:
            t = tensors[spec.param]
            name = kernel.tensor_params[spec.param].tv.name
            self.maps.append(MapGeometry(spec, t.shape, t.stride(), t.element_size(), name))
        self.steps = 0
        self.cluster = kernel.cluster  # (cx, cy): its CTAs run together, sharing one scheduler
        self.csize = self.cluster[0] * self.cluster[1]
        if self.csize > 1 and self.grid[0] % self.csize:
            raise CircbufError(
                f"{kernel.name}: grid {self.grid} is not a whole number of {self.cluster} clusters"
            )

    def whole_clusters(self, ctas) -> list:
        """``ctas`` with the rest of each one's cluster, in launch order."""
        if self.csize == 1:
            return list(ctas)
        out = []
        for x, y, z in ctas:
            for r in range(self.csize):
                b = (x - x % self.csize + r, y, z)
                if b not in out:
                    out.append(b)
        return out

    def ctas(self):
        gx, gy, gz = self.grid
        return [(x, y, z) for z in range(gz) for y in range(gy) for x in range(gx)]

    def run(self, seed=0, ctas=None):
        """Run the CTAs (all, or those listed) one after the other; write the
        outputs back into the tensors. Torch runs on one thread meanwhile:
        its ops here are small, and waking a thread pool for each costs more
        than the op."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.split_k_ws = ({}, {})  # split-K's partials and flags (interpret/split_k.py), per run
        try:
            order = self.whole_clusters(self.ctas() if ctas is None else ctas)
            for k in range(0, len(order), self.csize):
                sched = Scheduler(hash((seed, k)) & 0xFFFFFFFF)
                group = [CTA(self, b, sched=sched) for b in order[k : k + self.csize]]
                for c in group:
                    c.peers = group
                _run_ctas(group)
                self.steps += sched.steps
            self.glob.write_back()
        finally:
            torch.set_num_threads(threads)


# ------------------------------------------------------------ a CTA
def _run_ctas(ctas):
    """Run one CTA, or the CTAs of one cluster together (one scheduler: their
    threads interleave, copies multicast between them, arrivals cross them)."""
    head = ctas[0]
    try:
        head.sched.run()
    except Deadlock as d:
        raise CircbufError(head._deadlock(d.blocked)) from None
    if head.sched.in_flight and head.checker is not None:
        op = head.sched.in_flight[0]
        raise CircbufError(
            f"{head.kernel_name}: CTA {op.cta.bidx} ends with {op.who()} still in flight (no wait for it "
            "before the threads exit: its shared memory goes with the CTA)"
        )
    head.sched.finish_all()
    for c in ctas:
        c._check_registers()
        c._check_exit()


class CTA:
    def __init__(self, launch: Launch, bidx, seed=0, sched=None):
        self.launch, self.prog, self.k = launch, launch.prog, launch.k
        self.kernel_name = launch.k.name
        self.bidx = bidx
        self.glob = launch.glob
        self.checker = Checker(self) if launch.check else None
        self.sched = Scheduler(seed) if sched is None else sched
        self.peers = [self]  # the CTAs of its cluster, by rank
        self.rank = bidx[0] % launch.csize
        self.cidx, self.cidy = divmod(self.rank, launch.cluster[1])
        # a peer's accesses to this CTA (arrivals on its barriers, copies into its
        # stages): component -> (latest clock, what), each to happen before every
        # thread of this CTA exits
        self.remote: dict = {}
        self.cluster_bar = None
        self.shared: dict = {}
        self.shadow: dict = {}
        self.alloc: dict = {}  # shared tv name -> (base byte, element size, stage elements, stages)
        self.mbar: dict = {}
        self.bars: dict = {}
        self.colls: dict = {}
        self.regs: dict = {}  # warpgroup -> {thread lin: (count, increase)}
        self.tma_clock: dict = {}
        self.wg_clock: dict = {}
        self.turn_holders: dict = {}
        self.turns_epi = (self.prog.turn_of_acc or None) if launch.check else None
        self.exited = 0
        bx, by, bz = launch.block
        self.nthreads = bx * by * bz
        env = dict(launch.env)
        env["blockIdx.x"], env["blockIdx.y"], env["blockIdx.z"] = bidx
        env["cidx"], env["cidy"] = self.cidx, self.cidy
        self.threads = []
        lin = 0
        for z in range(bz):
            for y in range(by):
                for x in range(bx):
                    e = dict(env)
                    e["threadIdx.x"], e["threadIdx.y"], e["threadIdx.z"] = x, y, z
                    t = Thread(self, (x, y, z), lin, e, cid=lin + self.rank * self.nthreads)
                    self.threads.append(t)
                    self.sched.add(t)
                    lin += 1

    # ---------------------------------------------------------- objects
    def mbarrier(self, th, ref: kir.MBarrierRef) -> MBarrier:
        arr = self.mbar.get(ref.name)
        if arr is None:
            raise CircbufError(
                f"{self.kernel_name}: {th.who()} uses mbarrier {ref.name}, which is not allocated"
            )
        s = self.prog.sc(ref.stage)(th.env)
        if not 0 <= s < len(arr):
            raise CircbufError(f"{self.kernel_name}: {th.who()} uses {ref.name}[{s}] of {len(arr)}")
        return arr[s]

    def named(self, bid: int, threads: int, th) -> Barrier:
        if not 0 <= bid < 16:
            raise CircbufError(f"{self.kernel_name}: {th.who()} syncs on named barrier {bid} (ids are 0..15)")
        if (threads % 32 and threads != self.nthreads) or not 0 < threads <= self.nthreads:
            raise CircbufError(
                f"{self.kernel_name}: {th.who()} syncs {threads} threads on named barrier {bid} "
                f"(a multiple of 32, at most the block's {self.nthreads})"
            )
        b = self.bars.get(bid)
        if b is None:
            b = self.bars[bid] = Barrier(self, "__syncthreads" if bid == 0 else f"named barrier {bid}")
        return b

    def collective(self, key, label, hb) -> Barrier:
        b = self.colls.get(key)
        if b is None:
            b = self.colls[key] = Barrier(self, label, hb=hb)
        return b

    # ---------------------------------------------------------- running
    def run(self):
        _run_ctas(self.peers)

    @property
    def gone(self) -> bool:
        """Every thread has exited: its shared memory and barriers are gone."""
        return self.exited == self.nthreads

    def peer(self, th, rank: int, what: str):
        """CTA ``rank`` of this one's cluster, which ``th`` accesses (``what``)."""
        dest = self.peers[rank]
        if dest.gone:
            raise CircbufError(
                f"{self.kernel_name}: {th.who()} of CTA {self.bidx} {what} CTA {dest.bidx} of its cluster, "
                "which has exited (no cluster barrier before exit: a CTA must not exit while its peers may "
                "still write to its shared memory or arrive on its barriers)"
            )
        return dest

    def remote_access(self, comp, clk, what: str):
        if self.checker is not None and clk > self.remote.get(comp, (0, ""))[0]:
            self.remote[comp] = (clk, what)

    def _check_exit(self):
        """Every peer's access to this CTA happens before each of its threads exits."""
        for comp, (clk, what) in self.remote.items():
            for t in self.threads:
                if not t.sees(comp, clk):
                    raise CircbufError(
                        f"{self.kernel_name}: {t.who()} of CTA {self.bidx} may exit before {what} "
                        "(no cluster barrier before exit: a CTA must not exit while its peers may still "
                        "write to its shared memory or arrive on its barriers)"
                    )

    def _deadlock(self, blocked) -> str:
        many = len(self.peers) > 1
        groups: dict = {}
        for t in blocked:
            w = t.waiting
            desc = w.describe() if w is not None else "is runnable"
            if isinstance(w, MBarrierWait) and w.obj.name in self.prog.ring_of_bar:
                got = _ring_need(t, w.obj, *self.prog.ring_of_bar[w.obj.name])
                if got is not None:
                    desc += f" for {got[1]}, which completes phase {got[0]}"
            role = f"CTA {t.cta.bidx} {t.role_label()}" if many else t.role_label()
            groups.setdefault((role, desc), []).append(t)
        parts = []
        for (role, desc), ts in groups.items():
            n = len(ts)
            first = ts[0]
            where = first.positions(first.clk)
            if n > 1 and desc.startswith("waits"):
                desc = "wait" + desc[5:]
            parts.append(f"{role}: {n} thread{'s' if n > 1 else ''} (e.g. thread {first.tid}{where}) {desc}")
        exited = sum(c.exited for c in self.peers)
        done = f"; {exited} threads have returned" if exited else ""
        where = (
            f"the cluster of CTAs {', '.join(str(c.bidx) for c in self.peers)}"
            if many
            else f"CTA {self.bidx}"
        )
        return (
            f"{self.kernel_name}: deadlock in {where}: every live thread waits and no copy is in "
            f"flight: " + "; ".join(parts) + done
        )

    def _check_registers(self):
        if not self.regs:
            return
        tgt = self.k.target
        blocks = max(self.k.min_blocks, 1)
        budget = tgt.registers_per_sm // blocks
        default = min(tgt.registers_per_thread, (budget // self.nthreads) // 8 * 8)
        total = 0
        nwg = -(-self.nthreads // 128)
        for wg in range(nwg):
            got = self.regs.get(wg)
            members = min(128, self.nthreads - 128 * wg)
            if got is None:
                total += default * members
                continue
            vals = set(got.values())
            if len(got) != members or len(vals) != 1:
                raise CircbufError(
                    f"{self.kernel_name}: setmaxnreg acts on a whole warpgroup; warpgroup {wg} has "
                    f"{len(got)} of its {members} threads setting {sorted(vals)}"
                )
            total += vals.pop()[0] * members
        pool = default * self.nthreads  # what the launch gave the CTA; setmaxnreg moves only these
        if total > pool:
            per = ", ".join(
                f"warpgroup {wg}: {next(iter(v.values()))[0]}" for wg, v in sorted(self.regs.items())
            )
            raise CircbufError(
                f"{self.kernel_name}: the warp roles ask for {total} registers ({per}, 128 threads each) "
                f"but the CTA was launched with {pool} ({self.nthreads} threads x {default}): "
                "setmaxnreg.inc would wait forever"
            )

    # ---------------------------------------------------------- report context
    def where(self, s, k) -> str:
        base, size, stage_elems, stages = self.alloc[s.name][:4]
        ring = self.prog.ring_of_buf.get(s.name)
        if ring is not None and stage_elems:
            st = k // stage_elems
            return f"stage {st} of {s.name} (ring {ring.name}, element {k - st * stage_elems})"
        return f"{s.name}[{k}]"

    def ring_hint(self, s, k, first, second) -> str:
        ring = self.prog.ring_of_buf.get(s.name)
        if ring is None:
            return ""
        _, _, stage_elems, _ = self.alloc[s.name][:4]
        st = k // stage_elems if stage_elems else 0
        rel = f"{ring.empty}[{st}]" if ring.has_empty else "the block sync after the reads"
        return (
            f" (ring {ring.name}: a stage is filled on {ring.full}[{st}] and released by {rel}; "
            f"the producer must not refill it before every reader released it, a reader must not read "
            f"it before its wait on the full barrier)"
        )


# ------------------------------------------------------------ threads
class Thread(Agent):
    is_thread = True

    def __init__(self, cta: CTA, tid, lin: int, env: dict, cid=None):
        self.cta, self.prog = cta, cta.prog
        self.tid, self.lin, self.env = tid, lin, env
        self.lane, self.warp, self.wg = lin % 32, lin // 32, lin // 128
        self.local: dict = {}
        self.role = None
        self.group = 0
        self.cid, self.clk, self.vc = (lin if cid is None else cid), 1, {}
        self.fences: list = []
        self.bulk = BulkState()
        self.cp = CpAsyncState()
        self.ring_pos: dict = {}
        self.ring_log: list = []
        self.wg_open: list = []
        self.wg_groups: list = []
        self.acc_busy: dict = {}
        self.turns: dict = {}
        self.done, self.waiting, self.sched = False, None, None
        self.gen = self.main()

    def sched_wake(self):
        self.sched.runnable.append(self)

    def on_exit(self):
        self.cta.exited += 1

    def main(self):
        try:
            yield from self.run(self.prog.k.body)
        except _Return:
            pass

    def run(self, nodes):
        for gen, h, n in self.prog.steps(nodes):
            if gen:
                yield from h(self, n)
            else:
                h(self, n)

    def run_plain(self, nodes):
        for gen, h, n in self.prog.steps(nodes):
            if gen:  # a synchronizing node where none may be (a plain loop's body)
                raise AssertionError(f"{type(n).__name__} in a plain block")
            h(self, n)

    def tick(self):
        self.clk += 1

    def acquire(self, d: dict):
        ch = self.cta.checker
        if ch is not None and d:
            self.vc = ch.join(self.vc, d)

    # ------------------------------------------------------------ reports
    def role_label(self) -> str:
        if self.role is None:
            return "the block"
        g = f" group {self.group}" if self.role.groups > 1 else ""
        return f"role {self.role.name}{g}"

    def positions(self, clk) -> str:
        pos = self.ring_pos
        if clk is not None and self.ring_log:
            j = bisect.bisect_right(self.ring_log, (clk, float("inf"))) - 1
            pos = self.ring_log[j][2] if j >= 0 else {}
        elif clk is not None:
            pos = {}
        out = []
        for name, (p, stages) in pos.items():
            if name.endswith("_turn"):
                continue
            out.append(f"{name} position {p} (stage {p % stages}, phase {(p // stages) & 1})")
        return (" at " + ", ".join(out)) if out else ""

    def who(self, clk=None) -> str:
        return f"{self.role_label()} thread {self.tid}{self.positions(clk)}"

    def check_acc(self, name):
        if name in self.acc_busy:
            raise CircbufError(
                f"{self.cta.kernel_name}: {self.who()} reads accumulator {name} while wgmmas still write it "
                "(no wgmma.wait_group retired them)"
            )

    def holds(self, order, phase) -> bool:
        return self.turns.get((order.name, phase), False)

    def check_turn_store(self, what):
        for order in self.cta.turns_epi.values():
            if self.role is not None and self.role.name == order.role and "epi" in order.phases:
                if not self.holds(order, "epi"):
                    raise CircbufError(
                        f"{self.cta.kernel_name}: {self.who()} stores {what} outside its epilogue turn "
                        f"({order.barrier('epi')}[{self.group}]): the ping-pong warpgroups' epilogues overlap"
                    )


# ------------------------------------------------------------ node handlers
def _for_plain(th, n):
    env, sc = th.env, th.prog.sc
    ext, start, step = sc(n.extent)(env), sc(n.start)(env), sc(n.step)(env)
    if step <= 0:
        raise CircbufError(f"{th.cta.kernel_name}: loop {n.index} steps by {step}")
    name, body = n.index.name, n.body
    for j in range(start, ext, step):
        env[name] = j
        th.run_plain(body)


def _for_gen(th, n):
    env, sc = th.env, th.prog.sc
    ext, start, step = sc(n.extent)(env), sc(n.start)(env), sc(n.step)(env)
    if step <= 0:
        raise CircbufError(f"{th.cta.kernel_name}: loop {n.index} steps by {step}")
    name, body = n.index.name, n.body
    for j in range(start, ext, step):
        env[name] = j
        yield from th.run(body)


def _if_plain(th, n):
    th.run_plain(n.then if th.prog.sc(n.cond)(th.env) else n.else_)


def _if_gen(th, n):
    yield from th.run(n.then if th.prog.sc(n.cond)(th.env) else n.else_)


def _elected(th, n) -> bool:
    return th.lane == 0 and bool(th.prog.sc(n.warp)(th.env))


def _elect_plain(th, n):
    if _elected(th, n):
        th.run_plain(n.then)


def _elect_gen(th, n):
    if _elected(th, n):
        yield from th.run(n.then)


def _roles(th, n):
    env, sc = th.env, th.prog.sc
    k = next((k for k, r in enumerate(n.roles[:-1]) if sc(r.cond)(env)), len(n.roles) - 1)
    role = n.roles[k]
    th.role = role
    if role.groups > 1:
        rows = (role.hi - role.lo) // role.groups
        th.group = (env[role.axis.value] - role.lo) // rows
    yield from th.run(n.bodies[k])


def _let(th, n):
    th.env[n.var.name] = th.prog.sc(n.value)(th.env)


def _allocate(th, n):
    local, name, size, stages, zero = th.prog._memo((id(n), "alloc"), n, lambda: _alloc_facts(th.prog, n))
    env = th.env
    if size.__class__ is not int:
        size = size(env)
    if local:
        th.local[name] = [zero] * (size * stages)
        return
    cta = th.cta
    if name not in cta.shared:
        total = size * stages
        # shared memory starts as garbage on the device: NaN here, so a copy that
        # leaves an element unwritten (a ragged edge not zero-filled) shows
        cta.shared[name] = [_poison(n.tv.dtype)] * total
        off = n.offset if isinstance(n.offset, int) else th.prog.sc(n.offset)(env)
        cta.alloc[name] = (off, n.tv.dtype.size, size, stages, n.tv.dtype)
        if cta.checker is not None:
            cta.shadow[name] = cta.checker.shadow(name, total, name in th.prog.ring_of_buf)


def _alloc_facts(p, n):
    """What an Allocate node needs per thread: (local?, name, size or its
    function of the env, stages, the zero of its type)."""
    size = n.size if isinstance(n.size, int) else p.sc(n.size)
    return n.memory == MemoryType.Local, n.tv.name, size, n.stages, _zero(n.tv.dtype)


def _assign(th, n):
    th.prog.assign(n)(th)


def _comment(th, n):
    pass


def _return(th, n):
    raise _Return()


def _cluster_sync(th, n):
    """barrier.cluster.arrive.release + wait.acquire: every thread of every CTA of the cluster."""
    head = th.cta.peers[0]
    if head.cluster_bar is None:
        head.cluster_bar = Barrier(head, "the cluster barrier (barrier.cluster)")
    w = head.cluster_bar.arrive(th, sum(c.nthreads for c in th.cta.peers))
    th.tick()
    yield w


def _block_sync(th, n):
    bid, threads = n.barrier
    if is_block_wide(n.barrier):
        bid, threads = 0, th.cta.nthreads
    else:
        bid = th.prog.sc(as_scalar(bid))(th.env)
    b = th.cta.named(bid, threads, th)
    w = b.arrive(th, threads)
    th.tick()
    yield w


def _block_reduce(th, n):
    p = th.prog
    rd, wr, release, rows, warp_only = p._memo((id(n), "reduce"), n, lambda: _reduce_facts(th, n))
    if rows == 1:
        return
    v = rd(th)
    cta = th.cta
    if warp_only:  # one warp per row: shuffles only
        b, threads = cta.collective(("warp", th.warp), f"the reduction of warp {th.warp}", hb=True), 32
    else:
        bid, threads = n.barrier
        if is_block_wide(n.barrier):
            bid, threads = 0, cta.nthreads
        else:
            bid = p.sc(as_scalar(bid))(th.env)
        b = cta.named(bid, threads, th)
    w = b.arrive(th, threads, payload=(v,), release=release, where=n)
    th.tick()
    yield w
    wr(th, b.result(w.gen, th))


def _reduce_facts(th, n):
    """What a BlockReduce node needs per thread, computed once: its reader
    and writer, the function combining the arrivals' values per row (as
    ``cb::block_reduce_x``/``_y`` do), the rows of a TIDy reduction (1:
    nothing to do), whether one warp holds each row."""
    p = th.prog
    combine = reduction(n.expr.op_name, n.expr.out.dtype)
    rows = None
    if n.ptypes == (ParallelType.TIDy,):
        rows = n.threads

        def release(arrived):
            by_x: dict = {}
            for t, (val,) in sorted(arrived, key=lambda a: a[0].tid[1]):
                if t.tid[1] < rows:
                    by_x.setdefault((t.tid[0], t.tid[2]), []).append(val)
            out = {}
            for t, _ in arrived:
                vals = by_x[(t.tid[0], t.tid[2])]
                acc = vals[0]
                for x in vals[1:]:
                    acc = combine(acc, x)
                out[t.lin] = acc
            return out

    else:

        def release(arrived):
            by_row: dict = {}
            for t, (val,) in sorted(arrived, key=lambda a: a[0].tid[0]):
                by_row.setdefault((t.tid[1], t.tid[2]), []).append(val)
            out = {}
            for key, vals in by_row.items():
                acc = vals[0]
                for x in vals[1:]:
                    acc = combine(acc, x)
                by_row[key] = acc
            for t, _ in arrived:
                out[t.lin] = by_row[(t.tid[1], t.tid[2])]
            return out

    warp_only = n.ptypes != (ParallelType.TIDy,) and th.cta.launch.block[0] == 32
    return p.reader(n.ref), p.writer(n.ref), release, rows, warp_only


# mbarriers
def _mbar_alloc(th, n):
    cta = th.cta
    if n.name not in cta.mbar:
        cta.mbar[n.name] = [MBarrier(cta, n.name, s) for s in range(n.count)]


def _mbar_init(th, n):
    th.cta.mbarrier(th, n.bar).init(th, th.prog.sc(n.arrivals)(th.env))
    th.tick()


def _mbar_inval(th, n):
    th.cta.mbarrier(th, n.bar).inval(th)


def _mbar_arrive(th, n):
    if n.peers:  # in every CTA whose copies land in this one's (mapa + arrive.shared::cluster)
        cta = th.cta
        for r in kir.cluster_peers(th.cta.launch.cluster, n.peers, cta.cidx, cta.cidy):
            dest = cta.peer(th, r, "arrives on a barrier of")
            bar = dest.mbarrier(th, n.bar)
            if dest is not cta:
                dest.remote_access(th.cid, th.clk, f"{th.who()} of CTA {cta.bidx} arrives on its {bar.label}")
            bar.arrive(th)
        th.tick()
        yield None
        return
    bar = th.cta.mbarrier(th, n.bar)
    turn = th.prog.turn_of_bar.get(bar.name)
    if turn is not None:
        _turn_handover(th, bar, *turn)
    bar.arrive(th)
    th.tick()
    yield None


def _mbar_expect_tx(th, n):
    bar = th.cta.mbarrier(th, n.bar)
    bar.arrive(th, tx=th.prog.sc(n.bytes)(th.env))
    th.tick()
    yield None


def _mbar_wait(th, n):
    bar = th.cta.mbarrier(th, n.bar)
    parity = th.prog.sc(n.parity)(th.env)
    if parity not in (0, 1):
        raise CircbufError(f"{th.cta.kernel_name}: {th.who()} waits on {bar.label} for parity {parity}")
    bar._usable(th, "waits on")
    yield MBarrierWait(bar, parity)
    if bar.acc is not None and bar.phase:
        th.acquire(bar.done[bar.phase - 1])
    if th.cta.checker is not None:
        ring = th.prog.ring_of_bar.get(bar.name)
        if ring is not None:
            _check_ring_phase(th, bar, parity, *ring)
        turn = th.prog.turn_of_bar.get(bar.name)
        if turn is not None:
            _turn_take(th, bar, *turn)


def _ring_need(th, bar, ring, kind):
    """``(phases, what)``: how many phases of ring barrier ``bar`` have
    completed when the thread's wait on it may pass — the fill of its
    position (full), the release of the position ``d`` back (empty) — or
    None when the thread holds no position on that side."""
    side = ring.use if kind == "full" else ring.load
    got = th.ring_pos.get(side.name)
    if got is None:
        return None
    pos, S = got
    s = pos % S
    if kind == "full":
        if bar.stage != s:
            raise CircbufError(
                f"{th.cta.kernel_name}: {th.who()} waits on {bar.label}, not on its stage {s}'s full barrier"
            )
        return pos // S + 1, f"the fill of position {pos}"
    d = (s - bar.stage) % S or S
    return (pos - d) // S + 1, (
        f"the release of position {pos - d}" if pos >= d else "nothing (a fresh slot)"
    )


def _check_ring_phase(th, bar, parity, ring, kind):
    """A ring wait must pass on exactly the phase its position needs, not
    an older phase of the same parity, nor a newer one."""
    got = _ring_need(th, bar, ring, kind)
    if got is None:
        return
    need, what = got
    if bar.phase != need:
        why = (
            "an older phase of the same parity satisfied it"
            if bar.phase < need
            else "the barrier had already run past it"
        )
        raise CircbufError(
            f"{th.cta.kernel_name}: {th.who()} passed its wait on {bar.label} (parity {parity}) after "
            f"{bar.phase} completed phases; it waits for {what}, phase {need}: {why} (a wait satisfied by the wrong phase)"
        )


def _turn_take(th, bar, order, phase):
    if bar.stage != th.group:
        return
    key = (order.name, phase)
    holders = th.cta.turn_holders.setdefault(key, {})
    other = [g for g, c in holders.items() if c and g != th.group]
    if other:
        raise CircbufError(
            f"{th.cta.kernel_name}: {th.who()} takes the {phase} turn of {order.name} ({bar.label}) while "
            f"group {other[0]} of role {order.role} still holds it"
        )
    if not th.turns.get(key):
        th.turns[key] = True
        holders[th.group] = holders.get(th.group, 0) + 1


def _turn_handover(th, bar, order, phase):
    key = (order.name, phase)
    if bar.stage == th.group or not th.turns.get(key):
        return
    th.turns[key] = False
    th.cta.turn_holders[key][th.group] -= 1


def _fence(th, n):
    if n.kind == "proxy_async":
        th.tick()
        th.fences.append(th.clk)
        th.tick()


def _setmaxnreg(th, n):
    c = n.count
    if c % 8 or not 24 <= c <= 256:
        raise CircbufError(f"{th.cta.kernel_name}: setmaxnreg {c}: a multiple of 8 in [24, 256]")
    th.cta.regs.setdefault(th.wg, {})[th.lin] = (c, n.increase)


# rings
def _ring_init(th, n):
    side = n.ring
    S = side.stages
    pos = 0 if n.position is None else th.prog.sc(n.position)(th.env)
    th.env[f"{side.name}_stage"] = _eval_op("%", pos, S)
    th.env[f"{side.name}_phase"] = _eval_op("/", pos, S) & 1
    _ring_moved(th, side, pos)


def _ring_advance(th, n):
    side = n.ring
    S, env = side.stages, th.env
    c = th.prog.sc(n.count)(env)
    sk, pk = f"{side.name}_stage", f"{side.name}_phase"
    if c == 1:
        env[sk] += 1
        if env[sk] == S:
            env[sk] = 0
            env[pk] ^= 1
    else:
        env[sk] += c
        env[pk] ^= _eval_op("/", env[sk], S) & 1
        env[sk] = _eval_op("%", env[sk], S)
    got = th.ring_pos.get(side.name)
    if got is None:
        raise CircbufError(f"{th.cta.kernel_name}: {th.who()} advances ring {side.name} before its RING_INIT")
    pos = got[0] + c
    if env[sk] != pos % S or env[pk] != (pos // S) & 1:
        raise CircbufError(
            f"{th.cta.kernel_name}: ring {side.name} advanced by {c} to stage {env[sk]} phase {env[pk]}, "
            f"but position {pos} is stage {pos % S} phase {(pos // S) & 1}"
        )
    _ring_moved(th, side, pos)


def _ring_moved(th, side, pos):
    th.ring_pos = dict(th.ring_pos)
    th.ring_pos[side.name] = (pos, side.stages)
    if th.cta.checker is not None:
        th.tick()
        th.ring_log.append((th.clk, len(th.ring_log), th.ring_pos))
        th.tick()


# TMA copies and bulk groups
class _Op(Agent):
    """An asynchronous operation in flight."""

    kind = ""
    done = False
    group = None

    def sees(self, comp, clk) -> bool:
        return self.vc.get(comp, 0) >= clk  # as of its issue (its own component is its barrier's)

    def __init__(self, cta, th):
        self.cta, self.th = cta, th
        self.issued_clk = th.clk
        if cta.checker is not None:
            vc = dict(th.vc)
            vc[th.cid] = th.clk
            self.vc = vc


class TmaLoadOp(_Op):
    kind = "tma_load"

    def __init__(self, cta, th, geo, gidx, buf, sidx, bar):
        super().__init__(cta, th)
        self.geo, self.gidx, self.buf, self.sidx, self.bar = geo, gidx, buf, sidx, bar
        self.cid = ("tma", cta.rank, bar.label)
        self.clk = 0

    def who(self, clk=None):
        into = f" of CTA {self.cta.bidx}" if self.th.cta is not self.cta else ""
        by = f" of CTA {self.th.cta.bidx}" if into else ""
        return (
            f"the TMA copy into {self.buf}{into} (completing on {self.bar.label}) issued by "
            f"{self.th.who(self.issued_clk)}{by}"
        )

    def complete(self):
        cta = self.cta
        if cta.gone:
            raise CircbufError(
                f"{cta.kernel_name}: {self.who()} lands in CTA {cta.bidx}, which has exited (no cluster "
                "barrier before exit: a CTA must not exit while its peers may still write to its shared memory)"
            )
        vals, off, _ = cta.glob.data(self.geo.name)
        zero = _zero(cta.alloc[self.buf][4])
        buf = cta.shared[self.buf]
        for s, g in zip(self.sidx, self.gidx):
            buf[s] = vals[off + g] if g >= 0 else zero
        if cta.checker is not None:
            key = self.bar.label
            cta.tma_clock[key] = self.clk = cta.tma_clock.get(key, 0) + 1
            cta.checker.async_write_done(self, cta.shadow[self.buf], self.sidx)
        self.done = True
        self.bar.complete_tx(self, self.geo.nbytes)
        if self.th.cta is not cta:  # a peer's multicast slice
            cta.remote_access(self.cid, self.clk, f"{self.who()} lands in its {self.buf}")


class TmaStoreOp(_Op):
    kind = "tma_store"

    def __init__(self, cta, th, geo, gidx, buf, sidx, seq):
        super().__init__(cta, th)
        self.geo, self.gidx, self.buf, self.sidx = geo, gidx, buf, sidx
        self.cid, self.clk = ("bulk", th.cid), seq

    def who(self, clk=None):
        return f"the TMA store of {self.buf} (bulk group {self.clk}) issued by {self.th.who(self.issued_clk)}"

    def complete(self):
        cta = self.cta
        name = self.geo.name
        vals, off, _ = cta.glob.data(name)
        buf = cta.shared[self.buf]
        counts = cta.glob.counts.get(name)
        for s, g in zip(self.sidx, self.gidx):
            if g >= 0:
                vals[off + g] = buf[s]
                if counts is not None:
                    counts[g] += 1
        cta.glob.mark(name)
        if cta.checker is not None:
            cta.checker.async_read_done(self, cta.shadow[self.buf], self.sidx)
        self.done = True
        self.th.bulk.op_done(self)


def _smem_box(th, n, ref, geo):
    cta = th.cta
    name = ref.tv.name
    if name not in cta.alloc:
        raise CircbufError(f"{cta.kernel_name}: {th.who()} copies to/from {name}, which is not allocated")
    base, esize = cta.alloc[name][:2]
    if esize != geo.itemsize:
        raise CircbufError(
            f"{cta.kernel_name}: {name} holds {esize}-byte elements, the tensor map of {geo.name} {geo.itemsize}-byte ones"
        )
    i = th.prog.sc(ref.index)(th.env)
    sidx = geo.smem_index(base + i * esize, base, esize)
    size = len(cta.shared[name])
    if min(sidx) < 0 or max(sidx) >= size:
        raise CircbufError(
            f"{cta.kernel_name}: {th.who()}'s bulk copy of {geo.elems} elements at {name}[{i}] runs outside "
            f"its {size} elements"
        )
    return sidx


def _tma_load(th, n):
    cta = th.cta
    geo = cta.launch.maps[n.map_index]
    if geo.nbytes != n.box_bytes:
        raise CircbufError(f"{cta.kernel_name}: TMA load of {geo.nbytes} bytes announced as {n.box_bytes}")
    coords = [th.prog.sc(c)(th.env) for c in n.coords]
    sidx = _smem_box(th, n, n.dst, geo)
    gidx = geo.global_index(coords)
    # a multicast slice lands at the same offset in each CTA that shares the tile
    ranks = (
        kir.cluster_peers(cta.launch.cluster, (n.multicast,), cta.cidx, cta.cidy)
        if n.multicast
        else [cta.rank]
    )
    for r in ranks:
        dest = cta.peer(th, r, "multicasts into") if n.multicast else cta
        bar = dest.mbarrier(th, n.bar)
        if n.dst.tv.name not in dest.shared:
            raise CircbufError(
                f"{cta.kernel_name}: {th.who()} multicasts into {n.dst.tv.name} of CTA {dest.bidx}, "
                "which is not allocated there yet (no cluster barrier after the barriers' initialization)"
            )
        op = TmaLoadOp(dest, th, geo, gidx, n.dst.tv.name, sidx, bar)
        if dest.checker is not None:
            dest.checker.async_write_issue(op, dest.shadow[op.buf], sidx)
        cta.sched.start(op)
    th.tick()
    yield None


def _tma_store(th, n):
    cta = th.cta
    geo = cta.launch.maps[n.map_index]
    coords = [th.prog.sc(c)(th.env) for c in n.coords]
    sidx = _smem_box(th, n, n.src, geo)
    if cta.turns_epi is not None:
        th.check_turn_store(geo.name)
    op = TmaStoreOp(cta, th, geo, geo.global_index(coords), n.src.tv.name, sidx, len(th.bulk.groups) + 1)
    th.bulk.open.append(op)
    if cta.checker is not None:
        cta.checker.async_read_issue(op, cta.shadow[op.buf], sidx)
    th.tick()
    cta.sched.start(op)
    yield None


def _bulk_commit(th, n):
    b = th.bulk
    g = BulkGroup(len(b.groups) + 1, b.open)
    for op in b.open:
        op.group = g
    b.groups.append(g)
    b.open = []


def _bulk_wait(th, n):
    b = th.bulk
    upto = len(b.groups) - n.pending
    if upto <= 0:
        return
    w = BulkWait(th, upto)
    if not w.ready(th):
        yield w
    if th.cta.checker is not None:
        g = b.groups[upto - 1]
        ep = g.ep
        if ep is None:
            ep = g.ep = {("bulk", th.cid): g.seq}
        th.acquire(ep)


# cp.async: copies by the producer threads (a ring's fill kind cp.async)
class CpAsyncOp(_Op):
    """One thread's ``cp.async`` of ``len(sidx)`` elements in flight: it
    lands at a random later step, zeros past its ``valid`` elements (the
    src-size operand), and then counts down the arrivals waiting on it."""

    kind = "cp_async"

    def __init__(self, cta, th, gname, gidx, buf, sidx, valid):
        super().__init__(cta, th)
        self.gname, self.gidx, self.buf, self.sidx, self.valid = gname, gidx, buf, sidx, valid
        self.cid, self.clk = ("cp.async", th.cid), 0
        self.watchers: list = []

    def who(self, clk=None):
        return f"the cp.async into {self.buf} issued by {self.th.who(self.issued_clk)}"

    def complete(self):
        cta = self.cta
        vals, off, _ = cta.glob.data(self.gname)
        zero = _zero(cta.alloc[self.buf][4])
        buf = cta.shared[self.buf]
        for j, s in enumerate(self.sidx):
            buf[s] = vals[off + self.gidx + j] if j < self.valid else zero
        if cta.checker is not None:
            cta.tma_clock[self.cid] = self.clk = cta.tma_clock.get(self.cid, 0) + 1
            cta.checker.async_write_done(self, cta.shadow[self.buf], self.sidx)
        self.done = True
        self.th.cp.op_done(self)
        for w in self.watchers:
            w.one_done(self)


class CpAsyncArrival:
    """``cp.async.mbarrier.arrive.noinc``: one arrival on ``bar`` once the
    thread's cp.asyncs issued before it have landed, carrying their clocks."""

    def __init__(self, bar, ops):
        pending = [op for op in ops if not op.done]
        self.bar, self.left, self.ops = bar, len(pending), ops
        for op in pending:
            op.watchers.append(self)
        if not pending:
            bar.arrive_async(ops)

    def one_done(self, op):
        self.left -= 1
        if self.left == 0:
            self.bar.arrive_async(self.ops)


def _box_fns(p, n):
    """The compiled scalars of a cp.async box: chunk -> (shared index, swizzled;
    global index; in range; elements left in the row)."""

    def make():
        from ..lowering.indexing import swizzle_index

        dst, gidx, cond, inner = n.parts(kir.Var("cb_c"))
        return tuple(p.sc(x) for x in (swizzle_index(n.dst.tv, dst), gidx, cond, inner, n.dims[0][4]))

    return p._memo((id(n), "box"), n, make)


def _cp_async_box(th, n):
    cta, p = th.cta, th.prog
    name = n.dst.tv.name
    if name not in cta.alloc:
        raise CircbufError(f"{cta.kernel_name}: {th.who()} copies to {name}, which is not allocated")
    tid = th.lin if n.flat else th.env["threadIdx.x"]
    if tid >= n.threads:
        raise CircbufError(f"{cta.kernel_name}: {th.who()} runs a cp.async box of {n.threads} threads")
    fdst, fg, fin, finner, fstep = _box_fns(p, n)
    step = fstep(th.env) if not n.is_async else 1  # cp.async: contiguous elements
    gname = n.src.name
    vals, off, span = cta.glob.data(gname)
    buf = cta.shared[name]
    v, esize = n.vector, n.src.dtype.size
    nbytes = v * esize
    zero = _zero(n.dst.tv.dtype)
    env = dict(th.env)
    for c in range(tid, n.chunks, n.threads):
        env["cb_c"] = c
        i = fdst(env)
        ok = bool(fin(env))
        g = fg(env) if ok else 0
        valid = min(max(finner(env), 0), v) if ok else 0
        if i < 0 or i + v > len(buf) or (v > 1 and i % v):
            raise CircbufError(
                f"{cta.kernel_name}: {th.who()}'s copy of {v} elements to {name}[{i}] is outside its "
                f"{len(buf)} elements or not aligned to them"
            )
        last = g + (valid - 1) * step
        if valid and (min(g, last) < 0 or max(g, last) >= span):
            raise CircbufError(
                f"{cta.kernel_name}: {th.who()} copies {gname}[{g}:{g + valid}], outside its {span} elements"
            )
        sidx = list(range(i, i + v))
        if n.is_async:
            if valid and ((off + g) * esize) % nbytes:
                raise CircbufError(
                    f"{cta.kernel_name}: {th.who()}'s {nbytes}-byte cp.async reads {gname} at byte "
                    f"{(off + g) * esize} of its storage, not a multiple of {nbytes} (a misaligned cp.async)"
                )
            op = CpAsyncOp(cta, th, gname, g, name, sidx, valid)
            th.cp.issue(op)
            if cta.checker is not None:
                cta.checker.async_write_issue(op, cta.shadow[name], sidx)
            th.tick()
            cta.sched.start(op)
        else:
            if cta.checker is not None:
                cta.checker.write(th, cta.shadow[name], i, v)
            for j in range(v):
                buf[i + j] = vals[off + g + j * step] if j < valid else zero
            th.tick()
    yield None


def _cp_async_arrive(th, n):
    bar = th.cta.mbarrier(th, n.bar)
    bar._usable(th, "arrives on (cp.async.mbarrier.arrive)")
    CpAsyncArrival(bar, th.cp.for_arrival())
    th.tick()
    yield None


def _cp_async_commit(th, n):
    th.cp.commit()


def _cp_async_wait(th, n):
    w = CpAsyncWaitGroup(th.cp, n.pending)
    if not w.ready(th):
        yield w
    if th.cta.checker is not None:
        for op in w.retired():  # the copies' writes happen before what the thread does next
            th.acquire({**op.vc, op.cid: max(op.clk, op.vc.get(op.cid, 0))})


# wgmma
class WgmmaOp(_Op):
    kind = "wgmma"

    def __init__(self, cta, wg, vc, reads, role):
        self.cta, self.wg, self.vc, self.reads, self.role = cta, wg, vc, reads, role
        cta.wg_clock[wg] = self.clk = cta.wg_clock.get(wg, 0) + 1
        self.cid = ("wgmma", cta.rank, wg)
        self.ep = {self.cid: self.clk}
        self.retired = False

    def who(self, clk=None):
        return f"the wgmmas of warpgroup {self.wg} ({self.role})"

    def retire(self):
        if not self.retired:
            self.retired = True
            ch = self.cta.checker
            if ch is not None:
                for buf, idx in self.reads:
                    ch.async_read_done(self, self.cta.shadow[buf], idx)


def _wgmma(th, n):
    p, cta, env = th.prog, th.cta, th.env
    args = (
        p.sc(n.acc.index)(env),
        p.sc(n.a.offset)(env),
        p.sc(n.b.offset)(env),
        p.sc(n.scale_d)(env),
    )
    order = p.turn_of_acc.get(n.acc.tv.name)
    if order is not None and cta.checker is not None and not th.holds(order, "mma"):
        raise CircbufError(
            f"{cta.kernel_name}: {th.who()} issues a wgmma into {n.acc.tv.name} outside its turn on the tensor "
            f"cores ({order.barrier('mma')}[{th.group}] not held: the turn was handed over before the MMAs were issued)"
        )
    b = cta.collective(("wgmma", th.wg), f"the wgmma of warpgroup {th.wg}", hb=False)
    w = b.arrive(th, 128, payload=args, release=lambda arrived: _do_wgmma(cta, n, th.wg, arrived), where=n)
    yield w
    op = b.result(w.gen, th)
    th.wg_open.append(op)
    if cta.checker is not None:
        th.acc_busy[n.acc.tv.name] = op


def _do_wgmma(cta, n, wg, arrived):
    first = arrived[0][1]
    for t, args in arrived:
        if args != first:
            raise CircbufError(
                f"{cta.kernel_name}: the threads of warpgroup {wg} issue one wgmma with different operands "
                f"({arrived[0][0].who()}: {first}, {t.who()}: {args})"
            )
    acc_i, a_off, b_off, scale = first
    m, nn, k = n.shape
    reads = []
    mats = []
    for op, mn in ((n.a, m), (n.b, nn)):
        name = op.tv.name
        base, esize = cta.alloc[name][:2]
        buf = cta.shared[name]
        flat, get = _operand(cta, op, a_off if op is n.a else b_off, base, mn, k, esize, len(buf))
        reads.append((name, flat))
        vals = torch.tensor(get(buf), dtype=torch.float32 if op.tv.dtype == DataType.Float else torch.float64)
        if op.tv.dtype == DataType.Float:  # tf32: the tensor cores read 10 of the 23 mantissa bits
            vals = (vals.view(torch.int32) & ~0x1FFF).view(torch.float32)
        mats.append(vals.to(torch.float64).reshape(mn, k))
    d = mats[0] @ mats[1].T  # [m, n]
    vc = None
    if cta.checker is not None:
        acc = Accum()
        for t, _ in arrived:
            acc.add(t.vc, t.cid, t.clk)
        vc = acc.freeze()
    t0 = arrived[0][0]
    op = WgmmaOp(cta, wg, vc, reads, t0.role_label())
    if cta.checker is not None:
        for name, flat in reads:
            cta.checker.async_read_issue(op, cta.shadow[name], flat)
    name = n.acc.tv.name
    frag = _fragments(nn)
    order = sorted(arrived, key=lambda a: a[0].lin)
    vals = d.reshape(-1)[frag[torch.tensor([t.lin % 128 for t, _ in order])]]  # [threads, n / 2]
    nr = nn // 2
    if scale:
        vals += torch.tensor([t.local[name][acc_i : acc_i + nr] for t, _ in order], dtype=torch.float64)
    rows = vals.to(torch.float32).tolist()
    out = {}
    for (t, _), row in zip(order, rows):
        t.local[name][acc_i : acc_i + nr] = row
        out[t.lin] = op
    return out


_FRAG: dict = {}
_OPERANDS: dict = {}


def _operand(cta, op, start, base, mn, k, esize, size):
    """The flat element indices a wgmma operand reads, and their getter."""
    key = (op.lbo, op.sbo, op.swizzle, op.transpose, start, base, mn, k, esize)
    got = _OPERANDS.get(key)
    if got is None:
        idx = operand_index(op, start, base, mn, k, esize)
        flat = [i for row in idx for i in row]
        got = _OPERANDS[key] = (flat, operator.itemgetter(*flat), min(flat), max(flat))
    if got[2] < 0 or got[3] >= size:
        raise CircbufError(
            f"{cta.kernel_name}: a wgmma operand descriptor of {op.tv.name} reads outside its {size} elements"
        )
    return got[0], got[1]


def _fragments(n):
    """The accumulator layout as a [128, n / 2] index tensor into the [64, n] tile."""
    got = _FRAG.get(n)
    if got is None:
        got = _FRAG[n] = torch.tensor(fragment_index(n))
    return got


def _wgmma_fence(th, n):
    pass


def _wgmma_commit(th, n):
    th.wg_groups.append(th.wg_open)
    th.wg_open = []


def _wgmma_wait(th, n):
    groups = th.wg_groups
    upto = len(groups) - n.pending
    if upto <= 0:
        return
    last = None
    for g in groups[:upto]:
        for op in g:
            op.retire()
            last = op
    th.wg_groups = groups[upto:]
    if last is not None:
        th.acquire(last.ep)
    if th.acc_busy:
        live = {id(op) for g in th.wg_groups for op in g} | {id(op) for op in th.wg_open}
        th.acc_busy = {k: op for k, op in th.acc_busy.items() if id(op) in live}


_HANDLERS = {
    kir.ForLoop: (_for_gen, _for_plain),
    kir.IfThenElse: (_if_gen, _if_plain),
    kir.ElectOne: (_elect_gen, _elect_plain),
    kir.RoleSwitch: (_roles, None),
    kir.Let: (None, _let),
    kir.Allocate: (None, _allocate),
    kir.Assign: (None, _assign),
    kir.Comment: (None, _comment),
    kir.Return: (None, _return),
    kir.BlockSync: (_block_sync, None),
    kir.ClusterSync: (_cluster_sync, None),
    kir.BlockReduce: (_block_reduce, None),
    kir.MBarrierAlloc: (None, _mbar_alloc),
    kir.MBarrierInit: (None, _mbar_init),
    kir.MBarrierInval: (None, _mbar_inval),
    kir.MBarrierArrive: (_mbar_arrive, None),
    kir.MBarrierArriveExpectTx: (_mbar_expect_tx, None),
    kir.MBarrierWait: (_mbar_wait, None),
    kir.Fence: (None, _fence),
    kir.SetMaxNReg: (None, _setmaxnreg),
    kir.RingInit: (None, _ring_init),
    kir.RingAdvance: (None, _ring_advance),
    kir.TmaLoad: (_tma_load, None),
    kir.CpAsyncBox: (_cp_async_box, None),
    kir.CpAsyncArrive: (_cp_async_arrive, None),
    kir.CpAsyncCommit: (None, _cp_async_commit),
    kir.CpAsyncWait: (_cp_async_wait, None),
    kir.TmaStore: (_tma_store, None),
    kir.BulkCommitGroup: (None, _bulk_commit),
    kir.BulkWaitGroup: (_bulk_wait, None),
    kir.Wgmma: (_wgmma, None),
    kir.WgmmaFence: (None, _wgmma_fence),
    kir.WgmmaCommit: (None, _wgmma_commit),
    kir.WgmmaWait: (None, _wgmma_wait),
}
_HANDLERS.update(_PEER_HANDLERS)  # issue 22's peer stores and flags
_HANDLERS.update(_SPLIT_K_HANDLERS)  # split-K's fix-up in the GEMM kernel
_YIELDING = tuple(t for t, (gen, plain) in _HANDLERS.items() if plain is None and t is not kir.RoleSwitch) + (
    kir.RoleSwitch,
)
