"""Scheduling tools shared by the schedulers.

- :class:`LogicalMap`: which logical axes of different TensorViews are the same
  axis of the fusion (union-find over each expr's producer/consumer map).
- :func:`concretize_broadcasts`: give broadcast axes the extent of the concrete
  axis they meet, so loops over them can be shared with that axis.
- :func:`replay_like`: replay a reference's splits/merges/reorders on another
  TensorView (nvFuser's TransformPropagator, reduced to one reference).
- :func:`recompute_multi_use`: duplicate an intermediate for each extra consumer
  so that every consumer can inline its own copy.
- :func:`untangle_inlining`: lower inline positions that tie loops into a
  cycle (run after every scheduler, by :func:`.registry.apply`).
"""

from __future__ import annotations

from ..ir import (
    ELEMENTWISE,
    BroadcastOp,
    CircbufError,
    Const,
    ExpandOp,
    FullOp,
    Fusion,
    IterDomain,
    LinearOp,
    MatmulOp,
    MemoryType,
    ParallelType,
    PermuteOp,
    ReshapeOp,
    SqueezeOp,
    TensorView,
    broadcast_ids,
    transform_history,
)
from ..ir.iterdomain import Merge, Split, exact_merge, exact_split, merge, split
from ..ir.scalar import is_const


class LogicalMap:
    """Union-find over logical IterDomains of all TensorViews of a fusion.

    A reshape's producer axes map to its output's root axes; ``views`` holds
    the exact splits and merges from those root axes to the output's logical
    ones, which relate classes to each other (:meth:`derivable`).
    """

    def __init__(self, fusion: Fusion):
        self.parent: dict[int, int] = {}
        self.ids: dict[int, IterDomain] = {}
        self.views: list = []
        for tv in fusion.used_tvs():
            for i in tv.logical:
                self._add(i)
            self.views += tv.domain.view_transforms()
        for e in fusion.exprs():
            for p in e.tv_inputs():
                for a, b in e.logical_map(p):
                    self.union(a, b)
        # a recomputed copy's axes are its original's, even where nothing else
        # joins them (a copied broadcast's new axes, met only by the copy's consumer)
        for tv in fusion.used_tvs():
            src = tv.recomputes
            if src is not None:
                for a, b in zip(src.logical + src.domain.root, tv.logical + tv.domain.root):
                    self.union(b, a)
            for a, b in tv.joined_axes:  # a merged broadcast's link to its inner one's axes
                self.union(b, a)

    def view_classes(self):
        """(input classes, output classes) of every view split and merge."""
        return [([self.find(x) for x in t.inputs], [self.find(x) for x in t.outputs]) for t in self.views]

    def derivable(self, classes) -> set:
        """Classes that splits and merges of views make from ``classes``
        (a tensor with axes of these classes can be given axes of those)."""
        have = set(classes)
        changed = True
        while changed:
            changed = False
            for ins, outs in self.view_classes():
                for a, b in ((ins, outs), (outs, ins)):
                    if set(a) <= have and not set(b) <= have:
                        have |= set(b)
                        changed = True
        return have

    def view_component(self):
        """``class -> component``: classes a view splits or merges into one
        another share a component."""
        uf: dict = {}

        def find(c):
            while uf.get(c, c) != c:
                c = uf[c]
            return c

        for ins, outs in self.view_classes():
            cs = [find(c) for c in ins + outs]
            for c in cs[1:]:
                if c != cs[0]:
                    uf[c] = cs[0]
        return find

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


class AxisExtentsDiffer(CircbufError):
    """One axis class with two extents at run time, or an output with
    elements whose broadcast axis is in a class of extent 0 (the compile
    driver segments the fusion at the broadcast joining them)."""


def bind_axis_extents(fusion: Fusion, env: dict) -> None:
    """Every axis of one class (the same axis of the fusion, joined through
    broadcasts) must have one extent at run time: one kernel loops over it
    once. Symbolic extents of one class that are equal at run time are
    unified (the kernel is compiled for them being equal; every new input
    signature is checked here again). Two outputs of different extents that
    share a broadcast input (an [1, 2, 3] tensor added to both an
    [1, 4, 2, 3] and an [1, 5, 2, 3] one) break that: an error naming
    both axes, never a kernel sized for one of them (segmentation splits a
    fusion by its structure, before sizes are known).

    >>> # bind_axis_extents(fusion, {"i0": 4, "i3": 4})   # i3 becomes i0
    """
    from ..ir import Var, evaluate

    lmap = LogicalMap(fusion)
    seen: dict[int, tuple] = {}
    added = False
    for tv in fusion.used_tvs():
        for d, i in enumerate(tv.logical):
            ext = i.concrete_extent
            if ext is None:
                continue
            v = evaluate(ext, env)
            first = seen.setdefault(lmap.find(i), (v, tv, d, ext))
            if first[0] != v:
                raise AxisExtentsDiffer(
                    f"axis {first[2]} of {first[1].name} (extent {first[0]}) and axis {d} of {tv.name} "
                    f"(extent {v}) are one axis of the fusion, joined through a broadcast, but their "
                    "extents differ: one kernel cannot cover both (define them in separate fusions)"
                )
            # a size the fusion fixes (a broadcast_in_dim to [2, 5, 4]) names the
            # class as well as an input's extent does: loops over the class
            # must all read one extent
            pair = (first[3], ext)
            if (
                ext != first[3]
                and any(isinstance(x, Var) for x in pair)
                and all(isinstance(x, (Var, Const)) for x in pair)
            ):
                fusion.extent_equalities.append(pair)
                added = True
    why = unwritten_output(fusion, env, lmap)
    if why:
        raise AxisExtentsDiffer(f"{why}: one kernel cannot write it")
    if added:
        canonicalize_extents(fusion)


def unwritten_output(fusion: Fusion, env: dict, lmap: LogicalMap | None = None) -> str | None:
    """Why one kernel of ``fusion`` would leave an output unwritten for the
    sizes in ``env``, or None: an output with elements whose broadcast axis
    is one axis of the fusion with an axis of extent 0 (``neg(x[13, 1])``
    beside ``mul(y[13, 0], x)``). A kernel's loops over that axis run no
    iteration, so the output's element along it is never stored. nvFuser
    concretizes such extents to 0 and removes the empty tensors' math; here
    the segmenter gives the output a kernel without the empty axis. Extents
    ``env`` does not give are taken to be nonzero.

    >>> # unwritten_output(fusion, {"i0": 13, "i1": 0})  # -> "output T11 (shape [13, 1]) ..."
    """
    from ..ir import evaluate

    lmap = lmap or LogicalMap(fusion)

    def value(ext):
        try:
            return evaluate(ext, env)
        except KeyError:  # a size these inputs do not fix
            return None

    empty: dict[int, tuple] = {}
    for tv in fusion.used_tvs():
        for d, i in enumerate(tv.logical):
            ext = i.concrete_extent
            if ext is not None and lmap.find(i) not in empty and value(ext) == 0:
                empty[lmap.find(i)] = (tv, d)
    if not empty:
        return None
    for o in fusion.outputs:
        ids = o.domain.no_reductions()
        shape = [value(i.loop_extent) for i in ids]
        if 0 in shape:
            continue
        for d, i in enumerate(ids):
            if i.is_broadcast and lmap.find(i) in empty:
                tv, a = empty[lmap.find(i)]
                return (
                    f"output {o.name} (shape {shape}) has elements, but its broadcast axis {d} is one axis "
                    f"of the fusion with axis {a} of {tv.name}, of extent 0: a loop over it writes nothing"
                )
    return None


def concretize_broadcasts(fusion: Fusion, lmap: LogicalMap):
    """Set ``expanded_extent`` on broadcast logical axes that meet a concrete one."""
    concrete: dict[int, object] = {}
    for tv in fusion.used_tvs():
        for i in tv.logical:
            if i.concrete_extent is not None:
                concrete.setdefault(lmap.find(i), i.concrete_extent)
    for tv in fusion.used_tvs():
        if tv.is_input:
            continue
        for i in tv.logical:
            if i.is_broadcast and i.expanded_extent is None:
                ext = concrete.get(lmap.find(i))
                if ext is not None:
                    i.expanded_extent = ext


class _Derive:
    """Axes of one tensor for the classes of another, through views.

    ``tv`` has axes of some classes; a view's exact split or merge relates
    classes (``lmap.views``). :meth:`get` returns tv's axis of a class, making
    it when needed by replaying a view's transform forward (split/merge tv's
    axes like the reshape did) or backward (undo it: merge what it split,
    split what it merged). Axes used up by a transform are no longer
    available; :meth:`rest` lists those left.

    Upstream of ``x[6, 4] -> reshape [24]``, a reference with axis {24}
    gets ``merge(x6, x4)``; downstream of ``s[6] -> reshape [2, 3]``, a
    reference with axis {6} gets ``merge(a2, b3)`` of the reshaped tensor.
    """

    def __init__(self, lmap: LogicalMap, axes):
        self.lmap = lmap
        self.have: dict = {}
        self.extra: list = []  # axes of a class already held (x + x.T): kept, innermost
        for i in axes:
            c = lmap.find(i)
            if c in self.have:
                self.extra.append(i)
            else:
                self.have[c] = i
        self.views = [(t, ins, outs) for t, (ins, outs) in zip(lmap.views, lmap.view_classes())]

    def _can(self, c, seen) -> bool:
        if c in self.have:
            return True
        if c in seen:
            return False
        seen = seen | {c}
        for _, ins, outs in self.views:
            for src, dst in ((ins, outs), (outs, ins)):
                if c in dst and all(self._can(x, seen) for x in src):
                    return True
        return False

    def get(self, c, seen=frozenset()):
        if c in self.have:
            return self.have.pop(c)
        if c in seen or not self._can(c, seen):
            return None
        seen = seen | {c}
        for t, ins, outs in self.views:
            for forward, src, dst in ((True, ins, outs), (False, outs, ins)):
                if c in dst and all(self._can(x, seen) for x in src):
                    made = _replay_view(t, [self.get(x, seen) for x in src], forward)
                    for k, a in zip(dst, made):
                        self.have[k] = a
                    return self.have.pop(c)
        return None

    def rest(self) -> list:
        return list(self.have.values()) + self.extra


def _replay_view(t, axes, forward: bool) -> list:
    """Apply view transform ``t`` (forward) or its inverse to ``axes`` (t's
    inputs, resp. outputs); returns the new axes (t's outputs, resp. inputs)."""
    if isinstance(t, Split) == forward:  # a split, or undoing a merge: into t.outer x t.inner
        made = list(exact_split(axes[0], t.outer.extent, t.inner.extent))
    else:
        whole = t.out if forward else t.in_  # a merge, or undoing a split
        made = [exact_merge(axes[0], axes[1], whole.extent)]
    # a broadcast axis given the view's pieces stays a broadcast as split()
    # and merge() make one: extent 1, the pieces' extents as its expanded
    # ones where it had one (else a later split gives its loops one trip
    # where the concrete axes it is inlined with have many)
    expanded = any(a.expanded_extent is not None for a in axes)
    for a in made:
        if a.is_broadcast:
            a.extent, a.expanded_extent = Const(1), (a.extent if expanded else None)
    return made


def replay_like(ref: TensorView, tv: TensorView, lmap: LogicalMap) -> dict:
    """Apply ref's loop transforms to ``tv``; returns {ref axis id: tv axis}.

    Axes of ref that ``tv`` lacks are skipped (a merge with a missing side
    passes the other side through). tv's loop order follows ref's; tv axes
    that ref lacks go last. Across a reshape, tv's axes are first split and
    merged into ref's (see :class:`_Derive`).
    """
    derive = _Derive(lmap, tv.logical)
    m: dict[int, IterDomain] = {}
    for r in ref.logical:
        t = derive.get(lmap.find(r))
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
    loop += [a for a in derive.rest() if id(a) not in used]
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
                    for a, b in zip(tv.logical + tv.domain.root, clone.logical + clone.domain.root):
                        lmap.union(b, a)  # the original keeps its class root
                e.replace_input(tv, clone)
            changed = True
            break


def _clone_tv(fusion: Fusion, tv: TensorView) -> TensorView:
    import copy

    d = tv.definition
    c = TensorView([i.clone() for i in tv.logical], tv.dtype, MemoryType.Local)
    if tv.domain.has_root:  # a reshape's output: its root axes and transforms too
        c.domain = tv.domain.clone()
    fusion.register(c)
    c.recomputes = tv.recomputes or tv
    nd = copy.copy(d)
    nd.outputs = [c]
    nd.inputs = list(d.inputs)
    c.definition = nd
    for i in nd.tv_inputs():
        i.uses.append(nd)
    if isinstance(d, BroadcastOp):
        nd.is_broadcast_dim = list(d.is_broadcast_dim)
    return c


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
        if type(d) is BroadcastOp and type(e) is BroadcastOp:  # broadcast(broadcast(x)): one broadcast
            inner = iter(d.is_broadcast_dim)
            flags = [f or next(inner) for f in e.is_broadcast_dim]
            # the inner broadcast's new axes are still src's: src may have other
            # readers (a hoisted copy of an elementwise chain sits beside the
            # original), whose loops over those axes are this tensor's loops
            e.out.joined_axes += e.logical_map(src)
            src.uses.remove(e)
            BroadcastOp(e.out, d.inputs[0], flags)
            hoist_broadcasts(fusion)
            return
        view = isinstance(d, (PermuteOp, ExpandOp, SqueezeOp)) or (isinstance(d, ReshapeOp) and d.concrete)
        if view and any(e.is_broadcast_dim):
            _hoist_through_view(fusion, e, d)
            hoist_broadcasts(fusion)
            return
        if not isinstance(d, (*ELEMENTWISE, FullOp)):  # a fill is made at any rank
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


def _hoist_through_view(fusion: Fusion, e: BroadcastOp, d) -> None:
    """``broadcast(view(x))`` -> ``view'(broadcast(x))``: the new axes are
    appended to x and pass through the view as themselves, so the view's
    output is computed at the full rank of its consumers."""
    from ..ir.view import build

    x, out = d.inputs[0], e.out
    xs = x.domain.no_reductions()
    new_pos = [k for k, f in enumerate(e.is_broadcast_dim) if f]
    if isinstance(d, ExpandOp):  # positional: broadcast x at e's positions
        flags = list(e.is_broadcast_dim)
    elif isinstance(d, SqueezeOp):  # the new axes where e puts them, squeezed axes kept in between
        flags, squeezed, xi = [], [], 0
        for f in e.is_broadcast_dim + [False]:
            while xi < len(xs) and xi in d.dims:
                squeezed.append(len(flags))
                flags.append(False)
                xi += 1
            if f:
                flags.append(True)
            elif xi < len(xs):
                flags.append(False)
                xi += 1
    else:
        flags = [False] * len(xs) + [True] * len(new_pos)
    bx = fusion.register(TensorView(broadcast_ids(xs, flags), x.dtype, MemoryType.Local))
    BroadcastOp(bx, x, flags)
    src_pos = [k for k, f in enumerate(e.is_broadcast_dim) if not f]  # e.out position of src axis s
    e.inputs[0].uses.remove(e)  # d stays, for src's other consumers
    if isinstance(d, ExpandOp):
        ExpandOp(out, bx)
    elif isinstance(d, SqueezeOp):
        SqueezeOp(out, bx, squeezed)
    elif isinstance(d, PermuteOp):
        dims = [0] * len(out.logical)
        for s, k in enumerate(src_pos):
            dims[k] = d.dims[s]
        for j, k in enumerate(new_pos):
            dims[k] = len(xs) + j
        PermuteOp(out, bx, dims)
    else:
        op = ReshapeOp(out, bx)
        build(op, [(gi, tuple(src_pos[b] for b in go)) for gi, go in d.groups])


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
        # an input's extent names the class, before a computed size or a scalar input
        rank = 0 if n.startswith("i") and n not in fusion.derived_extents else 1
        return (rank, int(n[1:]) if n[1:].isdigit() else 1 << 30)

    for a, b in fusion.extent_equalities:
        if isinstance(a, Var) and isinstance(b, Var):
            # both names are keys of ``parent``: a representative that later
            # receives a constant (i1 == i3, then i3 == 130) is mapped too
            parent.setdefault(a.name, a.name)
            parent.setdefault(b.name, b.name)
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


def resolve_derived_extents(fusion: Fusion) -> None:
    """Replace the names of computed sizes (a reshape's ``-1``) that were not
    unified with an input's extent by their expressions, which the kernel
    computes from its arguments."""
    from ..ir.scalar import substitute

    names = set(fusion.derived_extents)
    mapping = {}
    for n, e in fusion.derived_extents.items():
        for _ in range(len(names) + 1):  # a size computed from another computed size
            e2 = substitute(e, {k: fusion.derived_extents[k] for k in names})
            if e2 == e:
                break
            e = e2
        mapping[n] = e
    if mapping:
        _substitute_extents(fusion, mapping)


def prepare(fusion: Fusion, env: dict) -> tuple:
    """Make ``fusion`` (a copy being compiled) concrete for the sizes in
    ``env``: unify equal extents, concretize reshapes, bind each axis class to
    one extent. Returns what a kernel compiled from it is specialized for
    beyond its params: the groups of every reshape.

    >>> # sig = prepare(copy, info.extents); params = compute_params(copy, info, overrides)
    """
    from ..ir import concretize_reshapes

    canonicalize_extents(fusion)
    sig = concretize_reshapes(fusion, env)
    canonicalize_extents(fusion)
    resolve_derived_extents(fusion)
    bind_axis_extents(fusion, env)
    return sig


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
        for i in {id(a): a for a in tv.logical + tv.domain.view_ids()}.values():
            i.extent = substitute(i.extent, mapping)
            if i.expanded_extent is not None:
                i.expanded_extent = substitute(i.expanded_extent, mapping)
    for e in fusion.exprs():
        e.inputs = [substitute(x, mapping) if not isinstance(x, TensorView) else x for x in e.inputs]
    for name, e in fusion.derived_extents.items():
        fusion.derived_extents[name] = substitute(e, mapping)


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
        pos = min(row_pos, len(tv.loop)) if per_row else len(tv.loop)
        # axes a consumer lacks (a broadcast a reshape drops) are one element wide
        # and innermost: inline down to the consumers' loops, not past them
        limit = min((len(c.loop) for c in fusion.consumers(tv)), default=pos)
        while pos > limit and (tv.loop[pos - 1].is_broadcast or is_const(tv.loop[pos - 1].loop_extent, 1)):
            pos -= 1
        tv.inline_at(pos)


def untangle_inlining(fusion: Fusion) -> None:
    """Lower inline positions that no one loop nest can honor.

    Inlining ``p`` at a position past ``k`` makes axis ``k`` of ``p`` and of
    every consumer of ``p`` one loop. When a tensor between two of those
    consumers (computed from one, read by the other) has a loop of its own at
    that level, no order of the two loops computes each tensor before it is
    read: ``a = neg(x)`` inlined into both ``b = exp(a)`` and ``d = mul(a,
    c)``, where ``c = sin(b)`` is a pointwise output's register cache computed
    whole before it is stored (inlined at the thread position), would need the
    element loop of ``b`` and ``d`` both before and after that of ``c``.
    Level by level, outermost first, such a ``p`` with several consumers is
    inlined at ``k`` instead: its consumers keep loops of their own there and
    it is a register array over its inner axes, computed before them::

        FOR v            # p, b, d: one loop       FOR v: p = neg(x)
          p = neg(x)                                FOR v: b = exp(p)
          b = exp(p)     # c's loop must come       FOR v: c = sin(b)
          d = mul(p, c)  # between b and d          FOR v: d = mul(p, c)

    Only a tensor with several consumers can tie loops into a cycle (a chain
    of single consumers inlined into one another is a tree whose loop ends at
    its last tensor); each step lowers one that breaks a cycle.
    """
    tvs = [t for t in fusion.used_tvs() if not t.is_input and t.definition is not None]
    edges = [(p, e.out) for e in fusion.exprs() for p in e.tv_inputs() if not p.is_input]
    consumers = {id(t): {id(c) for p, c in edges if p is t} for t in tvs}
    depth = max((len(t.loop) for t in tvs), default=0)
    for k in range(depth):
        while True:
            cyclic = _cyclic_loop_classes(tvs, edges, k)
            if not cyclic:
                break
            tied = [t for t in tvs if id(t) in cyclic and t.compute_at_pos > k and len(consumers[id(t)]) > 1]
            assert tied, f"a cycle of loops at level {k} with no tensor of several consumers inlined past it"
            n = len(cyclic)
            pick = None
            for t in reversed(tied):  # the last one first: the cycle is downstream of the rest
                pos, t.compute_at_pos = t.compute_at_pos, k
                breaks = len(_cyclic_loop_classes(tvs, edges, k)) < n
                t.compute_at_pos = pos
                if breaks:
                    pick = t
                    break
            for t in [pick] if pick is not None else tied:
                t.inline_at(k)


def _cyclic_loop_classes(tvs, edges, k: int) -> set:
    """``id(tv)`` of each tensor whose loop at level ``k`` (the loop class its
    axis ``k`` joins by inlining) lies on a cycle of loops, each computing a
    tensor the next one reads."""
    parent = {id(t): id(t) for t in tvs}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for p, c in edges:
        if p.compute_at_pos > k:
            parent[find(id(p))] = find(id(c))
    succ: dict = {}
    for p, c in edges:
        a, b = find(id(p)), find(id(c))
        if a != b:
            succ.setdefault(a, set()).add(b)
    # Tarjan's strongly connected components, iteratively
    index, low, on, stack, comp = {}, {}, set(), [], {}
    counter = 0
    for root in {find(id(t)) for t in tvs}:
        if root in index:
            continue
        work = [(root, iter(succ.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                for w in scc:
                    comp[w] = len(scc) > 1
    return {id(t) for t in tvs if comp[find(id(t))]}


def aligned(lmap: LogicalMap, x: TensorView, ref: TensorView, broadcast: bool = False) -> bool:
    """True when ``x``'s axes are ``ref``'s logical axes, in order, none
    broadcast: no view, permute or broadcast between them, so a tile of ref
    is a tile of x (what TMA boxes and vector loads of x assume). With
    ``broadcast``, axes of x may be broadcast ones of ref's classes (an
    output written along ref's loop: :func:`output_vectorizable` then looks
    at the axis it is stored along)."""
    if len(x.logical) != len(ref.logical) or (not broadcast and any(i.is_broadcast for i in x.logical)):
        return False
    cls = [lmap.find(i) for i in x.logical]
    return len(set(cls)) == len(cls) and all(c == lmap.find(r) for c, r in zip(cls, ref.logical))


def full_shape_inputs(fusion: Fusion, ref: TensorView, lmap: LogicalMap) -> list[int]:
    """Positions of the inputs with the reduced input's full shape, in its
    axis order (see :func:`aligned`), that something reads: these are staged by TMA.
    ``lmap`` is a LogicalMap of ``fusion`` as it is now."""
    out = []
    for k, x in enumerate(fusion.inputs):
        if isinstance(x, TensorView) and aligned(lmap, x, ref) and fusion.consumers(x):
            out.append(k)
    return out


def once_per_row(lmap: LogicalMap, reduction: TensorView):
    """``tv -> bool``: True for tensors without a reduced axis (computed once
    per row/column of the reduction, not per element). Through a reshape,
    an axis split from or merged with a reduced one counts as reduced."""
    comp = lmap.view_component()
    rclasses = frozenset(comp(lmap.find(i)) for i in reduction.logical if i.is_reduction)
    return lambda tv: not any(comp(lmap.find(i)) in rclasses and not i.is_broadcast for i in tv.logical)


def required_ones(fusion: Fusion) -> set:
    """Names of the extents the fusion requires to be 1 (a squeezed symbolic
    axis, an input axis a reshape squeezes): one element, no loop. Compiling
    makes them the constant 1; a segmenter's verdict, before that, asks here."""
    eq = getattr(fusion, "extent_equalities", ())
    return {str(a) for a, b in eq if is_const(b, 1)} | {str(b) for a, b in eq if is_const(a, 1)}


def unmapped_axis(fusion: Fusion, refs, lmap: LogicalMap | None = None) -> str | None:
    """Why ``refs`` cannot drive the loops of every tensor of ``fusion``, or
    None: an axis of some tensor (not a plain broadcast, not of size 1) that
    is none of the refs' axes nor split or merged from them by a view
    (nvFuser's reference check). Transform propagation would leave such a
    tensor unscheduled: serial loops over all of it that every thread of
    every CTA runs, which recomputes its elements on each CTA and, for an
    output written in place, reads elements another CTA already wrote. The
    segmenter gives such a part (an independent output, say) its own kernel."""
    lmap = lmap if lmap is not None else LogicalMap(fusion)
    classes = lmap.derivable({lmap.find(i) for r in refs for i in r.logical})
    # a reshape to sizes only the inputs give has no splits and merges yet
    # (prepare() makes them): its axes relate to all of its input's
    pending = [e for e in fusion.exprs() if isinstance(e, ReshapeOp) and not e.concrete]
    grown = True
    while grown:
        grown = False
        for e in pending:
            both = {lmap.find(i) for t in (e.inputs[0], e.out) for i in t.logical}
            if both & classes and not both <= classes:
                classes = lmap.derivable(classes | both)
                grown = True
    names = " and ".join(r.name for r in refs)
    ones = required_ones(fusion)
    for tv in fusion.used_tvs():
        for d, i in enumerate(tv.logical):
            if is_const(i.loop_extent, 1) or (i.is_broadcast and i.concrete_extent is None):
                continue
            if str(i.extent) in ones:
                continue
            if lmap.find(i) not in classes:
                return (
                    f"axis {d} of {tv.name} is no axis of {names}, whose loops the kernel runs "
                    "(an independent part of the fusion: a kernel of its own)"
                )
    return None


def view_self_mapping(fusion: Fusion, lmap: LogicalMap | None = None, empty: bool = False) -> str | None:
    """Why one loop nest cannot walk every tensor of ``fusion``, or None: a
    tensor that holds one axis of the fusion twice (nvFuser's self mapping).

    - Through a view: an axis and, beside it, the pieces a view splits that
      axis into (or the axes a view merges into it): ``add(reshape(x, [2, 64,
      1, 1]), neg(x))`` of an x[128, 1] is [2, 64, 128, 1], x's axis 0 both
      its axis 2 and, through the reshape, its axes 0 and 1. A reference's
      splits and merges, replayed onto x, would need x's one axis for both.
    - Through a broadcast: an axis and a broadcast axis that the fusion
      expands to that axis elsewhere. ``x[n]`` broadcast to ``t[n, 1]``,
      summed over axis 0 and added to x: t's axis 1 meets x's axis 0 in the
      add, so t holds x's axis once reduced and once as its broadcast (the
      sum is computed for every element of x); 931:108 makes one with a
      reshape's new size-1 axis beside the axis a var reduces. The reference
      has the axis twice, every other tensor once.

    The segmenter computes the two in different kernels (the view, or the
    reduction, in one; the kernel that combines them reads its output).
    Tensors with no element (an extent 0) are walked by no loop: the
    pointwise kernel leaves their loops empty and runs; ``empty=True`` (the
    reduction kernels, whose row and reduced loops a view of such a tensor
    tangles: ``reshape(x[0, 1, 2], [0])`` beside ``sum(x, [1, 2])`` makes
    the row axis from itself and the reduced ones) checks them too. (A
    reshape to sizes only the inputs give has no splits and merges until it
    is concretized for sizes: the segmenter does that for the first call's.)"""
    lmap = lmap if lmap is not None else LogicalMap(fusion)
    tvs = fusion.used_tvs()
    # classes some axis gives an extent other than 1: a plain broadcast of
    # one is given that extent (concretize_broadcasts) and walked
    big = set()
    for tv in tvs:
        for i in tv.logical:
            e = i.concrete_extent
            if e is not None and not is_const(e, 1):
                big.add(lmap.find(i))
    walked = []  # per tensor with elements: (tensor, [(position, class, plain broadcast)])
    for tv in tvs:
        if not empty and any(is_const(i.loop_extent, 0) for i in tv.logical):
            continue  # no element, no loop walks it (x[n, 0] beside reshape(x, [0]): 0 * n is 0)
        axes = []
        for d, i in enumerate(tv.logical):
            c = lmap.find(i)
            plain = i.is_broadcast and i.concrete_extent is None
            if (plain and c in big) or not (plain or is_const(i.loop_extent, 1)):
                axes.append((d, c, plain))
        walked.append((tv, axes))
    if lmap.views:
        for tv, axes in walked:
            classes = {c for _, c, _ in axes}
            for d, c, _ in axes:
                if c in lmap.derivable(classes - {c}):
                    return (
                        f"axis {d} of {tv.name} is also made, through a view, from its other axes: a tensor "
                        "is combined with a view of itself (reshape(x) + x); one kernel cannot walk both"
                    )
    for tv, axes in walked:
        seen: dict = {}
        for d, c, plain in axes:
            first = seen.setdefault(c, (d, plain))
            if first[0] != d and (plain or first[1]):
                b, a = (d, first[0]) if plain else (first[0], d)
                return (
                    f"axis {b} of {tv.name} is a broadcast the fusion expands to its axis {a} elsewhere: "
                    f"{tv.name} holds one axis of the fusion twice (a tensor combined with a broadcast of "
                    "itself); one kernel cannot walk both"
                )
    return None


def contractions(fusion: Fusion) -> list:
    """The fusion's matmul and linear exprs (the matmul scheduler's; the
    others refuse a fusion with one)."""
    return [e for e in fusion.exprs() if isinstance(e, (MatmulOp, LinearOp))]


def check_distinct_axes(fusion: Fusion) -> None:
    """Refuse, by name, a tensor two of whose axes are one axis of the fusion
    (``x + permute(x, [1, 0])``): one loop nest cannot walk both in step."""
    lmap = LogicalMap(fusion)
    for tv in fusion.used_tvs():
        seen: dict = {}
        for d, i in enumerate(tv.logical):
            if i.is_broadcast or is_const(i.extent, 1):
                continue
            c = lmap.find(i)
            if c in seen:
                raise CircbufError(
                    f"axes {seen[c]} and {d} of {tv.name} are one axis of the fusion: a tensor is "
                    "combined with a permutation of itself (x + x.T); one kernel cannot walk both "
                    "(a transpose scheduler would); compute the permuted copy in another fusion"
                )
            seen[c] = d


def check_aliases(fusion: Fusion) -> None:
    """Refuse, by name, in-place outputs (``add_output(alias_input=x)``) a
    kernel could get wrong: one reads x[e] only while computing element e
    of the output when x's axes are the output's (same classes, in order)
    and everything computed from x is elementwise (no reduction, broadcast
    or view of it: those read x[e] for other elements, maybe after another
    thread wrote it). Then each element of x is read before it is written,
    by the thread that writes it, in every scheduler."""
    if not fusion.aliases:
        return
    lmap = LogicalMap(fusion)
    live = {id(e) for e in fusion.exprs()}
    for k, j in fusion.aliases.items():
        out, x = fusion.outputs[k], fusion.inputs[j]
        what = f"{out.name} written in place into {x.name}"
        if not any(id(e) in live for e in x.uses):
            continue  # x only receives the output (an earlier segment read it): nothing to race
        cls = [lmap.find(i) for i in x.logical]
        if len(set(cls)) != len(cls) or any(
            c != lmap.find(o) for c, o in zip(cls, out.domain.no_reductions())
        ):
            raise CircbufError(f"{what}: the axes of {out.name} are not those of {x.name}, in order")
        iterated = {lmap.find(i) for t in fusion.used_tvs() for i in t.logical if not i.is_broadcast}
        for d, i in enumerate(x.logical):
            if i.is_broadcast and lmap.find(i) in iterated:  # x + a, x of [1, C], a of [N, C]
                raise CircbufError(
                    f"{what}: {x.name} is also read through its broadcast axis {d}, for every element "
                    "of that axis of the fusion, while it is written"
                )
        todo, seen = [x], set()
        while todo:
            t = todo.pop()
            for e in t.uses:
                if id(e) not in live or id(e) in seen:
                    continue
                seen.add(id(e))
                if not isinstance(e, ELEMENTWISE):
                    raise CircbufError(
                        f"{what}: {x.name} is also read through {e.op_name} ({e}), which reads "
                        f"elements of {x.name} other than the one being written; compute it from a "
                        "copy (define another input)"
                    )
                todo.append(e.out)


def output_vectorizable(fusion: Fusion, info, k: int, axis: int, vec: int) -> bool:
    """True when output ``k`` can be stored ``vec`` elements at a time along
    its logical axis ``axis`` (whose extent ``vec`` divides): that axis is
    innermost in memory and the other strides are multiples of ``vec``. An
    output written in place into an input has that input's strides and
    address; others are allocated in their stride order."""
    o = fusion.outputs[k]
    if o.domain.no_reductions()[axis].is_broadcast:  # written one element wide
        return False
    if k in fusion.aliases:
        return vector_access(info.tensors[fusion.aliases[k]], axis, vec)
    return o.domain.allocation_order()[-1] == axis


def vector_access(t, axis: int, vec: int) -> bool:
    """True when tensor argument ``t`` (a TensorInfo: sizes, strides,
    alignment) can be read or written ``vec`` elements at a time along its
    axis ``axis``: unit stride there, every other stride (of an axis longer
    than 1) a multiple of ``vec`` so each run starts on a vector boundary,
    and the pointer aligned to a whole vector."""
    return (
        t.strides[axis] == 1
        and all(st % vec == 0 for d, (st, sz) in enumerate(zip(t.strides, t.sizes)) if d != axis and sz > 1)
        and t.align % (vec * t.itemsize) == 0
    )


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
    if any(n > 1 and st == 0 for n, st in zip(t.sizes, t.strides)):
        return "an expanded axis (stride 0): its elements are one element of memory"
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
