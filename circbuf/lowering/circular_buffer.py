"""Pass: circular buffering of TMA-filled shared-memory buffers.

For each buffer ``X`` marked ``circular_buffer(S, P)``, the loop ``L`` it
rotates over (the innermost serial loop left of its compute-at position) is
rewritten so that the copies for iteration ``i + P`` are in flight while
iteration ``i`` computes. ``full[s]`` barriers say "stage s landed" (one
elected thread arrives with the expected byte count; the copies complete the
transaction); the slot is known free again through a block sync at the end of
each iteration (``war="block_sync"``) or an ``empty[s]`` barrier every thread
arrives on (``war="mbarrier"``). Stage ``i % S``, phase ``(i / S) % 2``.

Before::

    FOR j0 in 0..E                                  // L
      FOR j1 in 0..ceilDiv(R, 256)
        TMA_LOAD X[j1 * 256] <- tmap0{j1 * 256, j0 * G + blockIdx.x}
      ... reads X[...] ...

After::

    ALLOC mbarrier X_full[S]
    IF thread 0: MBARRIER_INIT X_full[s] arrivals=1 (each s); FENCE mbarrier_init
    BLOCK_SYNC
    FOR j2 in 0..P                                   // prologue: fill P stages
      IF (j2 < E) and thread 0
        MBARRIER_ARRIVE_EXPECT_TX X_full[j2 % S] bytes=stage bytes
        FOR j1 ..: TMA_LOAD X[(j2 % S) * stage + j1 * 256] <- ... on X_full[j2 % S]
    FOR j0 in 0..E                                   // main; the last P iterations drain
      IF (j0 + P < E) and thread 0
        [MBARRIER_WAIT X_empty[(j0 + P) % S] parity=((j0 + P) / S + 1) % 2]
        MBARRIER_ARRIVE_EXPECT_TX X_full[(j0 + P) % S] ...; TMA_LOAD ... (j0 + P)
      MBARRIER_WAIT X_full[j0 % S] parity=(j0 / S) % 2
      ... reads X[(j0 % S) * stage + ...] ...
      BLOCK_SYNC | MBARRIER_ARRIVE X_empty[j0 % S]
    BLOCK_SYNC; IF thread 0: MBARRIER_INVAL X_full[s] (each s)

The drain is the main loop's last P iterations with their issue predicated
off, so the consumer body (reductions, stores) is not duplicated.

WarpSpecialized(on=TIDy): one more row of threads is launched; it is the
producer. Its elected thread runs a clone of every serial loop enclosing the
copies, holding only the copies; everyone else runs the original nest with
the copies removed. Stage and phase come from the linear index over all
enclosing serial loops, so an outer loop and the buffered loop share one
ring that never drains between outer iterations::

    IF (threadIdx.y == Y)                    // producer
      [SETMAXNREG.DEC 40]
      IF (threadIdx.x == 0)
        FOR j0 in 0..E                       // clone: copies only
          MBARRIER_WAIT X_empty[lin % S] parity=(lin / S + 1) % 2
          MBARRIER_ARRIVE_EXPECT_TX X_full[lin % S]; TMA_LOAD ...
      RETURN
    ELSE                                     // consumers
      [SETMAXNREG.INC 232]
      FOR j0 in 0..E
        MBARRIER_WAIT X_full[lin % S] parity=(lin / S) % 2
        ... (block reductions sync consumers only: bar.sync 1, Y * T)
        MBARRIER_ARRIVE X_empty[lin % S]
"""

from __future__ import annotations

import copy

from ..ir import Bin, CircbufError, Const, ParallelType, Var, WarpSpecialized, simplify
from ..ir.scalar import substitute
from .kir import (
    Allocate,
    Assign,
    BlockReduce,
    BlockSync,
    Comment,
    Fence,
    ForLoop,
    IfThenElse,
    Kernel,
    MBarrierAlloc,
    MBarrierArrive,
    MBarrierArriveExpectTx,
    MBarrierInit,
    MBarrierInval,
    MBarrierRef,
    MBarrierWait,
    Return,
    SetMaxNReg,
    TensorRef,
    TmaLoad,
    thread0_cond,
    walk,
)


def _find_loop(nodes, key):
    found = []
    walk(nodes, lambda n, s: found.append(n) if isinstance(n, ForLoop) and n.key == key else None)
    return found[0] if found else None


def _only_loads(node, tv) -> bool:
    if isinstance(node, TmaLoad):
        return node.dst.tv is tv
    if isinstance(node, ForLoop):
        return bool(node.body) and all(_only_loads(n, tv) for n in node.body)
    return False


def _reads(node, tv) -> bool:
    hit = []

    def f(n, _s):
        if isinstance(n, Assign) and any(isinstance(o, TensorRef) and o.tv is tv for o in n.operands):
            hit.append(n)

    walk([node], f)
    return bool(hit)


def _clone_loads(nodes, mapping, stage_off, bar):
    """Copies of the load nest for another iteration: indices substituted, the
    destination moved to the stage, every copy completing on ``bar``."""
    out = []
    for n in nodes:
        if isinstance(n, ForLoop):
            c = copy.copy(n)
            c.extent = substitute(n.extent, mapping)
            c.body = _clone_loads(n.body, mapping, stage_off, bar)
            out.append(c)
        else:
            dst = TensorRef(n.dst.tv, substitute(n.dst.index, mapping) + stage_off)
            out.append(
                TmaLoad(dst, n.map_index, [substitute(x, mapping) for x in n.coords], n.box_bytes, bar)
            )
    return out


def _offset_reads(nodes, tv, off):
    def f(n, _s):
        if isinstance(n, Assign):
            n.operands = [
                TensorRef(o.tv, o.index + off, o.vector) if isinstance(o, TensorRef) and o.tv is tv else o
                for o in n.operands
            ]
        elif isinstance(n, BlockReduce) and n.ref is not None and n.ref.tv is tv:
            raise CircbufError(f"{tv.name}: a circular buffer cannot be a reduction result")

    walk(nodes, f)


def circular_buffer(kernel: Kernel) -> Kernel:
    """Entry: rewrite the loops of circular-buffered TMA buffers (see module doc)."""
    if not kernel.circular_loops:
        return kernel
    allocs = {}
    walk(kernel.body, lambda n, s: allocs.__setitem__(n.tv.name, n) if isinstance(n, Allocate) else None)
    ws = [n for n in kernel.circular_loops if isinstance(allocs[n].tv.circular[2], WarpSpecialized)]
    if ws:
        return _warp_specialize_all(kernel, allocs, ws)
    setup, teardown = [], []
    thread0 = thread0_cond(kernel)
    n_threads = kernel.max_threads
    for name, key in kernel.circular_loops.items():
        alloc = allocs[name]
        tv = alloc.tv
        stages, prefetch, kind = tv.circular
        loop = _find_loop(kernel.body, key)
        if loop is None:
            raise CircbufError(f"{name}: its circular-buffer loop was not generated (is the axis parallel?)")
        loads = [n for n in loop.body if _only_loads(n, tv)]
        if not loads:
            raise CircbufError(f"{name}: circular buffering needs the TMA copies directly in its loop")
        rest = [n for n in loop.body if not any(n is m for m in loads)]
        first_read = next((k for k, n in enumerate(loop.body) if _reads(n, tv)), len(loop.body))
        if any(loop.body.index(m) > first_read for m in loads):
            raise CircbufError(f"{name}: a read of the buffer precedes its copy in the loop")
        S, P = stages, prefetch
        full = f"{name}_full"
        empty = f"{name}_empty" if kind.war == "mbarrier" else None
        kernel.barrier_names += [full] + ([empty] if empty else [])
        stage_elems = alloc.size
        stage_bytes = simplify(stage_elems * tv.dtype.size)
        i, E = loop.index, loop.extent

        ring = _Ring(S, full, empty, stage_elems, stage_bytes, loads, i)
        issue = ring.issue
        pv = Var(f"{i.name}_pro", lo=0, hi=Const(P))
        prologue = ForLoop(pv, Const(P), [IfThenElse(Bin("&&", pv.lt(E), thread0), issue(pv))], key=-1)
        ahead = simplify(i + P)
        main = [
            Comment(f"issue the copies of iteration {ahead}, then wait for iteration {i}"),
            IfThenElse(Bin("&&", ahead.lt(E), thread0), issue(ahead)),
            MBarrierWait(MBarrierRef(full, simplify(i % S)), simplify((i // S) % 2)),
        ]
        _offset_reads(rest, tv, simplify((i % S) * stage_elems))
        release = (
            [MBarrierArrive(MBarrierRef(empty, simplify(i % S)))]
            if empty
            else [BlockSync(f"WAR: stage {i} % {S} of {name} is refilled next")]
        )
        loop.body = main + _release_after_last_read(rest, tv, release)
        _insert_before(kernel.body, loop, [Comment(f"prologue: fill {P} of {S} stages of {name}"), prologue])
        # barrier setup at the top of the kernel, teardown at the end
        setup.append(MBarrierAlloc(full, S))
        inits = [MBarrierInit(MBarrierRef(full, Const(s)), Const(1)) for s in range(S)]
        invals = [MBarrierInval(MBarrierRef(full, Const(s))) for s in range(S)]
        if empty:
            setup.append(MBarrierAlloc(empty, S))
            inits += [MBarrierInit(MBarrierRef(empty, Const(s)), Const(n_threads)) for s in range(S)]
            invals += [MBarrierInval(MBarrierRef(empty, Const(s))) for s in range(S)]
        setup.append(IfThenElse(thread0, inits + [Fence("mbarrier_init")]))
        teardown.append(IfThenElse(thread0, invals))
    setup.append(BlockSync("barriers initialized before any thread uses them"))
    kernel.body = setup + kernel.body + [BlockSync("every wait is done before the barriers go")] + teardown
    return kernel


class _Ring:
    """One circular buffer's stages and barriers."""

    def __init__(self, stages, full, empty, stage_elems, stage_bytes, loads, index):
        self.S, self.full, self.empty = stages, full, empty
        self.stage_elems, self.stage_bytes = stage_elems, stage_bytes
        self.loads, self.index = loads, index

    def issue(self, it) -> list:
        """Copies of iteration ``it`` into stage ``it % S``: wait for the slot
        (mbarrier WAR), announce the bytes, issue."""
        slot = simplify(it % self.S)
        body = []
        if self.empty:
            body.append(MBarrierWait(MBarrierRef(self.empty, slot), simplify((it // self.S + 1) % 2)))
        body.append(MBarrierArriveExpectTx(MBarrierRef(self.full, slot), self.stage_bytes))
        body += _clone_loads(
            self.loads, {self.index.name: it}, simplify(slot * self.stage_elems), MBarrierRef(self.full, slot)
        )
        return body


def _release_after_last_read(rest, tv, release) -> list:
    """The slot is free once its last reader is done: a row copied to registers
    releases its stage before the reductions run."""
    last = max((k for k, n in enumerate(rest) if _reads(n, tv)), default=len(rest) - 1)
    return rest[: last + 1] + release + rest[last + 1 :]


def _insert_before(nodes, target, new) -> bool:
    for k, n in enumerate(nodes):
        if n is target:
            nodes[k:k] = new
            return True
        if isinstance(n, ForLoop) and _insert_before(n.body, target, new):
            return True
        if isinstance(n, IfThenElse) and (
            _insert_before(n.then, target, new) or _insert_before(n.else_, target, new)
        ):
            return True
    return False


def _stack_to(nodes, target, stack=()):
    """The ForLoops enclosing ``target`` (outermost first), or None."""
    for n in nodes:
        if n is target:
            return list(stack)
        if isinstance(n, ForLoop):
            r = _stack_to(n.body, target, (*stack, n))
            if r is not None:
                return r
        if isinstance(n, IfThenElse):
            r = _stack_to(n.then + n.else_, target, stack)
            if r is not None:
                return r
    return None


def _warp_specialize_all(kernel, allocs, names):
    """All warp-specialized buffers must rotate over one loop with one stage count."""
    if len(names) != len(kernel.circular_loops):
        raise CircbufError("a kernel's circular buffers must all be warp-specialized, or none")
    keys = {kernel.circular_loops[n] for n in names}
    rings = {allocs[n].tv.circular[:1] + (allocs[n].tv.circular[2],) for n in names}
    if len(keys) != 1 or len(rings) != 1:
        raise CircbufError(
            f"warp-specialized buffers {', '.join(names)} must share one loop, stage count and type"
        )
    loop = _find_loop(kernel.body, keys.pop())
    if loop is None:
        raise CircbufError(f"{names[0]}: its circular-buffer loop was not generated (is the axis parallel?)")
    bufs = []
    for n in names:
        tv = allocs[n].tv
        loads = [x for x in loop.body if _only_loads(x, tv)]
        if not loads:
            raise CircbufError(f"{n}: circular buffering needs the TMA copies directly in its loop")
        bufs.append((allocs[n], loads))
    rest = [x for x in loop.body if not any(x is m for _, ls in bufs for m in ls)]
    stages, _, kind = allocs[names[0]].tv.circular
    return _warp_specialize(kernel, bufs, loop, rest, stages, kind)


def _warp_specialize(kernel, bufs, loop, rest, stages, kind):
    name = ", ".join(a.tv.name for a, _ in bufs)
    if kind.on != ParallelType.TIDy:
        raise CircbufError(f"{name}: WarpSpecialized(on={kind.on.name}) is not supported yet (use TIDy)")
    y = kernel.launch.get(ParallelType.TIDy, Const(1))
    tx = kernel.launch.get(ParallelType.TIDx, Const(1))
    if not isinstance(y, Const) or not isinstance(tx, Const):
        raise CircbufError(f"{name}: warp specialization needs constant thread extents")
    consumers = y.value * tx.value
    if kind.registers and tx.value % 128:
        raise CircbufError(
            f"{name}: WarpSpecialized(registers=...) uses setmaxnreg, which acts on whole warpgroups: "
            f"each threadIdx.y row must be a multiple of 128 threads, not {tx.value}"
        )
    kernel.launch[ParallelType.TIDy] = Const(y.value + 1)  # the producer row
    kernel.max_threads = consumers + tx.value
    if kernel.max_threads > 1024:
        raise CircbufError(f"{name}: {kernel.max_threads} threads with the producer row exceed 1024")
    S = stages
    encl = _stack_to(kernel.body, loop) + [loop]
    lin = Const(0)
    for lp in encl:
        lin = lin * lp.extent + lp.index
    lin = simplify(lin)
    slot = simplify(lin % S)
    prod, waits, releases = [], [], []
    for alloc, loads in bufs:
        tv = alloc.tv
        full, empty = f"{tv.name}_full", f"{tv.name}_empty"
        kernel.barrier_names += [full, empty]
        stage_elems = alloc.size
        stage_bytes = simplify(stage_elems * tv.dtype.size)
        # producer: for each buffer, wait for the slot, announce the bytes, copy
        prod += [
            MBarrierWait(MBarrierRef(empty, slot), simplify((lin // S + 1) % 2)),
            MBarrierArriveExpectTx(MBarrierRef(full, slot), stage_bytes),
        ] + _clone_loads(loads, {}, simplify(slot * stage_elems), MBarrierRef(full, slot))
        _offset_reads(rest, tv, simplify(slot * stage_elems))
        waits.append(MBarrierWait(MBarrierRef(full, slot), simplify((lin // S) % 2)))
        releases.append((tv, MBarrierArrive(MBarrierRef(empty, slot))))
    # a clone of the enclosing serial loops around the copies
    for lp in reversed(encl):
        prod = [ForLoop(lp.index, lp.extent, prod, lp.ptype, key=-1)]
    producer = []
    if kind.registers:
        producer.append(SetMaxNReg(kind.registers[0], increase=False))
    producer += [
        IfThenElse(Var("threadIdx.x").eq(0), [Comment("elected producer thread"), *prod]),
        Return(),
    ]
    # consumers: the original nest without the copies
    body = rest
    for tv, rel in releases:
        body = _release_after_last_read(body, tv, [rel])
    loop.body = waits + body

    def named(n, _s):
        if isinstance(n, (BlockReduce, BlockSync)):
            if consumers % 32:
                raise CircbufError(
                    f"{name}: warp-specialized consumers that synchronize need whole warps "
                    f"(named barriers count warps), not {consumers} threads"
                )
            n.barrier = (1, consumers)

    kernel.consumer_barrier = (1, consumers)

    walk(kernel.body, named)
    consumer = [SetMaxNReg(kind.registers[1], increase=True)] if kind.registers else []
    # shared buffers are seen by both roles: declare them before the split
    smem = [n for n in kernel.body if isinstance(n, Allocate) and n.memory.name == "Shared"]
    consumer += [n for n in kernel.body if not any(n is m for m in smem)]
    if kind.registers:
        kernel.min_blocks = 1  # setmaxnreg needs a register cap at entry
    inits, bar_allocs = [], []
    for alloc, _ in bufs:
        full, empty = f"{alloc.tv.name}_full", f"{alloc.tv.name}_empty"
        bar_allocs += [MBarrierAlloc(full, S), MBarrierAlloc(empty, S)]
        inits += [MBarrierInit(MBarrierRef(full, Const(s)), Const(1)) for s in range(S)]
        inits += [MBarrierInit(MBarrierRef(empty, Const(s)), Const(consumers)) for s in range(S)]
    kernel.body = [
        *bar_allocs,
        IfThenElse(
            Bin("&&", Var("threadIdx.x").eq(0), Var("threadIdx.y").eq(0)), inits + [Fence("mbarrier_init")]
        ),
        BlockSync("barriers initialized before the roles split"),
        *smem,
        Comment(f"warp roles: threadIdx.y == {y.value} loads {name}, the other rows compute"),
        IfThenElse(Var("threadIdx.y").eq(y.value), producer, consumer, roles=True),
    ]
    return kernel
