"""IterDomains and the transforms that derive loop domains from logical ones.

An IterDomain is one axis of iteration. Splits and merges create new
IterDomains and remember their ``definition``, so indexing can walk from the
loop domain back to logical coordinates.

>>> from circbuf.ir.scalar import Var
>>> i = IterDomain(Var("i0")); o, n = split(i, 128)
>>> str(o.extent), str(n.extent), o.definition is n.definition
('ceilDiv(i0, 128)', '128', True)
>>> print(o, n)  # printed with a process-wide id: iS<id>  # doctest: +ELLIPSIS
iS...{ceilDiv(i0, 128)} iS...{128}
"""

from __future__ import annotations

import itertools
from enum import Enum

from .errors import CircbufError
from .scalar import Const, Scalar, as_scalar, ceil_div

_ids = itertools.count()


class IterType(Enum):
    Iteration = "i"
    Reduction = "r"
    Broadcast = "b"


class ParallelType(Enum):
    Serial = "S"
    BIDx = "blockIdx.x"
    BIDy = "blockIdx.y"
    BIDz = "blockIdx.z"
    TIDx = "threadIdx.x"
    TIDy = "threadIdx.y"
    TIDz = "threadIdx.z"
    Vectorize = "V"
    Unroll = "UR"
    Bulk = "B"  # moved whole by one bulk (TMA) copy: no loop, no thread
    # covered by one MMA instruction (wgmma): no loop; on its output these
    # are the per-thread fragment registers, on its K axis the instruction's k
    Mma = "MMA"
    # the CTA's coordinates in its thread-block cluster (cluster=(cx, cy)): an axis
    # bound to one is split between the cluster's CTAs; a shared buffer's box axis
    # bound to one is loaded in slices, each CTA loading one and multicasting it to
    # the CTAs that differ from it only along that coordinate (they share the tile)
    CIDx = "cidx"
    CIDy = "cidy"

    @property
    def is_cluster(self):
        return self in (ParallelType.CIDx, ParallelType.CIDy)

    @property
    def is_block(self):
        return self in (ParallelType.BIDx, ParallelType.BIDy, ParallelType.BIDz)

    @property
    def is_thread(self):
        return self in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz)

    @property
    def is_grid_or_block(self):
        """Parallel types that map to hardware indices rather than loops."""
        return self.is_block or self.is_thread


class IterDomain:
    """One axis: an extent, an IterType and a ParallelType.

    ``expanded_extent`` is set on broadcast axes by the scheduler: the extent a
    loop over this axis runs when it is inlined with a concrete axis.
    """

    __slots__ = ("id", "extent", "iter_type", "parallel_type", "definition", "expanded_extent", "unroll_by")

    def __init__(self, extent, iter_type=IterType.Iteration, parallel_type=ParallelType.Serial):
        self.id = next(_ids)
        self.extent: Scalar = as_scalar(extent)
        self.iter_type = iter_type
        self.parallel_type = parallel_type
        self.definition = None  # Split or Merge that produced this axis
        self.expanded_extent = None
        self.unroll_by = 0  # a serial loop kept a loop, unrolled this many at a time (0: the default)

    @property
    def is_reduction(self):
        return self.iter_type == IterType.Reduction

    @property
    def is_broadcast(self):
        return self.iter_type == IterType.Broadcast

    @property
    def concrete_extent(self) -> Scalar | None:
        """The extent this axis gives where it meets other axes (broadcasting):
        its own, the one a broadcast was expanded to, or None for a plain
        broadcast, which takes the others'."""
        if not self.is_broadcast:
            return self.extent
        return self.expanded_extent

    @property
    def loop_extent(self) -> Scalar:
        """Trip count of a loop over this axis; the tensor's size along it
        (an expanded broadcast has its expanded extent, as torch's expand)."""
        c = self.concrete_extent
        return self.extent if c is None else c

    def parallelize(self, ptype: ParallelType) -> IterDomain:
        """Bind this axis to a parallel type; returns self.

        >>> IterDomain(Const(128)).parallelize(ParallelType.TIDx).parallel_type.value
        'threadIdx.x'
        """
        if not isinstance(ptype, ParallelType):
            raise CircbufError(f"parallelize: {ptype!r} is not a ParallelType")
        if ptype == ParallelType.Bulk and not (
            isinstance(self.loop_extent, Const) and 1 <= self.loop_extent.value <= 256
        ):
            raise CircbufError(
                f"parallelize: a bulk (TMA box) axis needs a constant extent in [1, 256], got {self}"
            )
        if ptype == ParallelType.Mma and not isinstance(self.loop_extent, Const):
            raise CircbufError(f"parallelize: an MMA instruction axis needs a constant extent, got {self}")
        if ptype == ParallelType.Vectorize and not isinstance(self.loop_extent, Const):
            raise CircbufError(f"parallelize: vectorized axis {self} needs a constant extent")
        self.parallel_type = ptype
        return self

    def unroll(self, factor: int) -> IterDomain:
        """Keep the loop over this serial axis a loop, unrolled ``factor``
        iterations at a time (``#pragma unroll factor``), where a constant trip
        count up to 32 would be unrolled whole: fewer values live at once (a
        row store's 16 row iterations, each with its addresses, beside the
        accumulator registers). Returns self.

        >>> IterDomain(Const(16)).unroll(4).unroll_by
        4
        """
        if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
            raise CircbufError(f"unroll({factor!r}): must be an int >= 1")
        if self.parallel_type != ParallelType.Serial:
            raise CircbufError(f"unroll: {self} is bound to {self.parallel_type.name}, not a serial loop")
        self.unroll_by = factor
        return self

    def clone(self) -> IterDomain:
        c = IterDomain(self.extent, self.iter_type, self.parallel_type)
        c.expanded_extent = self.expanded_extent
        c.unroll_by = self.unroll_by
        return c

    def fresh(self) -> IterDomain:
        """This axis in another tensor (an elementwise op's output, a view's,
        a broadcast's): a new serial axis of the same extent and type; an
        expanded broadcast stays expanded, so the tensor keeps the size torch
        gives it.

        >>> b = IterDomain(Const(1), IterType.Broadcast); b.expanded_extent = Const(8)
        >>> f = b.fresh(); f is b, f.is_broadcast, str(f.expanded_extent)
        (False, True, '8')
        """
        o = IterDomain(self.extent, self.iter_type)
        o.expanded_extent = self.expanded_extent
        return o

    def __str__(self):
        p = self.parallel_type.value
        return f"{self.iter_type.value}{p}{self.id}{{{self.loop_extent}}}"

    __repr__ = __str__


class Split:
    """``in -> outer, inner``; ``factor`` sizes the inner axis (or the outer one
    when ``inner_split`` is False). An ``exact`` split (a reshape's) divides
    its input exactly: ``outer * inner`` is the input's extent, symbolic
    factors allowed, nothing to predicate."""

    def __init__(self, in_, outer, inner, factor, inner_split, exact=False):
        self.in_, self.outer, self.inner = in_, outer, inner
        self.factor, self.inner_split = factor, inner_split
        self.exact = exact

    @property
    def inputs(self):
        return (self.in_,)

    @property
    def outputs(self):
        return (self.outer, self.inner)

    def divisible(self) -> bool:
        """True when the split provably creates no out-of-range iterations."""
        if self.exact:
            return True
        ext = self.in_.loop_extent
        return isinstance(ext, Const) and ext.value % self.factor == 0

    def __str__(self):
        kind = "exact" if self.exact else "inner" if self.inner_split else "outer"
        return f"Split({self.in_}, factor={self.factor}, {kind}) -> {self.outer}, {self.inner}"


class Merge:
    def __init__(self, outer, inner, out):
        self.outer, self.inner, self.out = outer, inner, out

    @property
    def inputs(self):
        return (self.outer, self.inner)

    @property
    def outputs(self):
        return (self.out,)

    def __str__(self):
        return f"Merge({self.outer}, {self.inner}) -> {self.out}"


def broadcast_ids(src, flags) -> list[IterDomain]:
    """The logical axes of ``broadcast(x, flags)`` (nvFuser's BroadcastOp), for
    ``src`` the non-reduction axes of ``x``: a new broadcast axis where
    ``flags[k]`` is True, else the next axis of ``src`` (:meth:`IterDomain.fresh`).

    >>> ids = broadcast_ids([IterDomain(Const(4))], [True, False])
    >>> [(i.iter_type.name, str(i.extent)) for i in ids]
    [('Broadcast', '1'), ('Iteration', '4')]
    """
    src = iter(src)
    return [IterDomain(Const(1), IterType.Broadcast) if f else next(src).fresh() for f in flags]


def split(id_: IterDomain, factor: int, inner_split: bool = True):
    """Split an axis; returns (outer, inner)."""
    if not isinstance(factor, int) or isinstance(factor, bool) or factor <= 0:
        raise CircbufError(f"split: factor must be a positive int, got {factor!r} for axis {id_}")
    ext = id_.loop_extent
    rest = ceil_div(ext, factor)
    outer_ext, inner_ext = (rest, Const(factor)) if inner_split else (Const(factor), rest)
    outer = IterDomain(outer_ext, id_.iter_type)
    inner = IterDomain(inner_ext, id_.iter_type)
    if id_.is_broadcast:
        # A split broadcast stays broadcast; its pieces iterate over the expanded
        # extents when the scheduler gave the axis one, else over nothing.
        outer.extent = inner.extent = Const(1)
        if id_.expanded_extent is not None:
            outer.expanded_extent, inner.expanded_extent = outer_ext, inner_ext
    Split(id_, outer, inner, factor, inner_split).attach()
    return outer, inner


def merge(outer: IterDomain, inner: IterDomain) -> IterDomain:
    """Merge two axes into one (outer-major)."""
    kinds = {outer.iter_type, inner.iter_type} - {IterType.Broadcast}
    if kinds == {IterType.Iteration, IterType.Reduction}:
        raise CircbufError(f"merge: cannot merge reduction axis with iteration axis ({outer} and {inner})")
    if outer.is_broadcast and inner.is_broadcast:
        it = IterType.Broadcast
    else:
        it = kinds.pop() if kinds else IterType.Iteration
    ext = outer.loop_extent * inner.loop_extent
    out = IterDomain(ext, it)
    if it == IterType.Broadcast:
        if outer.expanded_extent is not None or inner.expanded_extent is not None:
            out.extent, out.expanded_extent = Const(1), ext
    Merge(outer, inner, out).attach()
    return out


def exact_split(id_: IterDomain, outer_extent, inner_extent, outer=None, inner=None):
    """Split ``id_`` into axes of the given extents, whose product is its
    extent (a reshape, checked when the sizes are known); returns (outer,
    inner). ``outer``/``inner`` name existing axes to use as the outputs.

    >>> from circbuf.ir.scalar import Var
    >>> o, i = exact_split(IterDomain(Var("i0")), Var("i1"), 4)
    >>> str(o.extent), str(i.extent), o.definition.divisible()
    ('i1', '4', True)
    """
    outer = outer if outer is not None else IterDomain(outer_extent, id_.iter_type)
    inner = inner if inner is not None else IterDomain(inner_extent, id_.iter_type)
    Split(id_, outer, inner, inner.extent, True, exact=True).attach()
    return outer, inner


def exact_merge(outer: IterDomain, inner: IterDomain, extent=None, out=None) -> IterDomain:
    """Merge two axes into one of ``extent`` (default: the product), or into
    the existing axis ``out``; a reshape's merge."""
    if out is None:
        it = IterType.Broadcast if outer.is_broadcast and inner.is_broadcast else IterType.Iteration
        if IterType.Reduction in (outer.iter_type, inner.iter_type):
            it = IterType.Reduction
        out = IterDomain(extent if extent is not None else outer.loop_extent * inner.loop_extent, it)
    Merge(outer, inner, out).attach()
    return out


def transforms_behind(axes, stop=()) -> list:
    """The splits and merges that made ``axes``, each once, an input's before
    the transforms that use it: a depth-first walk back through definitions,
    which ends at axes without one and at the axes in ``stop``.

    >>> i = IterDomain(Const(8)); o, n = split(i, 4); m = merge(o, n)
    >>> [type(t).__name__ for t in transforms_behind([m])], transforms_behind([m], stop=[m])
    (['Split', 'Merge'], [])
    """
    stop = {id(i) for i in stop}
    seen, out = set(), []

    def visit(i):
        d = i.definition
        if d is None or id(i) in stop or id(d) in seen:
            return
        for x in d.inputs:
            visit(x)
        seen.add(id(d))
        out.append(d)

    for i in axes:
        visit(i)
    return out


def _attach(self):
    for o in self.outputs:
        o.definition = self
    return self


Split.attach = _attach
Merge.attach = _attach
