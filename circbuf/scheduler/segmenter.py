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
while some scheduler's ``can_schedule`` takes the merged group and the
group graph stays acyclic. Ties go to the earlier exprs, so the result is
deterministic for a fusion. Structural only: no input sizes are needed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..ir import CircbufError, Fusion, TensorView, Var
from ..ir.fusion import _elementwise_layout
from ..ir.nodes import MemoryType, TensorDomain
from ..ir.scalar import free_vars


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
    it when the first declines the input sizes)."""

    fusion: Fusion
    inputs: list
    outputs: list
    scheduler: str
    math: list  # its exprs, printed

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


def schedulers_taking(fusion: Fusion) -> list:
    """Names of the schedulers whose ``can_schedule`` takes ``fusion``."""
    from .registry import SCHEDULERS

    return [s.name for s, _ in SCHEDULERS if s.can_schedule(fusion) is None]


def segment(fusion: Fusion) -> SegmentedFusion:
    """Partition ``fusion`` into segments the schedulers take (see the module
    docstring). Raises CircbufError naming an expr no scheduler takes even
    alone."""
    exprs = fusion.exprs()
    n = len(exprs)
    pos = {id(e): k for k, e in enumerate(exprs)}
    made_by = {id(t): pos[id(e)] for e in exprs for t in e.outputs}
    # tensor edges: (producer expr or None for an input, consumer expr, tensor)
    reads: list[tuple] = []
    for k, e in enumerate(exprs):
        for t in e.tv_inputs():
            reads.append((made_by.get(id(t)), k, t))

    verdicts: dict[frozenset, list] = {}

    def takers(group: frozenset) -> list:
        if group not in verdicts:
            verdicts[group] = schedulers_taking(_cut(fusion, sorted(group))[0])
        return verdicts[group]

    for k, e in enumerate(exprs):
        if not takers(frozenset([k])):
            from .registry import SCHEDULERS

            f1 = _cut(fusion, [k])[0]
            why = "; ".join(f"{s.name}: {s.can_schedule(f1)}" for s, _ in SCHEDULERS)
            raise CircbufError(f"no scheduler can take this fusion (nor {e} as a kernel of its own: {why})")

    group_of = list(range(n))  # expr -> group id (the group's first expr)
    members = {k: frozenset([k]) for k in range(n)}

    def group_edges():
        """(group a, group b) -> bytes-rank the merge saves, deterministic order."""
        best: dict[tuple, tuple] = {}
        by_tensor: dict[int, list] = {}
        for p, c, t in reads:
            by_tensor.setdefault(id(t), []).append((p, c, t))
        for p, c, t in reads:
            if p is not None and group_of[p] != group_of[c]:
                key = (min(group_of[p], group_of[c]), max(group_of[p], group_of[c]))
                best[key] = max(best.get(key, (0, 0, 0)), (2,) + _size_rank(t))
        for lst in by_tensor.values():  # consumers of one tensor: one read less
            gs = sorted({group_of[c] for _, c, _ in lst})
            for i, a in enumerate(gs):
                for b in gs[i + 1 :]:
                    best[(a, b)] = max(best.get((a, b), (0, 0, 0)), (1,) + _size_rank(lst[0][2]))
        return sorted(best, key=lambda ab: (tuple(-x for x in best[ab]), ab))

    def reaches(a: int, b: int, skip_direct: bool) -> bool:
        """A path from group a to group b through some other group."""
        succ: dict[int, set] = {}
        for p, c, _ in reads:
            if p is not None and group_of[p] != group_of[c]:
                succ.setdefault(group_of[p], set()).add(group_of[c])
        todo = [x for x in succ.get(a, ()) if not (skip_direct and x == b)]
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
        for a, b in group_edges():
            if reaches(a, b, True) or reaches(b, a, True):
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

    order = _order(fusion, exprs, reads, members, group_of)
    segments = []
    for g in order:
        f2, ins, outs = _cut(fusion, sorted(members[g]))
        math = [str(exprs[k]) for k in sorted(members[g])]
        segments.append(Segment(f2, ins, outs, takers(members[g])[0], math))
    return SegmentedFusion(fusion, segments)


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


def _cut(fusion: Fusion, positions: list[int]):
    """A standalone copy of ``fusion`` holding the exprs at ``positions`` of
    ``fusion.exprs()``: tensors they read from other exprs become inputs
    (reduced axes dropped, dense, in the producer's layout), tensors read by
    other exprs or returned become outputs. Returns (fusion, input sources,
    output names)."""
    orig_exprs = fusion.exprs()
    live_names = {t.name for e in orig_exprs for t in e.outputs}
    f2 = copy.deepcopy(fusion)
    f2.check_overrides = None
    ex2 = f2.exprs()
    group = [ex2[k] for k in positions]
    gid = {id(e) for e in group}
    live = {id(e) for e in ex2}
    orig_outputs = {t.name for t in fusion.outputs}
    layouts = {t.name: t for e in orig_exprs for t in e.outputs}

    boundary, used_inputs = [], set()
    for e in group:
        for t in e.tv_inputs():
            if t.definition is None:
                used_inputs.add(id(t))
            elif id(t.definition) not in gid and all(t is not b for b in boundary):
                boundary.append(t)
    alias_of = {f2.outputs[k].name: f2.inputs[j] for k, j in f2.aliases.items()}
    outputs = []
    for e in group:
        for t in e.outputs:
            if t.name in orig_outputs or any(id(u) in live and id(u) not in gid for u in t.uses):
                outputs.append(t)
                if t.name in alias_of:
                    used_inputs.add(id(alias_of[t.name]))
    assert all(t.name in live_names for t in boundary)

    # inputs: the original ones this segment reads (and every scalar), then intermediates
    sources, new_inputs = [], []
    for j, x in enumerate(f2.inputs):
        if isinstance(x, Var) or id(x) in used_inputs:
            new_inputs.append(x)
            sources.append(("input", j))
    for t in boundary:
        orig = layouts[t.name]
        t.definition = None
        t.is_input = True
        t.memory_type = MemoryType.Global
        t.domain = TensorDomain(t.domain.no_reductions(), stride_order=_layout(orig))
        new_inputs.append(t)
        sources.append(("tensor", t.name))
    f2.inputs = new_inputs
    f2.outputs, f2.returns, f2.aliases = [], [], {}
    for t in outputs:
        if t.name in alias_of:
            f2.add_output(t, alias_input=alias_of[t.name])
        else:
            f2.add_output(t)
            t.domain.stride_order = _layout(layouts[t.name])  # as the next segment reads it
    for t in f2.used_tvs():
        t.uses = [u for u in t.uses if id(u) in gid]
    f2.tvs = f2.used_tvs()

    # sizes: an extent the segment's math or shapes use that none of its
    # inputs carries (a mean's row length, the rows reduced away) comes in
    # as a scalar, ("extent", name), from the whole fusion's sizes
    bound = {x.name for x in f2.inputs if isinstance(x, Var)}
    for x in f2.inputs:
        if isinstance(x, TensorView):
            for i in x.logical:
                if isinstance(i.extent, Var):
                    bound.add(i.extent.name)
    needed: dict = {}
    for t in f2.used_tvs():
        if t.is_input:
            continue
        for i in t.logical + t.domain.view_ids():
            free_vars(i.extent, needed)
            if i.expanded_extent is not None:
                free_vars(i.expanded_extent, needed)
    for e in group:
        for x in e.inputs:
            if not isinstance(x, TensorView):
                free_vars(x, needed)
    for name, v in needed.items():
        if name not in bound and name not in f2.derived_extents:
            f2.inputs.append(v)
            sources.append(("extent", name))
            bound.add(name)
    derived = {}
    for name, e in f2.derived_extents.items():
        if set(free_vars(e)) <= bound:
            derived[name] = e
            bound.add(name)
        elif name in needed:
            f2.inputs.append(Var(name))
            sources.append(("extent", name))
            bound.add(name)
    f2.derived_extents = derived
    f2.extent_equalities = [
        (a, b) for a, b in f2.extent_equalities if set(free_vars(a)) | set(free_vars(b)) <= bound
    ]
    return f2, sources, [t.name for t in f2.outputs]


def _layout(t: TensorView):
    """The stride order a tensor between segments is written and read in:
    its own, else the one it inherits elementwise from the fusion's inputs."""
    return t.domain.stride_order if t.domain.stride_order is not None else _elementwise_layout(t)
