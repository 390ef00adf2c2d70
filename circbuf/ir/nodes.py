"""TensorDomain, TensorView and the expressions of the fusion math.

A TensorView has a *logical* domain (its shape), a *loop* domain derived from
it by split/merge/reorder, and an allocation given by its memory type (global
tensors use strides; local and shared buffers are sized from the loop axes
right of the compute-at position).

>>> from circbuf.ir.scalar import Var
>>> tv = TensorView([IterDomain(Var("i0")), IterDomain(Var("i1"))], DataType.Float)
>>> print(tv.merge(0).split(0, 128))  # doctest: +ELLIPSIS
T?_g_f32[iS...{ceilDiv((i0 * i1), 128)}, iS...{128}]
"""

from __future__ import annotations

from enum import Enum

from .dtype import DataType
from .errors import CircbufError
from .iterdomain import (
    IterDomain,
    IterType,
    ParallelType,
    Split,
    exact_merge,
    exact_split,
    merge,
    split,
    transforms_behind,
)
from .scalar import Const, Scalar


class MemoryType(Enum):
    Global = "g"
    Shared = "s"
    Local = "l"


class TensorDomain:
    """The axes of a tensor, from what its producer maps to down to the loops:

    - ``root``: the axes the producer's axes map to. The logical axes for
      every tensor but a reshape's output, whose logical axes are made from
      its root axes by exact splits and merges (:class:`ReshapeOp`);
    - ``logical``: the shape;
    - ``loop``: the logical axes after the scheduler's splits, merges and reorders;
    - ``stride_order`` (nvFuser's convention): ``stride_order[d]`` ranks the
      stride of non-reduction axis ``d``, larger = larger stride; None is
      row-major (``[n-1, ..., 1, 0]``). Memory layout of global tensors only;
    - ``contiguity``: per axis in allocation order (outermost first), True
      when its stride is the next inner axis' stride times that axis' extent.
    """

    def __init__(self, logical, contiguity=None, stride_order=None):
        self.logical: list[IterDomain] = list(logical)
        self.loop: list[IterDomain] = list(logical)
        self.contiguity = list(contiguity) if contiguity is not None else [True] * len(logical)
        # a shared buffer's allocation domain (IterDomains of its transforms,
        # outer to inner) when it is not its loop axes right of compute-at
        self.allocation: list[IterDomain] | None = None
        self.stride_order = list(stride_order) if stride_order is not None else None
        self._root: list[IterDomain] | None = None

    @property
    def root(self) -> list[IterDomain]:
        return self._root if self._root is not None else self.logical

    @root.setter
    def root(self, axes):
        self._root = list(axes)

    @property
    def has_root(self) -> bool:
        """True for a reshape's output: its logical axes are derived from root axes."""
        return self._root is not None

    def no_reductions(self) -> list[IterDomain]:
        return [i for i in self.logical if not i.is_reduction]

    def allocation_order(self) -> list[int]:
        """Positions of the non-reduction axes in memory order, outermost first.

        >>> from circbuf.ir.scalar import Const
        >>> TensorDomain([IterDomain(Const(2))] * 3, stride_order=[2, 0, 1]).allocation_order()
        [0, 2, 1]
        """
        n = len(self.no_reductions())
        if self.stride_order is None:
            return list(range(n))
        return sorted(range(n), key=lambda d: -self.stride_order[d])

    def broken_contiguity(self, sizes, strides) -> tuple | None:
        """The first promise of ``contiguity`` that a tensor of these sizes and
        strides breaks, ``(axis, stride, expected, position)``; None when it
        keeps them all. Each axis declared contiguous (contiguity is in stride
        order, outermost first) has the next inner axis' stride times that
        axis' size (1 for the innermost); expanded (stride-0) axes hold no
        memory and are skipped, as nvFuser's ``[True, None]`` for a column
        expanded to rows says.

        >>> from circbuf.ir.scalar import Const
        >>> d = TensorDomain([IterDomain(Const(2))] * 2, contiguity=[True, True])
        >>> d.broken_contiguity((5, 7), (8, 1))   # rows padded to 8
        (0, 8, 7, 0)
        """
        if any(n == 0 for n in sizes):  # no element to address: any strides keep the promise
            return None
        order = self.allocation_order()
        contig = self.contiguity
        expect = 1
        for pos in range(len(order) - 1, -1, -1):
            a = order[pos]
            size = sizes[a]
            if contig[pos] is True and size > 1 and strides[a] != expect:
                return a, strides[a], expect, pos
            if size > 1 and strides[a] != 0:
                expect = strides[a] * size
        return None

    def view_transforms(self) -> list:
        """The exact splits and merges from root to logical axes, in order (empty
        unless ``has_root``)."""
        if not self.has_root:
            return []
        return transforms_behind(self.logical, stop=self._root)

    def view_ids(self) -> list[IterDomain]:
        """Root axes and the axes between them and the logical ones."""
        out = {id(i): i for i in self.root}
        for t in self.view_transforms():
            for i in t.inputs + t.outputs:
                out.setdefault(id(i), i)
        return list(out.values())

    def clone(self) -> TensorDomain:
        """A copy with fresh axes: root axes cloned, the view transforms replayed
        on them, loop = logical. Axes keep extents, types and positions."""
        if not self.has_root:
            d = TensorDomain([i.clone() for i in self.logical], self.contiguity, self.stride_order)
            return d
        new = {id(i): i.clone() for i in self._root}
        for t in self.view_transforms():
            if isinstance(t, Split) and not t.exact:  # an rfactor's split (a partial reduction)
                Split(
                    new[id(t.in_)],
                    new.setdefault(id(t.outer), t.outer.clone()),
                    new.setdefault(id(t.inner), t.inner.clone()),
                    t.factor,
                    t.inner_split,
                ).attach()
            elif isinstance(t, Split):
                exact_split(
                    new[id(t.in_)],
                    None,
                    None,
                    outer=new.setdefault(id(t.outer), t.outer.clone()),
                    inner=new.setdefault(id(t.inner), t.inner.clone()),
                )
            else:
                exact_merge(new[id(t.outer)], new[id(t.inner)], out=new.setdefault(id(t.out), t.out.clone()))
        d = TensorDomain(
            [new.get(id(i)) or i.clone() for i in self.logical], self.contiguity, self.stride_order
        )
        d.root = [new[id(i)] for i in self._root]
        return d


class TensorView:
    """A tensor in the fusion, with the scheduling transforms applied to it."""

    def __init__(self, logical, dtype: DataType, memory_type=MemoryType.Global, contiguity=None):
        self.domain = TensorDomain(logical, contiguity)
        self.dtype = dtype
        self.memory_type = memory_type
        self.compute_at_pos = 0
        self.definition: Expr | None = None
        self.uses: list[Expr] = []
        self.fusion = None
        self.name = "T?"
        self.is_input = False
        self.circular = None  # (stages, prefetch, Pipelined | WarpSpecialized)
        self.swizzle_bytes = 0  # shared memory: 32/64/128-byte XOR swizzle of 16-byte chunks
        self.ring_axis: int | None = None  # circular_buffer(axis=...): the loop it rotates over
        self.turns = None  # ParallelType whose groups alternate their MMA and epilogue phases
        # the tensor this one is a copy of, recomputed for one of its consumers:
        # its axes are that tensor's axes (each broadcast makes fresh axes, which
        # only this link relates to the original's)
        self.recomputes: TensorView | None = None
        # pairs (axis of another tensor, axis of this one) that are one axis of
        # the fusion though no expr relates them: a broadcast of a broadcast
        # rewritten as one broadcast keeps the inner one's new axes this way
        self.joined_axes: list[tuple[IterDomain, IterDomain]] = []
        self.peer_store = None  # ir.peer.PeerStore: also stored into peer GPUs' buffers

    # ------------------------------------------------------------ shape
    @property
    def ndim(self) -> int:
        return len(self.domain.no_reductions())

    def shape(self) -> list[Scalar]:
        """Sizes of the non-reduction logical axes, as torch gives them: an
        expanded broadcast's is its expanded extent."""
        return [i.loop_extent for i in self.domain.no_reductions()]

    def size(self, dim: int) -> Scalar:
        return self.shape()[_norm_axis(dim, self.ndim, self, "size")]

    @property
    def loop(self) -> list[IterDomain]:
        return self.domain.loop

    @property
    def logical(self) -> list[IterDomain]:
        return self.domain.logical

    def axis(self, i: int) -> IterDomain:
        """The loop axis at position ``i`` (negative counts from the end)."""
        return self.loop[_norm_axis(i, len(self.loop), self, "axis")]

    @property
    def is_output(self) -> bool:
        return self.fusion is not None and self in self.fusion.outputs

    # ------------------------------------------------------- transforms
    def split(self, axis: int, factor: int, inner_split: bool = True) -> TensorView:
        """Split loop axis ``axis`` by ``factor``; returns self for chaining.

        >>> # tv.split(0, 128): [I] -> [ceilDiv(I, 128), 128]
        """
        a = _norm_axis(axis, len(self.loop), self, "split")
        outer, inner = split(self.loop[a], factor, inner_split)
        self.loop[a : a + 1] = [outer, inner]
        return self

    def merge(self, axis_o: int, axis_i: int | None = None) -> TensorView:
        """Merge loop axes ``axis_o`` and ``axis_i`` (default ``axis_o + 1``)."""
        n = len(self.loop)
        a = _norm_axis(axis_o, n, self, "merge")
        b = a + 1 if axis_i is None else _norm_axis(axis_i, n, self, "merge")
        if b >= n or a == b:
            raise CircbufError(f"merge: axis {b} out of range for {self.name} with {n} loop axes")
        try:
            out = merge(self.loop[a], self.loop[b])
        except CircbufError as e:
            raise CircbufError(f"{self.name}: {e}") from None
        lo = min(a, b)
        new = [x for k, x in enumerate(self.loop) if k not in (a, b)]
        new.insert(lo, out)
        self.domain.loop = new
        return self

    def reorder(self, order) -> TensorView:
        """Reorder loop axes. ``order`` is ``{old: new}`` or a permutation list
        ``[old positions in new order]``.

        >>> # tv.reorder({0: 1, 1: 0}) swaps the first two axes
        """
        n = len(self.loop)
        if isinstance(order, (list, tuple)):
            perm = [_norm_axis(o, n, self, "reorder") for o in order]
            if sorted(perm) != list(range(n)):
                raise CircbufError(f"reorder: {list(order)} is not a permutation of {n} axes")
            self.domain.loop = [self.loop[p] for p in perm]
            return self
        mapping = {
            _norm_axis(k, n, self, "reorder"): _norm_axis(v, n, self, "reorder") for k, v in order.items()
        }
        if len(set(mapping.values())) != len(mapping):
            raise CircbufError(f"reorder: two axes sent to one position in {order}")
        new = [None] * n
        for old, pos in mapping.items():
            new[pos] = self.loop[old]
        rest = iter(x for k, x in enumerate(self.loop) if k not in mapping)
        self.domain.loop = [x if x is not None else next(rest) for x in new]
        return self

    def parallelize(self, axis: int, ptype: ParallelType) -> TensorView:
        """``tv.parallelize(0, ParallelType.BIDx)``; same as ``tv.axis(0).parallelize``."""
        self.axis(axis).parallelize(ptype)
        return self

    def inline_at(self, pos: int) -> TensorView:
        """Compute this tensor inside the first ``pos`` loops of its consumers."""
        if self.is_input:
            raise CircbufError(f"inline_at: {self.name} is a fusion input; it is not computed")
        if not 0 <= pos <= len(self.loop):
            raise CircbufError(
                f"inline_at: position {pos} out of range for {self.name} ({len(self.loop)} axes)"
            )
        self.compute_at_pos = pos
        return self

    compute_at = inline_at

    def set_allocation(self, order) -> TensorView:
        """The allocation domain of a shared buffer: IterDomains of its
        transforms (logical, split or merged axes), outermost first; the
        buffer is row-major over them instead of over its loop axes right of
        the compute-at position (a [rows][cols] staging tile whose threads own
        the wgmma fragment layout). Global tensors lie as their strides say
        (the kernel is specialized for their memory order).

        >>> # cs.set_allocation([warpgroup_axis, row_axis, col_axis])
        """
        if self.memory_type != MemoryType.Shared:
            raise CircbufError(
                f"set_allocation({self.name}): only shared buffers take an allocation domain "
                f"(it is {self.memory_type.name})"
            )
        from .fusion import transform_history

        known = {i.id for i in self.logical}
        for t in transform_history(self):
            known.update(o.id for o in t.outputs)
        for ax in order:
            if not isinstance(ax, IterDomain) or ax.id not in known:
                raise CircbufError(
                    f"set_allocation({self.name}): {ax} is not an axis of {self.name}'s transforms"
                )
        self.domain.allocation = list(order)
        return self

    def set_memory_type(self, mt: MemoryType) -> TensorView:
        if self.fusion is not None:
            self.fusion._caches_added = True
        if (self.is_input or self.is_output) and mt != MemoryType.Global:
            raise CircbufError(f"{self.name} is a fusion input/output and must stay in global memory")
        self.memory_type = mt
        return self

    def cache_after(self, op: str = "set", vector: int = 1) -> TensorView:
        """Insert ``c = set(self)`` and make every other use of self read ``c``.

        The cache starts in local memory. ``op="tma"`` (a bulk tensor copy per
        box of its ``Bulk`` axes) and ``op="cp.async"`` (the threads copy the
        same box, ``vector`` elements per copy: 16, 8 or 4 bytes) put it in
        shared memory; both are circular-buffered (``circular_buffer``).

        >>> # xs = x.cache_after(op="cp.async", vector=4); xs.inline_at(3); xs.circular_buffer(2)
        """
        if op not in ("set", "tma", "cp.async"):
            raise CircbufError(
                f"cache_after: op={op!r} is not supported (supported: 'set', 'tma', 'cp.async')"
            )
        if op != "set" and not (self.is_input and self.memory_type == MemoryType.Global):
            raise CircbufError(f"cache_after(op={op!r}): {self.name} must be a global fusion input")
        if op == "cp.async" and (vector * self.dtype.size not in (4, 8, 16)):
            raise CircbufError(
                f"cache_after(op='cp.async', vector={vector}): a copy of {vector} x {self.dtype.size} bytes "
                "is not 4, 8 or 16 bytes"
            )
        fusion = self._need_fusion("cache_after")
        fusion._caches_added = True
        uses = list(self.uses)
        mem = MemoryType.Local if op == "set" else MemoryType.Shared
        c = TensorView([i.clone() for i in self.domain.no_reductions()], self.dtype, mem)
        for i in c.logical:
            i.parallel_type = ParallelType.Serial
        fusion.register(c)
        LoadStoreOp(c, self, kind=op, vector=vector if op == "cp.async" else 1)
        for e in uses:
            e.replace_input(self, c)
        return c

    def cache_before(self, op: str = "set") -> TensorView:
        """Make the definition of self write a new ``c``; self = set(c).

        ``op="tma"`` (self a global fusion output): ``c`` lives in shared
        memory and one bulk tensor copy per box stores it to self; the box is
        made of self's ``Bulk`` axes.

        ``op="rows"`` (self a global fusion output): ``c`` lives in shared
        memory too and the threads store it a row piece at a time
        (``self = rows(c)``): self's loop nest walks the tile's rows with
        consecutive threads on consecutive columns; its innermost axis,
        parallelized ``Vectorize``, is a pair of elements that each thread
        stores with one access as wide as the row's alignment in memory allows
        (a row of an odd-width 16-bit output starts 2-byte aligned every other
        row: there the 4-byte pieces start one element earlier, and the tile
        row's first and last elements are stored alone).

        >>> # ys = y.cache_before(op="tma"); ys.inline_at(2); y.axis(2).parallelize(ParallelType.Bulk)
        """
        if op not in ("set", "tma", "rows"):
            raise CircbufError(f"cache_before: op={op!r} is not supported (supported: 'set', 'tma', 'rows')")
        fusion = self._need_fusion("cache_before")
        if op != "set" and not (self in fusion.outputs and self.memory_type == MemoryType.Global):
            raise CircbufError(f"cache_before(op={op!r}): {self.name} must be a global fusion output")
        fusion._caches_added = True
        d = self.definition
        if d is None:
            raise CircbufError(f"cache_before: {self.name} has no definition (is it an input?)")
        mem = MemoryType.Shared if op in ("tma", "rows") else MemoryType.Local
        c = TensorView([i.clone() for i in self.logical], self.dtype, mem)
        if self.domain.has_root:  # a reshape's output: the cache is the reshape now
            c.domain = self.domain.clone()
        for i in c.logical:
            i.parallel_type = ParallelType.Serial
        fusion.register(c)
        d.replace_output(self, c)
        # axes joined to self's (a broadcast of a broadcast made one) are c's now:
        # self's axes are replaced by fresh ones below, which the copy joins to c's
        mine = {id(i): k for k, i in enumerate(self.logical + self.domain.root)}
        cs = c.logical + c.domain.root
        c.joined_axes = [(a, cs[mine[id(b)]]) for a, b in self.joined_axes if id(b) in mine]
        self.joined_axes = []
        self.domain = TensorDomain(
            [i.clone() for i in c.domain.no_reductions()], self.domain.contiguity, self.domain.stride_order
        )
        for i in self.logical:
            i.parallel_type = ParallelType.Serial
        LoadStoreOp(self, c, kind=op)
        return c

    def _need_fusion(self, what):
        if self.fusion is None:
            raise CircbufError(f"{what}: {self.name} is not part of a fusion")
        return self.fusion

    def swizzle(self, nbytes: int) -> TensorView:
        """Lay this shared-memory buffer out with the hardware's XOR swizzle:
        within each span of ``nbytes`` (128, 64 or 32) the 16-byte chunk
        index is XORed with the row index, rows being ``nbytes`` long
        (CUTLASS's Swizzle<3,4,3>, <2,4,3>, <1,4,3>). TMA copies (the tensor
        map's swizzle mode), wgmma descriptors and the threads' own accesses
        are all derived from it; each stage is aligned to 1024 bytes. The
        buffer's innermost allocated axis must span exactly ``nbytes``.

        >>> # As.swizzle(128)   # [rows][64 bf16] tiles read by wgmma without bank conflicts
        """
        if nbytes not in (32, 64, 128):
            raise CircbufError(f"swizzle({nbytes}): must be 32, 64 or 128 bytes")
        if self.memory_type != MemoryType.Shared:
            raise CircbufError(
                f"swizzle({self.name}): only shared-memory buffers are swizzled (it is {self.memory_type.name})"
            )
        self.swizzle_bytes = nbytes
        return self

    def take_turns(self, ptype: ParallelType) -> TensorView:
        """The two thread groups of ``ptype`` (ping-pong warpgroups, each on its
        own tiles) take turns: one issues this MMA output's tensor-core work
        while the other runs its epilogue, ordered by a pair of barriers.

        >>> # acc.take_turns(ParallelType.TIDy)
        """
        if not isinstance(self.definition, Expr) or self.definition.op_name != "mma":
            raise CircbufError(f"take_turns({self.name}): only an MMA's output takes turns")
        if not any(a.parallel_type == ptype for a in self.loop):
            raise CircbufError(f"take_turns({self.name}): no axis of {self.name} is bound to {ptype.value}")
        self.turns = ptype
        return self

    def circular_buffer(
        self, stages: int, prefetch: int | None = None, type=None, axis: int | None = None
    ) -> TensorView:
        """Pipeline this shared-memory TMA buffer over the innermost serial loop
        left of its compute-at position (or over loop axis ``axis``): ``stages``
        slots, ``prefetch`` loads in flight (default ``stages - 1``), ``type``
        Pipelined() or WarpSpecialized(). A buffer not inlined into its readers
        (compute-at 0) runs its copies in a loop nest of its own; each stage
        holds its loop axes right of ``axis``.

        >>> # xs = x.cache_after(op="tma"); xs.inline_at(2); xs.circular_buffer(3)
        """
        from .circular import Pipelined, WarpSpecialized

        type = Pipelined() if type is None else type
        if not isinstance(type, (Pipelined, WarpSpecialized)):
            raise CircbufError(
                f"circular_buffer: type must be Pipelined(...) or WarpSpecialized(...), got {type!r}"
            )
        if not isinstance(stages, int) or stages < 2:
            raise CircbufError(f"circular_buffer({self.name}): stages must be an int >= 2, got {stages!r}")
        prefetch = stages - 1 if prefetch is None else prefetch
        if not isinstance(prefetch, int) or not 0 < prefetch < stages:
            raise CircbufError(
                f"circular_buffer({self.name}): prefetch must satisfy 0 < prefetch < stages ({stages}), got {prefetch!r}"
            )
        if self.memory_type != MemoryType.Shared:
            raise CircbufError(
                f"circular_buffer({self.name}): the tensor must be in shared memory (it is {self.memory_type.name})"
            )
        d = self.definition
        is_tma = isinstance(d, LoadStoreOp) and d.kind in ("tma", "cp.async")  # copies into the ring
        if isinstance(type, WarpSpecialized) and not is_tma and type.fill != "threads":
            raise CircbufError(
                f"circular_buffer({self.name}): a warp-specialized buffer must be filled by TMA or cp.async "
                "(or by its writers' threads: WarpSpecialized(fill='threads', readers=...))"
            )
        if isinstance(type, WarpSpecialized) and type.fill == "threads" and is_tma:
            raise CircbufError(
                f"circular_buffer({self.name}): a TMA- or cp.async-filled buffer cannot have fill='threads'"
            )
        if axis is not None:
            a = _norm_axis(axis, len(self.loop), self, "circular_buffer")
            if self.loop[a].parallel_type not in (ParallelType.Serial, ParallelType.Unroll):
                raise CircbufError(
                    f"circular_buffer({self.name}): ring axis {a} ({self.loop[a]}) must be a serial loop"
                )
            if self.compute_at_pos and a >= self.compute_at_pos:
                raise CircbufError(
                    f"circular_buffer({self.name}): ring axis {a} must be left of the compute-at position "
                    f"({self.compute_at_pos})"
                )
            self.ring_axis = a
        if self.circular_buffer_axis() is None:
            raise CircbufError(
                f"circular_buffer({self.name}): no serial loop left of its compute-at position "
                f"({self.compute_at_pos}) to buffer over"
            )
        self.circular = (stages, prefetch, type)
        if self.fusion is not None:
            self.fusion._caches_added = True
        return self

    def circular_buffer_axis(self) -> int | None:
        """Position of the loop the buffer rotates over: the innermost serial
        axis left of its compute-at position, or, for a buffer not inlined
        into its readers (its copies form a loop nest of their own, as a
        matmul's operand tiles do), left of its first bulk (box) axis."""
        if self.ring_axis is not None:
            return self.ring_axis
        end = self.compute_at_pos
        if end == 0:
            end = next((k for k, a in enumerate(self.loop) if a.parallel_type == ParallelType.Bulk), 0)
        for k in range(end - 1, -1, -1):
            ax = self.loop[k]
            if ax.parallel_type in (ParallelType.Serial, ParallelType.Unroll) and not ax.is_broadcast:
                return k
        return None

    # ---------------------------------------------------------- printing
    def __str__(self):
        ids = ", ".join(str(i) for i in self.loop)
        s = f"{self.name}_{self.memory_type.value}_{self.dtype.short}[{ids}]"
        if self.compute_at_pos:
            s += f" ca_pos({self.compute_at_pos})"
        if self.swizzle_bytes:
            s += f" swizzle({self.swizzle_bytes}B)"
        if self.circular:
            s += f" circular_buffer(stages={self.circular[0]}, prefetch={self.circular[1]}, {self.circular[2]})"
        return s

    __repr__ = __str__


def _norm_axis(i, n, tv, what):
    if not isinstance(i, int) or not -n <= i < n:
        raise CircbufError(f"{what}: axis {i} out of range for {tv.name} with {n} axes")
    return i % n


# ------------------------------------------------------------------ exprs
class Expr:
    """A node of the fusion DAG. ``inputs`` may hold TensorViews and Scalars."""

    def __init__(self, outputs, inputs):
        self.outputs = list(outputs)
        self.inputs = list(inputs)
        for o in self.outputs:
            o.definition = self
        for i in self.inputs:
            if isinstance(i, TensorView):
                i.uses.append(self)

    @property
    def out(self) -> TensorView:
        return self.outputs[0]

    def tv_inputs(self) -> list[TensorView]:
        return [i for i in self.inputs if isinstance(i, TensorView)]

    def replace_input(self, old, new):
        self.inputs = [new if i is old else i for i in self.inputs]
        if self in old.uses:
            old.uses.remove(self)
        new.uses.append(self)

    def replace_output(self, old, new):
        self.outputs = [new if o is old else o for o in self.outputs]
        new.definition = self
        old.definition = None

    def logical_map(self, producer: TensorView) -> list[tuple[IterDomain, IterDomain]]:
        """Pairs (producer logical axis, consumer logical axis)."""
        return list(zip(producer.domain.no_reductions(), self.out.logical))

    def _operand_str(self, x):
        return x.name if isinstance(x, TensorView) else str(x)

    def __str__(self):
        args = ", ".join(self._operand_str(i) for i in self.inputs)
        return f"{self.out.name} = {self.op_name}({args})"


class UnaryOp(Expr):
    """``out = op(in)``. The input is in the type the op computes in (the
    frontend casts it); ``out`` has that type, or Bool for a predicate."""

    OPS = (
        # keep the type (ints too)
        "neg",
        "abs",
        "relu",
        "floor",
        "ceil",
        "round",
        "trunc",
        "bitwise_not",
        # floating point
        "exp",
        "exp2",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "tanh",
        "sigmoid",
        "gelu",
        "silu",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "erfc",
        "erfinv",
        "erfcinv",
        "lgamma",
        "log1p",
        "expm1",
        "log2",
        "log10",
        "frac",
    )
    # Bool results, computed on the input's type
    PREDICATES = ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "isreal", "signbit")

    def __init__(self, op, out, in_):
        assert op in self.OPS or op in self.PREDICATES, op
        self.op_name = op
        super().__init__([out], [in_])


class CastOp(Expr):
    op_name = "cast"

    def __init__(self, out, in_):
        super().__init__([out], [in_])

    def __str__(self):
        return f"{self.out.name} = cast({self._operand_str(self.inputs[0])}, {self.out.dtype.name})"


class BinaryOp(Expr):
    """``out = op(a, b)``; both operands in one type (the frontend casts them)."""

    OPS = (
        "add",
        "sub",
        "mul",
        "div",  # integers: truncation toward zero, as C
        "truediv",
        "maximum",
        "minimum",
        "lt",
        "le",
        "gt",
        "ge",
        "eq",
        "ne",
        "pow",
        "fmod",
        "remainder",
        "mod",
        "atan2",
        "nextafter",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "logical_right_shift",
        "gcd",
    )

    def __init__(self, op, out, a, b):
        assert op in self.OPS, op
        self.op_name = op
        super().__init__([out], [a, b])


class TernaryOp(Expr):
    op_name = "where"

    def __init__(self, out, cond, a, b):
        super().__init__([out], [cond, a, b])


class FullOp(Expr):
    """``out`` filled with one scalar (nvFuser's FullOp); no tensor inputs."""

    op_name = "full"

    def __init__(self, out, fill: Scalar):
        super().__init__([out], [fill])

    def __str__(self):
        shape = ", ".join(str(i.extent) for i in self.out.logical)
        return f"{self.out.name} = full({{{shape}}}, {self._operand_str(self.inputs[0])})"


class LoadStoreOp(Expr):
    """A copy between memories (``set``); ``stride_order`` shows when the
    copy is allocated in another layout (``ops.stride_order``). A TMA copy
    may land in a buffer with broadcast axes (``is_broadcast_dim``): a
    matmul operand tile ``[M, K]`` staged as ``[M, 1, K]``, so that its loop
    nest can iterate over the output's N tiles as well; the same box lands
    once per iteration of those axes."""

    op_name = "set"

    def __init__(self, out, in_, kind: str = "set", is_broadcast_dim=None, vector: int = 1):
        self.kind = kind
        self.is_broadcast_dim = list(is_broadcast_dim) if is_broadcast_dim else None
        self.vector = vector  # kind "cp.async": elements per copy
        super().__init__([out], [in_])

    def logical_map(self, producer):
        if self.is_broadcast_dim is None:
            return super().logical_map(producer)
        cons = [c for c, b in zip(self.out.logical, self.is_broadcast_dim) if not b]
        return list(zip(producer.domain.no_reductions(), cons))

    def __str__(self):
        so = self.out.domain.stride_order
        if so is None:
            return super().__str__()
        return f"{self.out.name} = set({self._operand_str(self.inputs[0])}, stride_order={so})"


class BroadcastOp(Expr):
    """Insert broadcast axes where ``is_broadcast_dim`` is True."""

    op_name = "broadcast"

    def __init__(self, out, in_, is_broadcast_dim):
        self.is_broadcast_dim = list(is_broadcast_dim)
        super().__init__([out], [in_])

    def logical_map(self, producer):
        cons = [c for c, b in zip(self.out.logical, self.is_broadcast_dim) if not b]
        return list(zip(producer.domain.no_reductions(), cons))

    def __str__(self):
        flags = "".join("b" if b else "i" for b in self.is_broadcast_dim)
        return f"{self.out.name} = broadcast({self.inputs[0].name}, {flags})"


class ViewExpr(Expr):
    """A view of its input: the same elements, indexed another way (no
    arithmetic, no copy in the math). Lowered as a copy wherever the schedule
    materializes the output; the schedulers see through it by ``logical_map``
    (and, for a reshape, the root-to-logical transforms of its output)."""

    is_view = True


class PermuteOp(ViewExpr):
    """``out`` axis ``k`` is input axis ``dims[k]`` (torch.permute)."""

    op_name = "permute"

    def __init__(self, out, in_, dims):
        self.dims = list(dims)
        super().__init__([out], [in_])

    def logical_map(self, producer):
        src = producer.domain.no_reductions()
        return [(src[d], self.out.logical[k]) for k, d in enumerate(self.dims)]

    def __str__(self):
        return f"{self.out.name} = permute({self.inputs[0].name}, dims={self.dims})"


class SqueezeOp(ViewExpr):
    """Drop the input axes ``dims``, each of extent 1."""

    op_name = "squeeze"

    def __init__(self, out, in_, dims):
        self.dims = sorted(dims)
        super().__init__([out], [in_])

    def logical_map(self, producer):
        kept = [a for k, a in enumerate(producer.domain.no_reductions()) if k not in self.dims]
        return list(zip(kept, self.out.logical))

    def __str__(self):
        return f"{self.out.name} = squeeze({self.inputs[0].name}, dims={self.dims})"


class ReshapeOp(ViewExpr):
    """``out = reshape(in, shape)``, row-major as ``torch.reshape``.

    ``out``'s logical axes have the new shape. Once the input's sizes are
    known (when it is defined, for fixed sizes; else at each compile, from the
    actual sizes) :func:`circbuf.ir.view.concretize` gives ``out`` a root
    domain, one axis per input axis (``logical_map`` pairs them), and derives
    the logical axes from the root axes by exact splits and merges: both
    shapes are cut into groups of equal size (in [6, 4] -> out [2, 3, 4]:
    {6} -> {2, 3} and {4} -> {4}); a group's root axes are merged and the
    result split into its logical axes; a group of one axis each way keeps
    the one axis. Indexing walks from the logical axes back to the root ones
    through these transforms, as through any split or merge, so the view
    costs index math, not a copy.

    Before concretization ``logical_map`` is empty: the schedulers never see
    a reshape that is not concrete.
    """

    op_name = "reshape"

    def __init__(self, out, in_):
        super().__init__([out], [in_])
        self.groups = None  # ((input axes), (output axes)) per group, once concrete

    @property
    def concrete(self) -> bool:
        return self.groups is not None

    def logical_map(self, producer):
        if not self.concrete:
            return []
        return list(zip(producer.domain.no_reductions(), self.out.domain.root))

    def __str__(self):
        shape = ", ".join(str(i.extent) for i in self.out.logical)
        return f"{self.out.name} = reshape({self.inputs[0].name}, [{shape}])"


class ReductionOp(Expr):
    """``out`` keeps the reduced axes as reduction IterDomains."""

    OPS = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}

    def __init__(self, op, out, in_, init: Const):
        assert op in self.OPS, op
        self.op_name = op
        self.init = init
        super().__init__([out], [in_])

    def logical_map(self, producer):
        """The input's axes map to the output's root axes: its logical ones, or for
        a partial reduction (an rfactor) the axes its logical ones are split from."""
        return list(zip(producer.domain.no_reductions(), self.out.domain.root))

    def __str__(self):
        dims = [k for k, i in enumerate(self.out.logical) if i.is_reduction]
        if self.out.domain.has_root:  # a partial reduction: the root axes it reduces part of
            dims = [k for k, i in enumerate(self.out.domain.root) if i.is_reduction]
            kept = ", ".join(f"{'r' if i.is_reduction else 'i'}{i.extent}" for i in self.out.logical)
            return (
                f"{self.out.name} = partial {self.op_name}({self.inputs[0].name}, dims={dims} as [{kept}], "
                f"init={self.init})"
            )
        return f"{self.out.name} = {self.op_name}({self.inputs[0].name}, dims={dims}, init={self.init})"


class _Contraction(Expr):
    """Base of the exprs that contract an axis of two operands. ``maps[k]``
    pairs (axis of input k, axis of ``out``) for the axes that carry over;
    axes of an input absent from its map are contracted (K)."""

    def __init__(self, out, inputs, maps):
        self.maps = [list(m) for m in maps]
        super().__init__([out], inputs)

    def logical_map(self, producer):
        out = []
        for k, x in enumerate(self.inputs):
            if x is producer:
                ids = producer.domain.no_reductions()
                out += [(ids[i], self.out.logical[j]) for i, j in self.maps[k]]
        return out


class MatmulOp(_Contraction):
    """``out = a @ b`` with torch.matmul's semantics (batch axes broadcast,
    1-D operands as torch treats them): one expr of the fusion math, in the
    inputs' dtype, accumulated in fp32. The matmul scheduler translates it
    to MMA form (or, where the tensor cores cannot take it, to a sum of
    products)."""

    op_name = "matmul"

    def __init__(self, out, a, b, maps, k_axes):
        self.k_axes = tuple(k_axes)  # the contracted axis of a and of b
        super().__init__(out, [a, b], maps)


class LinearOp(_Contraction):
    """``out = x @ w.T (+ bias)`` with w ``[N, K]``, as
    ``torch.nn.functional.linear``; like :class:`MatmulOp` one expr."""

    op_name = "linear"

    def __init__(self, out, x, w, bias, maps):
        self.k_axes = (len(x.domain.no_reductions()) - 1, len(w.domain.no_reductions()) - 1)
        super().__init__(out, [x, w] + ([bias] if bias is not None else []), maps)


class MmaOp(_Contraction):
    """The MMA form of a matmul: ``out[b.., m, n, rk] = sum_k a[.., m, k] * b[.., k, n]``
    in ``out``'s dtype (fp32). ``roles[k][i]`` names what axis ``i`` of
    operand ``k`` is: ``"B"`` (batch), ``"M"``, ``"N"`` or ``"K"``; the
    memory layout of each operand (K-major or MN-major) is read off the
    shared-memory buffers that feed it when it is lowered."""

    op_name = "mma"

    def __init__(self, out, a, b, roles):
        self.roles = [list(r) for r in roles]
        pos = {}  # role -> out axis positions
        axes = out.logical
        batch = [j for j, i in enumerate(axes) if not i.is_reduction][:-2]
        pos["M"], pos["N"] = len(batch), len(batch) + 1
        pos["K"] = next(j for j, i in enumerate(axes) if i.is_reduction)
        maps = []
        for r in self.roles:
            m, nb, seen = [], r.count("B"), 0
            for i, role in enumerate(r):
                if role == "B":  # an operand's batch axes align with out's innermost ones
                    m.append((i, batch[len(batch) - nb + seen]))
                    seen += 1
                else:
                    m.append((i, pos[role]))
            maps.append(m)
        super().__init__(out, [a, b], maps)

    def __str__(self):
        ra, rb = ("".join(r) for r in self.roles)
        return f"{self.out.name} = mma({self.inputs[0].name} [{ra}], {self.inputs[1].name} [{rb}])"


class ExpandOp(BroadcastOp):
    """Give the input's broadcast axes an extent (``expanded_extent``), as
    ``torch.expand``; no new axes."""

    op_name = "expand"

    def __init__(self, out, in_):
        super().__init__(out, in_, [False] * len(out.logical))

    def __str__(self):
        shape = ", ".join(str(i.loop_extent) for i in self.out.logical)
        return f"{self.out.name} = expand({self.inputs[0].name}, [{shape}])"


# Exprs whose output element at a position is computed from the input
# elements at that position only (broadcast axes read their one element):
# they inherit the inputs' layout, commute with broadcasts, may read an input
# they write in place, and may be a matmul's epilogue.
ELEMENTWISE = (UnaryOp, BinaryOp, TernaryOp, CastOp, LoadStoreOp)


def reduction_init(op: str, dtype: DataType) -> Const:
    if op == "sum":
        return Const(0.0 if dtype.is_float else 0, dtype)
    if op == "prod":
        return Const(1.0 if dtype.is_float else 1, dtype)
    big = {
        DataType.Int32: 2**31 - 1,
        DataType.Int64: 2**63 - 1,
        DataType.Bool: 1,
    }.get(dtype, float("inf"))
    v = -big if op == "max" else big
    if dtype == DataType.Int32 and op == "max":
        v = -(2**31)
    if dtype == DataType.Int64 and op == "max":
        v = -(2**63)
    if dtype == DataType.Bool:
        v = op == "min"
    return Const(v, dtype)


__all__ = [
    "ELEMENTWISE",
    "MemoryType",
    "TensorDomain",
    "TensorView",
    "Expr",
    "UnaryOp",
    "CastOp",
    "BinaryOp",
    "TernaryOp",
    "FullOp",
    "LoadStoreOp",
    "BroadcastOp",
    "ExpandOp",
    "ViewExpr",
    "PermuteOp",
    "SqueezeOp",
    "ReshapeOp",
    "ReductionOp",
    "MatmulOp",
    "LinearOp",
    "MmaOp",
    "IterType",
    "reduction_init",
]
