"""Pass: block syncs for shared-memory hazards.

Requires: predicated, tma_stores_synced, pipelined, named_barriers, mbarriers_allocated; provides:
synced, named_barriers.

Read-after-write: a statement reading a shared buffer that an earlier sibling
wrote gets a sync before it. Write-after-read across iterations: a loop whose
body reads and writes one shared buffer ends its body with a sync. Two syncs
separated only by fences become one.

Before::

    FOR j0 ..:  T2_s[threadIdx.x] = set(T0[...])
    FOR j1 ..:  T3[j1] = T2_s[(threadIdx.x + 1) % 128]

After::

    FOR j0 ..:  T2_s[...] = ...
    BLOCK_SYNC  // RAW on T2
    FOR j1 ..:  T3[j1] = T2_s[...]

In a warp-role switch each role syncs only its own threads: the syncs and
block reductions of a role's branch use the role's named barrier (ids
allocated per role and per sync group, ``Kernel.role_barrier``)::

    ROLES
      ROLE producer: threadIdx.y == 2 (128 threads)   ... (no syncs)
      ROLE consumers: threadIdx.y in 0..2 (256 threads)
        T2 = block_reduce[tidx](max)                  -> on bar1/256
        BLOCK_SYNC bar1/256  // RAW on T5
"""

from __future__ import annotations

from ..ir import CircbufError, Const, MemoryType, Var
from ..ir.scalar import Scalar, free_vars
from .kir import (
    Assign,
    BlockReduce,
    BlockSync,
    Fence,
    ForLoop,
    IfThenElse,
    Kernel,
    RoleSwitch,
    TensorRef,
    children,
    is_block_wide,
)


def _synced_by_barriers(tv) -> bool:
    d = tv.definition
    return getattr(d, "kind", None) == "tma"  # mbarriers order these (circular-buffer pass)


def _access(node, reads, writes, tvs=None):
    if isinstance(node, Assign):
        if node.lhs.tv.memory_type == MemoryType.Shared and not _synced_by_barriers(node.lhs.tv):
            writes.add(node.lhs.tv.name)
            if tvs is not None:
                tvs[node.lhs.tv.name] = node.lhs.tv
        refs = list(node.operands) + ([node.row.prev] if node.row is not None else [])
        for o in refs:
            if (
                isinstance(o, TensorRef)
                and o.tv.memory_type == MemoryType.Shared
                and not _synced_by_barriers(o.tv)
            ):
                reads.add(o.tv.name)
                if tvs is not None:
                    tvs[o.tv.name] = o.tv
    elif isinstance(node, ForLoop):
        for n in node.body:
            _access(n, reads, writes, tvs)
    elif isinstance(node, IfThenElse):
        for n in node.then + node.else_:
            _access(n, reads, writes, tvs)
    elif isinstance(node, RoleSwitch):
        for body in node.bodies:
            for n in body:
                _access(n, reads, writes, tvs)


def _last_sync(body: list):
    """The BlockSync ``body`` ends with after all of its accesses (itself, or
    that of a loop that runs at least once and whose body ends so), else None."""
    if not body:
        return None
    last = body[-1]
    if isinstance(last, BlockSync):
        return last
    if isinstance(last, ForLoop) and isinstance(last.extent, Const) and last.extent.value >= 1:
        return _last_sync(last.body)
    return None


def _private_slices(kernel: Kernel, role, tvs: list):
    """The named barrier of one group of ``role``'s threads (``(id, threads)``)
    when every buffer in ``tvs`` is allocated a slice per index of the role's
    thread axis (a staging tile [W][64][en], a warpgroup's own rows) and the
    role would otherwise sync all of its groups at once, else None: a
    warpgroup that writes and reads only its own slice waits only for itself."""
    if role is None or role.groups != 1 or role.hi - role.lo < 2 or role.threads % (role.hi - role.lo):
        return None
    per = role.threads // (role.hi - role.lo)
    for tv in tvs:
        alloc = tv.domain.allocation
        if not alloc or not any(a.parallel_type == role.axis for a in alloc):
            return None
    if per % 32:
        return None
    name = " ".join(sorted(tv.name for tv in tvs))
    base = kernel.named_barrier(f"{role.name} {name}", role.hi - role.lo)
    gid = Var(role.axis.value) - role.lo if role.lo else Var(role.axis.value)
    return (gid + base, per)


def _sync_list(kernel: Kernel, nodes: list, bar) -> list:
    """``bar(tvs)``: the barrier ``(id, threads)`` of the threads running ``nodes``
    that syncs a hazard on the buffers ``tvs`` (a role's named barrier, or one
    group's where each group owns a slice of them, is allocated only when a
    sync needs it)."""
    out, dirty, seen = [], set(), {}
    for n in nodes:
        if isinstance(n, ForLoop):
            n.body = _sync_list(kernel, n.body, bar)
            r, w, tvs = set(), set(), {}
            _access(n, r, w, tvs)
            if r & w:
                # (a sync the body ends with covers the hazard only if it is this hazard's
                # barrier or the whole block's: one warpgroup's own barrier, for its slice
                # of a staging tile, does not order another buffer both warpgroups share)
                want = bar([tvs[x] for x in r & w])
                done = _last_sync(n.body)
                if done is None or not (done.barrier == want or is_block_wide(done.barrier)):
                    n.body.append(BlockSync("WAR across iterations on " + ", ".join(sorted(r & w)), want))
        elif isinstance(n, IfThenElse) and not _thread_vars(n.cond):
            # a branch every thread takes alike (split-K's ``split_last``: the whole sync
            # group): its body syncs within itself, and around it as one statement below
            n.then, n.else_ = _sync_list(kernel, n.then, bar), _sync_list(kernel, n.else_, bar)
        elif isinstance(n, RoleSwitch):  # each role syncs among its own threads
            n.bodies = [
                _sync_list(
                    kernel, b, lambda ts, r=role: _private_slices(kernel, r, ts) or kernel.role_barrier(r)
                )
                for role, b in zip(n.roles, n.bodies)
            ]
            # the roles' threads never meet: nothing after the switch waits on their writes
            out.append(n)
            continue
        r, w, tvs = set(), set(), {}
        _access(n, r, w, tvs)
        if r & dirty:
            out.append(BlockSync("RAW on " + ", ".join(sorted(r & dirty)), bar([seen[x] for x in r & dirty])))
            dirty = set()
        out.append(n)
        dirty |= w
        seen.update(tvs)
    return out


def _merge_barriers(nodes: list) -> list:
    """[BLOCK_SYNC a, FENCE.., BLOCK_SYNC b] -> [FENCE.., BLOCK_SYNC a+b]: the
    fences order this thread's earlier writes, so they may move above ``a``."""
    out = []
    for n in nodes:
        if isinstance(n, ForLoop):
            n.body = _merge_barriers(n.body)
        elif isinstance(n, IfThenElse):
            n.then, n.else_ = _merge_barriers(n.then), _merge_barriers(n.else_)
        elif isinstance(n, RoleSwitch):
            n.bodies = [_merge_barriers(b) for b in n.bodies]
        if isinstance(n, BlockSync):
            k = len(out) - 1
            while k >= 0 and isinstance(out[k], Fence):
                k -= 1
            if k >= 0 and isinstance(out[k], BlockSync) and out[k].barrier == n.barrier:
                first = out.pop(k)
                n.reason = f"{first.reason}; {n.reason}"
        out.append(n)
    return out


def _thread_vars(e) -> set:
    if not isinstance(e, Scalar):
        return set()
    return {n for n in free_vars(e) if n.startswith("threadIdx")}


def _check_uniform_trips(nodes: list, loops: tuple = ()) -> None:
    """A barrier whose id is the same for all threads (``__syncthreads`` or
    the consumers' named barrier) must be reached the same number of times
    by each: a loop whose bounds depend on a thread index (a ping-pong
    warpgroup's share of a persistent grid) cannot contain one, or the
    warpgroup with fewer trips leaves the others waiting forever."""
    for n in nodes:
        if isinstance(n, (BlockSync, BlockReduce)) and not _thread_vars(n.barrier[0]):
            for loop in loops:
                used = set()
                for e in (loop.start, loop.extent, loop.step):
                    used |= _thread_vars(e)
                if used:
                    what = n.reason if isinstance(n, BlockSync) else f"block reduction of {n.expr.out.name}"
                    raise CircbufError(
                        f"a block-wide barrier ({what}) sits in loop {loop.index.name}, whose trip count "
                        f"depends on {', '.join(sorted(used))}: threads would reach it different numbers "
                        "of times and hang"
                    )
        inner = loops + (n,) if isinstance(n, ForLoop) else loops
        for body in children(n):
            _check_uniform_trips(body, inner)


def _role_syncs(kernel: Kernel) -> None:
    """Block-wide syncs and block reductions placed inside a role's branch
    (by earlier passes) become the role's named barrier."""

    def visit(node, role):
        if isinstance(node, RoleSwitch):
            for r, body in zip(node.roles, node.bodies):
                for n in body:
                    visit(n, r)
            return
        if role is not None and isinstance(node, (BlockReduce, BlockSync)) and is_block_wide(node.barrier):
            node.barrier = kernel.role_barrier(role)
        for body in children(node):
            for n in body:
                visit(n, role)

    for n in kernel.body:
        visit(n, None)


def insert_syncs(kernel: Kernel) -> Kernel:
    """Entry: add BlockSync nodes for shared-memory RAW/WAR hazards; in each
    branch of a warp-role switch they are the role's named barrier."""
    _role_syncs(kernel)
    kernel.body = _merge_barriers(_sync_list(kernel, kernel.body, lambda _tvs: (0, 0)))
    _check_uniform_trips(kernel.body)
    return kernel
