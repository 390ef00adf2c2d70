"""Scheduling tools shared by the schedulers.

- :class:`LogicalMap`: which logical axes of different TensorViews are the same
  axis of the fusion (union-find over each expr's producer/consumer map).
- :func:`concretize_broadcasts`: give broadcast axes the extent of the concrete
  axis they meet, so loops over them can be shared with that axis.
- :func:`replay_like`: replay a reference's splits/merges/reorders on another
  TensorView (nvFuser's TransformPropagator, reduced to one reference).
- :func:`recompute_multi_use`: duplicate an intermediate for each extra consumer
  so that every consumer can inline its own copy.
"""

from __future__ import annotations

from ..ir import (
    BroadcastOp,
    CircbufError,
    Fusion,
    IterDomain,
    MemoryType,
    ParallelType,
    TensorView,
    transform_history,
)
from ..ir.iterdomain import Merge, Split, merge, split


class LogicalMap:
    """Union-find over logical IterDomains of all TensorViews of a fusion."""

    def __init__(self, fusion: Fusion):
        self.parent: dict[int, int] = {}
        self.ids: dict[int, IterDomain] = {}
        for tv in fusion.used_tvs():
            for i in tv.logical:
                self._add(i)
        for e in fusion.exprs():
            for p in e.tv_inputs():
                for a, b in e.logical_map(p):
                    self.union(a, b)

    def _add(self, i):
        self.parent.setdefault(i.id, i.id)
        self.ids[i.id] = i

    def find(self, i) -> int:
        k = i.id if isinstance(i, IterDomain) else i
        self._add(i) if isinstance(i, IterDomain) else None
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

    def same(self, a, b) -> bool:
        return self.find(a) == self.find(b)


def bind_axis_extents(fusion: Fusion, env: dict) -> None:
    """Every axis of one class (the same axis of the fusion, joined through
    broadcasts) must have one extent at run time: one kernel loops over it
    once. Symbolic extents of one class that are equal at run time are
    unified (the kernel is compiled for them being equal; every new input
    signature is checked here again). Two outputs of different extents that
    share a broadcast input (an [1, 2, 3] tensor added to both an
    [1, 4, 2, 3] and an [1, 5, 2, 3] one) break that; until fusion
    segmentation runs them as separate kernels, that is an error naming
    both axes, never a kernel sized for one of them.

    >>> # bind_axis_extents(fusion, {"i0": 4, "i3": 4})   # i3 becomes i0
    """
    from ..ir import Var, evaluate

    lmap = LogicalMap(fusion)
    seen: dict[int, tuple] = {}
    added = False
    for tv in fusion.used_tvs():
        for d, i in enumerate(tv.logical):
            ext = i.expanded_extent if i.is_broadcast else i.extent
            if ext is None:
                continue
            v = evaluate(ext, env)
            first = seen.setdefault(lmap.find(i), (v, tv, d, ext))
            if first[0] != v:
                raise CircbufError(
                    f"axis {first[2]} of {first[1].name} (extent {first[0]}) and axis {d} of {tv.name} "
                    f"(extent {v}) are one axis of the fusion, joined through a broadcast, but their "
                    "extents differ: one kernel cannot cover both (this needs fusion segmentation, "
                    "not built yet; define them in separate fusions)"
                )
            if ext != first[3] and isinstance(ext, Var) and isinstance(first[3], Var):
                fusion.extent_equalities.append((first[3], ext))
                added = True
    if added:
        canonicalize_extents(fusion)


def concretize_broadcasts(fusion: Fusion, lmap: LogicalMap):
    """Set ``expanded_extent`` on broadcast logical axes that meet a concrete one."""
    concrete: dict[int, object] = {}
    for tv in fusion.used_tvs():
        for i in tv.logical:
            if not i.is_broadcast:
                concrete.setdefault(lmap.find(i), i.extent)
            elif i.expanded_extent is not None:
                concrete.setdefault(lmap.find(i), i.expanded_extent)
    for tv in fusion.used_tvs():
        if tv.is_input:
            continue
        for i in tv.logical:
            if i.is_broadcast and i.expanded_extent is None:
                ext = concrete.get(lmap.find(i))
                if ext is not None:
                    i.expanded_extent = ext


def replay_like(ref: TensorView, tv: TensorView, lmap: LogicalMap) -> dict:
    """Apply ref's loop transforms to ``tv``; returns {ref axis id: tv axis}.

    Axes of ref that ``tv`` lacks are skipped (a merge with a missing side
    passes the other side through). tv's loop order follows ref's; tv axes
    that ref lacks go last.
    """
    by_class = {}
    for i in tv.logical:
        by_class.setdefault(lmap.find(i), i)
    m: dict[int, IterDomain] = {}
    for r in ref.logical:
        t = by_class.pop(lmap.find(r), None)
        if t is not None:
            m[r.id] = t
    for t in transform_history(ref):
        if isinstance(t, Split):
            src = m.get(t.in_.id)
            if src is None:
                continue
            o, i = split(src, t.factor, t.inner_split)
            m[t.outer.id], m[t.inner.id] = o, i
        elif isinstance(t, Merge):
            a, b = m.get(t.outer.id), m.get(t.inner.id)
            if a is not None and b is not None:
                m[t.out.id] = merge(a, b)
            elif a is not None or b is not None:
                m[t.out.id] = a if a is not None else b
    used = set()
    loop = []
    for r in ref.loop:
        t = m.get(r.id)
        if t is not None and id(t) not in used:
            used.add(id(t))
            loop.append(t)
            if r.parallel_type != ParallelType.Serial:
                t.parallel_type = r.parallel_type
    # logical axes of tv that ref has no counterpart for stay, innermost
    loop += list(by_class.values())
    tv.domain.loop = loop
    return m


def propagate(ref: TensorView, tvs, lmap: LogicalMap):
    """Replay ref's loop domain onto each tv (inputs are skipped)."""
    for tv in tvs:
        if tv is ref or tv.is_input:
            continue
        replay_like(ref, tv, lmap)


def recompute_multi_use(fusion: Fusion, keep, lmap: LogicalMap | None = None) -> None:
    """Give each extra consumer of an intermediate its own copy of it.

    ``keep(tv)`` returns True for tensors computed once and shared (inputs,
    outputs, reduction results and what is broadcast from them). Clones'
    axes join their originals' classes in ``lmap``.
    """
    changed = True
    while changed:
        changed = False
        for tv in fusion.used_tvs():
            if tv.is_input or tv.is_output or keep(tv):
                continue
            uses = [e for e in tv.uses if e in fusion.exprs()]
            if len(uses) <= 1:
                continue
            for e in uses[1:]:
                clone = _clone_tv(fusion, tv)
                if lmap is not None:
                    for a, b in zip(tv.logical, clone.logical):
                        lmap.union(b, a)  # the original keeps its class root
                e.replace_input(tv, clone)
            changed = True
            break


def _clone_tv(fusion: Fusion, tv: TensorView) -> TensorView:
    import copy

    d = tv.definition
    c = TensorView([i.clone() for i in tv.logical], tv.dtype, MemoryType.Local)
    fusion.register(c)
    nd = copy.copy(d)
    nd.outputs = [c]
    nd.inputs = list(d.inputs)
    c.definition = nd
    for i in nd.tv_inputs():
        i.uses.append(nd)
    if isinstance(d, BroadcastOp):
        nd.is_broadcast_dim = list(d.is_broadcast_dim)
    return c


_POINTWISE = ("UnaryOp", "BinaryOp", "TernaryOp", "CastOp", "LoadStoreOp", "FullOp")


def hoist_broadcasts(fusion: Fusion) -> None:
    """Rewrite ``broadcast(f(x, ...))`` as ``f(broadcast(x), ...)``.

    Pointwise ops commute with broadcast. After this pass every pointwise
    intermediate has the full rank of its consumers, so a reference's
    transforms replay onto it axis for axis and it can be inlined.
    """
    for e in list(fusion.exprs()):
        if not isinstance(e, BroadcastOp):
            continue
        src = e.inputs[0]
        d = src.definition
        if d is None or type(d).__name__ not in _POINTWISE:
            continue
        new_inputs = []
        for x in d.inputs:
            if isinstance(x, TensorView):
                b = TensorView([i.clone() for i in e.out.logical], x.dtype, MemoryType.Local)
                for i, flag in zip(b.logical, e.is_broadcast_dim):
                    if not flag:
                        i.iter_type = next(
                            j for j in [x.domain.no_reductions()[_src_pos(e, b.logical.index(i))]]
                        ).iter_type
                fusion.register(b)
                BroadcastOp(b, x, e.is_broadcast_dim)
                new_inputs.append(b)
            else:
                new_inputs.append(x)
        import copy

        nd = copy.copy(d)
        nd.inputs = new_inputs
        nd.outputs = [e.out]
        e.out.definition = nd
        for x in new_inputs:
            if isinstance(x, TensorView):
                x.uses.append(nd)
        src.uses.remove(e)
        hoist_broadcasts(fusion)  # the new broadcasts may hoist further
        return


def _src_pos(e: BroadcastOp, consumer_pos: int) -> int:
    return sum(1 for k in range(consumer_pos) if not e.is_broadcast_dim[k])


def canonicalize_extents(fusion: Fusion) -> dict:
    """Replace symbolic extents the fusion equated (``a + b`` on tensors with
    extents i0 and i2) by one representative, so their loops compare equal;
    an extent equated with a constant (``broadcast_in_dim(w, [3, 4], [1])``
    next to ``x[i0, i1]``) becomes that constant, as nvFuser concretizes it.
    Returns {name: representative}. The runtime checks the equalities."""
    from ..ir import Const, Var

    parent: dict[str, str] = {}
    value: dict[str, Const] = {}

    def find(n):
        while parent.get(n, n) != n:
            n = parent[n]
        return n

    def key(n):
        return int(n[1:]) if n[1:].isdigit() else 1 << 30

    for a, b in fusion.extent_equalities:
        if isinstance(a, Var) and isinstance(b, Var):
            ra, rb = find(a.name), find(b.name)
            if ra != rb:
                lo, hi = sorted((ra, rb), key=key)
                parent[hi] = lo
                if hi in value:
                    _bind_const(value, lo, value.pop(hi), a, b)
        elif isinstance(a, Var) != isinstance(b, Var):
            v, c = (a, b) if isinstance(a, Var) else (b, a)
            if isinstance(c, Const):
                parent.setdefault(v.name, v.name)
                _bind_const(value, find(v.name), c, a, b)
    if not parent:
        return {}
    reps = {v.name: v for v in fusion.extent_vars}
    mapping = {}
    for n in parent:
        r = find(n)
        mapping[n] = value.get(r, reps.get(r))
    mapping = {n: m for n, m in mapping.items() if m is not None and not (isinstance(m, Var) and m.name == n)}
    _substitute_extents(fusion, mapping)
    return {n: str(m) for n, m in mapping.items()}


def _bind_const(value: dict, root: str, c, a, b):
    old = value.get(root)
    if old is not None and old.value != c.value:
        raise CircbufError(f"extents {a} and {b} must be equal, but they are bound to {old} and {c}")
    value[root] = c


def propagate_transforms(fusion: Fusion, ref: TensorView) -> None:
    """Give every non-input tensor ``ref``'s splits, merges, order and parallel
    types (for manual schedules).

    >>> # out.split(0, 128); out.axis(0).parallelize(ParallelType.BIDx)
    >>> # propagate_transforms(fd.fusion, out)
    """
    lmap = LogicalMap(fusion)
    concretize_broadcasts(fusion, lmap)
    propagate(ref, fusion.used_tvs(), lmap)


def specialize_extent(fusion: Fusion, name: str, value: int) -> None:
    """Compile for one value of a symbolic extent (a register-resident row needs
    a constant length). The runtime keys compiled kernels by params, which
    carry the value, and launch plans by exact shapes."""
    from ..ir import Const

    mapping = {name: Const(value)}
    _substitute_extents(fusion, mapping)


def _substitute_extents(fusion: Fusion, mapping: dict) -> None:
    """Replace extent Vars (by name) in every axis and scalar operand."""
    from ..ir.scalar import substitute

    for tv in fusion.tvs:
        for i in tv.logical:
            i.extent = substitute(i.extent, mapping)
            if i.expanded_extent is not None:
                i.expanded_extent = substitute(i.expanded_extent, mapping)
    for e in fusion.exprs():
        e.inputs = [substitute(x, mapping) if not isinstance(x, TensorView) else x for x in e.inputs]
    defs = fusion.extent_definitions
    for name in defs:
        defs[name] = substitute(defs[name], mapping)


def cache_output(fusion: Fusion, o: TensorView) -> TensorView:
    """Compute output ``o`` into a register cache that its other consumers read
    too (reading it back from global memory would race with its store)."""
    others = [e for e in o.uses if e in fusion.exprs()]
    c = o.cache_before()
    for e in others:
        e.replace_input(o, c)
    return c


def inline_intermediates(fusion: Fusion, row_pos: int | None = None, row_scalar=None) -> None:
    """Every intermediate goes to registers, fully inlined into its consumer;
    with ``row_pos``, reduction results and what ``row_scalar`` says is
    computed once per row are inlined only down to the row loops."""
    from ..ir import ReductionOp

    for tv in fusion.used_tvs():
        if tv.is_input or tv.is_output:
            continue
        tv.memory_type = MemoryType.Local
        per_row = row_pos is not None and (isinstance(tv.definition, ReductionOp) or row_scalar(tv))
        tv.inline_at(min(row_pos, len(tv.loop)) if per_row else len(tv.loop))


def full_shape_inputs(fusion: Fusion, ref: TensorView) -> list[int]:
    """Positions of the inputs with the reduced input's full shape (no
    broadcast axes) that something reads: these are staged by TMA."""
    out = []
    for k, x in enumerate(fusion.inputs):
        if getattr(x, "ndim", None) == len(ref.logical) and not any(i.is_broadcast for i in x.logical):
            if fusion.consumers(x):
                out.append(k)
    return out


def once_per_row(lmap: LogicalMap, reduction: TensorView):
    """``tv -> bool``: True for tensors without a reduced axis (computed once
    per row/column of the reduction, not per element)."""
    rclasses = frozenset(lmap.find(i) for i in reduction.logical if i.is_reduction)
    return lambda tv: not any(lmap.find(i) in rclasses and not i.is_broadcast for i in tv.logical)


def tma_describable(t, split: int) -> str | None:
    """None when a 2-D tensor map can describe input ``t`` with its axes
    [0, split) flattened into the outer map dim and [split, ndim) into the
    inner one, else the cuTensorMapEncodeTiled rule it breaks, named."""
    if t is None:
        return "not a tensor"
    if t.align % 16:
        return "global address not 16-byte aligned"
    if t.sizes[-1] > 1 and t.strides[-1] != 1:
        return "innermost axis not contiguous"
    for d in range(len(t.sizes) - 1):
        if d != split - 1 and t.sizes[d] > 1 and t.strides[d] != t.strides[d + 1] * t.sizes[d + 1]:
            return f"axes {d} and {d + 1} do not flatten"
    if split == 0:
        return None
    outer_stride = t.strides[split - 1] * t.itemsize  # a map stride even when that axis has size 1
    if outer_stride % 16:
        return f"row stride {outer_stride} bytes not a multiple of 16"
    if outer_stride >= 1 << 40:
        return "stride >= 2^40 bytes"
    return None


def ring_kind(params):
    """The circular-buffer type the params ask for (``warp_specialized``, ``war``)."""
    from ..ir import Pipelined, WarpSpecialized

    return WarpSpecialized(on=ParallelType.TIDy) if params.warp_specialized else Pipelined(war=params.war)


def tma_ring(xs: TensorView, tile, grid_axis: int, params) -> None:
    """Make ``xs`` (a ``cache_after(op="tma")`` buffer) a circular buffer in
    shared memory: ``tile(xs)`` shapes its loop from the logical axes so that
    the first two axes are the grid axis (``grid_axis``, bound to blockIdx.x)
    and the ring loop, and the last two are the box one TMA copy moves.

    >>> # tma_ring(xs, lambda t: _tiles(t, params), 1, params)
    """
    xs.memory_type = MemoryType.Shared
    xs.domain.loop = list(xs.logical)
    tile(xs)
    xs.axis(grid_axis).parallelize(ParallelType.BIDx)
    xs.axis(-2).parallelize(ParallelType.Bulk)
    xs.axis(-1).parallelize(ParallelType.Bulk)
    xs.inline_at(2)
    xs.circular_buffer(params.stages, params.prefetch, ring_kind(params))
