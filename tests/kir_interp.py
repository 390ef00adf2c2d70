"""Test-only: run a lowered kernel on the CPU, thread by thread, for tiny shapes.

It executes the kernel IR that codegen prints (loops, predicates, indexed
assignments, block reductions and syncs) with every thread of a block as a
Python generator that pauses at each barrier, so indexing, predication and
views can be checked numerically on a machine without a GPU. Values are
Python numbers (no 16-bit rounding); TMA and mbarrier kernels are not
covered (force ``tma=False``).

>>> # outs = interpret(fd, [torch.randn(2, 3, 4)])   # like fd.execute, on the CPU
"""

from __future__ import annotations

import math

import torch

from circbuf.ir import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    DataType,
    LoadStoreOp,
    MemoryType,
    ParallelType,
    ReductionOp,
    TernaryOp,
    UnaryOp,
    evaluate,
)
from circbuf.lowering.kir import Allocate, Assign, BlockReduce, BlockSync, Comment, ForLoop, IfThenElse, Let

_UN = {
    "neg": lambda x: -x,
    "abs": abs,
    "exp": math.exp,
    "exp2": lambda x: 2.0**x,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda x: 1 / math.sqrt(x),
    "reciprocal": lambda x: 1 / x,
    "tanh": math.tanh,
    "sigmoid": lambda x: 1 / (1 + math.exp(-x)),
    "relu": lambda x: max(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "silu": lambda x: x / (1 + math.exp(-x)),
    "floor": math.floor,
    "ceil": math.ceil,
    "trunc": math.trunc,
    "bitwise_not": lambda x: not x if isinstance(x, bool) else ~x,
}


def _nan_outside(f):
    """``f``, NaN where its argument is outside its domain (as CUDA's math)."""

    def g(x):
        try:
            return f(x)
        except (ValueError, OverflowError):
            return math.nan

    return g


for _name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf",
              "erfc", "lgamma", "log1p", "expm1", "log2", "log10"):  # fmt: skip
    _UN[_name] = _nan_outside(getattr(math, _name))
_UN.update(
    {
        "round": lambda x: float(round(x)) if isinstance(x, float) else x,  # halves to even, as rint
        "frac": lambda x: x - math.trunc(x),
        # predicates: Bool results of the input's value
        "isnan": lambda x: isinstance(x, float) and math.isnan(x),
        "isinf": lambda x: isinstance(x, float) and math.isinf(x),
        "isfinite": lambda x: not isinstance(x, float) or math.isfinite(x),
        "isposinf": lambda x: x == math.inf,
        "isneginf": lambda x: x == -math.inf,
        "isreal": lambda x: True,
        "signbit": lambda x: math.copysign(1.0, x) < 0 if isinstance(x, float) else x < 0,
    }
)


def _div(a, b, dt):
    if dt.is_float:
        return a / b
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_BIN = {
    "add": lambda a, b, dt: a + b,
    "sub": lambda a, b, dt: a - b,
    "mul": lambda a, b, dt: a * b,
    "div": _div,
    "maximum": lambda a, b, dt: max(a, b),
    "minimum": lambda a, b, dt: min(a, b),
    "lt": lambda a, b, dt: a < b,
    "le": lambda a, b, dt: a <= b,
    "gt": lambda a, b, dt: a > b,
    "ge": lambda a, b, dt: a >= b,
    "eq": lambda a, b, dt: a == b,
    "ne": lambda a, b, dt: a != b,
}


def _c_mod(a, b, dt):
    """C's ``%`` / ``fmod``: the sign of ``a``."""
    if dt.is_float:
        return math.fmod(a, b)
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


def _nextafter(a, b, dt):
    t = {DataType.Float: torch.float32, DataType.Double: torch.float64}.get(dt, torch.float32)
    return torch.nextafter(torch.tensor(a, dtype=t), torch.tensor(b, dtype=t)).item()


_BIN.update(
    {
        "truediv": lambda a, b, dt: a / b,
        "pow": lambda a, b, dt: a**b if dt.is_float or b >= 0 else int(1 / a**-b),
        "fmod": _c_mod,
        "mod": _c_mod,
        "remainder": lambda a, b, dt: a % b,  # Python's: the sign of b, as torch.remainder
        "atan2": lambda a, b, dt: math.atan2(a, b),
        "nextafter": _nextafter,
        "bitwise_and": lambda a, b, dt: a & b,
        "bitwise_or": lambda a, b, dt: a | b,
        "bitwise_xor": lambda a, b, dt: a ^ b,
        "bitwise_left_shift": lambda a, b, dt: a << b,
        "bitwise_right_shift": lambda a, b, dt: a >> b,
        "logical_right_shift": lambda a, b, dt: (a & ((1 << 8 * dt.size) - 1)) >> b,
        "gcd": lambda a, b, dt: math.gcd(a, b),
    }
)
_RED = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": max, "min": min}


def _cast(v, dt: DataType):
    if dt == DataType.Bool:
        return bool(v)
    if dt.is_int:
        return int(v)  # C truncation
    return float(v)


class _Thread:
    def __init__(self, run, env):
        self.run, self.env, self.local = run, env, {}

    def buf(self, tv):
        if tv.memory_type == MemoryType.Global:
            return self.run.glob[tv.name]
        if tv.memory_type == MemoryType.Shared:
            return self.run.shared[tv.name]
        return self.local[tv.name]

    def load(self, ref, k=0):
        i = evaluate(ref.index, self.env) + k
        b = self.buf(ref.tv)
        if ref.tv.memory_type == MemoryType.Global:
            assert 0 <= i < b.numel(), f"{ref.tv.name}[{i}] out of bounds ({b.numel()})"
            return b[i].item()
        v = b[i]
        # registers of lanes predicated off hold garbage on the GPU; their
        # results are never stored, so any value does
        return 0 if v is None else v

    def store(self, ref, v, k=0):
        i = evaluate(ref.index, self.env) + k
        b = self.buf(ref.tv)
        if ref.tv.memory_type == MemoryType.Global:
            assert 0 <= i < b.numel(), f"{ref.tv.name}[{i}] out of bounds ({b.numel()})"
            counts = self.run.stores.get(ref.tv.name)
            if counts is not None:
                counts[i] += 1
            b[i] = torch.tensor(v, dtype=torch.float64) if isinstance(v, float) else v  # inf past fp32
        else:
            b[i] = v

    def value(self, x, dt):
        from circbuf.lowering.kir import TensorRef

        if isinstance(x, TensorRef):
            return self.load(x)
        return _cast(evaluate(x, self.env), dt)

    def exec(self, nodes):
        for n in nodes:
            if isinstance(n, ForLoop):
                # a persistent grid loop runs for (j = blockIdx.x; j < extent; j += gridDim.x)
                ext = evaluate(n.extent, self.env)
                start, step = evaluate(n.start, self.env), evaluate(n.step, self.env)
                assert step > 0, f"loop {n.index} has step {step}"
                for j in range(start, ext, step):
                    self.env[n.index.name] = j
                    yield from self.exec(n.body)
            elif isinstance(n, IfThenElse):
                yield from self.exec(n.then if evaluate(n.cond, self.env) else n.else_)
            elif isinstance(n, Let):
                self.env[n.var.name] = evaluate(n.value, self.env)
            elif isinstance(n, Allocate):
                size = evaluate(n.size, self.env) if not isinstance(n.size, int) else n.size
                if n.memory == MemoryType.Local:
                    self.local[n.tv.name] = [None] * (size * n.stages)
                else:
                    self.run.shared.setdefault(n.tv.name, [None] * (size * n.stages))
            elif isinstance(n, Assign):
                self.assign(n)
            elif isinstance(n, BlockSync):
                yield ("sync", None)
            elif isinstance(n, BlockReduce):
                v = self.load(n.ref)
                r = yield ("reduce", (n, v))
                self.store(n.ref, r)
            elif isinstance(n, Comment):
                pass
            else:
                raise NotImplementedError(f"interpreter: {type(n).__name__}")

    def assign(self, a: Assign):
        out = a.lhs.tv
        dt = out.dtype
        if a.lhs.vector > 1:
            for k in range(a.lhs.vector):
                self.store(a.lhs, self.load(a.operands[0], k), k)
            return
        if a.init is not None:
            self.store(a.lhs, _cast(a.init.value, dt))
            return
        try:
            v = self.compute(a, dt)
        except OverflowError:
            v = float("inf")
        except (ZeroDivisionError, ValueError):
            v = float("nan")  # garbage of a lane predicated off (a GPU gives inf/NaN too)
        self.store(a.lhs, _cast(v, dt) if not (isinstance(v, float) and math.isnan(v)) or dt.is_float else 0)

    def compute(self, a: Assign, dt):
        e, ops = a.expr, a.operands
        if isinstance(e, ReductionOp):
            v = _RED[e.op_name](self.load(ops[0]), self.value(ops[1], dt))
        elif isinstance(e, CastOp):
            v = self.value(ops[0], e.inputs[0].dtype)
        elif isinstance(e, UnaryOp):
            v = _UN[e.op_name](self.value(ops[0], dt))
        elif isinstance(e, BinaryOp):
            cdt = next((x.dtype for x in e.inputs if hasattr(x, "dtype") and hasattr(x, "domain")), dt)
            v = _BIN[e.op_name](self.value(ops[0], cdt), self.value(ops[1], cdt), cdt)
        elif isinstance(e, TernaryOp):
            c = self.value(ops[0], DataType.Bool)
            v = self.value(ops[1], dt) if c else self.value(ops[2], dt)
        elif isinstance(e, (LoadStoreOp, BroadcastOp)) or getattr(e, "is_view", False):
            v = self.value(ops[0], dt)
        else:
            raise NotImplementedError(f"interpreter: {type(e).__name__}")
        return v


class _Run:
    def __init__(self, kernel, glob):
        self.k, self.glob, self.shared = kernel, glob, {}
        self.stores: dict = {}  # output name -> stores per element of its span


def _check_stored_once(name, t, counts, expanded=False):
    """Every element of output ``t`` written exactly once and nothing else in
    its span; an element of a stride-0 output shares its memory with the
    others along that axis: its address is written once per element.
    ``expanded``: the buffer holds a broadcast axis once (size 1), which
    kernels may write any number of times: each address at least once."""
    if t.numel() == 0:
        return
    addr = torch.as_strided(torch.arange(counts.numel()), t.shape, t.stride()).reshape(-1)
    want = torch.bincount(addr, minlength=counts.numel())
    bad = ((counts < 1) & (want > 0)) | ((counts > 0) & (want == 0)) if expanded else counts != want
    bad = bad.nonzero().reshape(-1)
    if bad.numel():
        first = bad[:4]
        where = [
            tuple(int(c) for c in torch.unravel_index((addr == a).nonzero()[0, 0], t.shape))
            if want[a]
            else f"@{int(a)} (no element)"
            for a in first
        ]
        raise AssertionError(
            f"output {name}: {bad.numel()} addresses of {t.numel()} elements not stored "
            f"{'at least' if expanded else 'exactly'} once per element (e.g. {where} stored "
            f"{counts[first].tolist()} times for {want[first].tolist()}; {int(counts.sum())} stores in all)"
        )


def _block(run, env, block):
    """Run one CTA: all threads advance to their next barrier together."""
    threads = []
    for tz in range(block[2]):
        for ty in range(block[1]):
            for tx in range(block[0]):
                e = dict(env, **{"threadIdx.x": tx, "threadIdx.y": ty, "threadIdx.z": tz})
                t = _Thread(run, e)
                threads.append((t, t.exec(run.k.body)))
    pending = {i: None for i in range(len(threads))}
    while pending:
        events = {}
        for i, send in list(pending.items()):
            try:
                events[i] = threads[i][1].send(send)
            except StopIteration:
                del pending[i]
        if not events:
            break
        assert len(events) == len(pending), "some threads exited while others wait at a barrier"
        kinds = {ev[0] for ev in events.values()}
        assert len(kinds) == 1, f"threads disagree on the next barrier: {kinds}"
        if kinds == {"sync"}:
            pending = {i: None for i in events}
            continue
        groups: dict = {}
        for i, (_, (node, v)) in events.items():
            e = threads[i][0].env
            pt = node.ptypes[0]
            key = e["threadIdx.y"] if pt == ParallelType.TIDx else e["threadIdx.x"]
            groups.setdefault(key, []).append((i, v))
        node = next(iter(events.values()))[1][0]
        op = _RED[node.expr.op_name]
        for members in groups.values():
            acc = members[0][1]
            for _, v in members[1:]:
                acc = op(acc, v)
            for i, _ in members:
                pending[i] = acc


def interpret(fd, inputs, check_stores=True):
    """Compile ``fd`` for sm_90a on these CPU inputs and run the kernel here.
    Returns what ``fd.execute`` would (outputs poisoned with NaN first).
    ``check_stores``: assert the kernel stores each element of each output
    exactly once (a grid loop that misses rows, an element visited twice).
    A segmented fusion runs the executor's segmented plan, each segment's
    kernel here."""
    inputs = fd._flat_inputs(inputs)  # define_vector inputs spread
    ex = fd._get_executor()
    ex.compile(inputs, arch="sm_90a")
    if ex._segments is None:
        return interpret_executor(ex, inputs, check_stores=check_stores)
    info, _ = ex._bind(inputs, need_cuda=False)
    plan = ex._segmented_plan(info)
    subs = ex._segments[1]

    def make(i, args):
        def run(a, finish, sub=subs[i]):
            return interpret_executor(sub, list(a), finish, check_stores=check_stores)

        plan.steps[i][0] = run
        return type("Interpreted", (), {"run": staticmethod(run)})

    plan.make = make
    return plan.run(inputs)


def interpret_executor(ex, inputs, finish=True, check_stores=True):
    """``interpret`` for a FusionExecutor; ``finish=False``: the tensors the
    kernel wrote, as a segment hands them to the next one."""
    ck = ex.compile(inputs, arch="sm_90a")
    info, _ = ex._bind(inputs, need_cuda=False)
    if not ex.fusion.outputs:  # inputs and views of them returned: no kernel to run
        fin = ex._finish(info.extents)
        return fin(inputs, []) if fin and finish else []
    k = ck.kernel
    plan = ex._build_plan(ck, info, torch.device("cpu"))
    outs = plan.new_outputs(inputs)
    for o, spec in zip(outs, plan.out_specs):
        if o.is_floating_point() and spec[3] is None:  # not an input written in place
            o.fill_(float("nan"))
    if plan.empty:
        return plan.finish(inputs, outs) if plan.finish and finish else outs
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)] + list(outs)
    env = {}
    glob = {}
    for p, t in zip(k.tensor_params, tensors):
        name = p.tv.name
        span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
        glob[name] = torch.as_strided(t, (span,), (1,), t.storage_offset())
        for d in range(t.dim()):
            env[f"{name}.stride[{d}]"] = t.stride(d)
    for name, (pi, d) in k.extent_bindings.items():
        env[name] = tensors[pi].shape[d]
    scal = [x for d, x in zip(ex.fusion.inputs, inputs) if not isinstance(x, torch.Tensor)]
    for v, x in zip(k.scalar_params, scal):
        env[v.name] = x
    run = _Run(k, glob)
    outs_of = {p.tv.name: t for p, t in zip(k.tensor_params, tensors) if p.is_output}
    if check_stores:
        run.stores = {name: torch.zeros(glob[name].numel(), dtype=torch.int64) for name in outs_of}
    for bz in range(plan.grid[2]):
        for by in range(plan.grid[1]):
            for bx in range(plan.grid[0]):
                run.shared = {}
                e = dict(env, **{"blockIdx.x": bx, "blockIdx.y": by, "blockIdx.z": bz})
                _block(run, e, plan.block)
    # a broadcast axis of an output is held once in the buffer (size 1), and a
    # kernel may loop over it at the extent it meets (the fusion expanded it,
    # or the scheduler runs it with the axis it is joined to): every thread on
    # it stores the same value; the fusion as defined says which axes
    declared = [p for p in k.tensor_params if p.is_output]
    for p, o in zip(declared, ex.fusion.outputs):
        if p.tv.name in run.stores:
            t = outs_of[p.tv.name]
            expanded = any(ax.is_broadcast and n == 1 for ax, n in zip(o.domain.no_reductions(), t.shape))
            _check_stored_once(p.tv.name, t, run.stores[p.tv.name], expanded)
    return plan.finish(inputs, outs) if plan.finish and finish else outs
