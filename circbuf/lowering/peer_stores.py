"""Pass: ship each finished output tile to the peer GPUs, and flag it (issue 22).

Requires: tma_stores_synced, role_switch, tensor_maps, synced; provides: peer_stores, peer,
tensor_params, scalar_params, tensor_maps.

An output with a ``peer_store`` (:mod:`circbuf.ir.peer`) is not stored into
its own buffer: each TMA store of a sub-tile becomes ``world`` TMA stores from
the same staged shared memory, one per peer buffer ``P<p>`` (a tensor map per
peer, all encoded by the runtime from torch's symmetric-memory views; peer
``rank`` is this GPU's own buffer), inside the same bulk group. The TMA unit
is the communication engine: the MMA warpgroups go on to the next tile while
the copies cross NVLink. For a reduce-scatter the row coordinate of peer
``d``'s store is shifted by ``d * M / world`` (its buffer holds rows
``[d * M/world, (d+1) * M/world)`` of this rank's partial), so TMA clips the
rows that belong to other peers.

It runs after the sync pass: the TMA stores' fences, barriers and bulk-group
waits are in place, and no ring or barrier pass sees the peer stores.

A tile is flagged one tile late, so the storing lane never waits on NVLink:
at the end of tile ``t``'s iteration it waits until only tile ``t``'s bulk
groups are in flight (``cp.async.bulk.wait_group G``: tile ``t - 1``'s writes
are complete), fences the async proxy against the generic one and adds 1 to
flag ``[rank * tiles + (t - 1)]`` of every peer with release semantics at
system scope (one ``fence.acq_rel.sys``, then a ``red.relaxed.sys`` per peer); the
last tile after the loop, after ``wait_group 0``. A flag collects one
arrival per storing warpgroup per call, so a reader of call ``e`` (1, 2, ...)
waits for ``e * groups`` (:func:`flag_wait_kernel`): flags are never reset.

Before (the consumer role's persistent tile loop)::

    FOR j6 in blockIdx.x..T step grid            // tiles
      ... MMAs ...
      FOR sub-tiles: ... IF elect: TMA_STORE tmap2{c, r} <- T6; BULK_COMMIT_GROUP
    IF elect: BULK_WAIT_GROUP 0

After::

    PEER_TILE prev = -1
    FOR j6 in blockIdx.x..T step grid
      ... MMAs ...
      FOR sub-tiles: ... IF elect: TMA_STORE P0 tmap2{c, r - 0*M/W} <- T6
                                   TMA_STORE P1 tmap3{c, r - 1*M/W} <- T6; BULK_COMMIT_GROUP
      IF elect: PEER_SIGNAL prev (wait_group G), prev = j6
    IF elect: BULK_WAIT_GROUP 0
    IF elect: PEER_SIGNAL prev (wait_group 0)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import CircbufError, Const, DataType, IterDomain, TensorView, Var, simplify
from .kir import (
    BlockSync,
    BulkCommitGroup,
    ElectOne,
    ForLoop,
    IfThenElse,
    Kernel,
    Node,
    RoleSwitch,
    TensorMapSpec,
    TensorParam,
    TmaStore,
)

# PTX of the flag protocol (sys scope: the reader is another GPU)
HELPERS = {
    "cb_flag": """\
namespace cb {
// a tile's flag: release (the tile's writes happen before) / acquire, system scope
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
// after fence_acq_rel_sys: the fence and this strong write are a release pattern (one fence, world flags)
__device__ __forceinline__ void flag_add(int* p, unsigned v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned flag_acquire(const int* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// TMA (async proxy) writes complete -> visible to generic-proxy release/acquire
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
}  // namespace cb"""
}


@dataclass(eq=False)
class PeerTmaStore(TmaStore):
    """A TMA store of a staged sub-tile into peer ``peer``'s buffer; ``tile``:
    the tile index it belongs to (the checker pairs it with the tile's flag)."""

    peer: int = 0
    tile: object = None

    def lines(self, ind):
        c = ", ".join(str(x) for x in self.coords)
        return [
            "  " * ind
            + f"TMA_STORE peer {self.peer} tmap{self.map_index}{{{c}}} <- {self.src} (tile {self.tile})"
        ]

    def cuda(self, cg):
        coords = ", ".join(f"(int)({cg.scalar(c)})" for c in self.coords)
        cg.emit(f"cb::tma_store(&tmap{self.map_index}, &{cg.ref(self.src)}, {coords});  // peer {self.peer}")


@dataclass(eq=False)
class PeerTileVar(Node):
    """``int prev = -1``: the storing lane's last tile, not yet flagged."""

    var: Var

    def lines(self, ind):
        return ["  " * ind + f"PEER_TILE {self.var} = -1"]

    def cuda(self, cg):
        cg.emit(f"int {self.var.name} = -1;  // the last tile stored to the peers, not yet flagged")


@dataclass(eq=False)
class PeerSignal(Node):
    """On the lane that issued the stores: wait until at most ``pending``
    bulk groups are in flight (the tile ``prev``'s are complete), then add 1
    to flag ``rank * tiles + prev`` of every peer (``flags``: their int32
    flag tensors) with release semantics at system scope; then ``prev =
    tile`` (``tile`` None: the kernel's last signal)."""

    flags: list  # TensorView per peer
    rank: Var
    tiles: object  # Scalar: tiles per rank
    prev: Var
    tile: object  # Scalar or None
    pending: int

    def index(self):
        return simplify(self.rank * self.tiles + self.prev)

    def lines(self, ind):
        to = ", ".join(f"{f.name}[{self.index()}]" for f in self.flags)
        nxt = f"; {self.prev} = {self.tile}" if self.tile is not None else ""
        return [
            "  " * ind
            + f"PEER_SIGNAL (wait_group {self.pending}) release +1 -> {to} if {self.prev} >= 0{nxt}"
        ]

    def cuda(self, cg):
        cg.helpers.update(HELPERS)
        p = self.prev.name
        cg.emit(f"cb::bulk_wait_group<{self.pending}>();  // tile {p}'s stores to the peers are complete")
        cg.emit(f"if ({p} >= 0) {{")
        cg.emit("  cb::fence_proxy_async_global();")
        cg.emit("  cb::fence_acq_rel_sys();  // release: the tile's writes before the flags")
        idx = cg.scalar(self.index())
        for f in self.flags:
            cg.emit(f"  cb::flag_add(&{f.name}.data[{idx}], 1u);")
        cg.emit("}")
        if self.tile is not None:
            cg.emit(f"{p} = (int)({cg.scalar(self.tile)});")


@dataclass(eq=False)
class FlagWait(Node):
    """Wait until flag ``flags[index]`` reaches ``target`` (acquire, system
    scope); after ``timeout_ns`` record ``{1, index, value, target}`` in
    ``err`` (int32 [4]) and return: a named error on the host, not a hang."""

    flags: TensorView
    index: object
    target: object
    err: TensorView
    timeout_ns: int

    def lines(self, ind):
        return ["  " * ind + f"FLAG_WAIT {self.flags.name}[{self.index}] >= {self.target} (acquire)"]

    def cuda(self, cg):
        cg.helpers.update(HELPERS)
        f, e = self.flags.name, self.err.name
        idx, tgt = cg.scalar(self.index), cg.scalar(self.target)
        cg.emit("{")
        cg.emit(f"  const unsigned target = (unsigned)({tgt});")
        cg.emit("  const unsigned long long t0 = cb::globaltimer();")
        cg.emit("  unsigned v;")
        cg.emit(f"  while ((int)((v = cb::flag_acquire(&{f}.data[{idx}])) - target) < 0) {{")
        cg.emit(f"    if (cb::globaltimer() - t0 > {self.timeout_ns}ull) {{")
        cg.emit(f"      if (atomicCAS(&{e}.data[0], 0, 1) == 0) {{")
        cg.emit(f"        {e}.data[1] = (int)({idx}); {e}.data[2] = (int)v; {e}.data[3] = (int)target;")
        cg.emit("      }")
        cg.emit("      return;")
        cg.emit("    }")
        cg.emit("    __nanosleep(128);")
        cg.emit("  }")
        cg.emit("}")


def _tensor(name: str, dtype: DataType, ndim: int) -> TensorView:
    tv = TensorView([IterDomain(Var(f"{name}_n{d}")) for d in range(ndim)], dtype)
    tv.name = name
    return tv


def _find(nodes, out, stack, found):
    """(store, its enclosing nodes, the node list holding it) for each TMA store of ``out``."""
    for n in nodes:
        if isinstance(n, TmaStore) and n.out is out:
            found.append((n, list(stack), nodes))
        for attr in ("body", "then", "else_"):
            sub = getattr(n, attr, None)
            if isinstance(sub, list):
                _find(sub, out, stack + [n], found)
        if isinstance(n, RoleSwitch):
            for b in n.bodies:
                _find(b, out, stack + [n, b], found)


def peer_stores(kernel: Kernel) -> Kernel:
    """Entry: peer TMA stores and per-tile flags for an output with a
    ``peer_store`` (see the module doc); other kernels pass unchanged."""
    outs = [p for p in kernel.tensor_params if p.is_output and p.tv.peer_store is not None]
    if not outs:
        return kernel
    if len(outs) > 1:
        raise CircbufError(f"{kernel.name}: one output per kernel can be stored to peers")
    out = outs[0].tv
    spec = out.peer_store
    world = spec.world
    found: list = []
    _find(kernel.body, out, [], found)
    if not found:
        raise CircbufError(f"{out.name} is stored to peer GPUs, which needs its TMA-store epilogue")
    map_index = found[0][0].map_index
    if any(s.map_index != map_index for s, _, _ in found):
        raise CircbufError(f"{out.name}: its TMA stores use more than one tensor map")
    # the peer buffers and flags: tensor parameters after the kernel's own
    base = kernel.tensor_maps[map_index]
    nd = len(out.domain.no_reductions())
    peers = [_tensor(f"P{p}", out.dtype, nd) for p in range(world)]
    flags = [_tensor(f"F{p}", DataType.Int32, 1) for p in range(world)]
    first = len(kernel.tensor_params)
    kernel.tensor_params += [TensorParam(t, True) for t in peers] + [TensorParam(t, True) for t in flags]
    maps = []
    for p in range(world):
        spec_p = TensorMapSpec(first + p, list(base.dims), base.swizzle)
        if p == 0:
            kernel.tensor_maps[map_index] = spec_p  # the output itself is not stored
            maps.append(map_index)
        else:
            kernel.tensor_maps.append(spec_p)
            maps.append(len(kernel.tensor_maps) - 1)
    rows = next((k for k, (axes, _) in enumerate(base.dims) if tuple(axes) == (0,)), None)
    if spec.kind == "reduce_scatter" and (nd != 2 or rows is None):
        raise CircbufError(f"{out.name}: a reduce-scatter output must be a 2-D [M, N] tensor")
    m_per = out.domain.no_reductions()[0].extent // world if spec.kind == "reduce_scatter" else None
    rank = Var("cb_rank", dtype=DataType.Int32)
    kernel.scalar_params.append(rank)
    # the storing lanes, their tile loop and the bulk groups per tile
    loops: dict = {}
    for store, stack, holder in found:
        loop = next((n for n in stack if isinstance(n, ForLoop) and n.strided), None)
        if loop is None:
            raise CircbufError(f"{out.name} is stored to peer GPUs, which needs a persistent tile loop")
        groups = 1
        for n in stack[stack.index(loop) + 1 :]:
            if isinstance(n, ForLoop):
                if not isinstance(n.extent, Const):
                    raise CircbufError(f"{out.name}: sub-tile loop {n.index} has no constant extent")
                groups *= n.extent.value
        elect = next(n for n in reversed(stack) if isinstance(n, (ElectOne, IfThenElse)))
        branch = next((stack[k + 1] for k, n in enumerate(stack) if isinstance(n, RoleSwitch)), kernel.body)
        loops.setdefault(id(loop), (loop, elect, branch, groups, stack))
        k = holder.index(store)
        holder[k : k + 1] = [
            PeerTmaStore(
                store.src,
                maps[p],
                [
                    c - p * m_per if (m_per is not None and d == rows) else c
                    for d, c in enumerate(store.coords)
                ],
                store.box_bytes,
                store.out,
                peer=p,
                tile=loop.index,
            )
            for p in range(world)
        ]
        assert isinstance(holder[k + world], BulkCommitGroup), "a peer store's group is committed after it"
    for loop, elect, branch, groups, _stack in loops.values():
        prev = Var(f"cb_prev_{loop.index.name}", dtype=DataType.Int32)
        tiles = loop.extent
        sig = PeerSignal(flags, rank, tiles, prev, loop.index, groups)
        loop.body.append(_like(elect, [sig]))
        k = branch.index(next(n for n in branch if n is loop or _contains(n, loop)))
        branch.insert(k, PeerTileVar(prev))
        branch.append(_like(elect, [PeerSignal(flags, rank, tiles, prev, None, 0)]))
    kernel.peer = dict(
        kind=spec.kind,
        world=world,
        peers=[first + p for p in range(world)],
        flags=[first + world + p for p in range(world)],
        stores_per_tile=_stores_per_tile(kernel, found),
        tiles=loops and next(iter(loops.values()))[0].extent,
    )
    return kernel


def _stores_per_tile(kernel, found) -> int:
    """Storing lanes per tile: one per sync group of the threads that fill
    a box (the named barrier before the elected store counts a group's
    threads; the role's threads over it is the number of groups)."""
    from .kir import parent_list

    store, stack, _ = found[0]
    elect = next(n for n in reversed(stack) if isinstance(n, (ElectOne, IfThenElse)))
    holder = parent_list(kernel.body, elect)
    k = holder.index(elect)
    sync = holder[k - 1] if k and isinstance(holder[k - 1], BlockSync) else None
    sw = next((n for n in stack if isinstance(n, RoleSwitch)), None)
    if sync is None or not sync.barrier[1] or sw is None:
        return 1
    body = stack[stack.index(sw) + 1]
    role = sw.roles[[id(b) for b in sw.bodies].index(id(body))]
    return max(role.threads // sync.barrier[1], 1)


def _like(elect, body):
    if isinstance(elect, ElectOne):
        return ElectOne(elect.warp, body)
    return IfThenElse(elect.cond, body)


def _contains(node, target) -> bool:
    from .kir import children

    return any(c is target or _contains(c, target) for sub in children(node) for c in sub)


def flag_wait_kernel(world: int, timeout_ns: int, name: str = "circbuf_flag_wait") -> Kernel:
    """The consumer side: one thread per flag of this rank's ``F`` ([world *
    tiles] int32) waits until it reaches ``cb_target`` (the call's epoch times
    the stores per tile); a timeout records itself in ``E`` ([4] int32)."""
    from ..ir import ParallelType

    f = _tensor("F", DataType.Int32, 1)
    e = _tensor("E", DataType.Int32, 1)
    n = Var("i0")
    target = Var("cb_target", dtype=DataType.Int32)
    idx = Var("blockIdx.x") * 128 + Var("threadIdx.x")
    body = [IfThenElse(idx.lt(n), [FlagWait(f, idx, target, e, timeout_ns)])]
    return Kernel(
        name,
        body,
        [TensorParam(f, False), TensorParam(e, True)],
        [target],
        {ParallelType.BIDx: Var("cb_grid"), ParallelType.TIDx: Const(128)},
        {"i0": (0, 0)},
        {},
        max_threads=128,
    )
