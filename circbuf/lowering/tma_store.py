"""Pass: order TMA stores against the threads that fill their shared source.

Requires: indexed, role_switch, launch, named_barriers; provides: tma_stores_synced, named_barriers.

A TMA store reads its shared-memory source through the async proxy, so the
threads' generic-proxy writes must be fenced (``fence.proxy.async``) and
joined by a barrier before one elected thread issues the copy and commits
it as a bulk group. Before those threads overwrite the source in the next
iteration of the enclosing serial loop, the elected thread waits until the
store has *read* it (``wait_group.read 0``) and a barrier passes that on.
Completion of the global writes is awaited once, at the end of the kernel
(of the role's branch, in a warp-specialized kernel). The barriers are those
of the threads that fill a box: the block's (``__syncthreads``, or the role's
named barrier inside a role), or, when each group of them stores its own
boxes (a warpgroup its rows of the tile), one named barrier per group,
reserved as ``<role> store <buffer>``.

Before::

    FOR j0 in 0..E
      ... TMA loads, compute ...
      FOR j1 ..: Y_s[...] = f(...)                 // threads write the source
      TMA_STORE tmap1{..} <- Y_s[0]

After::

    FOR j0 in 0..E
      ... TMA loads, compute ...
      IF elect_one(warp 0): BULK_WAIT_GROUP.READ 0 // the last store has read Y_s
      BLOCK_SYNC  // WAR on Y_s
      FOR j1 ..: Y_s[...] = f(...)
      FENCE proxy_async
      BLOCK_SYNC  // RAW on Y_s
      IF elect_one(warp 0): TMA_STORE tmap1{..} <- Y_s[0]; BULK_COMMIT_GROUP
    IF elect_one(warp 0): BULK_WAIT_GROUP 0
"""

from __future__ import annotations

from ..ir import CircbufError, Const, ParallelType, Var, simplify
from ..ir.scalar import free_vars
from .kir import (
    Assign,
    BlockSync,
    BulkCommitGroup,
    BulkWaitGroup,
    ElectOne,
    Fence,
    ForLoop,
    IfThenElse,
    Kernel,
    RoleSwitch,
    TmaStore,
    thread0_cond,
    walk,
)


def _writes(node, tv) -> bool:
    hit = []
    walk([node], lambda n, _s: hit.append(n) if isinstance(n, Assign) and n.lhs.tv is tv else None)
    return bool(hit)


def _dims(kernel, role):
    """``(axis, extent, first index)`` of the thread axes of the block, or
    of ``role``'s threads (its rows of its axis). Thread extents are
    constants (the loop-nest pass requires it)."""
    out = []
    for p in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz):
        e, lo = kernel.launch.get(p, Const(1)).value, 0
        if role is not None and p == role.axis:
            e, lo = role.hi - role.lo, role.lo
        out.append((p, e, lo))
    return out


def _elected(kernel, body, warp=None, role=None):
    """``body`` on one lane of the first warp of the block (or of ``role``'s
    threads) (elect.sync), or of the warp ``warp`` selects, or on thread 0
    when the block is not made of whole warps."""
    if warp is not None:
        return ElectOne(warp, body)
    dims = _dims(kernel, role)
    threads = 1
    for _, e, _ in dims:
        threads *= e
    if threads % 32:
        if role is not None:
            raise CircbufError(f"{kernel.name}: the {role.name} role stores with TMA but is not whole warps")
        return IfThenElse(thread0_cond(kernel), body)
    return ElectOne(_linear_tid(dims).lt(32), body)


def _index(p, e, lo):
    v = Var(p.value, lo=lo, hi=Const(lo + e))
    return v - lo if lo else v


def _linear_tid(dims):
    """The linear thread index over ``dims`` ((axis, extent, first), fastest first)."""
    lin, stride = Const(0), 1
    for p, e, lo in dims:
        if e > 1:
            lin = lin + _index(p, e, lo) * stride
            stride *= e
    return simplify(lin)


def _group(kernel, store, role):
    """The threads that fill and store one box: all of the block (or of
    ``role``), or, when the box depends on thread indices (a warpgroup's own
    rows of the tile), the threads sharing those indices. Returns (barrier,
    elect) for ``BlockSync``/``ElectOne`` and the number of groups:
    ``((0, 0), None, 1)`` for all of them (the sync pass makes a role's the
    role's barrier), else a named barrier per group and the condition that
    picks its first warp."""
    used = set()
    for c in store.coords + [store.src.index]:
        used |= set(free_vars(c))
    if store.out is not None:  # thread axes of the stored tensor: one store per index
        used |= {ax.parallel_type.value for ax in store.out.loop if ax.parallel_type.is_thread}
    dims = _dims(kernel, role)
    dep = [d for d in dims if d[0].value in used and d[1] > 1]
    if not dep:
        return (0, 0), None, 1
    rest = [d for d in dims if d not in dep and d[1] > 1]
    threads, groups = 1, 1
    for _, e, _ in rest:
        threads *= e
    for _, e, _ in dep:
        groups *= e
    order = [p for p, _, _ in dims]
    if rest and dep and max(order.index(p) for p, _, _ in rest) > min(order.index(p) for p, _, _ in dep):
        # A named barrier counts whole warps; a group is whole warps only when the
        # thread axes it spans are the fast-varying ones.
        raise CircbufError(
            f"{store.src.tv.name}: each box is filled by threads that differ in "
            f"{', '.join(p.value for p, _, _ in rest)} but share {', '.join(p.value for p, _, _ in dep)}; "
            "such a group is not whole warps, so it cannot sync on a named barrier"
        )
    if threads % 32:
        raise CircbufError(
            f"{store.src.tv.name}: each box is filled by {threads} threads; a group that syncs on a "
            "named barrier must be whole warps"
        )
    gid = Const(0)
    for p, e, lo in dep:
        gid = gid * e + _index(p, e, lo)
    who = f"{role.name} " if role is not None else ""
    base = kernel.named_barrier(f"{who}store {store.src.tv.name}", groups)
    return (gid + base, threads), _linear_tid(rest).lt(32), groups


def _buffers(src, store, groups) -> int:
    """Boxes the source buffer holds per storing group of threads."""
    from .allocation import allocation_size

    size = allocation_size(src)
    box = store.box_bytes // src.dtype.size
    if not isinstance(size, Const) or size.value % (box * groups):
        return 1
    return max(size.value // (box * groups), 1)


def _rewrite(nodes, kernel, loop, found, role=None, branch=None) -> list:
    """``branch``: the node list the stores' final wait goes to (the
    kernel's body, or the branch of the role they sit in)."""
    out = []
    for n in nodes:
        if isinstance(n, ForLoop):
            n.body = _rewrite(
                n.body, kernel, n if n.ptype == ParallelType.Serial else loop, found, role, branch
            )
        elif isinstance(n, IfThenElse):
            n.then = _rewrite(n.then, kernel, loop, found, role, branch)
            n.else_ = _rewrite(n.else_, kernel, loop, found, role, branch)
        elif isinstance(n, RoleSwitch):
            n.bodies = [_rewrite(b, kernel, loop, found, r, b) for r, b in zip(n.roles, n.bodies)]
        if not isinstance(n, TmaStore):
            out.append(n)
            continue
        src = n.src.tv.name
        barrier, warp, groups = _group(kernel, n, role)
        found.append((n, loop, barrier, warp, groups, role, branch))
        out += [
            Fence("proxy_async"),
            BlockSync(f"RAW: {src} written by the threads, read by the TMA store", barrier),
            _elected(kernel, [n, BulkCommitGroup()], warp, role),
        ]
    nodes[:] = out  # in place: a role's branch list stays the one ``found`` names
    return nodes


def tma_stores(kernel: Kernel) -> Kernel:
    """Entry: fences, barriers and bulk-group waits around TMA stores (see module doc)."""
    found: list = []
    kernel.body = _rewrite(kernel.body, kernel, None, found)
    if not found:
        return kernel
    for store, loop, barrier, warp, groups, role, _ in found:
        if loop is None:
            continue
        src = store.src.tv
        k = next((k for k, n in enumerate(loop.body) if _writes(n, src)), None)
        if k is None:
            raise CircbufError(f"{src.name}: the TMA store's source is not written in its loop")
        # a source holding B boxes per group of threads is rewritten while up
        # to B - 1 later stores still read their boxes
        pending = _buffers(src, store, groups) - 1
        loop.body[k:k] = [
            _elected(kernel, [BulkWaitGroup(pending, read=True)], warp, role),
            BlockSync(f"WAR: the TMA store of this buffer of {src.name} has read it", barrier),
        ]
    # the stores' global writes are done before the kernel (or the role's
    # branch) ends: one wait per issuing warp, by the lane that committed them
    waits = {}
    for _, _, _, w, _, role, branch in found:
        waits.setdefault((id(branch), str(w)), (w, role, branch))
    for w, role, branch in waits.values():
        (kernel.body if branch is None else branch).append(
            _elected(kernel, [BulkWaitGroup(0, read=False)], w, role)
        )
    return kernel
