"""Build the loop nest from loop domains and inline positions (before ``PASSES``).

Each expr is placed in the loops of its output's loop domain. Axis ``k`` of a
producer inlined at position ``p > k`` is the same loop as axis ``k`` of its
consumer (loops are found by their loop class). Grid and block axes become
``blockIdx``/``threadIdx``; broadcast axes nobody shares get no loop.

Before (scheduled fusion, softmax row)::

    T2_l[iblockIdx.x, rS{ceilDiv(i1, 128)}, rthreadIdx.x{128}] ca_pos(1) = max(T1)
    T4_l[iblockIdx.x, iS, ithreadIdx.x] ca_pos(3) = exp(T1 - T3)
    T5_l[iblockIdx.x, rS, rthreadIdx.x] ca_pos(1) = sum(T4)

After::

    T2 = -inf  // init
    FOR j0 in 0..ceilDiv(i1, 128)
      T2 = max(T2, T1)
    T2 = block_reduce[threadIdx.x](max)
    T5 = 0  // init
    FOR j1 in 0..ceilDiv(i1, 128)
      T4 = exp(T1 - T3)
      T5 = sum(T5, T4)
    T5 = block_reduce[threadIdx.x](sum)
"""

from __future__ import annotations

from ..ir import CircbufError, Const, Fusion, MemoryType, ParallelType, ReductionOp, TensorView, Var, simplify
from ..ir.iterdomain import Split
from ..ir.scalar import is_const
from ..target import DEFAULT, Target
from . import wgmma_ops
from .kir import BlockReduce, ExprStmt, ForLoop, Kernel, ReductionInit, TensorParam


class _UnionFind:
    def __init__(self):
        self.parent = {}

    def find(self, i):
        p = self.parent.setdefault(i, i)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[i] = p
        return p

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _same_extent(a, b) -> bool:
    return simplify(a.loop_extent) == simplify(b.loop_extent)


def _check_inline(p: TensorView, c: TensorView, k: int):
    a, b = p.loop[k], c.loop[k]
    if not _same_extent(a, b):
        raise CircbufError(
            f"{p.name} is inlined at position {p.compute_at_pos} into {c.name}, but loop axis {k} "
            f"differs: {a} vs {b} (transform both alike or lower the inline position)"
        )
    one = is_const(simplify(a.loop_extent), 1)  # one iteration, index 0 however it is bound
    if (
        not one
        and a.parallel_type != b.parallel_type
        and (a.parallel_type.is_grid_or_block or b.parallel_type.is_grid_or_block)
    ):
        raise CircbufError(
            f"{p.name} is inlined into {c.name} but axis {k} is parallelized differently: "
            f"{a.parallel_type.name} vs {b.parallel_type.name}"
        )


def _first_reduction_axis(tv):
    for k, ax in enumerate(tv.loop):
        if ax.is_reduction:
            return k
    return None


def generate_loop_nest(fusion: Fusion, name: str = "kernel", target: Target = DEFAULT) -> Kernel:
    """Entry: scheduled fusion -> Kernel holding ExprStmts in loops."""
    exprs = fusion.exprs()
    uf = _UnionFind()
    members: dict[int, int] = {}
    for e in exprs:
        c = e.out
        for p in e.tv_inputs():
            if p.is_input:
                continue
            if p.compute_at_pos > len(p.loop) or p.compute_at_pos > len(c.loop):
                raise CircbufError(
                    f"{p.name}: inline position {p.compute_at_pos} exceeds the loop axes of "
                    f"{p.name} or its consumer {c.name}"
                )
            r = _first_reduction_axis(p)
            if r is not None and p.compute_at_pos > r:
                raise CircbufError(
                    f"{p.name}: cannot inline past its reduction axis {r} into {c.name}; "
                    f"inline at {r} or less"
                )
            for k in range(p.compute_at_pos):
                _check_inline(p, c, k)
                uf.union(p.loop[k].id, c.loop[k].id)
    for e in exprs:
        for ax in e.out.loop:
            r = uf.find(ax.id)
            members[r] = members.get(r, 0) + 1
    shared = {r for r, n in members.items() if n > 1}
    chains = _class_chains(exprs, uf)

    # a circular buffer rotates over its loop even when fixed sizes give it one trip
    rings = {uf.find(tv.loop[tv.circular_buffer_axis()].id) for tv in fusion.used_tvs() if tv.circular}
    # a ring that is a loop nest of its own (not inlined into its readers) and
    # its readers keep their one-trip serial loops too: the circular_buffer
    # pass matches the two sides' loops level by level (a matmul whose tile
    # count or K is one when compiling still has tile and k loops on both sides)
    for e in exprs:
        own = [p for p in e.tv_inputs() if p.circular and p.compute_at_pos == 0]
        for tv in [*own, e.out] if own else []:
            rings |= {uf.find(ax.id) for ax in tv.loop if ax.parallel_type == ParallelType.Serial}
    launch: dict = {}
    counter = [0]
    body: list = []

    def new_loop(ax, key):
        v = Var(f"j{counter[0]}", lo=0, hi=ax.loop_extent)
        counter[0] += 1
        return ForLoop(v, ax.loop_extent, [], ax.parallel_type, key, unroll_by=ax.unroll_by)

    for e in exprs:
        out = e.out
        if isinstance(e, ReductionOp):
            _check_reduction(out)
        cur = body
        index = {}
        anchor = None  # (list, loop or None) where a reduction's init goes
        inner = []  # loops of iteration axes inside a reduction's loops (a register per value)
        for ax in out.loop:
            pt = ax.parallel_type
            if ax.is_reduction and anchor is None:
                anchor = (cur, None)
            if pt.is_grid_or_block or pt.is_cluster:
                ext = simplify(ax.loop_extent)
                if pt in launch and launch[pt] != ext and not ax.is_broadcast:
                    raise CircbufError(
                        f"{out.name}: axis {ax} is bound to {pt.value} with extent {ext}, "
                        f"but another axis bound to it has extent {launch[pt]}"
                    )
                if not ax.is_broadcast or pt not in launch:
                    launch.setdefault(pt, ext)
                hi = ext if isinstance(ext, Const) else None
                index[ax.id] = Var(pt.value, lo=0, hi=hi)
                continue
            key = uf.find(ax.id)
            if pt in (ParallelType.Bulk, ParallelType.Mma):
                # one copy moves the whole box, one instruction covers the
                # MMA tile: index of its first element
                index[ax.id] = Const(0)
                continue
            if (ax.is_broadcast and key not in shared) or (is_const(ax.loop_extent, 1) and key not in rings):
                index[ax.id] = Const(0)
                continue
            loop = None
            if key in shared:
                loop = next((n for n in reversed(cur) if isinstance(n, ForLoop) and n.key == key), None)
            # The loop's form belongs to its class, not to whichever member
            # (say a broadcast input's cache, which has no grid split of its
            # own) happens to open it first.
            chain = chains.get(key)
            if loop is None:
                loop = new_loop(ax, key)
                if chain is not None:  # for (t = start; t < extent; t += step)
                    loop.extent, loop.start, loop.step = chain[1].loop_extent, chain[2], chain[3]
                    loop.index = Var(loop.index.name, lo=0, hi=loop.extent)
                cur.append(loop)
            if anchor is not None and anchor[1] is None and anchor[0] is cur:
                anchor = (cur, loop)
            elif anchor is not None and not ax.is_reduction:
                inner.append((ax, loop))
            index[ax.id] = loop.index
            own = _grid_stride(ax)
            if own is not None:
                index[own[1].id] = loop.index  # the loop runs the split's input index itself
                # the axes between the two (a ping-pong warpgroup's share of the tiles) get
                # their indices from the tile index, not from the loop variable read as the
                # outer part: a bounds check on one read tile 1 as share 2 (fixed extents)
                val = loop.index
                for d in reversed(_chain_splits(ax, own[1])):
                    if d.in_ is not own[1]:
                        index[d.in_.id] = val
                    val = simplify(val // d.inner.loop_extent)
            elif chain is not None:
                # a member without the grid split counts the class's trips
                index[ax.id] = simplify((loop.index - chain[2]) // chain[3])
            cur = loop.body
        stmt = ExprStmt(e, index)
        cur.append(stmt)
        if isinstance(e, ReductionOp):
            _place_reduction(e, index, anchor, stmt, launch, inner, new_loop)

    _check_outputs_split_over_the_grid(fusion, launch)
    body = _sort_body(body)
    params = [TensorParam(t, False) for t in fusion.inputs if isinstance(t, TensorView)]
    params += [TensorParam(t, True) for t in fusion.outputs]
    scalars = [v for v in fusion.inputs if not isinstance(v, TensorView)]
    bindings = {}
    passed = {v.name for v in scalars}  # a size a segment gets as a scalar is not read again from a tensor
    for k, p in enumerate(params):
        if p.is_output:
            continue
        for d, ax in enumerate(p.tv.domain.no_reductions()):
            if isinstance(ax.extent, Var) and ax.extent.name not in passed:
                bindings.setdefault(ax.extent.name, (k, d))
    threads = 1
    for pt in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz):
        ext = launch.get(pt)
        if ext is not None:
            if not isinstance(ext, Const):
                raise CircbufError(f"the extent bound to {pt.value} must be a constant, got {ext}")
            threads *= ext.value
    if threads > target.max_threads_per_block:
        raise CircbufError(f"{threads} threads per block exceeds the limit of {target.max_threads_per_block}")
    kernel = Kernel(
        name=name,
        body=body,
        tensor_params=params,
        scalar_params=scalars,
        launch=launch,
        extent_bindings=bindings,
        strides={},
        max_threads=threads,
        # a scheduler that sizes its grid for n resident CTAs per SM caps the registers to fit them
        min_blocks=fusion.launch_min_blocks,
    )
    for tv in fusion.used_tvs():
        if tv.circular is not None:
            k = tv.circular_buffer_axis()
            kernel.circular_loops[tv.name] = uf.find(tv.loop[k].id)
    return kernel


def _class_chains(exprs, uf) -> dict:
    """The persistent grid loop (:func:`_grid_stride`) of each loop class that
    has one: every loop of the class strides, whichever member opens it. Two
    members whose grid splits disagree cannot share one loop."""
    chains: dict = {}
    for e in exprs:
        for ax in e.out.loop:
            ch = _grid_stride(ax)
            if ch is None:
                continue
            key = uf.find(ax.id)
            prev = chains.setdefault(key, ch)
            if prev is not ch and not all(
                simplify(a) == simplify(b)
                for a, b in ((prev[1].loop_extent, ch[1].loop_extent), (prev[2], ch[2]), (prev[3], ch[3]))
            ):
                raise CircbufError(
                    f"{e.out.name}: axis {ax} shares a loop with {prev[0]} but their grid splits differ "
                    f"({prev[1].loop_extent} from {prev[2]} step {prev[3]} vs "
                    f"{ch[1].loop_extent} from {ch[2]} step {ch[3]})"
                )
    return chains


def _check_outputs_split_over_the_grid(fusion: Fusion, launch: dict):
    """On a grid of several CTAs, each output must have an axis bound to a
    block index: one with none is written whole by every CTA (a tensor the
    scheduler left unscheduled), which for an output written in place reads
    elements another CTA has already written."""
    grid = {pt: ext for pt, ext in launch.items() if pt.is_block and not is_const(ext, 1)}
    if not grid:
        return
    for o in fusion.outputs:
        if not any(ax.parallel_type.is_block for ax in o.loop):
            raise CircbufError(
                f"output {o.name} has no axis bound to a block index, but the kernel runs on a grid "
                f"({', '.join(f'{pt.value}: {ext}' for pt, ext in grid.items())}): every CTA would "
                f"write all of it; bind one of its axes {o.loop} to the grid or schedule it alike"
            )


def _chain_splits(ax, top) -> list:
    """The splits from ``ax`` (an outer part) up to ``top`` (their first input),
    innermost first."""
    out, cur = [], ax
    while cur is not top:
        out.append(cur.definition)
        cur = cur.definition.in_
    return out


def _grid_stride(ax):
    """A serial axis that is the outer part of a split whose inner part is
    bound to a block index (through splits whose inner parts are thread
    indices, as a ping-pong warpgroup's share of the tiles) is a persistent
    grid loop: it runs ``for (t = start; t < extent; t += step)`` over the
    split input ``top`` directly. Returns (ax, top, start, step) or None.
    The chain stops at the first block-bound inner part, so rows split over
    threadIdx.y below a grid split keep a trip count every row shares."""
    if ax.parallel_type != ParallelType.Serial or ax.is_broadcast:
        return None
    cur, step, start = ax, Const(1), Const(0)
    while True:
        d = cur.definition
        if d is None or not isinstance(d, Split) or d.outer is not cur or not d.inner_split:
            return None
        inner = d.inner
        pt = inner.parallel_type
        if not pt.is_grid_or_block or inner.is_broadcast:
            return None
        ext = simplify(inner.loop_extent)
        hw = Var(pt.value, lo=0, hi=ext if isinstance(ext, Const) else None)
        start = simplify(start * ext + hw)
        step = simplify(step * ext)
        cur = d.in_
        if pt.is_block:
            return ax, cur, start, step


def _check_reduction(out: TensorView):
    seen_red = False
    free = wgmma_ops.free_loop_order(out)
    for ax in out.loop:
        if ax.parallel_type in (ParallelType.Mma, ParallelType.Bulk):
            continue
        if free and not ax.is_reduction:
            continue  # an MMA output's fragment axes: any loop order
        if ax.is_reduction:
            seen_red = True
            if ax.parallel_type.is_block:
                raise CircbufError(
                    f"{out.name}: reduction axis {ax} is bound to {ax.parallel_type.value}; "
                    "grid reductions are not supported"
                )
        elif seen_red and not ax.is_broadcast and not is_const(ax.loop_extent, 1):
            if out.memory_type == MemoryType.Local and ax.parallel_type in (
                ParallelType.Serial,
                ParallelType.Unroll,
            ):
                continue  # registers: one accumulator per value of the axis (initialized in a loop of its own)
            if not ax.parallel_type.is_grid_or_block:
                raise CircbufError(
                    f"{out.name}: iteration axis {ax} is inside a reduction axis; "
                    "reorder the reduction axes innermost"
                )


def _place_reduction(e, index, anchor, stmt, launch, inner=(), new_loop=None):
    """The init before the reduction's first loop, and a block reduction after
    it. Iteration axes inside the reduction's loops (a register accumulator
    per fragment row, say, whose columns are reduced around it) get loops of
    their own around the init::

        FOR j1 in 0..2                  // the init's own loop over h
          P[j1] = 0  // init
        FOR j2 in 0..8                  // rj
          FOR j3 in 0..2                // h
            FOR j4 in 0..2              // re
              P[j3] = P[j3] + x
    """
    out = e.out
    tid = tuple(ax.parallel_type for ax in out.loop if ax.is_reduction and ax.parallel_type.is_thread)
    body, loop = anchor
    init = ReductionInit(e, index)
    node = init
    if inner:
        if tid:
            raise CircbufError(
                f"{out.name}: a block reduction of an accumulator held per iteration of inner loops "
                f"({', '.join(str(ax) for ax, _ in inner)}) is not supported"
            )
        own = dict(index)
        for ax, _ in reversed(inner):
            f = new_loop(ax, None)
            f.body = [node]
            own[ax.id] = f.index
            node = f
        init.index = own
    if loop is not None:
        pos = body.index(loop)
        body.insert(pos, node)
        after = pos + 2
    else:
        pos = body.index(stmt)
        body.insert(pos, node)
        after = pos + 2
    if tid:
        if tid not in ((ParallelType.TIDx,), (ParallelType.TIDy,)):
            raise CircbufError(
                f"{out.name}: block reductions are supported over threadIdx.x or threadIdx.y alone"
            )
        n = launch.get(tid[0])
        if not isinstance(n, Const) or (tid[0] == ParallelType.TIDx and n.value % 32):
            raise CircbufError(
                f"{out.name}: a reduction over threadIdx.x needs a multiple of 32 threads, got {n}"
            )
        body.insert(after, BlockReduce(e, index, tid, n.value))


def _summary(node, defs, reads):
    if isinstance(node, ExprStmt):
        defs.add(id(node.expr.out))
        reads.update(id(t) for t in node.expr.tv_inputs())
    elif isinstance(node, ForLoop):
        for c in node.body:
            _summary(c, defs, reads)


def _sort_body(nodes: list) -> list:
    """Order siblings so every tensor is defined before it is read.

    Exprs are placed into existing loops by loop class, which can put a
    loop nest ahead of a sibling that produces its input; a stable
    topological sort of each body (smallest original position first) fixes
    that without reordering independent nodes. A reduction's init precedes
    the node that accumulates it and its block reduction follows it.
    """
    for n in nodes:
        if isinstance(n, ForLoop):
            n.body = _sort_body(n.body)
    info = []
    for n in nodes:
        d, r = set(), set()
        if _init_of(n) is not None:
            info.append(({("init", id(_init_of(n).expr.out))}, set()))
            continue
        if isinstance(n, BlockReduce):
            info.append(({("br", id(n.expr.out))}, {id(n.expr.out)}))
            continue
        _summary(n, d, r)
        info.append((d, r - d))
    definer, br, init = {}, {}, {}
    for k, (d, _) in enumerate(info):
        for x in d:
            if isinstance(x, tuple):
                (br if x[0] == "br" else init)[x[1]] = k
            else:
                definer[x] = k
    preds = [set() for _ in nodes]
    for k, (d, r) in enumerate(info):
        for x in r:
            src = br.get(x, definer.get(x))
            if isinstance(nodes[k], BlockReduce):
                src = definer.get(x)
            if src is not None and src != k:
                preds[k].add(src)
        for x in d:
            if not isinstance(x, tuple) and x in init:
                preds[k].add(init[x])
    out, done = [], set()
    while len(out) < len(nodes):
        k = next((k for k in range(len(nodes)) if k not in done and preds[k] <= done), None)
        if k is None:
            # a loop shared by a tensor's producers and its consumers (a value
            # per row inlined into the row's element loop, past the reduction
            # it needs): no order defines everything before its use
            stuck = sorted({x.expr.out.name for n in nodes if n not in out for x in _stmts(n)})
            raise CircbufError(
                f"no order of the loops computes each tensor before it is read: {', '.join(stuck)} "
                "share loops with the tensors they depend on (inline positions past a reduction's "
                "consumers?)"
            )
        done.add(k)
        out.append(nodes[k])
    return out


def _init_of(node):
    """The ReductionInit ``node`` is, or runs in loops of its own, else None."""
    while isinstance(node, ForLoop) and len(node.body) == 1:
        node = node.body[0]
    return node if isinstance(node, ReductionInit) else None


def _stmts(node) -> list:
    """The ExprStmts in ``node`` (itself, or inside its loops)."""
    if isinstance(node, ExprStmt):
        return [node]
    if isinstance(node, ForLoop):
        return [s for c in node.body for s in _stmts(c)]
    return []
