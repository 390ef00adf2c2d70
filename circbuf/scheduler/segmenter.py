"""Fusion segmentation: a fusion no one scheduler takes, split into the
fewest segments the schedulers can take, each a standalone Fusion whose
inputs are fusion inputs or tensors an earlier segment writes to global
memory.

>>> import circbuf as cb
>>> with cb.FusionDefinition() as fd:
...     x = fd.define_tensor([-1, -1])
...     fd.add_output(fd.ops.sum(x, [0]))
...     fd.add_output(fd.ops.sum(x, [1]))
>>> print(segment(fd.fusion))
segment 0 (outer_reduction): T1 = sum(T0, dims=[0], init=0.0)
segment 1 (normalization): T2 = sum(T0, dims=[1], init=0.0)

The merge, in the spirit of nvFuser's FusionSegmenter: start from one group
per expr; repeatedly merge the pair of neighbouring groups whose merge saves
the most global traffic (a producer and its consumer save a write and a
read of the tensor between them; two consumers of one tensor save a read)
while some scheduler's ``can_schedule`` takes the merged group (asked of a
light view, :func:`_view`), its in-place outputs pass ``check_aliases``, and
the group graph stays acyclic (counting "every reader of an input runs
before the segment writing it in place"). Ties go to the earlier exprs, so
the result is deterministic for a fusion. Then one-input elementwise chains
(a cast of a bf16 input) are recomputed in each segment that reads them
rather than passed through memory (:func:`_forward`), and each group is cut
out as a standalone Fusion (:func:`_cut`). Structural: no input sizes are
needed; given the first call's (``env``), axes of different extents joined
through a broadcast are cut apart, an output with elements is cut from an
axis of extent 0 its broadcast axis meets (a loop over it writes nothing:
:func:`.utils.unwritten_output`), and reshapes whose splits and merges
depend on sizes only the inputs give are judged as these sizes make them
(a tensor combined with a view of itself shows only then).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..ir import CircbufError, Fusion, IterType, ReshapeOp, TensorView, Var
from ..ir.fusion import _elementwise_layout
from ..ir.nodes import ELEMENTWISE, MemoryType, TensorDomain, _Contraction
from ..ir.scalar import free_vars, is_const
from ..ir.view import concretize_for
from .utils import check_aliases, unwritten_output


@dataclass
class Segment:
    """One kernel's worth of a fusion.

    ``fusion``: standalone, scheduled and compiled like any fusion;
    ``inputs[k]``: where its input ``k`` comes from, ``("input", j)`` (the
    original fusion's input ``j``), ``("tensor", name)`` (an earlier
    segment's output, by its name in the original fusion) or
    ``("extent", name)`` (a size of the whole fusion none of the segment's
    tensors carries, passed as a scalar);
    ``outputs[k]``: the original fusion's name of its output ``k``;
    ``scheduler``: the first scheduler that takes it (a later one may run
    it when the first declines the input sizes); ``overrides``: the
    ``schedule()`` names its schedulers take."""

    fusion: Fusion
    inputs: list
    outputs: list
    scheduler: str
    math: list  # its exprs, printed
    overrides: frozenset = frozenset()

    def __str__(self):
        return f"({self.scheduler}): " + "; ".join(self.math)


class SegmentedFusion:
    """Segments in execution order, and how the original fusion's returns
    come out of them: ``returns[k]`` is ``("input", j)`` or ``("tensor", name)``.
    ``last_use[name]``: the segment after which an intermediate is dead."""

    def __init__(self, fusion: Fusion, segments: list[Segment]):
        self.segments = segments
        self.returns = [
            ("tensor", fusion.outputs[k].name) if kind == "output" else (kind, k)
            for kind, k in fusion.returns
        ]
        # schedule() names meant for no segment of this split (a matmul filled for K = 0)
        self.ignored_overrides: frozenset = frozenset()
        keep = {name for kind, name in self.returns if kind == "tensor"}
        keep |= {fusion.outputs[k].name for k in fusion.aliases}
        self.last_use: dict[str, int] = {}
        for s, seg in enumerate(segments):
            for kind, name in seg.inputs:
                if kind == "tensor" and name not in keep:
                    self.last_use[name] = s

    def __len__(self):
        return len(self.segments)

    def __str__(self):
        return "\n".join(f"segment {k} {seg}" for k, seg in enumerate(self.segments))


def _override_names(schedulers: list) -> frozenset:
    """The ``schedule()`` names the schedulers called ``schedulers`` take."""
    from .registry import SCHEDULERS

    return frozenset(k for s, allowed in SCHEDULERS if s.name in schedulers for k in allowed)


def schedulers_taking(fusion: Fusion) -> list:
    """Names of the schedulers whose ``can_schedule`` takes ``fusion``."""
    from .registry import SCHEDULERS, can_schedule

    return [s.name for s, _ in SCHEDULERS if can_schedule(s, fusion) is None]


def extents_differ(fusion: Fusion, env: dict | None = None) -> str | None:
    """Why no one kernel can cover ``fusion``'s axes, or None: two axes of
    one class (one axis of the fusion, joined through broadcasts) whose
    extents differ, as constants or for the sizes in ``env`` (a [1, 4, 2, 3]
    and a [1, 5, 2, 3] tensor both added to one [1, 2, 3]; a statistic
    summed over a broadcast axis, of extent 1, that is also expanded to the
    row length). Extents ``env`` does not give are taken to agree."""
    from ..ir import evaluate
    from .utils import LogicalMap

    lmap = LogicalMap(fusion)
    seen: dict = {}
    for tv in fusion.used_tvs():
        for d, i in enumerate(tv.logical):
            ext = i.concrete_extent
            if ext is None:
                continue
            try:
                v = evaluate(ext, env or {})
            except KeyError:  # a size these inputs do not fix
                continue
            first = seen.setdefault(lmap.find(i), (v, tv, d))
            if first[0] != v:
                return (
                    f"axis {first[2]} of {first[1].name} (extent {first[0]}) and axis {d} of {tv.name} "
                    f"(extent {v}) are one axis of the fusion, joined through a broadcast, but their "
                    "extents differ"
                )
    return None


def segment(
    fusion: Fusion, env: dict | None = None, verdicts: dict | None = None, target=None
) -> SegmentedFusion:
    """Partition ``fusion`` into segments the schedulers take (see the module
    docstring), none of which joins two axes of different extents (constants,
    or the sizes in ``env``: :func:`extents_differ`). Raises CircbufError
    naming an expr no scheduler takes even alone.

    ``verdicts``: (group of expr positions, its outputs' names or None) ->
    names of the schedulers taking it, as an earlier split of this fusion
    for these sizes found them; it is read, and filled with the verdicts
    asked (the compile driver keeps it in its disk cache). ``target``: the
    GPU the sizes in ``env`` are compiled for (a matmul the split-K
    heuristic splits there keeps a row reduction of its output to itself)."""
    from .empty_k import IGNORED, fill_empty_k
    from .matmul_reduce import is_partial, split_row_reductions

    # a matmul whose K is 0 for these sizes is its fill (zeros, or the bias): the
    # copy's expr positions differ, so its verdicts are kept apart
    filled = fill_empty_k(fusion, env)
    if filled is not None:
        vs = None if verdicts is None else verdicts.setdefault(("K = 0 filled",), {})
        seg = _segment(filled, env, vs)
        seg.ignored_overrides = IGNORED
        return seg
    # a row reduction of a matmul's output: partials in the matmul's epilogue, then their
    # reduction; kept only where the matmul's segment holds every partial (an in-place
    # output beside it, say, can make the partials a segment of their own: the unsplit
    # fusion then). The split fusion's verdicts are kept apart: its expr positions differ.
    split = split_row_reductions(fusion, env, target)
    if split is not None:
        vs = None if verdicts is None else verdicts.setdefault(("row reductions split",), {})
        try:
            seg = _segment(split, env, vs)
        except CircbufError:
            seg = None
        if seg is not None and all(
            s.scheduler == "matmul" for s in seg.segments if any(is_partial(e) for e in s.fusion.exprs())
        ):
            return seg
    return _segment(fusion, env, verdicts)


def _segment(fusion: Fusion, env, verdicts) -> SegmentedFusion:
    """:func:`segment` of ``fusion`` as it is."""
    exprs = fusion.exprs()
    n = len(exprs)
    # verdicts are asked of ``judged``: the fusion, or, where a reshape's
    # splits and merges depend on sizes only the inputs give, a copy with them
    # made for the sizes in ``env`` (a tensor combined with a view of itself
    # shows only then). The extents a reshape's grouping equates (an input
    # axis squeezed as 1) count for a group with that reshape: its segment,
    # compiled, concretizes the reshape again and knows them, a segment
    # without it does not. The segments are cut from the fusion itself.
    judged, jexprs, equal = fusion, exprs, {}
    if env is not None and any(isinstance(e, ReshapeOp) and not e.concrete for e in exprs):
        judged = fusion.clone()
        jexprs = judged.exprs()
        assert [type(e) for e in jexprs] == [type(e) for e in exprs]
        equal = {
            k: concretize_for(e, env)
            for k, e in enumerate(jexprs)
            if isinstance(e, ReshapeOp) and not e.concrete
        }

    def view(positions, outputs=None):
        f2 = _view(judged, jexprs, positions, outputs)[0]
        if equal:
            f2.extent_equalities = judged.extent_equalities + [q for k in positions for q in equal.get(k, ())]
        return f2

    pos = {id(e): k for k, e in enumerate(exprs)}
    made_by = {id(t): pos[id(e)] for e in exprs for t in e.outputs}
    # tensor edges: (producer expr or None for an input, consumer expr, tensor)
    reads: list[tuple] = []
    for k, e in enumerate(exprs):
        for t in e.tv_inputs():
            reads.append((made_by.get(id(t)), k, t))

    # an input written in place: every other reader of it runs before the writer
    in_place = [(j, pos[id(fusion.outputs[k].definition)]) for k, j in fusion.aliases.items()]

    if verdicts is None:
        verdicts = {}

    def takers(group: frozenset, outputs=None) -> list:
        key = (group, outputs)
        if key not in verdicts:
            f2 = view(sorted(group), outputs)
            unfit = (
                extents_differ(f2, env)
                or (env is not None and unwritten_output(f2, env))
                or reads_one_tensor_twice(f2)  # (computed in the group: no second input for it)
            )
            ok = [] if unfit else schedulers_taking(f2)
            if ok and f2.aliases:
                try:
                    check_aliases(f2)  # an in-place output no kernel can write with these readers
                except CircbufError:
                    ok = []
            verdicts[key] = ok
        return verdicts[key]

    for k, e in enumerate(exprs):
        why = extents_differ(view([k]), env)
        if why:
            raise CircbufError(f"{e}: {why}, within this one op (define them in separate fusions)")
    # an expr no scheduler takes alone (a 0-dim mean's division) may still
    # merge into a group one takes (its reduction's kernel): checked after merging

    group_of = list(range(n))  # expr -> group id (the group's first expr)
    members = {k: frozenset([k]) for k in range(n)}

    rank = {id(t): _size_rank(t) for _, _, t in reads}
    readers: dict[int, list] = {}
    for _, c, t in reads:
        readers.setdefault(id(t), []).append(c)

    def group_edges():
        """(group a, group b) pairs whose merge saves traffic, most first
        (ties: earlier groups first)."""
        best: dict[tuple, tuple] = {}
        for p, c, t in reads:
            if p is not None and group_of[p] != group_of[c]:
                key = (min(group_of[p], group_of[c]), max(group_of[p], group_of[c]))
                best[key] = max(best.get(key, (0, 0, 0)), (2,) + rank[id(t)])
        for tid, cs in readers.items():  # readers of one tensor: one read less (neighbours in order)
            gs = sorted({group_of[c] for c in cs})
            for a, b in zip(gs, gs[1:]):
                best[(a, b)] = max(best.get((a, b), (0, 0, 0)), (1,) + rank[tid])
        return sorted(best, key=lambda ab: (tuple(-x for x in best[ab]), ab))

    def successors() -> dict:
        """Group -> groups that must run after it (data, and readers before an in-place writer)."""
        succ: dict[int, set] = {}
        for p, c, _ in reads:
            if p is not None and group_of[p] != group_of[c]:
                succ.setdefault(group_of[p], set()).add(group_of[c])
        for j, w in in_place:
            for p, c, t in reads:
                if p is None and t is fusion.inputs[j] and group_of[c] != group_of[w]:
                    succ.setdefault(group_of[c], set()).add(group_of[w])
        return succ

    def reaches(succ: dict, a: int, b: int) -> bool:
        """A path from group a to group b through some other group."""
        todo = [x for x in succ.get(a, ()) if x != b]
        seen = set(todo)
        while todo:
            x = todo.pop()
            if x == b:
                return True
            for y in succ.get(x, ()):
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return False

    merged = True
    while merged:
        merged = False
        succ = successors()
        for a, b in group_edges():
            if reaches(succ, a, b) or reaches(succ, b, a):
                continue  # merging would put a group between the two halves of one segment
            group = members[a] | members[b]
            if not takers(group):
                continue
            keep, drop = min(a, b), max(a, b)
            members[keep] = group
            del members[drop]
            for k in group:
                group_of[k] = keep
            merged = True
            break

    for g in sorted(members):
        if not takers(members[g]):
            from .registry import SCHEDULERS, can_schedule

            k = next(k for k in sorted(members[g]) if not takers(frozenset([k])))
            f1 = view([k])
            why = "; ".join(f"{s.name}: {can_schedule(s, f1)}" for s, _ in SCHEDULERS)
            if schedulers_taking(
                f1
            ):  # the schedulers take it: the in-place output is what no kernel can write
                check_aliases(f1)  # raises, naming the rule
            raise CircbufError(
                f"no scheduler can take this fusion (nor {exprs[k]} as a kernel of its own, "
                f"nor with its neighbours: {why})"
            )

    order = _order(fusion, exprs, reads, members, group_of)
    extra = _forward(fusion, exprs, made_by, members, group_of, takers)
    segments = []
    for g in order:
        outs = _outputs(fusion, exprs, reads, members, group_of, extra, g)
        if not outs:
            continue  # every reader of what it makes recomputes it
        f2, ins, out_names = _cut(fusion, sorted(members[g] | extra[g]), outs)
        math = [
            str(exprs[k]) + (" (recomputed from an input)" if k in extra[g] else "")
            for k in sorted(members[g] | extra[g])
        ]
        names = takers(members[g] | extra[g], outs)
        segments.append(Segment(f2, ins, out_names, names[0], math, _override_names(names)))
    return SegmentedFusion(fusion, segments)


def _forward(fusion: Fusion, exprs, made_by: dict, members: dict, group_of: list, takers) -> dict:
    """Input forwarding: elementwise exprs of one fusion input (a cast to
    fp32, an exp) are recomputed in each segment that reads their result
    when the input is no bigger per element, instead of that segment reading
    a tensor another segment wrote. Returns group -> exprs it recomputes (a
    group keeps none when it would then not be schedulable)."""
    written = {j for j in fusion.aliases.values()}  # in place: read before the write only
    root: dict[int, int] = {}  # forwardable expr -> bytes per element of its fusion input
    for k, e in enumerate(exprs):
        tvs = e.tv_inputs()
        if isinstance(e, ELEMENTWISE) and len(tvs) == 1 and len(e.outputs) == 1:
            src = tvs[0]
            if src.definition is None:
                if any(src is fusion.inputs[j] for j in written):
                    continue
                root[k] = src.dtype.size
            elif made_by[id(src)] in root:
                root[k] = root[made_by[id(src)]]
    extra: dict[int, frozenset] = {}
    for g, mem in members.items():
        want: set = set()
        todo = [
            made_by[id(t)]
            for k in mem
            for t in exprs[k].tv_inputs()
            if id(t) in made_by and made_by[id(t)] not in mem
        ]
        todo = [p for p in todo if p in root and root[p] <= exprs[p].outputs[0].dtype.size]
        while todo:
            p = todo.pop()
            if p in want or p in mem:
                continue
            want.add(p)
            src = exprs[p].tv_inputs()[0]
            if src.definition is not None:
                todo.append(made_by[id(src)])
        extra[g] = frozenset(want)
    for g in members:
        if extra[g] and not takers(
            members[g] | extra[g], _outputs(fusion, exprs, None, members, group_of, extra, g)
        ):
            extra[g] = frozenset()
    return extra


def _outputs(fusion: Fusion, exprs, reads, members: dict, group_of: list, extra: dict, g: int) -> frozenset:
    """Names of the tensors group ``g`` writes: those its own exprs make that
    the fusion returns, or that an expr of another group reads without
    recomputing them."""
    returned = {t.name for t in fusion.outputs}
    own = {t.name for k in members[g] for t in exprs[k].outputs}
    out = own & returned
    for h, mem in members.items():
        if h == g:
            continue
        made_there = {t.name for k in mem | extra.get(h, frozenset()) for t in exprs[k].outputs}
        for k in mem | extra.get(h, frozenset()):
            for t in exprs[k].tv_inputs():
                if t.name in own and t.name not in made_there:
                    out.add(t.name)
    return frozenset(out)


def _size_rank(t: TensorView) -> tuple:
    """How big a tensor is, without sizes: (axes that are neither broadcast
    nor reduced, bytes per element)."""
    return (sum(not i.is_broadcast for i in t.domain.no_reductions()), t.dtype.size)


def _order(fusion: Fusion, exprs, reads, members: dict, group_of: list) -> list[int]:
    """Groups in execution order: each after the groups it reads from, and a
    group that writes an output in place into an input after every other
    group that reads that input; earlier exprs first among the ready ones."""
    before: dict[int, set] = {g: set() for g in members}
    for p, c, _ in reads:
        if p is not None and group_of[p] != group_of[c]:
            before[group_of[c]].add(group_of[p])
    readers: dict[int, set] = {}
    for p, c, t in reads:
        if p is None and t in fusion.inputs:
            readers.setdefault(fusion.inputs.index(t), set()).add(group_of[c])
    writes: dict[int, int] = {}
    for k, j in fusion.aliases.items():
        d = fusion.outputs[k].definition
        writes[j] = group_of[exprs.index(d)]
        before[writes[j]] |= readers.get(j, set()) - {writes[j]}
    order: list[int] = []
    while len(order) < len(members):
        ready = [g for g in sorted(members) if g not in order and before[g] <= set(order)]
        if not ready:
            j = next(j for j, w in writes.items() if w not in order)
            raise CircbufError(
                f"{fusion.inputs[j].name} is written in place (alias_input) by a kernel whose "
                f"inputs need another kernel that reads {fusion.inputs[j].name}: no order of the "
                "segments reads it before it is written; add that output without alias_input"
            )
        order.append(ready[0])
    return order


def _view(fusion: Fusion, exprs: list, positions: list[int], outputs=None):
    """The exprs at ``positions`` of ``exprs`` (``fusion.exprs()``) as a
    fusion of their own: new TensorViews and exprs sharing the original's
    axes (no deep copy: a ``can_schedule`` verdict costs the group's size, not
    the fusion's; :func:`_cut` deep-copies it before anything is scheduled).
    Tensors read from other exprs become inputs (reduced axes dropped, dense,
    in the producer's layout); the tensors named in ``outputs`` (default: those
    read by other exprs or returned) become outputs. Returns (fusion, where
    each input comes from: ``("input", j)`` or ``("tensor", name)``)."""
    group = [exprs[k] for k in sorted(positions)]
    gid = {id(e) for e in group}
    live = {id(e) for e in exprs}
    returned = {id(t) for t in fusion.outputs}
    f2 = Fusion()
    new: dict[int, TensorView] = {}
    boundary: list = []

    in_place = {id(fusion.outputs[k]) for k in fusion.aliases}

    def tv(t: TensorView) -> TensorView:
        if id(t) not in new:
            t2 = copy.copy(t)
            t2.uses, t2.definition, t2.fusion = [], None, f2
            if t.definition is not None and id(t.definition) not in gid:  # from another segment
                t2.is_input = True
                t2.memory_type = MemoryType.Global
                if id(t) in in_place:  # it lives in the input it was written into: that input's strides
                    t2.domain = TensorDomain(
                        t.domain.no_reductions(), contiguity=[None] * len(t.domain.no_reductions())
                    )
                else:
                    t2.domain = TensorDomain(t.domain.no_reductions(), stride_order=_layout(t))
                boundary.append(t)
            new[id(t)] = t2
        return new[id(t)]

    # a matmul whose two operands read one tensor computed elsewhere (x @ x, x @ x.T,
    # linear(x, x)): the B operand's side reads it as a second input with axes of its
    # own (its axes as both M and K, or M and N, are one axis of the fusion: no loop
    # nest walks that); :func:`_b_side_reads` says which reads
    twin_reads = _b_side_reads(group)
    twins: dict = {}  # id(tensor) -> (tensor, its second input)

    def twin(t: TensorView) -> TensorView:
        if id(t) not in twins:
            first = tv(t)
            d = copy.copy(first)
            d.uses, d.definition, d.fusion = [], None, f2
            axes = [i.fresh() for i in first.domain.no_reductions()]
            d.domain = TensorDomain(
                axes, contiguity=first.domain.contiguity, stride_order=first.domain.stride_order
            )
            twins[id(t)] = (t, d)
        return twins[id(t)][1]

    for e in group:
        e2 = copy.copy(e)
        e2.inputs = [
            (twin(x) if (id(e), k) in twin_reads else tv(x)) if isinstance(x, TensorView) else x
            for k, x in enumerate(e.inputs)
        ]
        e2.outputs = [tv(o) for o in e.outputs]
        for o in e2.outputs:
            o.definition = e2
        for x in e2.tv_inputs():
            x.uses.append(e2)
    alias_of = {id(fusion.outputs[k]): fusion.inputs[j] for k, j in fusion.aliases.items()}
    outs = []
    for e in group:
        for o in e.outputs:
            if outputs is None:
                wanted = id(o) in returned or any(id(u) in live and id(u) not in gid for u in o.uses)
            else:
                wanted = o.name in outputs
            if wanted:
                outs.append(o)
                if id(o) in alias_of:  # written in place: a parameter even when not read
                    tv(alias_of[id(o)])
    sources = []
    for j, x in enumerate(fusion.inputs):
        if id(x) in new:
            f2.inputs.append(new[id(x)])
            sources.append(("input", j))
    for t in boundary:
        f2.inputs.append(new[id(t)])
        sources.append(("tensor", t.name))
    for t, d in twins.values():
        f2.inputs.append(d)
        sources.append(sources[f2.inputs.index(new[id(t)])])
    for o in outs:
        o2 = new[id(o)]
        o2.memory_type = MemoryType.Global
        f2.outputs.append(o2)
        if id(o) in alias_of:  # written in place, not returned (as add_output(alias_input=...))
            f2.aliases[len(f2.outputs) - 1] = f2.inputs.index(new[id(alias_of[id(o)])])
        else:
            f2.returns.append(("output", len(f2.outputs) - 1))
    f2.tvs = f2.used_tvs()
    f2.extent_vars = fusion.extent_vars
    f2.extent_equalities = fusion.extent_equalities
    f2.derived_extents = fusion.derived_extents
    f2.schedule_overrides = fusion.schedule_overrides
    f2._tv_counter = fusion._tv_counter  # tensors a scheduler adds get names not taken here
    for _, d in twins.values():  # the second reading of a tensor: a name of its own
        d.name = f"T{f2._tv_counter}"
        f2._tv_counter += 1
    return f2, sources


def _computed_by(t: TensorView, made: dict) -> dict:
    """The exprs of ``made`` (id(tensor) -> expr) that ``t`` is computed by,
    transitively, by id."""
    seen, todo = {}, [t]
    while todo:
        e = made.get(id(todo.pop()))
        if e is not None and id(e) not in seen:
            seen[id(e)] = e
            todo += e.tv_inputs()
    return seen


def _operand_reads(c, made: dict) -> list:
    """Per operand of contraction ``c``: (the exprs of ``made`` that compute it, by
    id; its reads of tensors ``made`` does not make: id(tensor) -> [(expr, input
    position)], ``c``'s own read of the operand included where it is one)."""
    sides = []
    for k in (0, 1):
        chain = _computed_by(c.inputs[k], made)
        reads: dict = {}
        for e in [*chain.values(), c]:
            for j, x in enumerate(e.inputs):
                if isinstance(x, TensorView) and id(x) not in made and (e is not c or j == k):
                    reads.setdefault(id(x), []).append((e, j))
        sides.append((chain, reads))
    return sides


def _b_side_reads(group: list) -> set:
    """(id(expr), input position) of the reads of a tensor computed outside
    ``group`` (or a fusion input) by a contraction's B operand side, where its A
    side reads that tensor too: the reads that take a second input of it. An
    expr on both sides keeps its read (the group then fails, and the segmenter
    cuts that expr apart)."""
    made = {id(o): e for e in group for o in e.outputs}
    out = set()
    for c in group:
        if isinstance(c, _Contraction):
            (a_chain, a_reads), (_, b_reads) = _operand_reads(c, made)
            for t in set(a_reads) & set(b_reads):
                out |= {(id(e), j) for e, j in b_reads[t] if id(e) not in a_chain}
    return out


def reads_one_tensor_twice(fusion: Fusion) -> str | None:
    """Why ``fusion`` is cut before any scheduler sees it whole: a matmul or
    linear reading one tensor as both operands (``x @ x``, ``linear(x, x)``),
    whose axes would be one axis of the fusion twice over; its segment reads the
    tensor as two inputs (:func:`_view`). None when there is none."""
    for e in fusion.exprs():
        x = e.inputs[0] if isinstance(e, _Contraction) else None
        # (a vector's one axis is K on both sides: a dot, one kernel takes it as it is)
        if x is not None and x is e.inputs[1] and x.ndim >= 2:
            return f"{e.out.name} reads {x.name} as both operands (a segment may read it twice)"
    return None


def operands_share_a_tensor(fusion: Fusion) -> str | None:
    """A matmul or linear both of whose operands are computed from one fusion
    input (``x @ x.T`` written with a permute): the segmenter may cut it so that
    the B side reads a second input of that tensor. None when there is none."""
    made = {id(o): e for e in fusion.exprs() for o in e.outputs}
    for c in fusion.exprs():
        if isinstance(c, _Contraction):
            (_, a_reads), (_, b_reads) = _operand_reads(c, made)
            common = [e.inputs[j] for t in set(a_reads) & set(b_reads) for e, j in a_reads[t][:1]]
            if common:
                t = min(common, key=lambda x: x.name)
                return (
                    f"both operands of {c.out.name} are computed from {t.name} (a segment may read it twice)"
                )
    return None


def _cut(fusion: Fusion, positions: list[int], outputs=None):
    """:func:`_view`, deep-copied to be scheduled on its own: outputs in the
    layout the next segment reads them in, and the sizes its math or shapes
    use that no input tensor carries as scalar inputs. Returns (fusion, input
    sources, output names)."""
    view, sources = _view(fusion, fusion.exprs(), positions, outputs)
    f2 = view.clone()
    operands = _contraction_operands(fusion)  # written out in full by their producer
    read = _contraction_operands(fusion, returned=True)
    # a second input of an operand (``_view``'s twin: the same source) is the operand too
    wide = {src for t, src in zip(f2.inputs, sources) if t.name in read}
    full = {src for t, src in zip(f2.inputs, sources) if t.name in operands}
    for t, src in zip(f2.inputs, sources):
        if src in wide:
            # (an expand the fusion returns is handed over as torch's stride-0 view)
            _write_out_expanded(t, strided=src not in full)
    for t in f2.outputs:
        if t.name in operands:
            _write_out_expanded(t)
    written = {t.name: t for e in fusion.exprs() for t in e.outputs}
    for k, t in enumerate(f2.outputs):
        if k not in f2.aliases:
            t.domain.stride_order = _layout(written[t.name])  # as the next segment reads it

    # sizes: each name once, from a tensor that carries it, else a scalar
    # input of the fusion, else the whole fusion's sizes (("extent", name):
    # a mean's row length, the rows a reduction removed)
    bound = {i.extent.name for x in f2.inputs for i in x.logical if isinstance(i.extent, Var)}
    needed: dict = {}
    for t in f2.used_tvs():
        if t.is_input:
            continue
        for i in t.logical + t.domain.view_ids():
            free_vars(i.extent, needed)
            if i.expanded_extent is not None:
                free_vars(i.expanded_extent, needed)
    for e in f2.exprs():
        for x in e.inputs:
            if not isinstance(x, TensorView):
                free_vars(x, needed)
    for j, v in enumerate(fusion.inputs):
        if isinstance(v, Var) and v.name in needed and v.name not in bound:
            f2.inputs.append(v)
            sources.append(("input", j))
            bound.add(v.name)
    derived = {}
    for name, e in f2.derived_extents.items():
        if name in bound:
            continue
        if set(free_vars(e)) <= bound:
            derived[name] = e
            bound.add(name)
        elif name in needed:
            f2.inputs.append(Var(name))
            sources.append(("extent", name))
            bound.add(name)
    for name, v in needed.items():
        if name not in bound:
            f2.inputs.append(v)
            sources.append(("extent", name))
            bound.add(name)
    f2.derived_extents = derived
    f2.extent_equalities = [
        (a, b) for a, b in f2.extent_equalities if set(free_vars(a)) | set(free_vars(b)) <= bound
    ]
    return f2, sources, [t.name for t in f2.outputs]


def _contraction_operands(fusion: Fusion, returned: bool = False) -> frozenset:
    """Names of the tensors computed in ``fusion`` that a 16-bit matmul or
    linear reads as an operand (the tensor-core path takes them whole), none
    that the fusion returns unless ``returned``: an expand returned keeps
    torch's stride-0 layout where it is written, and only the matmul's segment
    reads it as rows."""
    from ..ir import DataType
    from ..ir.nodes import _Contraction

    returned = set() if returned else {t.name for t in fusion.outputs}
    return frozenset(
        x.name
        for e in fusion.exprs()
        if isinstance(e, _Contraction)
        for x in e.inputs[:2]
        if not x.is_input and x.name not in returned and x.dtype in (DataType.BFloat16, DataType.Half)
    )


def _write_out_expanded(t: TensorView, strided: bool = False) -> None:
    """A matmul operand between segments is written with its expanded axes
    in full (``x[1, K].expand(M, K)`` as M rows): a tensor map cannot read
    the expand of a smaller tensor (the tensor-core path took none, and the
    SIMT sum of products ran the matmul); the producer's expand writes the
    rows, the matmul's segment reads them as any input. ``strided``: the
    producer keeps the expand (the fusion returns it, as torch's stride-0
    view), and the matmul's segment reads that view as rows, promising no
    strides (the runtime copies it dense first: scheduler/realign.py)."""
    wide = False
    for i in t.logical:
        if i.is_broadcast and i.expanded_extent is not None and not is_const(i.expanded_extent, 1):
            i.iter_type, i.extent, i.expanded_extent = IterType.Iteration, i.expanded_extent, None
            wide = True
    if strided and wide:
        t.domain = TensorDomain(t.domain.no_reductions(), contiguity=[None] * t.ndim)


def _layout(t: TensorView):
    """The stride order a tensor between segments is written and read in:
    its own, else the one it inherits elementwise from the fusion's inputs."""
    return t.domain.stride_order if t.domain.stride_order is not None else _elementwise_layout(t)
