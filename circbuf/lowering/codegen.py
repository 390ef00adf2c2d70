"""Print a lowered Kernel as CUDA C++ (one method per node kind).

Requires: every fact of ``PASSES`` (it runs after them); provides: hang_record.

>>> # src = codegen(kernel)   # prelude + extern "C" __global__ void kernel(...)
"""

from __future__ import annotations

import math

from ..ir import (
    Bin,
    BinaryOp,
    BroadcastOp,
    CastOp,
    Const,
    DataType,
    FullOp,
    LoadStoreOp,
    MemoryType,
    ParallelType,
    ReductionOp,
    Scalar,
    TernaryOp,
    Un,
    UnaryOp,
    Var,
    ViewExpr,
    as_scalar,
    simplify,
)
from . import wgmma_ops
from .kir import (
    Allocate,
    Assign,
    BlockReduce,
    BlockSync,
    BulkCommitGroup,
    BulkWaitGroup,
    ClusterSync,
    Comment,
    CpAsyncArrive,
    CpAsyncBox,
    CpAsyncCommit,
    CpAsyncWait,
    ElectOne,
    Fence,
    ForLoop,
    IfThenElse,
    Kernel,
    Let,
    MBarrierAlloc,
    MBarrierArrive,
    MBarrierArriveExpectTx,
    MBarrierInit,
    MBarrierInval,
    MBarrierRef,
    MBarrierWait,
    Return,
    RingAdvance,
    RingInit,
    RoleSwitch,
    SetMaxNReg,
    TensorRef,
    TmaLoad,
    TmaStore,
    Wgmma,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
    barrier_name,
    cluster_ctas,
    is_block_wide,
    walk,
)
from .prelude import PRELUDE

_BIN = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "truediv": "/",  # the operands are floating point already
    "bitwise_and": "&",
    "bitwise_or": "|",
    "bitwise_xor": "^",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
}
_RED = {"sum": "cb::AddOp()", "prod": "cb::MulOp()", "max": "cb::MaxOp()", "min": "cb::MinOp()"}
_SCALAR_T = {
    DataType.Double: "double",
    DataType.Float: "float",
    DataType.Int64: "long long",
    DataType.Int32: "int",
    DataType.Bool: "bool",
}


def literal(c: Const, dt: DataType) -> str:
    v = c.value
    if dt == DataType.Bool:
        return "true" if v else "false"
    if dt.is_float:
        v = float(v)
        if math.isnan(v):
            bits = (
                "__longlong_as_double(0x7ff8000000000000LL)"
                if dt == DataType.Double
                else "__int_as_float(0x7fc00000)"
            )
            return bits if not dt.is_reduced_float else f"cb::cast<{dt.value}>({bits})"
        if math.isinf(v):
            if dt == DataType.Double:
                return ("-" if v < 0 else "") + "__longlong_as_double(0x7ff0000000000000LL)"
            inf = ("-" if v < 0 else "") + "__int_as_float(0x7f800000)"
            return inf if not dt.is_reduced_float else f"cb::cast<{dt.value}>({inf})"
        s = repr(v)
        if dt == DataType.Float:
            return s + "f"
        if dt.is_reduced_float:
            return f"cb::cast<{dt.value}>({s}f)"
        return s
    v = int(v)
    if dt == DataType.Int64 or not -(2**31) <= v < 2**31:  # (index math prints Int64 constants as int)
        if v == -(2**63):
            return "(-9223372036854775807LL - 1)"
        return f"{v}LL"
    if v == -(2**31):  # "-2147483648" is the negation of a literal too wide for int: a long long
        return "(-2147483647 - 1)"
    return str(v)


class CudaCodegen:
    def __init__(self, kernel: Kernel, debug_hang: int = 0):
        self.k = kernel
        self.debug_hang = debug_hang if kernel.barrier_names else 0
        self.lines: list[str] = []
        self.ind = 1
        self.red_smem: list[str] = []
        self.helpers: dict[str, str] = {}  # wgmma wrappers the kernel uses, by name
        self.zeroed = _zeroed_registers(kernel)
        self.scalars = _one_element_registers(kernel)

    # -------------------------------------------------------- scalars
    def scalar(self, e: Scalar) -> str:
        if isinstance(e, Const):
            # index math is typed index_t; plain int literals promote correctly
            return literal(e, DataType.Int32 if e.dtype == DataType.Int64 else e.dtype)
        if isinstance(e, Var):
            if e.name.startswith(("threadIdx.", "blockIdx.")):
                return f"((index_t){e.name})"
            return e.name
        if isinstance(e, Un):
            return self.scalar_fn(e)
        assert isinstance(e, Bin)
        a, b = self.scalar(e.a), self.scalar(e.b)
        if e.op == "ceilDiv":
            return f"ceilDiv({a}, {b})"
        if e.op in ("min", "max"):
            return f"({a} {'<' if e.op == 'min' else '>'} {b} ? {a} : {b})"
        if e.op.isidentifier():  # fusion scalar math: fmod, pow, gcd, ... in the result's type
            return f"cb::{e.op}({self.scalar_as(e.a, e.dtype)}, {self.scalar_as(e.b, e.dtype)})"
        return f"({a} {e.op} {b})"

    def scalar_as(self, e: Scalar, dt: DataType) -> str:
        """A scalar expression as a value of C++ type ``dt``: a typed literal, or
        a cast (extents are index_t, infix arithmetic has C's usual types)."""
        if isinstance(e, Const):
            return literal(e, dt)
        if isinstance(e, Un) and e.op == "cast" and e.dtype == dt:
            return self.scalar(e)
        return f"cb::cast<{_SCALAR_T[dt]}>({self.scalar(e)})"

    def scalar_fn(self, e: Un) -> str:
        """Fusion scalar math, computed in the scalar's C++ type (a predicate
        such as isnan in its operand's); a cast to a 16-bit float rounds and
        stays in fp32, as tensor arithmetic does."""
        ct = _SCALAR_T.get(e.a.dtype if e.op in UnaryOp.PREDICATES else e.dtype, "float")
        a = f"cb::cast<{ct}>({self.scalar(e.a)})"
        if e.op != "cast":
            return f"cb::{e.op}({a})"
        if e.dtype.is_reduced_float:
            return f"cb::cast<float>(cb::cast<{e.dtype.value}>({self.scalar(e.a)}))"
        return a

    def value(self, x, dt: DataType) -> str:
        """An operand as a value of compute type ``dt``."""
        if isinstance(x, TensorRef):
            return self.ref(x)
        if isinstance(x, Const):
            return literal(x, dt)
        if isinstance(x, Un) and x.op == "cast" and _SCALAR_T.get(x.dtype) == dt.value:
            return self.scalar(x)  # a cast to this type already
        return f"cb::cast<{dt.value}>({self.scalar(x)})"

    def ref(self, r: TensorRef) -> str:
        if r.tv.name in self.scalars:  # a register of one element is a plain variable
            return r.tv.name
        idx = self.scalar(r.index)
        if r.tv.memory_type == MemoryType.Global:
            return f"{r.tv.name}.data[{idx}]"
        return f"{r.tv.name}[{idx}]"

    def emit(self, s: str):
        self.lines.append("  " * self.ind + s)

    # ---------------------------------------------------------- nodes
    def node(self, n):
        visit = getattr(self, "visit_" + type(n).__name__, None)
        if visit is None:  # a node that prints itself (lowering/peer_stores.py)
            return n.cuda(self)
        visit(n)

    def visit_ForLoop(self, n: ForLoop):
        ext = self.scalar(n.extent)
        if n.unroll_by:
            self.emit(f"#pragma unroll {n.unroll_by}")
        elif isinstance(n.extent, Const) and not n.strided and (n.extent.value <= 32 or n.unroll):
            self.emit("#pragma unroll")
        v = n.index.name
        if n.strided:
            start, step = self.scalar(n.start), self.scalar(n.step)
            self.emit(f"for (index_t {v} = {start}; {v} < {ext}; {v} += {step}) {{")
        else:
            self.emit(f"for (index_t {v} = 0; {v} < {ext}; ++{v}) {{")
        self.block(n.body)
        self.emit("}")

    def block(self, nodes):
        self.ind += 1
        for c in nodes:
            self.node(c)
        self.ind -= 1

    def visit_Let(self, n: Let):
        self.emit(f"const index_t {n.var.name} = {self.scalar(n.value)};")

    def visit_IfThenElse(self, n: IfThenElse):
        if not n.else_ and len(n.then) == 1 and isinstance(n.then[0], Assign) and n.then[0].row is not None:
            # a row store's guard goes into the helper, which stores under it: no branch, so the
            # unrolled row loop issues several iterations' shared loads before their stores
            self._row_store(n.then[0], self.scalar(n.cond))
            return
        self.emit(f"if ({self.scalar(n.cond)}) {{")
        self.block(n.then)
        if n.else_:
            self.emit("} else {")
            self.block(n.else_)
        self.emit("}")

    def visit_RoleSwitch(self, n: RoleSwitch):
        """One branch per warp role, each named in a comment; the roles
        partition the block, so the last one is a plain ``else``."""
        last = len(n.roles) - 1
        for k, (role, body) in enumerate(zip(n.roles, n.bodies)):
            note = f"  // {role.name}: {role.describe()}"
            if k == 0:
                self.emit(f"if ({self.scalar(role.cond)}) {{{note}")
            elif k < last:
                self.emit(f"}} else if ({self.scalar(role.cond)}) {{{note}")
            else:
                self.emit(f"}} else {{{note}")
            self.block(body)
        self.emit("}")

    def was(self, name: str) -> str:
        """A trailing comment with the name the names pass replaced (the
        T-number ``print_math()`` shows), or nothing."""
        old = self.k.former_names.get(name)
        return f"  // {old}" if old else ""

    def visit_Allocate(self, n: Allocate):
        t = n.tv.dtype.value
        was = self.was(n.tv.name)
        if n.memory == MemoryType.Shared:
            stages = f" x {n.stages} stages" if n.stages > 1 else ""
            swz = f", {n.tv.swizzle_bytes}B swizzle" if n.tv.swizzle_bytes else ""
            self.emit(f"// {n.tv.name}: {self.scalar(n.size)} elements{stages}{swz}")
            self.emit(f"{t}* {n.tv.name} = reinterpret_cast<{t}*>(cb_smem + {self.scalar(n.offset)});{was}")
            desc = self.k.descriptors.get(n.tv.name)
            if desc is not None:  # wgmma reads it: the descriptor of element 0, made once
                self.emit(wgmma_ops.descriptor_decl(n.tv.name, desc))
        elif n.tv.name in self.scalars:
            zero = " = {}" if n.tv.name in self.zeroed else ""
            self.emit(f"{t} {n.tv.name}{zero};{was}")
        else:
            zero = " = {}" if n.tv.name in self.zeroed else ""
            self.emit(f"__align__(16) {t} {n.tv.name}[{n.size}]{zero};{was}")

    def bar(self, r: MBarrierRef) -> str:
        return f"&{r.name}[{self.scalar(r.stage)}]"

    def visit_MBarrierAlloc(self, n: MBarrierAlloc):
        self.emit(f"__shared__ __align__(8) unsigned long long {n.name}[{n.count}];{self.was(n.name)}")

    def visit_MBarrierInit(self, n: MBarrierInit):
        self.emit(f"cb::mbar_init({self.bar(n.bar)}, {self.scalar(n.arrivals)});")

    def visit_MBarrierInval(self, n: MBarrierInval):
        self.emit(f"cb::mbar_inval({self.bar(n.bar)});")

    def visit_MBarrierArriveExpectTx(self, n: MBarrierArriveExpectTx):
        self.emit(f"cb::mbar_arrive_expect_tx({self.bar(n.bar)}, (unsigned)({self.scalar(n.bytes)}));")

    def cluster_mask(self, along: tuple) -> str:
        """The ranks of :func:`cluster_ctas` for this CTA as a C bit mask: a constant
        pattern shifted to this CTA's row or column of the cluster."""
        shape = self.k.cluster
        base = sum(1 << r for r in cluster_ctas(shape, along, 0, 0))
        shift = []
        if ParallelType.CIDx not in along and shape[0] > 1:
            shift.append(f"cidx * {shape[1]}" if shape[1] > 1 else "cidx")
        if ParallelType.CIDy not in along and shape[1] > 1:
            shift.append("cidy")
        return f"({hex(base)}u << ({' + '.join(shift)}))" if shift else f"{hex(base)}u"

    def visit_MBarrierArrive(self, n: MBarrierArrive):
        if not n.peers:
            self.emit(f"cb::mbar_arrive({self.bar(n.bar)});")
            return
        cs = self.k.cluster[0] * self.k.cluster[1]
        mask = " | ".join(self.cluster_mask(a) for a in n.peers)
        self.emit("// released in every CTA whose slices land in this one's stage (this one's included)")
        self.emit(f"for (unsigned cta = 0, peers = {mask}; cta < {cs}; ++cta) {{")
        self.emit(f"  if ((peers >> cta) & 1u) cb::mbar_arrive_cluster({self.bar(n.bar)}, cta);")
        self.emit("}")

    def visit_ClusterSync(self, n: ClusterSync):
        self.emit(f"cb::cluster_sync();  // {n.why}" if n.why else "cb::cluster_sync();")

    def visit_MBarrierWait(self, n: MBarrierWait):
        parity = f"(unsigned)({self.scalar(n.parity)})"
        if self.debug_hang:
            bid = self.k.barrier_names.index(n.bar.name)
            self.emit(
                f"cb::mbar_wait_bounded({self.bar(n.bar)}, {parity}, {self.debug_hang}LL, {bid}, "
                f"(int)({self.scalar(n.bar.stage)}), cb_hang);"
            )
        else:
            self.emit(f"cb::mbar_wait({self.bar(n.bar)}, {parity});")

    def visit_Fence(self, n: Fence):
        self.emit(
            {"mbarrier_init": "cb::fence_mbarrier_init();", "proxy_async": "cb::fence_proxy_async();"}[n.kind]
        )

    def visit_ElectOne(self, n: ElectOne):
        warp = "" if n.warp == Const(True) else f"{self.scalar(n.warp)} && "
        self.emit(f"if ({warp}cb::elect_one()) {{")
        self.block(n.then)
        self.emit("}")

    def visit_TmaStore(self, n: TmaStore):
        coords = ", ".join(f"(int)({self.scalar(c)})" for c in n.coords)
        self.emit(f"cb::tma_store(&tmap{n.map_index}, &{self.ref(n.src)}, {coords});")

    def visit_BulkCommitGroup(self, n: BulkCommitGroup):
        self.emit("cb::bulk_commit_group();")

    def visit_BulkWaitGroup(self, n: BulkWaitGroup):
        self.emit(f"cb::bulk_wait_group{'_read' if n.read else ''}<{n.pending}>();")

    def visit_SetMaxNReg(self, n: SetMaxNReg):
        self.emit(f"cb::setmaxnreg_{'inc' if n.increase else 'dec'}<{n.count}>();")

    def visit_RingInit(self, n: RingInit):
        r = n.ring
        if r.stages == 1:  # a turn (one slot; rings have >= 2): no stage, only the phase moves
            pos = "0" if n.position is None else f"({self.scalar(n.position)}) & 1"
            self.emit(f"unsigned {r.name}_phase = {pos};")
        elif n.position is None:
            self.emit(f"int {r.name}_stage = 0;")
            self.emit(f"unsigned {r.name}_phase = 0;")
        else:
            pos = self.scalar(n.position)
            self.emit(f"int {r.name}_stage = ({pos}) % {r.stages};")
            self.emit(f"unsigned {r.name}_phase = (({pos}) / {r.stages}) & 1;")

    def visit_RingAdvance(self, n: RingAdvance):
        r = n.ring
        if r.stages == 1:
            one = isinstance(n.count, Const) and n.count.value == 1
            self.emit(f"{r.name}_phase ^= {'1' if one else f'({self.scalar(n.count)}) & 1'};")
        elif isinstance(n.count, Const) and n.count.value == 1:
            self.emit(f"if (++{r.name}_stage == {r.stages}) {{ {r.name}_stage = 0; {r.name}_phase ^= 1; }}")
        else:
            self.emit(f"{r.name}_stage += {self.scalar(n.count)};")
            self.emit(f"{r.name}_phase ^= ({r.name}_stage / {r.stages}) & 1;")
            self.emit(f"{r.name}_stage %= {r.stages};")

    def visit_Wgmma(self, n: Wgmma):
        """The instruction through its wrapper (one per shape and type, printed before the kernel)."""
        name = wgmma_ops.wrapper_name(n)
        if name not in self.helpers:
            self.helpers[name] = wgmma_ops.wrapper(n)
        self.emit(wgmma_ops.call(n, self.scalar, self.ref))

    def visit_WgmmaFence(self, n: WgmmaFence):
        self.emit("cb::wgmma_fence();")

    def visit_WgmmaCommit(self, n: WgmmaCommit):
        self.emit("cb::wgmma_commit();")

    def visit_WgmmaWait(self, n: WgmmaWait):
        self.emit(f"cb::wgmma_wait<{n.pending}>();")

    def visit_Return(self, n: Return):
        self.emit("return;")

    def visit_Comment(self, n: Comment):
        self.emit(f"// {n.text}")

    def visit_TmaLoad(self, n: TmaLoad):
        coords = ", ".join(f"(int)({self.scalar(c)})" for c in n.coords)
        if n.multicast:
            mask = f"(unsigned short){self.cluster_mask(n.multicast)}"
            self.emit(
                f"cb::tma_load_multicast(&{self.ref(n.dst)}, &tmap{n.map_index}, {self.bar(n.bar)}, {mask}, {coords});"
            )
            return
        self.emit(f"cb::tma_load(&{self.ref(n.dst)}, &tmap{n.map_index}, {self.bar(n.bar)}, {coords});")

    def visit_CpAsyncBox(self, n: CpAsyncBox):
        """The producer threads' chunks of one box: thread t copies chunks
        t, t + threads, ... at the buffer's swizzled addresses. A box every
        thread copies (``flat``) numbers the threads by their linear index and
        writes chunk ``t + i * threads`` as such, so that the chunk's
        coordinates simplify per thread (the loop over i unrolled)."""
        from .indexing import swizzle_index

        tv, g, v = n.dst.tv, n.src, n.vector
        nch, thr = n.chunks, n.threads
        iters = -(-nch // thr)
        full = nch % thr == 0
        if n.flat:
            t, i = Var("cb_t", lo=0, hi=Const(thr)), Var("cb_i", lo=0, hi=Const(iters))
            c = t + i * Const(thr) if full else Var("cb_c", lo=0, hi=Const(nch))
        else:
            c = Var("cb_c")
        dst, gidx, cond, inner = n.parts(c)
        dst = self.scalar(simplify(swizzle_index(tv, simplify(dst))))
        how = (
            f"cp.async of {v * g.dtype.size} bytes"
            if n.is_async
            else f"{v} loads of one element, one {v * g.dtype.size}-byte shared store"
        )
        self.emit(f"{{  // {tv.name} <- {g.name}: a box of {nch * v} elements, {how}, over {thr} threads")
        self.ind += 1
        if n.flat:
            dims = [self.k.launch.get(p, Const(1)) for p in (ParallelType.TIDx, ParallelType.TIDy)]
            bx, by = (self.scalar(simplify(d)) for d in dims)
            self.emit(
                f"const index_t cb_t = (index_t)threadIdx.x + {bx} * ((index_t)threadIdx.y + {by} * (index_t)threadIdx.z);"
            )
            # (non-negative: its chunk coordinates divide without the signed fix-ups)
            self.emit(f"__builtin_assume(cb_t >= 0 && cb_t < {thr});")
            self.emit("#pragma unroll 4")
        else:
            # chunks in flight per thread within the producer's 56 registers: 4 cp.asyncs,
            # 2 x 16 bytes loaded through registers (4 spilled, SASS for sm_90a)
            self.emit(f"#pragma unroll {4 if n.is_async else 2}")
        self.emit(f"for (index_t cb_i = 0; cb_i < {iters}; ++cb_i) {{")
        self.ind += 1
        if not n.flat:
            self.emit(f"const index_t cb_c = ((index_t)threadIdx.x) + cb_i * {thr};")
        elif not full:
            self.emit(f"const index_t cb_c = cb_t + cb_i * {thr};")
        if not full:
            self.emit(f"if (cb_c >= {nch}) break;")
        self.emit(f"const bool cb_in = {self.scalar(simplify(cond))};")
        self.emit(f"const index_t cb_g = cb_in ? {self.scalar(simplify(gidx))} : 0;")
        if n.is_async:
            es = g.dtype.size
            left = self.scalar(simplify(inner))
            if v == 1:  # (in range: its one element)
                self.emit("const index_t cb_n = cb_in ? 1 : 0;")
            else:
                self.emit(f"const index_t cb_n = cb_in ? ({left} < {v} ? {left} : {v}) : 0;")
            self.emit(
                f"cb::cp_async<{v * es}>(&{tv.name}[{dst}], {g.name}.data + cb_g, (unsigned)(cb_n * {es}));"
            )
        else:
            left, step = self.scalar(simplify(inner)), self.scalar(simplify(n.dims[0][4]))
            arr = f"cb::Array<{tv.dtype.value}, {v}>"
            zero = literal(Const(0), tv.dtype)
            self.emit(f"const index_t cb_n = cb_in ? ({left} < {v} ? {left} : {v}) : 0;")
            self.emit(f"{arr} cb_v;")
            self.emit("#pragma unroll")
            self.emit(f"for (int cb_j = 0; cb_j < {v}; ++cb_j)")
            self.emit(f"  cb_v.v[cb_j] = cb_j < cb_n ? {g.name}.data[cb_g + cb_j * {step}] : {zero};")
            self.emit(f"*reinterpret_cast<{arr}*>(&{tv.name}[{dst}]) = cb_v;")
        self.ind -= 1
        self.emit("}")
        self.ind -= 1
        self.emit("}")

    def visit_CpAsyncArrive(self, n: CpAsyncArrive):
        self.emit(f"cb::cp_async_mbar_arrive_noinc({self.bar(n.bar)});")

    def visit_CpAsyncCommit(self, n: CpAsyncCommit):
        self.emit("cb::cp_async_commit();")

    def visit_CpAsyncWait(self, n: CpAsyncWait):
        self.emit(f"cb::cp_async_wait<{n.pending}>();")

    def visit_BlockSync(self, n: BlockSync):
        if not is_block_wide(n.barrier):
            self.emit(
                f"cb::sync_threads({self.scalar(as_scalar(n.barrier[0]))}, {n.barrier[1]});  // {n.reason}"
            )
        else:
            self.emit(f"__syncthreads();  // {n.reason}")

    def visit_BlockReduce(self, n: BlockReduce):
        dt = n.expr.out.dtype
        smem = f"red_smem{len(self.red_smem)}"
        r = self.ref(n.ref)
        init = literal(n.expr.init, dt)
        bar_id, bar_n = n.barrier
        sync = "" if is_block_wide(n.barrier) else f", {self.scalar(as_scalar(bar_id))}, {bar_n}"
        if n.ptypes == (ParallelType.TIDy,):  # rows of threads (outer reductions)
            xdim = self.k.launch.get(ParallelType.TIDx, Const(1))
            self.red_smem.append(f"__shared__ {dt.value} {smem}[{xdim.value * n.threads}];")
            self.emit(f"{r} = cb::block_reduce_y<{n.threads}>({r}, {_RED[n.expr.op_name]}, {smem}{sync});")
            return
        ydim = self.k.launch.get(ParallelType.TIDy)
        rows = ydim.value if isinstance(ydim, Const) else 1
        self.red_smem.append(f"__shared__ {dt.value} {smem}[{32 * rows}];")
        self.emit(f"{r} = cb::block_reduce_x({r}, {_RED[n.expr.op_name]}, {init}, {smem}{sync});")

    def _row_store(self, a: Assign, guard: str):
        """``cb::row_store2``: a pair of a row, stored as the row's alignment allows,
        where ``guard`` (the pair's bounds) holds."""
        r = a.row
        assert a.lhs.vector == 2, "a row store moves pairs"
        col, left = self.scalar(simplify(r.col)), self.scalar(simplify(r.left))
        src = a.operands[0]  # (the helper finds the element before it by the buffer's swizzle)
        self.emit(
            f"cb::row_store2<{src.tv.swizzle_bytes}>(&{self.ref(a.lhs)}, &{self.ref(src)}, {col}, {r.width}, "
            f"{left}, {guard});"
        )

    def visit_Assign(self, a: Assign):
        lhs = a.lhs
        dt = lhs.tv.dtype
        if a.row is not None:  # a pair of a row, stored as the row's alignment allows
            self._row_store(a, "true")
            return
        if lhs.vector > 1:
            src = a.operands[0]
            self.emit(f"cb::vec_copy<{lhs.vector}>(&{self.ref(lhs)}, &{self.ref(src)});")
            return
        if a.init is not None:
            self.emit(f"{self.ref(lhs)} = {literal(a.init, dt)};")
            return
        e = a.expr
        ops = a.operands
        if isinstance(e, ReductionOp):
            acc, x = self.ref(ops[0]), self.value(ops[1], dt)
            if e.op_name in ("sum", "prod"):
                rhs = f"{acc} {'+' if e.op_name == 'sum' else '*'} {x}"
            else:
                rhs = f"cb::{'maximum' if e.op_name == 'max' else 'minimum'}({acc}, {x})"
        elif isinstance(e, (LoadStoreOp, BroadcastOp, FullOp, ViewExpr)):
            rhs = self.value(ops[0], dt)
        elif isinstance(e, CastOp):
            rhs = f"cb::cast<{dt.value}>({self.value(ops[0], e.inputs[0].dtype)})"
        elif isinstance(e, UnaryOp):
            rhs = f"cb::{'fast_' * a.fast}{e.op_name}({self.value(ops[0], dt)})"
        elif isinstance(e, BinaryOp):
            cdt = _operand_type(e)
            x, y = self.value(ops[0], cdt), self.value(ops[1], cdt)
            if e.op_name in _BIN:
                rhs = f"{x} {_BIN[e.op_name]} {y}"
            else:
                rhs = f"cb::{e.op_name}({x}, {y})"
        elif isinstance(e, TernaryOp):
            c = self.value(ops[0], DataType.Bool)
            rhs = f"{c} ? {self.value(ops[1], dt)} : {self.value(ops[2], dt)}"
        else:
            raise AssertionError(f"no codegen for {type(e).__name__}")
        self.emit(f"{self.ref(lhs)} = {rhs};")

    # --------------------------------------------------------- kernel
    def generate(self) -> str:
        k = self.k
        params = []
        for p in k.tensor_params:
            params.append(f"Tensor<{p.tv.dtype.value}, {p.tv.ndim}> {p.tv.name}")
        for v in k.scalar_params:
            params.append(f"{_SCALAR_T[v.dtype]} {v.name}")
        for m in range(len(k.tensor_maps)):
            params.append(f"const __grid_constant__ CUtensorMap tmap{m}")
        if k.split_k:  # split-K's workspace (lowering/split_k.py): partials, and flags zeroed once
            params += ["float* __restrict__ cb_partials", "int* __restrict__ cb_tile_flags"]
        if self.debug_hang:
            params.append("unsigned* cb_hang")
        self.ind = 1
        for name, (pi, d) in sorted(k.extent_bindings.items(), key=lambda x: int(x[0][1:])):
            self.emit(f"const index_t {name} = {k.tensor_params[pi].tv.name}.size[{d}];")
        if k.named_barriers:
            self.emit("// named barriers (id 0 is __syncthreads)")
        for purpose, (first, count) in k.named_barriers.items():
            groups = f": ids {first}..{first + count - 1}, one per sync group" if count > 1 else ""
            self.emit(f"constexpr int {barrier_name(purpose)} = {first};  // {purpose}{groups}")
        cx, cy = k.cluster
        cluster = ""
        if (cx, cy) != (1, 1):
            cluster = f"__cluster_dims__({cx * cy}, 1, 1) "
            rank = f" (rank = cidx * {cy} + cidy)" if cx > 1 and cy > 1 else ""
            self.emit(f"// this CTA's coordinates in its {cx}x{cy} cluster{rank}")
            if cx > 1:
                self.emit(
                    f"const index_t cidx = (index_t)(cb::cluster_ctarank(){f' / {cy}' if cy > 1 else ''});"
                )
            if cy > 1:
                self.emit(
                    f"const index_t cidy = (index_t)(cb::cluster_ctarank(){f' % {cy}' if cx > 1 else ''});"
                )
        for n in k.body:
            self.node(n)
        body = self.lines
        smem = ["  " + s for s in self.red_smem]
        if k.smem_bytes:
            smem.insert(0, "  extern __shared__ __align__(1024) unsigned char cb_smem[];")
        index_t = "int" if k.index_type == DataType.Int32 else "long long"
        head = [
            f"typedef {index_t} index_t;",
            PRELUDE,
            *self.helpers.values(),
            f'extern "C" __global__ void {cluster}__launch_bounds__({max(k.max_threads, 1)}{", " + str(k.min_blocks) if k.min_blocks else ""}) {k.name}(',
            "    " + ",\n    ".join(params) + ") {",
        ]
        pdl = ["  cb::grid_dependency();  // overlap this launch with the previous kernel's tail"]
        return "\n".join(head + smem + pdl + body + ["}", ""])


def _one_element_registers(kernel: Kernel) -> set:
    """Register buffers of one element, every access at index 0: printed as
    a plain variable (``float T11;``), not a one-element array."""
    allocs, bad = {}, set()

    def visit(n, _stack):
        if isinstance(n, Allocate) and n.memory == MemoryType.Local:
            if n.stages == 1 and as_scalar(n.size) == Const(1):
                allocs[n.tv.name] = n
            else:
                bad.add(n.tv.name)
        refs = []
        if isinstance(n, Assign):
            refs = [n.lhs, *n.operands]
        elif isinstance(n, BlockReduce):
            refs = [n.ref]
        for r in refs:
            if isinstance(r, TensorRef) and (r.vector != 1 or simplify(r.index) != Const(0)):
                bad.add(r.tv.name)

    walk(kernel.body, visit)
    return set(allocs) - bad


def _zeroed_registers(kernel: Kernel) -> set:
    """Register buffers that start zeroed: those a guarded statement writes (a
    load that may be out of range) computed outside loops over their broadcast
    axes, which every iteration of those loops reads (a bias along N held for
    the rows of the accumulator fragment). Left undefined where the guard
    fails, a predicated write merges with the register's previous contents,
    and ptxas keeps such registers live around the enclosing loops: the
    matmul epilogue that loads its bias once per fragment column spilled at
    232 and at 240 registers unless they start zeroed."""
    out = set()

    def visit(n, stack):
        if not (isinstance(n, Assign) and any(isinstance(s, IfThenElse) for s in stack)):
            return
        tv = n.lhs.tv
        serial = (ParallelType.Serial, ParallelType.Unroll)
        held = tv.loop[tv.compute_at_pos :]
        if tv.memory_type == MemoryType.Local and any(
            a.is_broadcast and a.parallel_type in serial for a in held
        ):
            out.add(tv.name)

    walk(kernel.body, visit)
    return out


def _operand_type(e) -> DataType:
    from ..ir import TensorView

    for x in e.inputs:
        if isinstance(x, TensorView):
            return x.dtype
    return e.out.dtype


def codegen(kernel: Kernel, debug_hang: int = 0) -> str:
    """Entry: Kernel -> CUDA source (prelude included). ``debug_hang`` > 0
    bounds every mbarrier wait to that many tries (CIRCBUF_DEBUG_HANG)."""
    cg = CudaCodegen(kernel, debug_hang)
    src = cg.generate()
    kernel.hang_record = bool(cg.debug_hang)
    return src
