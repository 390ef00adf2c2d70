"""Pass: circular buffering of TMA-filled shared-memory buffers.

Requires: allocated, indexed, predicated, wgmma_synced, roles, turns, tma_stores_synced,
launch, max_threads; provides: pipelined, rings.

A buffer ``X`` marked ``circular_buffer(S, P)`` holds ``S`` stages; the
loop it rotates over (its *ring loop*) gives one ring position per
iteration. ``full[s]`` barriers say "stage s landed" (one elected thread
announces the bytes, the copies complete the transaction); ``empty[s]``
barriers (or a block sync) say "stage s may be refilled". Each side of the
ring carries a stage index and a phase bit as variables (``X_load_stage``,
``X_use_phase``, ...), advanced once per ring position and flipped at each
wrap, so the ring is right for any loops around the ring loop: positions
run on across an enclosing loop (a warp-specialized ring never drains there;
a Pipelined one drains and re-primes each outer iteration, its stage and
phase carried over).

Pipelined (every thread loads and computes; ``P`` copies in flight)::

    RING X_load (stages=S); RING X_use (stages=S)
    FOR o ..                                      // any enclosing loops
      FOR j in 0..P                               // prologue: the first P copies
        IF (j < E) and thread 0: [WAIT X_empty[load_stage] parity=load_phase ^ 1]
                                  EXPECT_TX X_full[load_stage]; TMA_LOAD -> stage; ADVANCE X_load
      FOR i in 0..E                               // the ring loop
        IF (i + P < E) and thread 0: ... the copies of i + P, as above ...
        WAIT X_full[use_stage] parity=use_phase
        ... reads X[use_stage * stage + ...] ...
        BLOCK_SYNC | ARRIVE X_empty[use_stage]     // right after the last read
        ADVANCE X_use

A Pipelined buffer whose copies are ``CpAsyncBox`` es (``cache_after(op="cp.async")``)
is filled by every thread of the CTA: each copies its chunks of the box
(numbered by its linear thread index) and arrives on ``full[stage]``
(``cp.async.mbarrier.arrive.noinc``, one arrival per thread), no thread-0
condition; the rest is as above::

      FOR i in 0..E
        IF (i + P < E): CP_ASYNC_BOX X -> stage (this thread's chunks)
                        CP_ASYNC_ARRIVE.NOINC X_full[load_stage]; ADVANCE X_load
        WAIT X_full[use_stage] parity=use_phase
        ... reads ...; BLOCK_SYNC; ADVANCE X_use

WarpSpecialized: the roles pass has split the threads into a ``producer``
role (one more row of threads) and the ``consumers`` (the rows below it,
one sync group per row when the rows split the ring positions, as ping-pong
warpgroups do), each branch of the ``RoleSwitch`` holding its register
setting and the consumers' branch the whole loop nest. This pass makes the
ring between them: it moves the copies into the producer's branch and puts
the waits and releases into the consumers'. One elected lane issues the copies of every buffer of the ring
into one stage per position (one ``full``/``empty`` pair per stage). The
copies either sit inside the readers' loops (then the producer runs a
copy-only clone of the loops around them) or form a loop nest of their
own (a matmul's operand tiles: the tile loop and the k loop of the loads,
separate from the readers' tile loop, k loop and epilogue)::

    ROLES
    ROLE producer: threadIdx.y == Y
      SETMAXNREG.DEC 40
      IF elect_one(warp 0 of the row)
        RING X_load
        FOR t in blockIdx.x..T step gridDim.x
          FOR k in 0..K
            WAIT X_empty[load_stage] parity=load_phase ^ 1
            EXPECT_TX X_full[load_stage] bytes=A + B; TMA_LOAD A, B -> stage; ADVANCE X_load
      RETURN
    ROLE consumers: threadIdx.y in 0..Y
      SETMAXNREG.INC 232
      RING X_use at position p0                   // a ping-pong warpgroup starts a tile later
      FOR t in blockIdx.x + threadIdx.y * G..T step 2 * G
        FOR k in 0..K
          WAIT X_full[use_stage] parity=use_phase
          WGMMA_FENCE; WGMMA ...; WGMMA_COMMIT_GROUP; WGMMA_WAIT_GROUP 1
          IF (k != 0): ARRIVE X_empty[(use_stage + S - 1) % S]   // the previous stage's wgmmas are done
          ADVANCE X_use
        WGMMA_WAIT_GROUP 0; ARRIVE X_empty[(use_stage + S - 1) % S]
        ... epilogue ...
        ADVANCE X_use by K                        // the other warpgroup's tile

Fill ``cp.async`` (a buffer whose copies are ``CpAsyncBox`` es: operands a
tensor map cannot describe): every thread of the producer role runs the
copy nest; each waits for the slot, copies its chunks of each box, and
arrives on the full barrier (``cp.async.mbarrier.arrive.noinc``; after
copies through registers, ``fence.proxy.async`` and an arrive), whose
count is the producer's threads per kind of copy (+1 where a TMA buffer
shares the ring: the elected lane still announces and issues it); the
consumers fence the proxies after each full wait (wgmma reads what the
generic proxy wrote)::

    ROLE producer: threadIdx.y == Y
      RING X_load
      FOR t ..: FOR k ..
        WAIT X_empty[load_stage] parity=load_phase ^ 1      // every thread
        CP_ASYNC_BOX A -> stage (this thread's chunks); CP_ASYNC_BOX B -> stage
        CP_ASYNC_ARRIVE.NOINC X_full[load_stage]; ADVANCE X_load
      CP_ASYNC_COMMIT_GROUP; CP_ASYNC_WAIT_GROUP 0; RETURN

Fill ``multicast`` (a thread-block cluster's CTAs share an operand tile: its
box is split into slices bound to a cluster axis, ``TmaLoad.multicast``): each
CTA's elected lane loads its slice into the stage of every CTA that shares the
tile, completing on each one's full barrier, whose ``expect_tx`` still counts
the whole stage; a consumer release arrives on the stage's empty barrier in
every CTA whose slices land in its own (``MBarrierArrive.peers``), so an empty
barrier counts the releases of that many CTAs; the producer stays to the exit
cluster barrier (no early return)::

    ROLE producer: ... WAIT X_empty[load_stage] ^ 1
                       EXPECT_TX X_full[load_stage] bytes=A + B (the whole stage)
                       TMA_LOAD A -> stage; TMA_LOAD B[slice cidx] -> stage multicast along cidx
    ROLE consumers: ... ARRIVE X_empty[s] in every CTA multicasting to this one

A reader's position is found by mapping its loops onto the producer's: the
i-th serial loop around the reads corresponds to the i-th loop of the
producer's nest, with the same trip count; a reader loop that starts
``q`` producer steps later and strides ``r`` producer steps starts its
ring ``q x (positions per iteration)`` later and skips ``(r - 1) x (positions
per iteration)`` after each of its iterations. A stage read by asynchronous
wgmmas is released only once they are done: after the next k step's
``wgmma.wait_group 1``, or the ``wait_group 0`` after the k loop.

The pass describes each ring as IR data (``kernel.rings``: a ``Ring`` with
its stages, prefetch, producer and consumer roles, fill ``tma``, the
``full``/``empty`` arrays and their arrival counts, and the ``load``/``use``
sides' stage and phase); the mbarriers pass allocates and initializes the
arrays, and the sync pass gives each role's syncs its own named barrier.
"""

from __future__ import annotations

import copy
import dataclasses

from ..ir import Bin, CircbufError, Const, ParallelType, Var, WarpSpecialized, simplify
from ..ir.scalar import free_vars, substitute
from . import wgmma_ops
from .kir import (
    Allocate,
    Assign,
    BlockReduce,
    BlockSync,
    Comment,
    CpAsyncArrive,
    CpAsyncBox,
    CpAsyncCommit,
    CpAsyncWait,
    ElectOne,
    Fence,
    ForLoop,
    IfThenElse,
    Kernel,
    MBarrierArrive,
    MBarrierArriveExpectTx,
    MBarrierRef,
    MBarrierWait,
    Return,
    Ring,
    RingAdvance,
    RingInit,
    RoleSwitch,
    SetMaxNReg,
    TensorRef,
    TmaLoad,
    Wgmma,
    cluster_peers,
    enclosing,
    insert_after,
    insert_before,
    thread0_cond,
    walk,
)


# ------------------------------------------------------------ helpers
def _find_loop(nodes, key):
    found = []
    walk(nodes, lambda n, s: found.append(n) if isinstance(n, ForLoop) and n.key == key else None)
    return found[0] if found else None


def _only_loads(node, tvs) -> bool:
    if isinstance(node, (TmaLoad, CpAsyncBox)):
        return node.dst.tv in tvs
    if isinstance(node, ForLoop):
        return bool(node.body) and all(_only_loads(n, tvs) for n in node.body)
    return False


def _reads(node, tv) -> bool:
    """True when ``node`` (or a node inside it) reads ``tv``."""
    hit = []

    def f(n, _s):
        if isinstance(n, Wgmma) and tv in (n.a.tv, n.b.tv):
            hit.append(n)
        elif isinstance(n, Assign):
            if any(isinstance(o, TensorRef) and o.tv is tv for o in n.operands):
                hit.append(n)

    walk([node], f)
    return bool(hit)


def _clone_loads(nodes, mapping, stage_off=None, bar=None):
    """Copies of a load nest: indices substituted (another iteration, or
    another nest's loop variables), the destination moved by ``stage_off``
    and every copy completing on ``bar`` (when given)."""
    out = []
    for n in nodes:
        if isinstance(n, ForLoop):
            c = copy.copy(n)
            c.extent = substitute(n.extent, mapping)
            c.body = _clone_loads(n.body, mapping, stage_off, bar)
            out.append(c)
        else:
            idx = substitute(n.dst.index, mapping)
            dst = TensorRef(n.dst.tv, idx + stage_off if stage_off is not None else idx)
            b = bar if bar is not None else n.bar
            if isinstance(n, CpAsyncBox):
                dims = [(d, box, substitute(first, mapping), ext, st) for d, box, first, ext, st in n.dims]
                out.append(dataclasses.replace(n, dst=dst, dims=dims, bar=b))
                continue
            coords = [substitute(x, mapping) for x in n.coords]
            out.append(TmaLoad(dst, n.map_index, coords, n.box_bytes, b, n.multicast))
    return out


def _offset_reads(nodes, tv, off):
    """Every read of ``tv`` moves to the stage at element offset ``off``."""

    def f(n, _s):
        if isinstance(n, Assign):
            n.operands = [
                TensorRef(o.tv, o.index + off, o.vector) if isinstance(o, TensorRef) and o.tv is tv else o
                for o in n.operands
            ]
        elif isinstance(n, Wgmma):
            for side in ("a", "b"):
                op = getattr(n, side)
                if op.tv is tv:
                    setattr(n, side, dataclasses.replace(op, offset=op.offset + off))
        elif isinstance(n, BlockReduce) and n.ref is not None and n.ref.tv is tv:
            raise CircbufError(f"{tv.name}: a circular buffer cannot be a reduction result")

    walk(nodes, f)


def _loops_around(nodes, target) -> list:
    """The ForLoops enclosing ``target``, outermost first."""
    return [n for n in enclosing(nodes, target) if isinstance(n, ForLoop)]


def _first_read(nodes, tvs):
    """The first node (pre-order, innermost) that reads one of ``tvs``."""
    found = []

    def f(n, _s):
        if not found and isinstance(n, (Assign, Wgmma)) and any(_reads(n, t) for t in tvs):
            found.append(n)

    walk(nodes, f)
    return found[0] if found else None


class _Buffer:
    """One circular-buffered tensor: its allocation and its copies."""

    def __init__(self, alloc, loads):
        self.alloc, self.loads = alloc, loads
        self.tv = alloc.tv
        self.stage_elems = alloc.size
        self.stage_bytes = simplify(alloc.size * alloc.tv.dtype.size)


def _wait_for_slot(ring: Ring, gap_wait: bool) -> list:
    """The producer side's wait for its stage to be free (none without empty
    barriers); with ``gap_wait`` and a prefetch below S - 1, also for the
    position prefetch + 1 behind it, so the producer runs at most P ahead."""
    side, empty, S, P = ring.load, ring.empty, ring.stages, ring.prefetch
    st = side.stage
    if not empty:
        return []
    body = [MBarrierWait(MBarrierRef(empty, st), Bin("^", side.phase, Const(1)))]
    if gap_wait and P < S - 1:
        body.append(
            MBarrierWait(
                MBarrierRef(empty, simplify((st + (S - P - 1)) % S)),
                Bin("^", side.phase, st.lt(P + 1)),
            )
        )
    return body


def _issue(ring: Ring, bufs, loop_index, it, gap_wait=False) -> list:
    """The copies of the producer side's ring position (iteration ``it`` of
    the ring loop) into its stage: wait for the slot, announce the bytes of
    every buffer, issue, advance."""
    side, full = ring.load, ring.full
    st = side.stage
    body = _wait_for_slot(ring, gap_wait)
    nbytes = Const(0)
    for b in bufs:
        nbytes = simplify(nbytes + b.stage_bytes)
    body.append(MBarrierArriveExpectTx(MBarrierRef(full, st), nbytes))
    mapping = {loop_index.name: it} if loop_index is not None else {}
    for b in bufs:
        body += _clone_loads(b.loads, mapping, simplify(st * b.stage_elems), MBarrierRef(full, st))
    body.append(RingAdvance(side, Const(1)))
    return body


# ------------------------------------------------------- fill: cp.async
def _boxes(bufs) -> list:
    out = []
    walk(
        [n for b in bufs for n in b.loads], lambda n, _s: out.append(n) if isinstance(n, CpAsyncBox) else None
    )
    return out


def _by_threads(b) -> bool:
    """Whether buffer ``b``'s copies are cp.async boxes (else TMA boxes)."""
    return bool(_boxes([b]))


def _cp_async_arrivals(bufs, threads: int) -> int:
    """Arrivals that complete a stage's full barrier when the producer's
    threads fill it: one ``cp.async.mbarrier.arrive.noinc`` per thread when
    some copies are cp.asyncs, one arrive per thread (after its proxy fence)
    when some go through registers, one ``arrive.expect_tx`` of the elected
    lane when some buffers are TMA boxes."""
    boxes = _boxes(bufs)
    tma = any(not _by_threads(b) for b in bufs)
    asyn = any(x.is_async for x in boxes)
    sync = any(not x.is_async for x in boxes)
    return threads * (int(asyn) + int(sync)) + int(tma)


def _issue_threads(ring: Ring, bufs, gap_wait: bool) -> list:
    """The copies of the producer side's ring position when the producer
    role's threads fill it (fill ``cp.async``): every thread waits for the
    slot; the elected lane of warp 0 announces and issues the TMA boxes, if
    any; every thread issues its chunks of each cp.async box; then its
    arrivals: ``fence.proxy.async`` + arrive after stores through registers
    (the wgmmas read the stage through the async proxy), and
    ``cp.async.mbarrier.arrive.noinc`` for its cp.asyncs."""
    side, full = ring.load, ring.full
    st = side.stage
    body = _wait_for_slot(ring, gap_wait)
    bar = MBarrierRef(full, st)
    tma = [b for b in bufs if not _by_threads(b)]
    if tma:
        nbytes = Const(0)
        for b in tma:
            nbytes = simplify(nbytes + b.stage_bytes)
        issue = [MBarrierArriveExpectTx(bar, nbytes)]
        for b in tma:
            issue += _clone_loads(b.loads, {}, simplify(st * b.stage_elems), bar)
        body.append(ElectOne(Var("threadIdx.x").lt(32), [Comment("TMA boxes: the elected lane"), *issue]))
    boxes = []
    for b in bufs:
        if b not in tma:
            copies = _clone_loads(b.loads, {}, simplify(st * b.stage_elems), bar)
            body += copies
            walk(copies, lambda n, _s: boxes.append(n) if isinstance(n, CpAsyncBox) else None)
    if any(not x.is_async for x in boxes):
        body += [
            Fence("proxy_async"),  # the stores through registers, before the wgmmas read them
            MBarrierArrive(bar),
        ]
    if any(x.is_async for x in boxes):
        body.append(CpAsyncArrive(bar))
    body.append(RingAdvance(side, Const(1)))
    return body


def _release_after_last_read(body, tvs, release) -> list:
    """The slot is free once its last reader is done: a row copied to registers
    releases its stage before the reductions run."""
    last = max((k for k, n in enumerate(body) if any(_reads(n, t) for t in tvs)), default=len(body) - 1)
    return body[: last + 1] + release + body[last + 1 :]


# ------------------------------------------------------------ entry
def circular_buffer(kernel: Kernel) -> Kernel:
    """Entry: rewrite the loops of circular-buffered TMA buffers (see module doc)."""
    if not kernel.circular_loops:
        return kernel
    allocs = {}
    walk(kernel.body, lambda n, s: allocs.__setitem__(n.tv.name, n) if isinstance(n, Allocate) else None)
    ws = [n for n in kernel.circular_loops if isinstance(allocs[n].tv.circular[2], WarpSpecialized)]
    if ws:
        if len(ws) != len(kernel.circular_loops):
            raise CircbufError("a kernel's circular buffers must all be warp-specialized, or none")
        handed = [n for n in ws if allocs[n].tv.circular[2].fill == "threads"]
        _warp_specialize(kernel, allocs, [n for n in ws if n not in handed])
        for name in handed:
            _hand_over(kernel, allocs, name)
        return kernel
    setup = []
    for name, key in kernel.circular_loops.items():
        _pipeline(kernel, allocs[name], key, setup)
    kernel.body = setup + kernel.body
    return kernel


# ------------------------------------------------------------ Pipelined
def _pipeline(kernel, alloc, key, setup):
    tv = alloc.tv
    name = tv.name
    S, P, kind = tv.circular
    if tv.compute_at_pos == 0:
        raise CircbufError(
            f"{name}: a Pipelined circular buffer must be inlined into its readers' loops "
            "(a buffer with a loop nest of its own needs WarpSpecialized)"
        )
    loop = _find_loop(kernel.body, key)
    if loop is None:
        raise CircbufError(f"{name}: its circular-buffer loop was not generated (is the axis parallel?)")
    loads = [n for n in loop.body if _only_loads(n, [tv])]
    if not loads:
        raise CircbufError(f"{name}: circular buffering needs the TMA copies directly in its loop")
    by_threads = _by_threads(_Buffer(alloc, loads))
    if by_threads:
        # every thread of the CTA copies its chunks of the boxes
        threads = kernel.max_threads
        for box in _boxes([_Buffer(alloc, loads)]):
            box.threads, box.flat = threads, True
    rest = [n for n in loop.body if not any(n is m for m in loads)]
    first_read = next((k for k, n in enumerate(loop.body) if _reads(n, tv)), len(loop.body))
    if any(loop.body.index(m) > first_read for m in loads):
        raise CircbufError(f"{name}: a read of the buffer precedes its copy in the loop")
    if any(wgmma_ops.reads(n, tv) for n in rest):
        raise CircbufError(
            f"{name}: wgmmas read it asynchronously; a Pipelined ring would refill a stage they may "
            "still read (use WarpSpecialized, which releases after wgmma.wait_group)"
        )
    buf = _Buffer(alloc, loads)
    if any(_multicasts([buf])):
        raise CircbufError(f"{name}: a multicast (cluster) ring must be warp-specialized")
    # thread 0 fills (one expect_tx arrival), or every thread its cp.async chunks (one
    # arrival each); every thread releases a stage it has read
    if by_threads:
        ring = Ring(
            name,
            S,
            P,
            [name],
            fill="cp.async",
            full_arrivals=_cp_async_arrivals([buf], kernel.max_threads),
            empty_arrivals=kernel.max_threads,
        )
    else:
        ring = Ring(name, S, P, [name], full_arrivals=1, empty_arrivals=kernel.max_threads)
    ring.has_empty = kind.war == "mbarrier"
    kernel.rings.append(ring)
    full, empty, load, use = ring.full, ring.empty, ring.load, ring.use
    thread0 = thread0_cond(kernel)
    i, E, start, step = loop.index, loop.extent, loop.start, loop.step

    def issue(it):
        """The copies of iteration ``it``, where the ring loop has one."""
        if not by_threads:
            return IfThenElse(Bin("&&", it.lt(E), thread0), _issue(ring, [buf], i, it))
        # a copy of the loads with the ring loop's index at ``it``
        mapping = {i.name: it}
        loads_it = _clone_loads(buf.loads, mapping)
        return IfThenElse(it.lt(E), _issue_threads(ring, [_Buffer(alloc, loads_it)], gap_wait=False))

    pv = Var(f"{i.name}_pro", lo=0, hi=Const(P))
    first = simplify(start + pv * step)
    prologue = ForLoop(pv, Const(P), [issue(first)])
    ahead = simplify(i + step * P)
    _offset_reads(rest, tv, simplify(use.stage * buf.stage_elems))
    release = (
        [MBarrierArrive(MBarrierRef(empty, use.stage))]
        if empty
        else [BlockSync(f"WAR: stage {use.stage} of {name} is refilled next")]
    )
    loop.body = (
        [
            Comment(f"issue the copies of iteration {ahead}, then wait for iteration {i}"),
            issue(ahead),
            MBarrierWait(MBarrierRef(full, use.stage), use.phase),
        ]
        + _release_after_last_read(rest, [tv], release)
        + [RingAdvance(use, Const(1))]
    )
    insert_before(kernel.body, loop, [Comment(f"prologue: fill {P} of {S} stages of {name}"), prologue])
    setup += [RingInit(load), RingInit(use)]


# ------------------------------------------------------ WarpSpecialized
def _ring_groups(kernel, allocs, names) -> list:
    """Warp-specialized buffers grouped into rings: buffers inlined into their
    readers form one ring; buffers with loop nests of their own share a ring
    when their nests run the same loops down to their ring loops (a matmul's
    operand tiles), else each structure is a ring of its own (an epilogue
    input's sub-tiles beside the operands' k steps)."""
    separate = [allocs[n].tv.compute_at_pos == 0 for n in names]
    if any(separate) != all(separate):
        raise CircbufError(
            f"warp-specialized buffers {', '.join(names)} must all be inlined into their readers, or none"
        )
    if not all(separate):
        return [list(names)]
    groups = []  # [(levels of the first nest, [names])]
    for n in names:
        tv = allocs[n].tv
        top = [
            x for lst in _role_bodies(kernel) for x in lst if isinstance(x, ForLoop) and _only_loads(x, [tv])
        ]
        if len(top) != 1:
            raise CircbufError(f"{n}: its copies must form one loop nest of their own")
        levels = _level_loops(top[0], kernel.circular_loops[n])
        for lv, members in groups:
            if len(lv) == len(levels) and all(_same_header(x, y) for x, y in zip(lv, levels)):
                members.append(n)
                break
        else:
            groups.append((levels, [n]))
    return [members for _, members in groups]


def _role_bodies(kernel) -> list:
    switch = next((n for n in kernel.body if isinstance(n, RoleSwitch)), None)
    return switch.bodies if switch is not None else [kernel.body]


def _warp_specialize(kernel, allocs, names):
    """The warp-specialized buffers form rings between the roles the roles
    pass made (:func:`_ring_groups`): one producer lane issues every ring's
    copies, its nests fused under one tile loop (the loops above each ring
    loop must agree there); each ring has its own stages and barriers."""
    switch = next((n for n in kernel.body if isinstance(n, RoleSwitch)), None)
    if switch is None:
        raise CircbufError(f"{names[0]}: a warp-specialized ring needs the roles pass first")
    producer_role, consumer_role = kernel.role("producer"), kernel.role("consumers")
    k_prod, k_cons = switch.roles.index(producer_role), switch.roles.index(consumer_role)
    groups = _ring_groups(kernel, allocs, names)
    # the consumers' branch: its register setting, then the loop nests
    cbody = switch.bodies[k_cons]
    head = [n for n in cbody[:1] if isinstance(n, SetMaxNReg)]
    body = cbody[len(head) :]
    made = []  # (ring, bufs, levels, label)
    producer_nest = None
    for members in groups:
        S, P, _ = allocs[members[0]].tv.circular
        kinds = {allocs[n].tv.circular for n in members}
        if len(kinds) != 1:
            raise CircbufError(
                f"warp-specialized buffers {', '.join(members)} share a ring: they must share one stage "
                "count, prefetch and type"
            )
        label = "_".join(members) if len(members) > 1 else members[0]
        if all(allocs[n].tv.compute_at_pos == 0 for n in members):
            nest, bufs, levels = _separate_nests(kernel, body, allocs, members)
        else:
            nest, bufs, levels = _inlined_nest(kernel, body, allocs, members)
        if producer_nest is None:
            producer_nest = nest
        else:
            _fuse_under(producer_nest[0], nest[0], bufs, levels, label, body)
            levels = [(producer_nest[0], None)] + levels[1:]
        # the producer's expect_tx arrival fills a TMA stage; cp.async copies arrive per thread
        threads_fill = any(_by_threads(b) for b in bufs)  # the fill kind cp.async
        # slices of tiles the cluster's CTAs share, each multicast to those that share it
        peers = tuple(dict.fromkeys(m for m in _multicasts(bufs) if m))
        if peers and threads_fill:
            raise CircbufError(f"{label}: a cp.async fill cannot be multicast to the cluster's CTAs")
        ring = Ring(
            label,
            S,
            P,
            list(members),
            producer_role.name,
            [consumer_role.name],
            fill="cp.async" if threads_fill else "multicast" if peers else "tma",
            full_arrivals=_cp_async_arrivals(bufs, producer_role.threads) if threads_fill else 1,
            peers=peers,
        )
        kernel.rings.append(ring)
        made.append((ring, bufs, levels, label))
    by_threads = [r for r, *_ in made if r.fill == "cp.async"]
    if by_threads and len(made) > 1:
        raise CircbufError(
            f"{by_threads[0].name}: a ring filled by the producer's threads (cp.async) is the producer's only "
            "ring (its threads cannot share the nest with an elected lane's copies)"
        )
    if by_threads:
        ring, bufs, levels, _ = made[0]
        # producer: every thread of the role runs the copy nest (fill cp.async)
        levels[-1][0].body = _issue_threads(ring, bufs, gap_wait=True)
        # a thread leaves once its last copies have landed (cp.async.wait_all)
        drain = [CpAsyncCommit(), CpAsyncWait(0)] if any(x.is_async for x in _boxes(bufs)) else []
        switch.bodies[k_prod] += [
            Comment(f"the producer's {producer_role.threads} threads fill the stages (cp.async)"),
            RingInit(ring.load),
            *producer_nest,
            *drain,
            Return(),
        ]
    else:
        # producer: one elected lane runs the copy nest
        for ring, bufs, levels, _ in made:
            levels[-1][0].body = _issue(ring, bufs, None, None, gap_wait=True)
        warp0 = Var("threadIdx.x").lt(32)
        # a cluster's producer stays to the exit cluster barrier (its peers' consumers
        # arrive on its empty barriers until the end): no early return
        multicast = any(r.fill == "multicast" for r, *_ in made)
        switch.bodies[k_prod] += [
            ElectOne(
                warp0,
                [Comment("the elected producer lane"), *[RingInit(r.load) for r, *_ in made], *producer_nest],
            ),
            *([] if multicast else [Return()]),
        ]

    # consumers: wait for each position, release it after its last read
    body = [n for n in body if not any(n is m for m in producer_nest)]
    rows = consumer_role.hi - consumer_role.lo
    for ring, bufs, levels, label in made:
        # consumer threads (or elected lanes) release a stage
        ring.empty_arrivals, split = _place_consumer_ring(
            body, bufs, levels, ring, consumer_role.threads, label, rows
        )
        if split != (consumer_role.groups > 1):
            raise CircbufError(
                f"{label}: the roles pass and the ring disagree on whether the consumer rows split the positions"
            )
        if ring.fill == "cp.async" and any(x.is_async for x in _boxes(bufs)):
            _fence_after_full_waits(body, ring)
        if ring.peers:
            _release_to_peers(kernel, body, ring)
    switch.bodies[k_cons] = head + body
    return kernel


def _multicasts(bufs) -> list:
    """The cluster axes each TMA copy of ``bufs`` is multicast along (() for a local one)."""
    out = []
    walk(
        [n for b in bufs for n in b.loads],
        lambda n, _s: out.append(n.multicast) if isinstance(n, TmaLoad) else None,
    )
    return out


def _release_to_peers(kernel, body, ring):
    """A multicast ring (fill ``multicast``): a stage of this CTA is written by every
    CTA whose slices it receives, so each consumer release arrives on the stage's
    empty barrier in each of them (its own included), and an empty barrier waits
    for the releases of every CTA its own producer's slices land in: the
    arrivals per CTA times that many CTAs (the same for every CTA of the cluster:
    its row and column of the cluster, for A's and B's slices)::

        before: ARRIVE T_empty[s]
        after:  ARRIVE T_empty[s] in every CTA multicasting to this one (mapa + arrive.shared::cluster)
    """
    n = 0

    def f(node, _s):
        nonlocal n
        if isinstance(node, MBarrierArrive) and node.bar.name == ring.empty:
            node.peers = ring.peers
            n += 1

    walk(body, f)
    assert n, ring.name  # a ring whose stages are never released would have deadlocked
    ctas = len(cluster_peers(kernel.cluster, ring.peers, 0, 0))
    ring.empty_arrivals = ring.empty_arrivals * ctas


def _fuse_under(top, other, bufs, levels, label, body):
    """Another ring's copy nest ``other`` runs inside the first ring's tile
    loop ``top``, after its copies: the two tile loops must be one loop."""
    if not _same_header(top, other):
        raise CircbufError(
            f"{label}: its copies run a tile loop ({other.index} from {other.start} step {other.step} to "
            f"{other.extent}) unlike the other ring's ({top.index}): one producer walks both"
        )
    mapping = {other.index.name: top.index}
    for b in bufs:
        b.loads = _clone_loads(b.loads, mapping)
    for lp, _ in levels[1:]:
        for attr in ("extent", "start", "step"):
            setattr(lp, attr, substitute(getattr(lp, attr), mapping))
    top.body += other.body
    body.remove(other)


def _fence_after_full_waits(body, ring):
    """cp.async writes a stage through the generic proxy and the wgmmas read it
    through the async proxy: each consumer thread fences the proxies after its
    wait on the full barrier has made the copies visible to it."""
    waits = []
    walk(
        body,
        lambda n, _s: waits.append(n) if isinstance(n, MBarrierWait) and n.bar.name == ring.full else None,
    )
    for w in waits:
        insert_after(body, w, [Fence("proxy_async")])


def _inlined_nest(kernel, body, allocs, names):
    """Copies inside the readers' ring loop: the producer runs a copy-only
    clone of the serial loops around them; the readers keep the rest."""
    keys = {kernel.circular_loops[n] for n in names}
    if len(keys) != 1:
        raise CircbufError(f"warp-specialized buffers {', '.join(names)} must share one loop")
    loop = _find_loop(body, keys.pop())
    if loop is None:
        raise CircbufError(f"{names[0]}: its circular-buffer loop was not generated (is the axis parallel?)")
    tvs = [allocs[n].tv for n in names]
    bufs = []
    for n in names:
        loads = [x for x in loop.body if _only_loads(x, [allocs[n].tv])]
        if not loads:
            raise CircbufError(f"{n}: circular buffering needs the TMA copies directly in its loop")
        bufs.append(_Buffer(allocs[n], loads))
    loop.body = [x for x in loop.body if not _only_loads(x, tvs)]
    encl = _loops_around(body, loop) + [loop]
    nest, clones = [], []
    for lp in reversed(encl):
        c = copy.copy(lp)
        c.body = nest
        nest = [c]
        clones.insert(0, c)
    # the clone loops are the producer's levels; the readers' levels are the originals
    levels = [(c, lp) for c, lp in zip(clones, encl)]
    return nest, bufs, levels


def _separate_nests(kernel, body, allocs, names):
    """Each buffer's copies form a top-level loop nest of their own. The
    nests must have one loop structure; they are fused into one producer
    nest (one stage holds every buffer's tile of a position)."""
    nests, bufs = [], []
    for n in names:
        tv = allocs[n].tv
        top = [x for x in body if isinstance(x, ForLoop) and _only_loads(x, [tv])]
        if len(top) != 1:
            raise CircbufError(f"{n}: its copies must form one loop nest of their own")
        nests.append(top[0])
    head = nests[0]
    levels = _level_loops(head, kernel.circular_loops[names[0]])
    depth = len(levels)
    for n, nest in zip(names[1:], nests[1:]):
        other = _level_loops(nest, kernel.circular_loops[n])
        if len(other) != depth or any(not _same_header(a, b) for a, b in zip(levels, other)):
            raise CircbufError(
                f"{names[0]} and {n} share a ring but their copies run different loops; "
                "schedule their ring loops alike"
            )
    ring = levels[-1]
    for n, nest in zip(names, nests):
        other = _level_loops(nest, kernel.circular_loops[n])
        mapping = {b.index.name: a.index for a, b in zip(levels, other)}
        loads = _clone_loads(other[-1].body, mapping)
        bufs.append(_Buffer(allocs[n], loads))
    ring.body = []
    for nest in nests[1:]:  # fused into the head nest: gone from the kernel
        body.remove(nest)
    return [head], bufs, [(lp, None) for lp in levels]


def _level_loops(nest, key):
    """The serial loops from a load nest's top down to its ring loop."""
    chain, cur = [], nest
    while True:
        chain.append(cur)
        if cur.key == key:
            return chain
        inner = [x for x in cur.body if isinstance(x, ForLoop)]
        if len(inner) != 1 or len(cur.body) != 1:
            raise CircbufError("a ring's load nest must be a chain of loops down to its ring loop")
        cur = inner[0]


def _same_header(a, b) -> bool:
    return all(
        simplify(x - y) == Const(0) for x, y in ((a.extent, b.extent), (a.start, b.start), (a.step, b.step))
    )


def _place_consumer_ring(body, bufs, levels, ring, consumers, label, rows):
    """Waits, releases and ring advances in the readers' nest (``rows``:
    the consumers' threadIdx.y extent); returns the number of arrivals that
    release one position, and whether the rows split the positions."""
    use, full, empty = ring.use, ring.full, ring.empty
    tvs = [b.tv for b in bufs]
    read = _first_read(body, tvs)
    if read is None:
        raise CircbufError(f"{label}: no reader of the buffer in the kernel")
    encl = [lp for lp in _loops_around(body, read) if lp.ptype == ParallelType.Serial]
    depth = len(levels)
    if levels[0][1] is not None:  # inlined: the readers' own loops
        mine = [lp for _, lp in levels]
    else:
        mine = encl[:depth]
    if len(mine) != depth:
        raise CircbufError(f"{label}: the readers run fewer loops than the ring's {depth}")
    # where each reader loop starts and how far it strides, in producer
    # iterations; ``per``: ring positions per iteration of a level
    init, per = Const(0), Const(1)
    skips = []
    for depth_k, ((p, _), c) in enumerate(reversed(list(zip(levels, mine)))):
        if simplify(p.extent - c.extent) != Const(0):
            raise CircbufError(
                f"{label}: the readers' loop {c.index} (extent {c.extent}) does not match the ring's "
                f"loop {p.index} (extent {p.extent})"
            )
        off = simplify(c.start - p.start)
        q, r = simplify(off // p.step), simplify(c.step // p.step)
        if simplify(q * p.step - off) != Const(0) or simplify(r * p.step - c.step) != Const(0):
            raise CircbufError(
                f"{label}: the readers' loop {c.index} does not walk the ring's loop {p.index}"
            )
        if depth_k == 0 and (q != Const(0) or r != Const(1)):
            raise CircbufError(f"{label}: the readers must read every position of the ring loop {p.index}")
        init = simplify(init + q * per)
        skips.append((c, simplify((r - 1) * per)))
        if p is not levels[0][0]:
            if p.strided:
                raise CircbufError(f"{label}: only the outermost ring loop may be a grid-stride loop")
            per = simplify(per * p.extent)
    ring_loop = mine[-1]
    # stage offsets of the reads, the wait at the top of each position
    for b in bufs:
        _offset_reads(ring_loop.body, b.tv, simplify(use.stage * b.stage_elems))
    ring_loop.body.insert(0, MBarrierWait(MBarrierRef(full, use.stage), use.phase))
    per_arrival = 1  # threads per arrival on the empty barrier
    if any(wgmma_ops.reads(n, t) for n in ring_loop.body for t in tvs):
        per_arrival = wgmma_ops.release_after_wait_group(body, ring_loop, ring, label)
        ring_loop.body.append(RingAdvance(use, Const(1)))
    else:
        ring_loop.body = _release_after_last_read(
            ring_loop.body, tvs, [MBarrierArrive(MBarrierRef(empty, use.stage))]
        ) + [RingAdvance(use, Const(1))]
    for c, skip in skips[1:]:
        if skip != Const(0):
            c.body.append(Comment("the other readers' positions"))
            c.body.append(RingAdvance(use, skip))
    body.insert(0, RingInit(use, init if init != Const(0) else None))
    # one arrival per reading thread; thread indices that pick the position
    # (a ping-pong warpgroup's tiles) divide the readers of a position
    arrivals = consumers // per_arrival
    split = ParallelType.TIDy.value in free_vars(init)
    if split:
        arrivals //= rows  # the consumer rows (no producer row) split the positions
    return arrivals, split


# ------------------------------------------------- filled by threads
def _offset_writes(nodes, tv, off):
    """Every write of ``tv`` moves to the stage at element offset ``off``."""

    def f(n, _s):
        if isinstance(n, Assign) and n.lhs.tv is tv:
            n.lhs = TensorRef(tv, n.lhs.index + off, n.lhs.vector)

    walk(nodes, f)


def _hand_over(kernel, allocs, name):
    """A ring the consumers' threads fill for a role of readers of their own
    (the epilogue role: the accumulator handed over a sub-tile at a time).
    The writers wait for a free slot, write it and arrive on its ``full``
    barrier (every writing thread: the arrive releases its stores); the
    readers' loops are mapped onto the writers' as a TMA ring's readers are
    onto its producer's::

        ROLE consumers                         ROLE epilogue
          RING H_load                            RING H_use
          FOR t: ... k loop ...                  FOR t
            FOR s (the ring loop)                  FOR s
              WAIT H_empty[load_stage] ^ 1           WAIT H_full[use_stage]
              H[load_stage] = acc ...                ... = H[use_stage] ...
              ARRIVE H_full[load_stage]              ARRIVE H_empty[use_stage]
              ADVANCE H_load                         ADVANCE H_use
    """
    alloc = allocs[name]
    tv = alloc.tv
    S, P, kind = tv.circular
    switch = next((n for n in kernel.body if isinstance(n, RoleSwitch)), None)
    if switch is None:
        raise CircbufError(f"{name}: a threads-filled ring needs the roles pass first")
    writers, readers = kernel.role("consumers"), kernel.role(kind.readers)
    kw, kr = switch.roles.index(writers), switch.roles.index(readers)
    wbody = switch.bodies[kw]
    loop = _find_loop(wbody, kernel.circular_loops[name])
    if loop is None:
        raise CircbufError(f"{name}: its writers' ring loop was not generated")
    levels = [lp for lp in _loops_around(wbody, loop) if lp.ptype == ParallelType.Serial] + [loop]
    if writers.groups > 1:
        raise CircbufError(
            f"{name}: a threads-filled ring is written by every consumer thread (not ping-pong)"
        )
    ring = Ring(
        name, S, P, [name], writers.name, [readers.name], fill="threads", full_arrivals=writers.threads
    )
    kernel.rings.append(ring)
    # the writers: a free slot, the stores, then every writer arrives
    load = ring.load
    _offset_writes(loop.body, tv, simplify(load.stage * alloc.size))
    loop.body = [
        Comment(f"a free slot of {name}, then this thread's part of the sub-tile"),
        MBarrierWait(MBarrierRef(ring.empty, load.stage), Bin("^", load.phase, Const(1))),
        *loop.body,
        MBarrierArrive(MBarrierRef(ring.full, load.stage)),
        RingAdvance(load, Const(1)),
    ]
    insert_before(wbody, levels[0], [RingInit(load)])
    # the readers
    rbody = switch.bodies[kr]
    head = [n for n in rbody[:1] if isinstance(n, SetMaxNReg)]
    body = rbody[len(head) :]
    ring.empty_arrivals, split = _place_consumer_ring(
        body, [_Buffer(alloc, [])], [(lp, None) for lp in levels], ring, readers.threads, name, 1
    )
    if split:
        raise CircbufError(f"{name}: the {readers.name} role's rows must read every position")
    switch.bodies[kr] = head + body
