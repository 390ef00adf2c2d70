"""Warpgroup MMA (wgmma) facts, kept out of the general passes.

Not a pass: the wgmma facts the indexing pass, the ring and codegen use
(the pass that fences, commits and waits is :mod:`circbuf.lowering.wgmma`).
Each general pass makes one call per wgmma concern:

- indexing lowers an MMA expr to one instruction (:func:`lower_mma`): its
  m64nNk16 shape, the accumulator fragment layout (checked numerically), each
  operand's shared-memory descriptor (K- or MN-major), recorded in
  ``kernel.descriptors``;
- the loop nest lets an MMA output's fragment axes run in any order around
  its k loop (:func:`free_loop_order`);
- the ring (circular_buffer pass) sees which stages wgmmas read
  (:func:`reads`) and releases them only after a ``wgmma.wait_group``
  retires the reads (:func:`release_after_wait_group`);
- codegen prints the descriptors (:func:`descriptor_decl`), one wrapper per
  instruction shape (:func:`wrapper_name`, :func:`wrapper`) and each call
  (:func:`call`).

It picks no tile sizes: the shape follows from the scheduled axes, and a
layout the instruction cannot read is a ``CircbufError``.

>>> print(descriptor_decl("T4", (16, 1024, 128)))
const unsigned long long T4_desc = cb::smem_desc(T4, 16, 1024, 1);
"""

from __future__ import annotations

import itertools

from ..ir import (
    Bin,
    CircbufError,
    Const,
    DataType,
    MemoryType,
    MmaOp,
    ParallelType,
    Scalar,
    Var,
    evaluate,
    simplify,
)
from ..ir.scalar import free_vars
from . import indexing  # loop_to_ids, logical_to_ids (indexing calls lower_mma: imported as a module)
from .allocation import allocation_strides
from .kir import (
    Comment,
    ElectOne,
    IfThenElse,
    MBarrierArrive,
    MBarrierRef,
    MmaOperand,
    TensorRef,
    Wgmma,
    WgmmaWait,
    parent_list,
    walk,
)

# ------------------------------------------------------------ indexing


def lower_mma(ix, node) -> Wgmma:
    """One warpgroup MMA instruction for the placed MMA expr ``node`` (``ix``:
    the indexing pass's indexer, for its kernel and buffer offsets): the
    accumulator fragment of the output's MMA axes, both operands read from
    swizzled shared memory through descriptors. The output's fragment axes
    must be the instruction's register layout (checked numerically), the
    operand tiles one of the layouts wgmma reads (K- or MN-major). Each
    operand's descriptor base goes to ``kernel.descriptors``."""
    e = node.expr
    out = e.out
    frag = [a for a in out.loop if a.parallel_type == ParallelType.Mma and not a.is_reduction]
    kmma = [a for a in out.loop if a.parallel_type == ParallelType.Mma and a.is_reduction]
    k_inst = 1
    for a in kmma:
        k_inst *= int(simplify(a.loop_extent).value)
    if k_inst * e.inputs[0].dtype.size != 32:
        raise CircbufError(f"{out.name}: the MMA K axes cover {k_inst} elements; wgmma takes 32 bytes of K")
    regs = 1
    for a in frag:
        regs *= int(simplify(a.loop_extent).value)
    n_inst = 2 * regs
    if not (8 <= n_inst <= 256 and n_inst % 8 == 0):
        raise CircbufError(
            f"{out.name}: {regs} fragment registers make an m64n{n_inst}k16 wgmma (N in 8..256)"
        )
    tid = [a for a in out.loop if a.parallel_type == ParallelType.TIDx]
    if len(tid) != 1 or simplify(tid[0].loop_extent) != Const(128):
        raise CircbufError(
            f"{out.name}: a wgmma's output needs one threadIdx.x axis of 128 threads (a warpgroup)"
        )
    mpos = e.maps[0][[r for r in e.roles[0]].index("M")][1]
    npos = e.maps[1][[r for r in e.roles[1]].index("N")][1]
    kpos = next(j for j, i in enumerate(out.logical) if i.is_reduction)
    m_id, n_id, k_id = out.logical[mpos].id, out.logical[npos].id, out.logical[kpos].id
    origin = dict(node.index)
    origin[tid[0].id] = Const(0)
    ids0 = indexing.loop_to_ids(out, origin)
    _check_fragment(out, node.index, tid[0], frag, m_id, n_id, ix.k.extent_bindings)
    acc = TensorRef(out, ix.buffer_index(out, origin))
    ops = []
    for k, p in enumerate(e.inputs):
        plog = {pa.id: ids0.get(ca.id, Const(0)) for pa, ca in e.logical_map(p)}
        off = simplify(ix.buffer_index(p, indexing.logical_to_ids(p, plog)))
        mn_id = m_id if k == 0 else n_id
        extent = 64 if k == 0 else n_inst
        ops.append(_operand(ix, e, p, off, ids0, mn_id, k_id, extent))
    if e.inputs[0].dtype == DataType.Float and any(op.transpose for op in ops):
        raise CircbufError(f"{out.name}: a tf32 wgmma reads K-major operand tiles only (no transpose)")
    w = Wgmma(acc, ops[0], ops[1], (64, n_inst, k_inst), _scale_d(out, node.index))
    for op in (w.a, w.b):
        desc = (op.lbo, op.sbo, op.swizzle)
        if ix.k.descriptors.setdefault(op.tv.name, desc) != desc:
            raise CircbufError(f"{op.tv.name}: read by wgmmas with two different layouts")
    return w


def _operand(ix, e, p, off, ids0, mn_id, k_id, mn_extent):
    """The descriptor of operand ``p`` for the instruction at ``ids0``:
    its buffer offsets for a step along MN and along K tell the layout."""
    if p.memory_type != MemoryType.Shared or not p.swizzle_bytes:
        raise CircbufError(f"{p.name}: a wgmma operand must be a swizzled shared-memory buffer")
    span = p.swizzle_bytes // p.dtype.size  # elements in one swizzled row
    dmn, dk = Var("dmn"), Var("dk")
    cmap = {ca.id: pa for pa, ca in e.logical_map(p)}
    plog = {pa.id: ids0.get(ca.id, Const(0)) for pa, ca in e.logical_map(p)}
    plog[cmap[mn_id].id] = plog[cmap[mn_id].id] + dmn
    plog[cmap[k_id].id] = plog[cmap[k_id].id] + dk
    at = ix.buffer_index(p, indexing.logical_to_ids(p, plog))
    env = _probe_env(free_vars(at), ix.k.extent_bindings)

    def offset(i, k):
        return evaluate(at, {**env, "dmn": i, "dk": k}) - evaluate(at, {**env, "dmn": 0, "dk": 0})

    nbytes = p.dtype.size
    if offset(0, 1) == 1:  # K-major: rows of MN, K contiguous within a swizzled row
        pitch = offset(1, 0)
        ok = pitch == span and all(offset(0, k) == k for k in range(16))
        ok = ok and all(offset(i, 0) == i * pitch for i in range(mn_extent))
        if not ok:
            raise CircbufError(
                f"{p.name}: a K-major wgmma operand needs rows of {span} elements (one {p.swizzle_bytes}-byte "
                f"swizzle span), K contiguous; its layout steps {pitch} per row"
            )
        return MmaOperand(p, off, 16, 8 * span * nbytes, p.swizzle_bytes, False)
    if offset(1, 0) == 1:  # MN-major: chunks of `span` MN elements, K rows of them
        kpitch = offset(0, 1)
        chunk = offset(span, 0) if mn_extent > span else 0
        ok = kpitch == span and all(offset(0, k) == k * span for k in range(16))
        ok = ok and all(offset(i, 0) == (i // span) * chunk + i % span for i in range(mn_extent))
        if not ok:
            raise CircbufError(
                f"{p.name}: an MN-major wgmma operand needs {span}-element MN chunks, K rows of them "
                f"consecutive; its layout steps {kpitch} per K row"
            )
        return MmaOperand(p, off, max(chunk, 1) * nbytes, 8 * span * nbytes, p.swizzle_bytes, True)
    raise CircbufError(f"{p.name}: neither K nor MN is contiguous in this wgmma operand's buffer")


def _scale_d(out, index) -> Scalar:
    """0 (overwrite the accumulator) at the first k step of a tile, else 1."""
    first = None
    for a in out.loop:
        if a.is_reduction and a.parallel_type == ParallelType.Serial and a.id in index:
            i = index[a.id]
            if isinstance(i, Const):
                continue
            t = i.eq(0)
            first = t if first is None else Bin("&&", first, t)
    return Const(1) if first is None else Bin("^", first, Const(1))


def _probe_env(names, extents) -> dict:
    """Values to evaluate index expressions at one instruction: loop and
    thread indices 0, extents large (the layout is the same for any)."""
    return {v: (1 << 16 if v in extents else 0) for v in names}


def _check_fragment(out, index, tid, frag, m_id, n_id, extents):
    """The output's fragment axes must hold the wgmma accumulator layout:
    thread t of warp w = t / 32, lane l, register r = 4j + 2h + e holds row
    16w + 8h + l / 4 and column 8j + 2(l % 4) + e (of the instruction tile)."""
    fv = {a.id: Var(f"f{k}", lo=0, hi=a.loop_extent) for k, a in enumerate(frag)}
    t = Var("threadIdx.x", lo=0, hi=Const(128))
    idx = dict(index)
    idx[tid.id] = t
    idx.update(fv)
    ids = indexing.loop_to_ids(out, idx)
    m, n = ids[m_id], ids[n_id]
    strides = {a.id: s for a, s in allocation_strides(out)}
    r_expr = Const(0)
    for a in frag:
        r_expr = r_expr + fv[a.id] * strides.get(a.id, Const(0))
    exts = [int(simplify(a.loop_extent).value) for a in frag]
    base = _probe_env(set(free_vars(m)) | set(free_vars(n)) | set(free_vars(r_expr)), extents)
    m0, n0 = evaluate(m, base), evaluate(n, base)
    r0 = evaluate(r_expr, base)
    for combo in itertools.product(*[range(x) for x in exts]):
        env = dict(base)
        env.update({f"f{k}": v for k, v in enumerate(combo)})
        for tt in (0, 1, 3, 4, 7, 31, 32, 45, 64, 127) if len(exts) else (0,):
            env["threadIdx.x"] = tt
            r = evaluate(r_expr, env) - r0
            w, ln = tt // 32, tt % 32
            want_m = 16 * w + 8 * ((r // 2) % 2) + ln // 4
            want_n = 8 * (r // 4) + 2 * (ln % 4) + r % 2
            if evaluate(m, env) - m0 != want_m or evaluate(n, env) - n0 != want_n:
                raise CircbufError(
                    f"{out.name}: its fragment axes are not the wgmma accumulator layout (thread {tt}, "
                    f"register {r}: row {evaluate(m, env) - m0}, column {evaluate(n, env) - n0}; the instruction "
                    f"puts it at row {want_m}, column {want_n})"
                )


# ------------------------------------------------------------ loop nest


def free_loop_order(out) -> bool:
    """Whether ``out``'s non-reduction axes may run in any order around its
    reduction loops: an MMA writes each fragment whole (its k steps accumulate)."""
    return isinstance(out.definition, MmaOp)


# ------------------------------------------------------------ ring


def reads(node, tv) -> bool:
    """True when a wgmma in ``node`` reads ``tv``: reads that are done only
    at a ``wgmma.wait_group``."""
    hit = []
    walk([node], lambda n, _s: hit.append(n) if isinstance(n, Wgmma) and tv in (n.a.tv, n.b.tv) else None)
    return bool(hit)


def release_after_wait_group(body, ring_loop, ring, label) -> int:
    """Release the ring's stages that wgmmas in ``ring_loop`` (a loop of
    ``body``) read: each k step's ``wgmma.wait_group`` retires the previous
    step's reads, so the previous stage is released after it (from the
    second iteration on), and the last stage after the ``wait_group 0``
    behind the loop. A warp's wait_group retires its warpgroup's reads at
    once: one elected lane per warp arrives (a thread's own loads would need
    every thread). Returns the threads per arrival."""
    use, empty, S = ring.use, ring.empty, ring.stages
    prev = simplify((use.stage + (S - 1)) % S)

    def release():
        return ElectOne(Const(True), [MBarrierArrive(MBarrierRef(empty, prev))])

    waits = [k for k, n in enumerate(ring_loop.body) if isinstance(n, WgmmaWait)]
    if not waits:
        raise CircbufError(f"{label}: wgmmas read the ring but no wgmma wait_group retires them")
    k = waits[-1]
    ring_loop.body.insert(
        k + 1,
        IfThenElse(
            Bin("!=", ring_loop.index, ring_loop.start),
            [Comment("the previous stage's wgmmas are done"), release()],
        ),
    )
    parent = parent_list(body, ring_loop)
    after = parent.index(ring_loop) + 1
    tail = next((k for k in range(after, len(parent)) if isinstance(parent[k], WgmmaWait)), None)
    if tail is None or parent[tail].pending != 0:
        raise CircbufError(f"{label}: the wgmmas of the last k step are never waited for")
    parent.insert(tail + 1, release())
    return 32


# ------------------------------------------------------------ codegen

_SWIZZLE_CODE = {128: 1, 64: 2, 32: 3, 0: 0}
_MMA_TYPE = {DataType.BFloat16: "bf16", DataType.Half: "f16", DataType.Float: "tf32"}


def descriptor_decl(name: str, desc) -> str:
    """The descriptor of element 0 of shared buffer ``name`` that wgmmas read
    (``desc``: its ``kernel.descriptors`` entry), made once."""
    lbo, sbo, swz = desc
    return (
        f"const unsigned long long {name}_desc = cb::smem_desc({name}, {lbo}, {sbo}, {_SWIZZLE_CODE[swz]});"
    )


def wrapper_name(n: Wgmma) -> str:
    """The device function that issues wgmma ``n`` (one per shape and operand type)."""
    m, nn, k = n.shape
    return f"wgmma_m{m}n{nn}k{k}_{n.a.tv.dtype.short}"


def wrapper(n: Wgmma) -> str:
    """The text of :func:`wrapper_name`'s device function."""
    return _wgmma_helper(wrapper_name(n), n.shape[1], n.a.tv.dtype)


def call(n: Wgmma, scalar, ref) -> str:
    """The statement that issues ``n`` (``scalar``, ``ref``: codegen's
    printers of scalar expressions and tensor elements)."""

    def desc(op: MmaOperand) -> str:
        off = scalar(op.offset)
        return f"{op.tv.name}_desc + (unsigned long long)((({off}) * {op.tv.dtype.size}) >> 4)"

    ta, tb = int(n.a.transpose), int(n.b.transpose)
    return (
        f"{wrapper_name(n)}<{ta}, {tb}>(&{ref(n.acc)}, {desc(n.a)}, {desc(n.b)}, (int)({scalar(n.scale_d)}));"
    )


def _wgmma_helper(name: str, n: int, ab: DataType) -> str:
    """One warpgroup MMA m64nNk16 (k8 for tf32: 32 bytes of K either way)
    with both operands from shared-memory descriptors, accumulating into
    N/2 fp32 registers per thread; scale_d 0 computes D = A x B (the first
    k step of a tile). tf32 takes no transpose operands (K-major tiles only:
    TA and TB are 0, checked by the caller's descriptors)."""
    regs = n // 2
    outs = ", ".join(f"%{k}" for k in range(regs))
    t = _MMA_TYPE[ab]
    k = 32 // ab.size
    trans = "" if ab == DataType.Float else f", %{regs + 3}, %{regs + 4}"
    asm = (
        f"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"
        f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t} {{{outs}}}, %{regs}, %{regs + 1}, "
        f"p, 1, 1{trans};\\n}}\\n"
    )
    dst = ", ".join(f'"+f"(d[{k}])' for k in range(regs))
    return "\n".join(
        [
            "template <int TA, int TB>",
            f"__device__ __forceinline__ void {name}(float* d, unsigned long long da, unsigned long long db, "
            "int scale_d) {",
            f'  asm volatile("{asm}"',
            f"      : {dst}",
            '      : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));',
            "}",
            "",
        ]
    )
