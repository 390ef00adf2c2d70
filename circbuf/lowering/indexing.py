"""Pass: turn placed exprs into indexed assignments.

Requires: loop_nest; provides: indexed, tensor_maps, descriptors; consumes: loop_nest.

Consumer indices are walked back from the loop indices through the recorded
splits and merges to logical coordinates; producers are indexed at the
mapped logical coordinates (global tensors through strides, buffers by
replaying their own transforms forward, which the simplifier folds back).
Each statement records the conditions under which it is in range.

Before::

    T3 = add(T1, T2)          // loop axes -> j0, threadIdx.x, blockIdx.x

After::

    T3[j0] = add(T1[j0], T2[((blockIdx.x * 128 + threadIdx.x) * 4 + j0) % i1])
      pred: ((blockIdx.x * 128 + threadIdx.x) * 4 + j0) < (i0 * i1)
"""

from __future__ import annotations

from ..ir import (
    Bin,
    CircbufError,
    Const,
    LoadStoreOp,
    MemoryType,
    MmaOp,
    ParallelType,
    ReductionOp,
    Scalar,
    TensorView,
    Var,
    simplify,
    transform_history,
)
from ..ir.iterdomain import Merge, Split
from . import wgmma_ops
from .allocation import allocation_strides
from .kir import (
    Assign,
    BlockReduce,
    CpAsyncBox,
    ExprStmt,
    Kernel,
    ReductionInit,
    RowPiece,
    TensorMapSpec,
    TensorRef,
    TmaLoad,
    TmaStore,
    rewrite,
)


def loop_to_ids(tv: TensorView, loop_index: dict) -> dict:
    """Indices of every IterDomain in tv's history, from its loop axes' indices.
    An index already given for a split's input (a grid-stride loop runs that
    index itself) is kept."""
    idx = dict(loop_index)
    for t in reversed(transform_history(tv)):
        if isinstance(t, Split):
            if t.in_.id in loop_index:
                continue
            o, i = idx.get(t.outer.id, Const(0)), idx.get(t.inner.id, Const(0))
            idx[t.in_.id] = o * t.inner.loop_extent + i
        elif isinstance(t, Merge):
            m = idx.get(t.out.id, Const(0))
            ext = t.inner.loop_extent
            idx[t.outer.id] = m // ext
            idx[t.inner.id] = m % ext
    return idx


def logical_to_ids(tv: TensorView, logical_index: dict) -> dict:
    """Forward: indices of tv's loop axes from its logical axes' indices (a
    reshape's root-to-logical transforms are behind the logical axes: skipped)."""
    idx = dict(logical_index)
    view = {id(t) for t in tv.domain.view_transforms()}
    for t in transform_history(tv):
        if id(t) in view:
            continue
        if isinstance(t, Split):
            x = idx.get(t.in_.id, Const(0))
            f = t.inner.loop_extent
            idx[t.outer.id], idx[t.inner.id] = x // f, x % f
        elif isinstance(t, Merge):
            a, b = idx.get(t.outer.id, Const(0)), idx.get(t.inner.id, Const(0))
            idx[t.out.id] = a * t.inner.loop_extent + b
    return idx


def predicate_terms(tv: TensorView, ids: dict, reduced_only: bool = False) -> list[Scalar]:
    """``index < extent`` for each split that may overrun its input.

    A split whose input is the outer output of another predicated split is
    implied by that one and skipped. ``reduced_only``: only the splits of
    reduced axes (a reduction update that reads registers alone may run at an
    out-of-range row: it fills an accumulator that only that row's guarded
    stores read, and the update needs no branch per element).
    """
    hist = [t for t in transform_history(tv) if isinstance(t, Split)]
    guarded = set()
    terms = []
    for t in hist:  # outer-to-inner order: logical side first
        if t.divisible():
            continue
        if t.in_.id in guarded:
            guarded.add(t.outer.id)
            continue
        if t.in_.is_broadcast or (reduced_only and not t.in_.is_reduction):
            continue
        terms.append(ids[t.in_.id].lt(t.in_.loop_extent))
        guarded.add(t.outer.id)
    return terms


class _Indexer:
    def __init__(self, kernel: Kernel):
        self.k = kernel

    def global_index(self, tv: TensorView, logical: dict) -> Scalar:
        off = Const(0)
        for d, ax in enumerate(tv.domain.no_reductions()):
            if ax.is_broadcast:
                continue
            i = logical.get(ax.id, Const(0))
            off = off + i * self.k.strides[(tv.name, d)]
        return off

    def buffer_index(self, tv: TensorView, ids: dict) -> Scalar:
        off = Const(0)
        for ax, s in allocation_strides(tv):
            off = off + ids.get(ax.id, Const(0)) * s
        return off

    def ref_out(self, tv, index: dict, logical: dict) -> TensorRef:
        if tv.memory_type == MemoryType.Global:
            return TensorRef(tv, self.global_index(tv, logical))
        ids = loop_to_ids(tv, index) if tv.domain.allocation is not None else index
        return TensorRef(tv, swizzle_index(tv, self.buffer_index(tv, ids)))

    def ref_in(self, e, p: TensorView, logical: dict, swizzled: bool = True) -> TensorRef:
        """``p`` read at the logical coordinates of ``e``'s output; a threads'
        access to a swizzled buffer goes to the swizzled address (the copy
        engines and wgmma apply the swizzle themselves: ``swizzled=False``)."""
        plog = {}
        for pa, ca in e.logical_map(p):
            plog[pa.id] = logical.get(ca.id, Const(0))
        if p.memory_type == MemoryType.Global:
            return TensorRef(p, self.global_index(p, plog))
        idx = self.buffer_index(p, logical_to_ids(p, plog))
        return TensorRef(p, swizzle_index(p, idx) if swizzled else idx)

    def row_store(self, e, ids: dict, lhs, ops) -> Assign:
        """A global output written from its staging tile by rows (kind ``"rows"``):
        the copy, plus where its pair lies in the staging row and in the output's
        row (:class:`~circbuf.lowering.kir.RowPiece`)."""
        out, src = e.out, e.inputs[0]
        assert src.memory_type == MemoryType.Shared and src.domain.allocation, f"{out.name}: no staging tile"
        n_out = out.logical[-1]
        plog, n_src = {}, None
        for pa, ca in e.logical_map(src):
            plog[pa.id] = ids.get(ca.id, Const(0))
            if ca is n_out:
                n_src = pa
        row_ax = src.domain.allocation[-1]
        width = simplify(row_ax.loop_extent)
        sids = logical_to_ids(src, plog)
        col = sids.get(row_ax.id)
        assert n_src is not None and col is not None and isinstance(width, Const), (
            f"{out.name}: a row store's staging tile holds a row of its last axis innermost"
        )
        sids[row_ax.id] = col - 1  # the element before the pair, in the same staging row
        prev_ref = TensorRef(src, swizzle_index(src, self.buffer_index(src, sids)))
        left = n_out.loop_extent - ids[n_out.id]
        return Assign(
            lhs,
            e,
            ops,
            pred=predicate_terms(out, ids),
            touches_global=True,
            row=RowPiece(prev_ref, col, width.value, left),
        )

    def _box(self, box_tv, g, g_axes, ids, cp_async=False):
        """The tensor-map dims of one bulk copy of global ``g``: the Bulk loop
        axes of ``box_tv`` (each the inner part of a split of merged logical
        axes), innermost logical axis first, as (g axes, box, coordinate).
        ``g_axes[d]`` is the id of box_tv's logical axis at g's axis d."""
        to_g = {i: d for d, i in enumerate(g_axes)}
        dims, covered = [], set()
        for ax in box_tv.loop:
            if ax.parallel_type != ParallelType.Bulk:
                continue
            t = ax.definition
            if not (isinstance(t, Split) and t.inner is ax and t.inner_split):
                raise CircbufError(f"{box_tv.name}: bulk axis {ax} must be the inner part of a split")
            # the inner part of inner parts of splits of (merged) logical axes: a
            # contiguous range of them, starting at the top axis's index
            top = t.in_
            while (
                isinstance(top.definition, Split)
                and top.definition.inner is top
                and top.definition.inner_split
            ):
                top = top.definition.in_
            leaves = _merged_leaves(top)
            if leaves is None:
                raise CircbufError(
                    f"{box_tv.name}: bulk axis {ax} must split logical axes joined by merges only"
                )
            axes = tuple(to_g[i.id] for i in leaves)
            covered.update(axes)
            dims.append((axes, box_extent(ax), ids[top.id]))
        if cp_async:
            # threads copy through the strides: the box's dims are the buffer's bulk
            # axes, innermost first, whatever the memory order
            dims.reverse()
            gl = g.domain.no_reductions()
            for d, lid in enumerate(g_axes):
                if d not in covered:
                    dims.append(((d,), 1, Const(0) if gl[d].is_broadcast else ids.get(lid, Const(0))))
            return dims
        # the tensor map's dims follow the memory order the kernel is specialized for
        order = self.k.memory_orders.get(g.name, list(range(len(g.domain.no_reductions()))))
        mem = {d: k for k, d in enumerate(order)}
        in_loop_order = [mem[a[-1]] for a, _, _ in dims]
        if in_loop_order != sorted(in_loop_order):
            raise CircbufError(
                f"{box_tv.name}: bulk axes must follow the memory order of the axes of {g.name} they split"
            )
        gl = g.domain.no_reductions()
        for d, lid in enumerate(g_axes):
            if d not in covered:
                # a broadcast axis of the global tensor is read at 0 whatever the loop index
                dims.append(((d,), 1, Const(0) if gl[d].is_broadcast else ids.get(lid, Const(0))))
        dims.sort(key=lambda x: -mem[x[0][-1]])  # innermost in memory first
        if len(dims) > 5:
            raise CircbufError(f"{box_tv.name}: a tensor map has at most 5 dims, this copy needs {len(dims)}")
        if not cp_async and (dims[0][1] * g.dtype.size) % 16:
            raise CircbufError(
                f"{box_tv.name}: the innermost box extent ({dims[0][1]} x {g.dtype.size} B) must be a multiple of 16 bytes"
            )
        return dims

    def _map(self, g, dims, smem=None):
        """A tensor map for global ``g``; ``smem``: the shared buffer on the
        other side, whose swizzle the map carries (its rows must be exactly
        one swizzle span of the box's inner dimension)."""
        param = next(k for k, p in enumerate(self.k.tensor_params) if p.tv is g)
        swz = smem.swizzle_bytes if smem is not None else 0
        if swz and dims[0][1] * g.dtype.size != swz:
            raise CircbufError(
                f"{smem.name}: a {swz}-byte swizzled TMA box needs an inner extent of {swz} bytes, "
                f"not {dims[0][1]} x {g.dtype.size}"
            )
        self.k.tensor_maps.append(TensorMapSpec(param, [(a, b) for a, b, _ in dims], swz))
        nbytes = g.dtype.size
        for _, b, _ in dims:
            nbytes *= b
        return len(self.k.tensor_maps) - 1, [c for _, _, c in dims], nbytes

    def tma_load(self, node) -> TmaLoad:
        """A bulk copy of the box whose first element the loop indices name."""
        e = node.expr
        out, g = e.out, e.inputs[0]
        ids = loop_to_ids(out, node.index)
        dst = TensorRef(out, self.buffer_index(out, node.index))
        dims = self._box(out, g, [c.id for _, c in e.logical_map(g)], ids)
        # the box lands densely: its axes must be the buffer's innermost, in order
        strides = dict((a.id, s) for a, s in allocation_strides(out))
        expect = 1
        for ax in reversed([a for a in out.loop if a.parallel_type == ParallelType.Bulk]):
            if simplify(strides.get(ax.id, Const(-1))) != Const(expect):
                raise CircbufError(
                    f"{out.name}: bulk axes must be the innermost axes of the buffer, in order"
                )
            expect *= box_extent(ax)
        m, coords, nbytes = self._map(g, dims, out)
        # a slice of a tile the cluster's CTAs share: multicast along those axes
        along = tuple(
            p for p in (ParallelType.CIDx, ParallelType.CIDy) if any(a.parallel_type == p for a in out.loop)
        )
        return TmaLoad(dst, m, coords, nbytes, multicast=along)

    def cp_async_box(self, node) -> CpAsyncBox:
        """The box a TMA load of the same buffer would copy, copied by the
        producer threads instead (the fill kind ``cp.async``, for strides and
        pointers a tensor map cannot describe): the box's dims with their
        extents and the global tensor's strides, no tensor map."""
        e = node.expr
        out, g = e.out, e.inputs[0]
        ids = loop_to_ids(out, node.index)
        dst = TensorRef(out, self.buffer_index(out, node.index))
        dims = self._box(out, g, [c.id for _, c in e.logical_map(g)], ids, cp_async=True)
        strides = dict((a.id, s) for a, s in allocation_strides(out))
        expect = 1
        for ax in reversed([a for a in out.loop if a.parallel_type == ParallelType.Bulk]):
            if simplify(strides.get(ax.id, Const(-1))) != Const(expect):
                raise CircbufError(
                    f"{out.name}: bulk axes must be the innermost axes of the buffer, in order"
                )
            expect *= box_extent(ax)
        if out.swizzle_bytes and dims[0][1] * g.dtype.size != out.swizzle_bytes:
            raise CircbufError(
                f"{out.name}: a {out.swizzle_bytes}-byte swizzled box needs an inner extent of "
                f"{out.swizzle_bytes} bytes, not {dims[0][1]} x {g.dtype.size}"
            )
        gl = g.domain.no_reductions()
        box = []
        for axes, n, first in dims:
            if len(axes) != 1:
                raise CircbufError(f"{out.name}: a cp.async box dim must be one axis of {g.name}, not {axes}")
            d = axes[0]
            ext = Const(1) if gl[d].is_broadcast else gl[d].extent
            stride = Const(0) if gl[d].is_broadcast else self.k.strides[(g.name, d)]
            box.append((d, n, first, ext, stride))
        vec = getattr(e, "vector", 1) or 1
        # the scheduler picked the width for a unit-stride innermost box dim (a stride
        # the kernel reads at run time is 1 there too: the params, which key the
        # compiled kernel, carry the width)
        if box[0][1] % vec:
            raise CircbufError(
                f"{out.name}: {vec}-element copies do not divide the box's inner extent {box[0][1]}"
            )
        threads = self.k.launch.get(ParallelType.TIDx, Const(1))
        assert isinstance(threads, Const), threads
        regs = vec * g.dtype.size < 4  # cp.async copies 4 bytes at least
        if regs:  # 16 bytes of single-element loads per chunk, one shared store
            vec = 16 // g.dtype.size
            if box[0][1] % vec:
                raise CircbufError(
                    f"{out.name}: the box's inner extent {box[0][1]} is no multiple of 16 bytes"
                )
        # element copies across the box's inner dim (a transposing copy: the box's inner
        # dim is not the tensor's innermost in memory): consecutive threads walk the dim
        # that is, 16 bytes of it (half a sector) before the next row, so that a warp's
        # copies read few sectors and its shared stores spread over 32 / (16 / item) x
        # as many banks as a walk along whole rows would
        walk, run = 0, 0
        if vec == 1 and not regs:
            order = self.k.memory_orders.get(g.name, list(range(len(gl))))
            walk = next((k for k, d in enumerate(box) if d[0] == order[-1] and d[1] > 1), 0)
            run = max(16 // g.dtype.size, 1) if walk else 0
        return CpAsyncBox(dst, g, box, vec, threads.value, through_registers=regs, walk=walk, run=run)

    def tma_store(self, node) -> TmaStore:
        """A bulk copy of the box of global ``out`` whose first element the loop
        indices name, from the shared buffer its producer wrote. The buffer
        must hold the box densely, row-major: proved by simplifying the
        buffer index at (origin + b) - (origin) to the row-major offset of b."""
        e = node.expr
        out, src = e.out, e.inputs[0]
        if src.memory_type != MemoryType.Shared:
            raise CircbufError(f"{out.name}: a TMA store reads a shared-memory buffer, {src.name} is not one")
        logical = [ax.id for ax in out.domain.no_reductions()]
        dims = self._box(out, out, logical, loop_to_ids(out, node.index))
        bulk = [a for a in out.loop if a.parallel_type == ParallelType.Bulk]
        offs = {a.id: Var(f"b{k}", lo=0, hi=a.loop_extent) for k, a in enumerate(bulk)}
        at0 = self.ref_in(e, src, loop_to_ids(out, node.index), swizzled=False).index
        atb = self.ref_in(e, src, loop_to_ids(out, {**node.index, **offs}), swizzled=False).index
        dense, stride = Const(0), 1
        for a in reversed(bulk):
            dense = dense + offs[a.id] * stride
            stride *= box_extent(a)
        if simplify(atb - at0 - dense) != Const(0):
            raise CircbufError(
                f"{out.name}: the TMA store box must lie densely, row-major, in {src.name} "
                f"(offset of box element b is {simplify(atb - at0)}, not {simplify(dense)}); "
                f"schedule {src.name}'s axes right of its inline position like the box"
            )
        m, coords, nbytes = self._map(out, dims, src)
        return TmaStore(TensorRef(src, simplify(at0)), m, coords, nbytes, out)

    def lower(self, node):
        if isinstance(node, ExprStmt) and isinstance(node.expr, MmaOp):
            return wgmma_ops.lower_mma(self, node)
        if isinstance(node, ExprStmt) and isinstance(node.expr, LoadStoreOp) and node.expr.kind == "cp.async":
            return self.cp_async_box(node)
        if isinstance(node, ExprStmt) and isinstance(node.expr, LoadStoreOp) and node.expr.kind == "tma":
            if node.expr.out.memory_type == MemoryType.Global:
                return self.tma_store(node)
            return self.tma_load(node)
        if isinstance(node, ExprStmt):
            e = node.expr
            out = e.out
            ids = loop_to_ids(out, node.index)
            lhs = self.ref_out(out, node.index, ids)
            ops = [self.ref_in(e, x, ids) if isinstance(x, TensorView) else x for x in e.inputs]
            # global memory, and shared buffers laid out by another tensor's
            # transforms (a TMA box padding), are only valid inside the extents
            bounded = (MemoryType.Global, MemoryType.Shared)
            glob = any(isinstance(o, TensorRef) and o.tv.memory_type in bounded for o in ops)
            glob = glob or out.memory_type == MemoryType.Global
            red = isinstance(e, ReductionOp)
            if red:
                ops = [lhs] + ops
            if isinstance(e, LoadStoreOp) and e.kind == "rows":
                return self.row_store(e, ids, lhs, ops)
            return Assign(
                lhs,
                e,
                ops,
                # an update reading only registers: out-of-range rows accumulate
                # junk nothing stores (every global write keeps its own guard)
                pred=predicate_terms(out, ids, reduced_only=red and not glob and _all_local(ops)),
                touches_global=glob,
                accumulate=red,
            )
        if isinstance(node, ReductionInit):
            out = node.expr.out
            ids = loop_to_ids(out, node.index)
            return Assign(self.ref_out(out, node.index, ids), None, [], init=node.expr.init)
        if isinstance(node, BlockReduce):
            out = node.expr.out
            ids = loop_to_ids(out, node.index)
            node.ref = self.ref_out(out, node.index, ids)
            return node
        return None


def _all_local(ops) -> bool:
    return all(not isinstance(o, TensorRef) or o.tv.memory_type == MemoryType.Local for o in ops)


def swizzle_index(tv: TensorView, idx: Scalar) -> Scalar:
    """The element a thread accesses for logical element ``idx`` of a
    swizzled buffer: within each row of ``swizzle_bytes``, the 16-byte chunk
    index XOR the row index (mod the chunks per row) — CUTLASS's
    Swizzle<3,4,3> for 128 bytes, <2,4,3> for 64, <1,4,3> for 32."""
    if not tv.swizzle_bytes:
        return idx
    per_chunk = 16 // tv.dtype.size
    rows = tv.swizzle_bytes // 16  # chunks per row = rows in the XOR pattern
    row = (idx // (8 * per_chunk)) % rows
    return Bin("^", idx, row * per_chunk)


def lower_indexing(kernel: Kernel) -> Kernel:
    """Entry: ExprStmt/ReductionInit -> Assign with explicit indices."""
    ix = _Indexer(kernel)
    kernel.body = rewrite(kernel.body, ix.lower)
    return kernel


def box_extent(ax) -> int:
    """Extent of a Bulk (TMA box) axis: a constant, as a tensor map's box is fixed."""
    return int(ax.loop_extent.value)


def _merged_leaves(i):
    """Logical axes merged (outer to inner) into ``i``, or None if a split is in the way."""
    d = i.definition
    if d is None:
        return [i]
    if isinstance(d, Merge):
        a, b = _merged_leaves(d.outer), _merged_leaves(d.inner)
        return None if a is None or b is None else a + b
    return None
