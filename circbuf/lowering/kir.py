"""Kernel IR: the loop nest the CUDA code is printed from.

Nodes are plain classes. ``print(kernel)`` shows the nest, e.g.::

    kernel pointwise_kernel(T0, T1) grid(ceilDiv(i0, 1024)) block(128)
      alloc T2_l_bf16[8]
      FOR j0 in 0..1 (unroll)
        T2[j0 * 8] = vec8 T0[...]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..ir import Bin, CircbufError, Const, DataType, Expr, MemoryType, ParallelType, Scalar, TensorView, Var
from ..ir.scalar import is_const
from ..target import DEFAULT, Target


@dataclass(frozen=True)
class TargetNeed:
    """What a node needs of the GPU target: compute capability ``sm`` or later;
    with ``specific``, an arch-specific target (``sm_90a``; later ``a`` and
    family ``f`` targets such as ``sm_100f`` keep setmaxnreg); with ``exact``,
    that one target only (wgmma exists on sm_90a alone).

    >>> need = TargetNeed("setmaxnreg", 90, specific=True)
    >>> need.allows(90, "a"), need.allows(90, ""), need.allows(100, "a"), str(need)
    (True, False, True, 'an arch-specific target: sm_90a, or a later sm_XYa')
    >>> TargetNeed("wgmma", 90, specific=True, exact=True).allows(100, "a")
    False
    """

    what: str
    sm: int
    specific: bool = False
    exact: bool = False

    def allows(self, sm: int, suffix: str) -> bool:
        if self.exact:
            return sm == self.sm and (not self.specific or suffix == "a")
        return sm >= self.sm and (not self.specific or suffix in ("a", "f"))

    def __str__(self):
        if self.exact:
            return f"sm_{self.sm}{'a' if self.specific else ''} only"
        if self.specific:
            return f"an arch-specific target: sm_{self.sm}a, or a later sm_XYa"
        return f"sm_{self.sm} or later"


class Node:
    needs: TargetNeed | None = None  # what the node's instructions need of the target

    def lines(self, ind: int) -> list[str]:
        raise NotImplementedError


def _block(nodes, ind):
    out = []
    for n in nodes:
        out += n.lines(ind)
    return out


@dataclass(eq=False)
class ForLoop(Node):
    """``for (index = start; index < extent; index += step)``. A loop over
    the outer part of a split whose inner part is a block index (a
    persistent grid) strides: ``start = blockIdx.x``, ``step = gridDim.x``,
    and ``index`` is then the split's input index itself."""

    index: Var
    extent: Scalar
    body: list = field(default_factory=list)
    ptype: ParallelType = ParallelType.Serial
    key: int = -1  # loop class of the IterDomains this loop iterates
    unroll: bool = False
    start: Scalar = field(default_factory=lambda: Const(0))
    step: Scalar = field(default_factory=lambda: Const(1))
    unroll_by: int = 0  # kept a loop, unrolled this many iterations at a time (IterDomain.unroll)

    @property
    def strided(self) -> bool:
        return not (is_const(self.start, 0) and is_const(self.step, 1))

    def lines(self, ind):
        tag = f" ({self.ptype.value})" if self.ptype != ParallelType.Serial else ""
        tag += " unroll" if self.unroll else ""
        tag += f" unroll {self.unroll_by}" if self.unroll_by else ""
        rng = f"{self.start}..{self.extent} step {self.step}" if self.strided else f"0..{self.extent}"
        head = "  " * ind + f"FOR {self.index} in {rng}{tag}"
        return [head] + _block(self.body, ind + 1)


@dataclass(eq=False)
class Let(Node):
    """A named index value, computed once where it stands: ``const index_t var = value;``."""

    var: Var
    value: Scalar

    def lines(self, ind):
        return ["  " * ind + f"LET {self.var} = {self.value}"]


@dataclass(eq=False)
class IfThenElse(Node):
    cond: Scalar
    then: list = field(default_factory=list)
    else_: list = field(default_factory=list)

    def lines(self, ind):
        out = ["  " * ind + f"IF {self.cond}"] + _block(self.then, ind + 1)
        if self.else_:
            out += ["  " * ind + "ELSE"] + _block(self.else_, ind + 1)
        return out


@dataclass(eq=False)
class Allocate(Node):
    """A buffer. Shared buffers live in dynamic shared memory at ``offset``
    bytes; a circular buffer holds ``stages`` copies of ``size`` elements."""

    tv: TensorView
    size: object  # elements per stage (int, or Scalar for shared memory)
    memory: MemoryType
    stages: int = 1
    offset: object = None

    def lines(self, ind):
        st = f" x {self.stages} stages" if self.stages > 1 else ""
        at = f" @smem+{self.offset}" if self.offset is not None else ""
        return [
            "  " * ind
            + f"ALLOC {self.tv.name}_{self.memory.value}_{self.tv.dtype.short}[{self.size}]{st}{at}"
        ]


@dataclass(eq=False)
class ExprStmt(Node):
    """A fusion expr placed in the nest, before indexing.
    ``index`` maps the ids of the output's loop axes to index scalars."""

    expr: Expr
    index: dict

    def lines(self, ind):
        return ["  " * ind + str(self.expr)]


@dataclass(eq=False)
class ReductionInit(Node):
    expr: Expr
    index: dict

    def lines(self, ind):
        return ["  " * ind + f"{self.expr.out.name} = {self.expr.init}  // init"]


@dataclass(eq=False)
class BlockReduce(Node):
    """Combine the partial results of a reduction across thread axes."""

    expr: Expr
    index: dict
    ptypes: tuple
    threads: int = 0
    ref: object = None  # TensorRef after indexing
    barrier: tuple = (0, 0)  # (named barrier id, threads); (0, 0): __syncthreads

    def lines(self, ind):
        axes = ",".join(p.value for p in self.ptypes)
        tgt = self.ref if self.ref is not None else self.expr.out.name
        return ["  " * ind + f"{tgt} = block_reduce[{axes}]({self.expr.op_name})"]


@dataclass(eq=False)
class TensorRef:
    """``tv[index]``; ``vector`` > 1 reads/writes that many elements at once."""

    tv: TensorView
    index: Scalar
    vector: int = 1

    def __str__(self):
        v = f"vec{self.vector} " if self.vector > 1 else ""
        return f"{v}{self.tv.name}[{self.index}]"


@dataclass(eq=False)
class RowPiece:
    """What a row store (``LoadStoreOp`` kind ``"rows"``: a global output
    written from its shared staging tile, :meth:`TensorView.cache_before`)
    needs beyond its copy: ``prev``, the staging element before the pair
    (where the row's 4-byte pieces start one element earlier; the CUDA helper
    finds it from the pair's address and the buffer's swizzle, the interpreter
    and the sync pass read this reference); ``col``, the
    pair's column in the staging row of ``width`` columns (the row's first
    and last elements are stored alone there); ``left``, the output row's
    elements in range from the pair's first (the guard holds ``left >= 1``)."""

    prev: TensorRef
    col: Scalar
    width: int
    left: Scalar

    def __str__(self):
        return f"row(prev {self.prev}, col {self.col} of {self.width}, left {self.left})"


@dataclass(eq=False)
class Assign(Node):
    """``lhs = op(operands)`` after indexing. ``op`` is the fusion expr (None for
    a plain copy or an init); ``operands`` are TensorRefs and Scalars."""

    lhs: TensorRef
    expr: Expr | None
    operands: list
    pred: list = field(default_factory=list)  # conditions that must hold
    touches_global: bool = False
    accumulate: bool = False  # reduction update: lhs = lhs op rhs
    init: Scalar | None = None
    fast: bool = False  # the op's fast approximate variant (set by the fast_math pass)
    row: RowPiece | None = None  # a row store's alignment facts (indexing)

    def lines(self, ind):
        if self.init is not None:
            rhs = str(self.init)
        else:
            args = ", ".join(str(o) for o in self.operands)
            rhs = f"{'fast_' * self.fast}{self.expr.op_name}({args})" if self.expr is not None else args
        row = f"  // {self.row}" if self.row is not None else ""
        return ["  " * ind + f"{self.lhs} = {rhs}{row}"]


@dataclass(eq=False)
class TensorMapSpec:
    """A tensor map the runtime encodes for a TMA copy of parameter
    ``param``: each map dim (innermost first) flattens the logical axes
    ``axes`` (outer to inner) and moves ``box`` elements per copy."""

    param: int
    dims: list  # list of (axes tuple, box)
    swizzle: int = 0  # bytes: the shared side's swizzle (0, 32, 64, 128)

    def __str__(self):
        sw = f", swizzle {self.swizzle}B" if self.swizzle else ""
        return f"tmap(param {self.param}, " + ", ".join(f"{list(a)}:{b}" for a, b in self.dims) + sw + ")"


@dataclass(eq=False)
class TmaLoad(Node):
    """One bulk tensor copy global -> shared, completing on ``bar``."""

    needs = TargetNeed("TMA loads (cp.async.bulk.tensor)", 90)
    dst: TensorRef
    map_index: int
    coords: list  # innermost first
    box_bytes: int
    bar: object = None  # MBarrierRef, set by the circular-buffer pass
    # the cluster axes (ParallelType.CIDx/CIDy) its box is a slice along: the copy lands
    # at the same offset in every CTA of the cluster that differs from this one only
    # along them (cluster_ctas), completing on each one's ``bar``; (): this CTA only
    multicast: tuple = ()

    def lines(self, ind):
        c = ", ".join(str(x) for x in self.coords)
        mc = f" multicast along {'/'.join(p.value for p in self.multicast)}" if self.multicast else ""
        return ["  " * ind + f"TMA_LOAD {self.dst} <- tmap{self.map_index}{{{c}}} on {self.bar}{mc}"]


@dataclass(eq=False)
class CpAsyncBox(Node):
    """The fill kind ``cp.async`` of a ring: the ``threads`` threads of the
    producer role (``threadIdx.x`` of its row) copy one box of global ``src``
    into shared ``dst``, which the box fills densely, innermost dim first, at
    the buffer's swizzled addresses (what a TMA copy of the same box writes,
    so the wgmma descriptors do not change). ``dims``: per box dim, innermost
    first, ``(axis of src, box extent, first coordinate, extent, stride)``.
    Thread ``t`` copies chunks ``t, t + threads, ...`` of ``vector`` elements:
    a ``cp.async`` of 16, 8 or 4 bytes whose src-size zero-fills what lies
    past the tensor's extents; or, ``through_registers`` (rows only 2-byte
    aligned: cp.async copies 4 bytes at least), 16 bytes of elements loaded
    one by one (along the inner dim's stride, zero past the extents) into
    registers and stored to shared memory at once. Completion:
    the ring's ``cp.async.mbarrier.arrive.noinc`` (:class:`CpAsyncArrive`), or
    for copies through registers a proxy fence and an arrive. ``flat``: the
    copying threads are all the CTA's, numbered by their linear index
    (``threadIdx.x`` fastest: a Pipelined ring every thread fills), not
    ``threadIdx.x`` alone. ``walk``: the box dim whose chunks consecutive
    threads take (0, the innermost, by default; a transposing copy walks the
    dim contiguous in global memory, so a warp's loads share sectors), ``run``
    elements of it (then the next row of the box's inner dim: a warp's
    element stores to shared memory spread over that many more banks)."""

    needs = TargetNeed("cp.async", 80)
    dst: TensorRef
    src: TensorView
    dims: list
    vector: int
    threads: int
    bar: object = None  # MBarrierRef of the stage's full barrier, set by the circular-buffer pass
    through_registers: bool = False
    flat: bool = False
    walk: int = 0
    run: int = 0  # elements of the walked dim consecutive threads take before the next row (0: all)

    @property
    def is_async(self) -> bool:
        return not self.through_registers

    @property
    def chunks(self) -> int:
        n = 1
        for d in self.dims:
            n *= d[1]
        assert n % self.vector == 0 and self.dims[0][1] % self.vector == 0
        return n // self.vector

    def parts(self, chunk: Scalar):
        """For chunk index ``chunk``: (the shared element index of its first
        element, unswizzled; the global element index; the condition that its
        first element is in range; the number of its elements in range)."""
        gidx, conds, inner = Const(0), [], None
        local = {}
        if self.walk == 0:  # dense: the chunk's elements are the box's, innermost dim first
            e = chunk * self.vector
            div = 1
            for k, (_axis, box, *_rest) in enumerate(self.dims):
                local[k] = (e // div) % box if k + 1 < len(self.dims) else e // div
                div *= box
        else:  # ``run`` of the walked dim first, then the dims innermost first (the walked one's rest)
            w = self.walk
            run = math.gcd(self.run or self.dims[w][1], self.dims[w][1])
            digits = [(w, run)] + [
                (k, self.dims[k][1] // (run if k == w else self.vector if k == 0 else 1))
                for k in range(len(self.dims))
            ]
            digits = [d for d in digits if d[1] > 1] or [(0, 1)]
            div, parts = 1, {}
            for j, (k, box) in enumerate(digits):
                x = (chunk // div) % box if j + 1 < len(digits) else chunk // div
                parts.setdefault(k, []).append((x, div))
                div *= box
            for k in range(len(self.dims)):
                got = parts.get(k, [])
                if k == w and len(got) == 2:  # the run, then the rest of the dim
                    local[k] = got[1][0] * run + got[0][0]
                else:
                    local[k] = got[0][0] if got else Const(0)
            local[0] = local[0] * self.vector
            e, mult = Const(0), 1
            for k, (_axis, box, *_rest) in enumerate(self.dims):
                e = e + local[k] * mult
                mult *= box
        for k, (_axis, _box, first, extent, stride) in enumerate(self.dims):
            x = first + local[k]
            gidx = gidx + x * stride
            if k == 0:
                inner = extent - x
            conds.append(x.lt(extent))
        cond = conds[0]
        for c in conds[1:]:
            cond = Bin("&&", cond, c)
        return self.dst.index + e, gidx, cond, inner

    def lines(self, ind):
        box = "x".join(str(d[1]) for d in reversed(self.dims))
        coords = ", ".join(str(d[2]) for d in self.dims)
        nbytes = self.vector * self.src.dtype.size
        how = f"cp.async {nbytes}B" if self.is_async else f"{self.vector} loads, st.shared {nbytes}B"
        return [
            "  " * ind + f"CP_ASYNC_BOX {self.dst} <- {self.src.name}{{{coords}}} box [{box}] ({how}, "
            f"{self.threads} threads) on {self.bar}"
        ]


@dataclass(eq=False)
class CpAsyncArrive(Node):
    """``cp.async.mbarrier.arrive.noinc``: one arrival on ``bar`` once every
    cp.async this thread issued before has landed (no pending count added:
    the barrier expects it among its arrivals)."""

    needs = TargetNeed("cp.async.mbarrier.arrive", 80)
    bar: object

    def lines(self, ind):
        return ["  " * ind + f"CP_ASYNC_ARRIVE.NOINC {self.bar}"]


@dataclass(eq=False)
class CpAsyncCommit(Node):
    """cp.async.commit_group: close this thread's open group of cp.asyncs."""

    needs = TargetNeed("cp.async", 80)

    def lines(self, ind):
        return ["  " * ind + "CP_ASYNC_COMMIT_GROUP"]


@dataclass(eq=False)
class CpAsyncWait(Node):
    """cp.async.wait_group: wait until at most ``pending`` of this thread's
    committed cp.async groups are in flight."""

    needs = TargetNeed("cp.async", 80)
    pending: int

    def lines(self, ind):
        return ["  " * ind + f"CP_ASYNC_WAIT_GROUP {self.pending}"]


@dataclass(eq=False)
class TmaStore(Node):
    """One bulk tensor copy shared -> global, in the issuing thread's bulk group."""

    needs = TargetNeed("TMA stores (cp.async.bulk.tensor)", 90)
    src: TensorRef
    map_index: int
    coords: list  # innermost first
    box_bytes: int
    out: object = None  # the global TensorView stored to (its thread axes say who stores)

    def lines(self, ind):
        c = ", ".join(str(x) for x in self.coords)
        return ["  " * ind + f"TMA_STORE tmap{self.map_index}{{{c}}} <- {self.src}"]


@dataclass(eq=False)
class BulkCommitGroup(Node):
    """Close the issuing thread's open bulk group (cp.async.bulk.commit_group)."""

    def lines(self, ind):
        return ["  " * ind + "BULK_COMMIT_GROUP"]


@dataclass(eq=False)
class BulkWaitGroup(Node):
    """Wait until at most ``pending`` bulk groups of this thread are in flight;
    ``read``: only until they have read their shared-memory source."""

    pending: int
    read: bool

    def lines(self, ind):
        return ["  " * ind + f"BULK_WAIT_GROUP{'.READ' if self.read else ''} {self.pending}"]


@dataclass(eq=False)
class ElectOne(Node):
    """``then`` runs on one lane (elect.sync) of the one full warp ``warp`` selects."""

    needs = TargetNeed("elect.sync", 90)
    warp: Scalar
    then: list = field(default_factory=list)

    def lines(self, ind):
        return ["  " * ind + f"IF elect_one({self.warp})"] + _block(self.then, ind + 1)


@dataclass(eq=False)
class MBarrierRef:
    name: str
    stage: object  # Scalar

    def __str__(self):
        return f"{self.name}[{self.stage}]"


@dataclass(eq=False)
class MBarrierAlloc(Node):
    name: str
    count: int

    def lines(self, ind):
        return ["  " * ind + f"ALLOC mbarrier {self.name}[{self.count}]"]


@dataclass(eq=False)
class MBarrierInit(Node):
    bar: MBarrierRef
    arrivals: object

    def lines(self, ind):
        return ["  " * ind + f"MBARRIER_INIT {self.bar} arrivals={self.arrivals}"]


@dataclass(eq=False)
class MBarrierInval(Node):
    bar: MBarrierRef

    def lines(self, ind):
        return ["  " * ind + f"MBARRIER_INVAL {self.bar}"]


@dataclass(eq=False)
class MBarrierArriveExpectTx(Node):
    needs = TargetNeed("mbarrier.expect_tx", 90)
    bar: MBarrierRef
    bytes: object

    def lines(self, ind):
        return ["  " * ind + f"MBARRIER_ARRIVE_EXPECT_TX {self.bar} bytes={self.bytes}"]


@dataclass(eq=False)
class MBarrierArrive(Node):
    """One arrival on ``bar``; with ``peers`` (a multicast ring's: the cluster axes of
    each of its multicast buffers) one on ``bar`` in every CTA of the cluster whose
    copies land in this one (``mapa`` + ``mbarrier.arrive.shared::cluster``), this
    CTA included."""

    bar: MBarrierRef
    peers: tuple = ()

    def lines(self, ind):
        if self.peers:
            along = ", ".join("/".join(p.value for p in a) for a in self.peers)
            return [
                "  " * ind
                + f"MBARRIER_ARRIVE {self.bar} in every CTA multicasting to this one (along {along})"
            ]
        return ["  " * ind + f"MBARRIER_ARRIVE {self.bar}"]


@dataclass(eq=False)
class ClusterSync(Node):
    """``barrier.cluster.arrive.release`` + ``barrier.cluster.wait.acquire``: every
    thread of every CTA of the cluster (a block-wide sync too)."""

    why: str = ""

    def lines(self, ind):
        return ["  " * ind + f"CLUSTER_SYNC  // {self.why}"]


def cluster_ctas(shape: tuple, along: tuple, cidx: int, cidy: int) -> list:
    """Ranks (cidx * cy + cidy) of the CTAs of a ``shape`` = (cx, cy) cluster that
    differ from CTA (cidx, cidy) only along the cluster axes ``along``.

    >>> cluster_ctas((2, 2), (ParallelType.CIDy,), 1, 0), cluster_ctas((2, 2), (ParallelType.CIDx,), 1, 0)
    ([2, 3], [0, 2])
    """
    cx, cy = shape
    xs = range(cx) if ParallelType.CIDx in along else [cidx]
    ys = range(cy) if ParallelType.CIDy in along else [cidy]
    return [x * cy + y for x in xs for y in ys]


def cluster_peers(shape: tuple, peers: tuple, cidx: int, cidy: int) -> list:
    """The union of :func:`cluster_ctas` over ``peers`` (a tuple of ``along``), in rank order."""
    out = set()
    for along in peers:
        out.update(cluster_ctas(shape, along, cidx, cidy))
    return sorted(out)


@dataclass(eq=False)
class MBarrierWait(Node):
    needs = TargetNeed("mbarrier.try_wait.parity", 90)
    bar: MBarrierRef
    parity: object

    def lines(self, ind):
        return ["  " * ind + f"MBARRIER_WAIT {self.bar} parity={self.parity}"]


@dataclass(eq=False)
class Fence(Node):
    """``mbarrier_init``: fence.mbarrier_init.release.cluster (barrier inits
    visible before any thread uses them); ``proxy_async``:
    fence.proxy.async.shared::cta (this thread's shared-memory writes visible
    to bulk copies issued after the next barrier)."""

    kind: str

    def lines(self, ind):
        return ["  " * ind + f"FENCE {self.kind}"]


@dataclass(eq=False)
class SetMaxNReg(Node):
    """setmaxnreg.{inc,dec}: move registers between warp roles."""

    needs = TargetNeed("setmaxnreg from WarpSpecialized(registers=...)", 90, specific=True)
    count: int
    increase: bool

    def lines(self, ind):
        return ["  " * ind + f"SETMAXNREG.{'INC' if self.increase else 'DEC'} {self.count}"]


@dataclass(eq=False)
class Return(Node):
    def lines(self, ind):
        return ["  " * ind + "RETURN"]


@dataclass(eq=False)
class RingSide:
    """One side's position in a circular buffer of ``stages`` slots: a stage
    index and a phase bit, carried as variables as a person writes them
    (``stage``, ``phase``), not recomputed from loop indices at every use."""

    name: str
    stages: int

    @property
    def stage(self) -> Var:
        return Var(f"{self.name}_stage", lo=0, hi=self.stages)

    @property
    def phase(self) -> Var:
        return Var(f"{self.name}_phase", lo=0, hi=2)


@dataclass(eq=False)
class Role:
    """A named group of warps or warpgroups of a warp-specialized kernel:
    the threads whose ``axis`` index lies in ``[lo, hi)`` (all of the faster
    thread axes), ``threads`` of them. ``registers``: the per-thread count it
    asks for with ``setmaxnreg`` (``increase``: .inc, else .dec), None: none.
    ``groups``: groups of threads along ``axis`` that each sync among
    themselves (two ping-pong warpgroups: 2). ``barrier``: the role's named
    barrier ``(id, threads)`` once allocated (:meth:`Kernel.role_barrier`);
    its block-wide syncs become that barrier.

    >>> r = Role("producer", lo=2, hi=3, threads=128, registers=40, increase=False)
    >>> str(r.cond), r.describe()
    ('(threadIdx.y == 2)', 'threadIdx.y == 2 (128 threads), setmaxnreg.dec 40')
    >>> str(Role("consumers", lo=0, hi=2, threads=256).cond)
    '(threadIdx.y < 2)'
    """

    name: str
    lo: int
    hi: int
    threads: int
    registers: int | None = None
    increase: bool = True
    axis: ParallelType = ParallelType.TIDy
    groups: int = 1
    barrier: tuple | None = None

    @property
    def cond(self) -> Scalar:
        """The condition that selects the role's threads."""
        v = Var(self.axis.value)
        if self.hi - self.lo == 1:
            return v.eq(self.lo)
        if self.lo == 0:
            return v.lt(self.hi)
        return Bin("&&", Bin(">=", v, Const(self.lo)), v.lt(self.hi))

    def describe(self) -> str:
        sel = str(self.cond)[1:-1] if self.hi - self.lo == 1 else f"{self.axis.value} in {self.lo}..{self.hi}"
        regs = ""
        if self.registers:
            regs = f", setmaxnreg.{'inc' if self.increase else 'dec'} {self.registers}"
        groups = f", {self.groups} sync groups" if self.groups > 1 else ""
        return f"{sel} ({self.threads} threads){groups}{regs}"


@dataclass
class TurnOrder:
    """The sync groups of a role taking turns (ping-pong warpgroups): each of
    ``phases`` (the MMAs, the epilogue) runs one group at a time, the groups
    in order. One mbarrier per group per phase: a group waits on its own for
    its turn and arrives on the next group's (every one of its ``arrivals``
    threads) when done; ``side`` carries the stage index and phase bit of the
    order, as a ring's side does.

    >>> t = TurnOrder("T9", "consumers", 2, ["mma", "epi"], 128)
    >>> str(t)
    'turns T9: the 2 sync groups of role consumers in order, mma T9_mma_turn[2], epi T9_epi_turn[2]'
    >>> t.barriers()
    [('T9_mma_turn', 2, 128), ('T9_epi_turn', 2, 128)]
    """

    name: str
    role: str
    groups: int
    phases: list
    arrivals: object

    def __post_init__(self):
        self.side = RingSide(f"{self.name}_turn", 1)

    def barrier(self, phase: str) -> str:
        return f"{self.name}_{phase}_turn"

    def barriers(self) -> list:
        """``(name, count, arrivals)`` of its mbarrier arrays, one per phase."""
        return [(self.barrier(p), self.groups, self.arrivals) for p in self.phases]

    def __str__(self):
        arrays = ", ".join(f"{p} {self.barrier(p)}[{self.groups}]" for p in self.phases)
        return f"turns {self.name}: the {self.groups} sync groups of role {self.role} in order, {arrays}"


@dataclass(eq=False)
class RoleSwitch(Node):
    """The warp-role split: branch ``k`` runs ``bodies[k]`` on the threads of
    ``roles[k]`` (the roles partition the block; the last one takes the rest)."""

    roles: list
    bodies: list

    def lines(self, ind):
        out = ["  " * ind + "ROLES"]
        for role, body in zip(self.roles, self.bodies):
            out += ["  " * (ind + 1) + f"ROLE {role.name}: {role.describe()}"] + _block(body, ind + 2)
        return out


@dataclass(eq=False)
class Ring:
    """A circular buffer between roles, as IR data: ``buffers`` (shared
    tensors, one slot of each per stage) hold ``stages`` slots, the producer
    running up to ``prefetch`` positions ahead. ``producer`` and
    ``consumers`` name roles (None / []: a Pipelined ring, where thread 0
    fills and every thread reads). ``fill`` says how a slot is filled:
    ``"tma"`` (expect_tx on the full barrier; the copies complete it),
    ``"cp.async"`` (every producer thread copies its chunks of each box and
    arrives: ``cp.async.mbarrier.arrive.noinc``, or a proxy fence and an
    arrive after stores through registers; a TMA buffer of the same ring is
    still announced and issued by the elected lane) or ``"threads"`` (the
    producer role's threads write the slot from registers, then every one
    arrives: the MMA warpgroups handing finished accumulator tiles to an
    epilogue role).
    ``full``/``empty`` are the mbarrier arrays (``empty`` None: a block
    sync releases the slots), completing a phase on
    ``full_arrivals``/``empty_arrivals`` arrivals; ``load``/``use`` carry
    each side's stage index and phase bit.

    >>> r = Ring("T4", 4, 3, ["T4"], "producer", ["consumers"], full_arrivals=1, empty_arrivals=256)
    >>> str(r)
    'ring T4: stages=4 prefetch=3 fill=tma producer->consumers full=T4_full[4] empty=T4_empty[4]'
    >>> r.barriers(), r.use.stage.name
    ([('T4_full', 4, 1), ('T4_empty', 4, 256)], 'T4_use_stage')
    """

    name: str
    stages: int
    prefetch: int
    buffers: list
    producer: str | None = None
    consumers: list = field(default_factory=list)
    fill: str = "tma"
    full_arrivals: object = 1
    empty_arrivals: object = None  # None: no empty barriers
    has_empty: bool = True
    # fill "multicast": the cluster axes of each multicast buffer; a consumer releases a
    # stage in every CTA whose copies land in its own (MBarrierArrive.peers)
    peers: tuple = ()

    def __post_init__(self):
        if self.fill not in ("tma", "threads", "cp.async", "multicast"):
            raise CircbufError(
                f"ring {self.name}: fill {self.fill!r} is not tma, threads, cp.async or multicast"
            )
        self.load = RingSide(f"{self.name}_load", self.stages)
        self.use = RingSide(f"{self.name}_use", self.stages)

    @property
    def full(self) -> str:
        return f"{self.name}_full"

    @property
    def empty(self) -> str | None:
        return f"{self.name}_empty" if self.has_empty else None

    def barriers(self) -> list:
        """``(name, count, arrivals)`` of its mbarrier arrays, full first."""
        out = [(self.full, self.stages, self.full_arrivals)]
        if self.has_empty:
            out.append((self.empty, self.stages, self.empty_arrivals))
        return out

    def __str__(self):
        who = (
            f"{self.producer}->{','.join(self.consumers)}" if self.producer else "thread0->block (pipelined)"
        )
        empty = f" empty={self.empty}[{self.stages}]" if self.has_empty else " empty=block_sync"
        return (
            f"ring {self.name}: stages={self.stages} prefetch={self.prefetch} fill={self.fill} {who} "
            f"full={self.full}[{self.stages}]{empty}"
        )


@dataclass(eq=False)
class RingInit(Node):
    """Declare ``ring``'s stage and phase at ring position ``position``."""

    ring: RingSide
    position: object = None  # Scalar; None: 0

    def lines(self, ind):
        at = f" at position {self.position}" if self.position is not None else ""
        return ["  " * ind + f"RING {self.ring.name} (stages={self.ring.stages}){at}"]


@dataclass(eq=False)
class RingAdvance(Node):
    """Move ``ring`` on by ``count`` positions (the phase flips at each wrap)."""

    ring: RingSide
    count: object  # Scalar

    def lines(self, ind):
        return ["  " * ind + f"RING_ADVANCE {self.ring.name} by {self.count}"]


@dataclass(eq=False)
class MmaOperand:
    """A wgmma operand in shared memory: buffer ``tv`` at element offset
    ``offset`` (stage included), read through a matrix descriptor with the
    leading/stride byte offsets ``lbo``/``sbo``, the buffer's swizzle and
    ``transpose`` set for an MN-major tile."""

    tv: TensorView
    offset: object  # Scalar, elements
    lbo: int
    sbo: int
    swizzle: int
    transpose: bool

    def __str__(self):
        t = " T" if self.transpose else ""
        return f"desc({self.tv.name}+{self.offset}, lbo={self.lbo}, sbo={self.sbo}, sw={self.swizzle}{t})"


@dataclass(eq=False)
class Wgmma(Node):
    """``wgmma.mma_async.m64nNk16``: acc[fragment] (+)= A x B for one
    warpgroup, the accumulator fragment starting at ``acc``; ``scale_d`` is
    0 for the first k step of a tile (D = A x B: no zeroing needed)."""

    needs = TargetNeed("wgmma", 90, specific=True, exact=True)
    acc: TensorRef
    a: MmaOperand
    b: MmaOperand
    shape: tuple  # (64, N, 16)
    scale_d: object  # Scalar

    def lines(self, ind):
        m, n, k = self.shape
        return ["  " * ind + f"WGMMA.m{m}n{n}k{k} {self.acc} += {self.a} x {self.b} scale_d={self.scale_d}"]


@dataclass(eq=False)
class WgmmaFence(Node):
    """wgmma.fence: the accumulator registers are handed to the tensor cores."""

    needs = TargetNeed("wgmma.fence", 90, specific=True, exact=True)

    def lines(self, ind):
        return ["  " * ind + "WGMMA_FENCE"]


@dataclass(eq=False)
class WgmmaCommit(Node):
    """Close this warpgroup's open group of wgmmas."""

    needs = TargetNeed("wgmma.commit_group", 90, specific=True, exact=True)

    def lines(self, ind):
        return ["  " * ind + "WGMMA_COMMIT_GROUP"]


@dataclass(eq=False)
class WgmmaWait(Node):
    """Wait until at most ``pending`` wgmma groups of this warpgroup are in flight."""

    needs = TargetNeed("wgmma.wait_group", 90, specific=True, exact=True)

    pending: int

    def lines(self, ind):
        return ["  " * ind + f"WGMMA_WAIT_GROUP {self.pending}"]


@dataclass(eq=False)
class Comment(Node):
    text: str

    def lines(self, ind):
        return ["  " * ind + f"// {self.text}"]


@dataclass(eq=False)
class BlockSync(Node):
    """A barrier over the block, or over the first ``barrier[1]`` threads with
    named barrier ``barrier[0]`` (warp-specialized consumers)."""

    reason: str = ""
    barrier: tuple = (0, 0)

    def lines(self, ind):
        named = "" if is_block_wide(self.barrier) else f" bar{self.barrier[0]}/{self.barrier[1]}"
        return ["  " * ind + f"BLOCK_SYNC{named}  // {self.reason}"]


@dataclass
class TensorParam:
    tv: TensorView
    is_output: bool


@dataclass(eq=False)
class Kernel:
    """A lowered kernel and its signature (what the runtime needs to launch it)."""

    name: str
    body: list
    tensor_params: list  # TensorParam, inputs then outputs
    scalar_params: list  # Var
    launch: dict  # ParallelType -> Scalar extent
    extent_bindings: dict  # extent name -> (param index, dim)
    strides: dict  # (tv name, dim) -> Scalar stride expression
    index_type: DataType = DataType.Int32
    smem_bytes: object = 0  # dynamic shared memory: int or Scalar of extents
    max_threads: int = 0
    target: Target = DEFAULT  # the GPU's limits, set by lower() before any pass
    circular_loops: dict = field(default_factory=dict)  # tv name -> loop key
    tensor_maps: list = field(default_factory=list)  # TensorMapSpec, passed after scalars
    mbarriers: list = field(default_factory=list)  # (name, count, arrivals), set up by the mbarriers pass
    min_blocks: int = 0  # __launch_bounds__ second argument, 0: none
    hang_record: bool = False  # the kernel takes a host-mapped record (CIRCBUF_DEBUG_HANG)
    roles: list = field(default_factory=list)  # Role: warp roles (set by the circular-buffer pass)
    rings: list = field(default_factory=list)  # Ring: their mbarriers are set up by the mbarriers pass
    turn_orders: list = field(default_factory=list)  # TurnOrder: groups of a role taking turns
    memory_orders: dict = field(
        default_factory=dict
    )  # tensor param name -> logical axes, outer to inner in memory
    descriptors: dict = field(
        default_factory=dict
    )  # smem tv name -> (lbo, sbo, swizzle): wgmma descriptor bases
    named_barriers: dict = field(default_factory=dict)  # purpose -> first id (ids 1..15; 0 is __syncthreads)
    fast_math: bool = True  # may the fast_math pass pick approximate transcendentals (CIRCBUF_FAST_MATH)
    # split-K summed in the kernel: chunks, the workspace's floats and flags per launch (Scalars
    # of the extents); the runtime passes cb_partials and cb_tile_flags (split_k pass)
    split_k: dict | None = None
    peer: dict | None = None  # an output stored to peer GPUs: kind, world, params, tiles (peer_stores pass)
    former_names: dict = field(default_factory=dict)  # new buffer/barrier name -> its T-number (names pass)

    @property
    def cluster(self) -> tuple:
        """(cx, cy): the thread-block cluster, from the extents bound to the CTA's
        cluster coordinates (1, 1: none)."""
        cx, cy = (self.launch.get(p, Const(1)) for p in (ParallelType.CIDx, ParallelType.CIDy))
        return (cx.value, cy.value)

    def mbarrier(self, name: str, count: int, arrivals) -> str:
        """Register an array of ``count`` mbarriers, each completing a phase on
        ``arrivals`` arrivals; the mbarriers pass allocates and initializes it."""
        self.mbarriers.append((name, count, arrivals))
        return name

    def all_mbarriers(self) -> list:
        """Every mbarrier array ``(name, count, arrivals)``: those registered
        with :meth:`mbarrier`, each turn order's, then each ring's full and
        empty arrays."""
        turns = [b for t in self.turn_orders for b in t.barriers()]
        return list(self.mbarriers) + turns + [b for ring in self.rings for b in ring.barriers()]

    @property
    def barrier_names(self) -> list:
        """The mbarrier arrays' names (hang diagnostics number them so)."""
        return [name for name, _, _ in self.all_mbarriers()]

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def role_barrier(self, role: Role) -> tuple:
        """The named barrier ``(id, threads)`` of ``role``'s threads (one id per
        sync group: the group's id is the first plus its index along the
        role's axis), allocated on first use."""
        if role.barrier is None:
            if role.threads % 32:
                raise CircbufError(
                    f"{self.name}: the {role.name} role synchronizes, which needs whole warps "
                    f"(named barriers count warps), not {role.threads} threads"
                )
            base = self.named_barrier(role.name, role.groups)
            per = role.threads // role.groups
            if role.groups == 1:
                role.barrier = (base, per)
            else:
                rows = (role.hi - role.lo) // role.groups
                gid = Var(role.axis.value) - role.lo if role.lo else Var(role.axis.value)
                role.barrier = (gid // rows + base if rows > 1 else gid + base, per)
        return role.barrier

    def named_barrier(self, purpose: str, count: int = 1) -> Var:
        """The first of ``count`` consecutive named-barrier ids reserved for
        ``purpose`` (the same ids for the same purpose); id 0 is __syncthreads.
        It is a named constant (:func:`barrier_name`), declared at the top of
        the kernel, so a sync reads ``bar_consumers`` rather than ``1``.

        >>> k = Kernel("k", [], [], [], {}, {}, {})
        >>> str(k.named_barrier("consumers")), str(k.named_barrier("consumers store T14", 2))
        ('bar_consumers', 'bar_consumers_store_T14')
        >>> k.named_barriers
        {'consumers': (1, 1), 'consumers store T14': (2, 2)}
        """
        if purpose not in self.named_barriers:
            used = sum(n for _, n in self.named_barriers.values())
            if 1 + used + count > 16:
                raise CircbufError(f"{self.name}: more than 15 named barriers needed ({purpose})")
            self.named_barriers[purpose] = (1 + used, count)
        first, count = self.named_barriers[purpose]
        return Var(barrier_name(purpose), lo=first, hi=Const(first + count))

    def __str__(self):
        grid = [str(self.launch.get(p, 1)) for p in (ParallelType.BIDx, ParallelType.BIDy, ParallelType.BIDz)]
        block = [
            str(self.launch.get(p, 1)) for p in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz)
        ]
        params = ", ".join(
            [p.tv.name for p in self.tensor_params]
            + [v.name for v in self.scalar_params]
            + [f"tmap{k}" for k in range(len(self.tensor_maps))]
        )
        head = f"kernel {self.name}({params}) grid({', '.join(grid)}) block({', '.join(block)})"
        if self.smem_bytes:
            head += f" smem({self.smem_bytes})"
        if self.cluster != (1, 1):
            head += f" cluster{self.cluster}"
        decls = [f"  role {r.name}: {r.describe()}" for r in self.roles] + [f"  {r}" for r in self.rings]
        decls += [f"  {t}" for t in self.turn_orders]
        return "\n".join([head] + decls + _block(self.body, 1))


def barrier_name(purpose: str) -> str:
    """The C name of the named-barrier id reserved for ``purpose``."""
    return "bar_" + re.sub(r"\W+", "_", purpose).strip("_")


def thread0_cond(kernel: Kernel) -> Scalar:
    """``threadIdx.x == 0 && ...`` over the block's non-trivial thread axes."""
    cond = None
    for pt in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz):
        ext = kernel.launch.get(pt)
        if ext is not None and not (isinstance(ext, Const) and ext.value == 1):
            t = Var(pt.value).eq(0)
            cond = t if cond is None else Bin("&&", cond, t)
    return cond if cond is not None else Const(True)


def target_needs(kernel: Kernel) -> list[TargetNeed]:
    """What the kernel's nodes need of the GPU target, each need once, in
    the order first met; a compile for a target without them is refused."""
    out = []

    def visit(n, _stack):
        if n.needs is not None and n.needs not in out:
            out.append(n.needs)

    walk(kernel.body, visit)
    return out


def walk(nodes, fn, stack=None):
    """Call ``fn(node, stack)`` for every node, pre-order; ``stack`` holds the
    enclosing ForLoop/IfThenElse/ElectOne/RoleSwitch nodes."""
    stack = [] if stack is None else stack
    for n in list(nodes):
        fn(n, stack)
        for sub in children(n):
            walk(sub, fn, stack + [n])


def rewrite(nodes, fn) -> list:
    """Rebuild a node list: ``fn(node)`` returns a node, a list of nodes, or
    None to keep the node (children are rewritten first)."""
    out = []
    for n in nodes:
        if isinstance(n, ForLoop):
            n.body = rewrite(n.body, fn)
        elif isinstance(n, IfThenElse):
            n.then = rewrite(n.then, fn)
            n.else_ = rewrite(n.else_, fn)
        elif isinstance(n, ElectOne):
            n.then = rewrite(n.then, fn)
        elif isinstance(n, RoleSwitch):
            n.bodies = [rewrite(b, fn) for b in n.bodies]
        r = fn(n)
        if r is None:
            out.append(n)
        elif isinstance(r, list):
            out.extend(r)
        else:
            out.append(r)
    return out


def children(n) -> list:
    """The node lists directly inside ``n`` (a loop's body, an if's branches)."""
    if isinstance(n, ForLoop):
        return [n.body]
    if isinstance(n, IfThenElse):
        return [n.then, n.else_]
    if isinstance(n, ElectOne):
        return [n.then]
    if isinstance(n, RoleSwitch):
        return list(n.bodies)
    return []


def parent_list(nodes, target):
    """The node list that holds ``target`` directly, or None."""
    for n in nodes:
        if n is target:
            return nodes
        for sub in children(n):
            r = parent_list(sub, target)
            if r is not None:
                return r
    return None


def _insert(nodes, target, new: list, after: bool) -> bool:
    lst = parent_list(nodes, target)
    if lst is None:
        return False
    k = next(k for k, n in enumerate(lst) if n is target) + after
    lst[k:k] = list(new)
    return True


def insert_before(nodes, target, new: list) -> bool:
    """Put ``new`` right before ``target`` wherever it sits in the tree."""
    return _insert(nodes, target, new, after=False)


def insert_after(nodes, target, new: list) -> bool:
    """Put ``new`` right after ``target`` wherever it sits in the tree."""
    return _insert(nodes, target, new, after=True)


def enclosing(nodes, target) -> list | None:
    """The nodes enclosing ``target`` (loops, ifs, elect-ones), outermost
    first, or None when ``target`` is not in the tree."""
    found = []
    walk(nodes, lambda n, stack: found.append(list(stack)) if n is target and not found else None)
    return found[0] if found else None


def is_block_wide(barrier: tuple) -> bool:
    """A ``(id, threads)`` barrier that is ``__syncthreads`` (id 0)."""
    return isinstance(barrier[0], int) and barrier[0] == 0
