"""Loops the schedulers' kernels can be trusted with (issue 16, silent wrong results).

Operand order: ``op(w, f(x))`` with ``w`` broadcast along the rows must give the
same kernel loops as ``op(f(x), w)``. The first expr of the former is the load
of ``w``'s cache, whose row axis is a broadcast with no grid split of its own;
the loop it opens is the persistent grid loop of every row, so it must start at
``blockIdx.x`` and stride by the grid (it did not: every CTA computed the first
row blocks and the other rows were never written).

The CPU checks: each store to an output depends on ``blockIdx`` (through its
index or the loops that make it) whenever the grid has several blocks; the
kernels also run in the kernel interpreter (circbuf.interpret), which checks
every output element is stored exactly once, against torch in float64.
"""

from __future__ import annotations

import math

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.ir import ParallelType
from circbuf.ir.scalar import Const, free_vars
from circbuf.lowering.kir import Assign, ForLoop, Let, TmaLoad, TmaStore, walk
from circbuf.runtime import nvrtc
from circbuf.scheduler import registry
from tests.util import D, assert_close

DEV = "cuda"

FLOAT_OPS = [
    "add", "sub", "mul", "div", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne",
    "truediv", "pow", "fmod", "remainder", "mod", "atan2", "nextafter",
]  # fmt: skip
INT_OPS = [
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "logical_right_shift", "gcd",
]  # fmt: skip
BINARY_OPS = FLOAT_OPS + INT_OPS


def _ref_op(op, a, b):
    """torch's ``op`` on float64 (or int64) tensors."""
    if op in ("div", "truediv") and a.is_floating_point():
        return a / b
    if op == "mod":
        return torch.fmod(a, b)
    if op == "logical_right_shift":  # on int32 bits
        return (a.to(torch.int64) & 0xFFFFFFFF) >> b
    return getattr(torch, op)(a, b)


def _rows(fd, x):
    return fd.ops.neg(x)


def _softmax(fd, x):
    return fd.ops.softmax(x, -1)


CASES = {
    # name: (scheduler forced, schedule() overrides, f of the rows, f in torch, where the binary op is:
    # after f ("epilogue"), before a sum over the rows ("outer") or the columns ("inner"), after linear)
    "pointwise": ("pointwise", {}, _rows, lambda x: -x, "epilogue"),
    "pointwise_tma": ("pointwise_tma", {"stages": 3}, _rows, lambda x: -x, "epilogue"),
    "norm_registers": (
        "normalization",
        {"staging": "registers"},
        _softmax,
        lambda x: x.softmax(-1),
        "epilogue",
    ),
    "norm_tma": ("normalization", {"staging": "tma"}, _softmax, lambda x: x.softmax(-1), "epilogue"),
    "outer_reduction": ("outer_reduction", {}, None, None, "outer"),
    # the plain path of outer reductions (tma=False) is the reduction scheduler's
    "reduction_outer": ("reduction", {}, None, None, "outer"),
    "reduction_inner": ("reduction", {}, None, None, "inner"),
    # linear(a, b) then op with a bias-like [N] broadcast along the rows of the tile
    "matmul_epilogue": ("matmul", {}, None, None, "matmul"),
}


def _force(monkeypatch, name):
    """Only scheduler ``name`` may take the fusion (the test is about its kernel)."""
    keep = [s for s in registry.SCHEDULERS if s[0].name == name]
    assert keep, name
    monkeypatch.setattr(registry, "SCHEDULERS", keep)


def _fusion(case, op, w_first, dtype):
    sched, overrides, f, _, kind = CASES[case]
    ints = op in INT_OPS
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        if kind == "matmul":
            x = fd.ops.linear(x, fd.define_tensor([-1, -1], dtype=dtype))
        w = fd.define_tensor([-1], dtype=dtype)
        if ints:
            w = fd.ops.cast(w, D.Int32)

        def bin_(a, b):
            if ints:
                a = fd.ops.cast(a, D.Int32) if a.dtype != D.Int32 else a
                b = fd.ops.cast(b, D.Int32) if b.dtype != D.Int32 else b
            return getattr(fd.ops, op)(a, b) if not w_first else getattr(fd.ops, op)(b, a)

        # the swap: bin_(rows, w) is op(rows, w), or op(w, rows) with w_first
        if kind == "epilogue":
            y = bin_(f(fd, x), w)
        elif kind == "matmul":
            y = bin_(x, w)
        else:  # a prologue with w broadcast along the rows, reduced over rows (outer) or columns
            y = fd.ops.sum(fd.ops.cast(bin_(x, w), D.Float), [0] if kind == "outer" else [1])
        fd.add_output(y)
    if overrides:
        fd.fusion.schedule(**overrides)
    return fd


def _inputs(op, rows, cols, dtype, device="cpu", k=None):
    """x [rows, cols] and w [cols]; with ``k``: a [rows, k], b [cols, k], w [cols] (linear)."""
    g = torch.Generator().manual_seed(rows * 31 + cols)
    if k is not None:
        a, b = (torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k) for n in (rows, cols))
        w = torch.randn(cols, generator=g, dtype=torch.float64)
        if op in INT_OPS:
            w = (w * 8).abs() % 5 + 1
        elif op == "pow":
            w = w.abs() + 0.5
        return [t.to(dtype).to(device) for t in (a, b, w)]
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    w = torch.randn(cols, generator=g, dtype=torch.float64)
    if op in INT_OPS:
        x, w = x * 8, (w * 8).abs() % 5 + 1  # small shift counts, no gcd(0, 0)
    elif op in ("pow",):
        x, w = x.abs() + 0.5, w.abs() + 0.5
    return [t.to(dtype).to(device) for t in (x, w)]


def _reference(case, op, w_first, inputs):
    _, _, _, tf, kind = CASES[case]
    if kind == "matmul":
        a, b, w = (t.cpu().double() for t in inputs)
        x = (a @ b.T).to(inputs[0].dtype).double()  # linear returns the inputs' type
    else:
        x, w = (t.cpu().double() for t in inputs)
    if op in INT_OPS:

        def bin_(a, b):
            a, b = a.to(torch.int32).to(torch.int64), b.to(torch.int32).to(torch.int64)
            r = _ref_op(op, b, a) if w_first else _ref_op(op, a, b)
            return r.to(torch.int32)
    else:

        def bin_(a, b):
            return _ref_op(op, b, a) if w_first else _ref_op(op, a, b)

    if kind == "matmul":
        return bin_(x, w.to(torch.int32) if op in INT_OPS else w)
    if kind == "epilogue":
        # the rows are computed in fp32 from the input type, as the kernel does
        r = tf(x) if op not in INT_OPS else tf(x).to(torch.int32)
        return bin_(r, w.to(torch.int32) if op in INT_OPS else w)
    wx = w.to(torch.int32) if op in INT_OPS else w
    return bin_(x, wx).double().sum(0 if kind == "outer" else 1)


def _store_deps(kernel):
    """For each store to a kernel output: the names its address depends on,
    through the loops whose indices it uses (their start and extent)."""
    outs = {p.tv.name for p in kernel.tensor_params if p.is_output}
    found = []

    def visit(n, stack):
        if isinstance(n, Assign) and n.lhs.tv.name in outs:
            exprs = [n.lhs.index]
        elif isinstance(n, TmaStore):
            exprs = list(n.coords)
        else:
            return
        names = {}
        for e in exprs:
            free_vars(e, names)
        # through the named values (the hoist pass's LETs) and the loops'
        # starts, until nothing new turns up
        loops = [s for s in stack if isinstance(s, ForLoop)]
        while True:
            before = set(names)
            for v in before:
                if v in lets:
                    free_vars(lets[v], names)
            for loop in reversed(loops):
                if loop.index.name in names:
                    free_vars(loop.start, names)
            if set(names) == before:
                break
        found.append((n, set(names)))

    lets = {}
    walk(kernel.body, lambda n, _s: lets.__setitem__(n.var.name, n.value) if isinstance(n, Let) else None)
    walk(kernel.body, visit)
    return found


def assert_stores_bind_the_grid(ck):
    """Every output store of a kernel launched on several blocks depends on blockIdx."""
    k = ck.kernel
    blocks = [pt.value for pt in (ParallelType.BIDx, ParallelType.BIDy, ParallelType.BIDz) if pt in k.launch]
    if not blocks or all(isinstance(k.launch[ParallelType(b)], Const) and k.launch[ParallelType(b)].value == 1
                         for b in blocks):  # fmt: skip
        return
    stores = _store_deps(k)
    assert stores, "kernel stores no output"
    for node, deps in stores:
        assert deps & set(blocks), (
            f"an output store does not depend on {blocks}: every CTA writes the same elements\n"
            + "\n".join(node.lines(0))
            + f"\n{ck.kernel_ir}"
        )


def _plain(ck) -> bool:
    found = []
    walk(ck.kernel.body, lambda n, s: found.append(n) if isinstance(n, (TmaLoad, TmaStore)) else None)
    return not found


SHAPES = {  # small enough for the interpreter, several CTAs each
    "pointwise": (6, 40),
    "pointwise_tma": (64, 256),
    "norm_registers": (20, 64),
    "norm_tma": (24, 256),
    "outer_reduction": (16, 96),
    "reduction_outer": (16, 96),
    "reduction_inner": (6, 64),
    "matmul_epilogue": (256, 512),  # x 64 (K)
}


def _check_case(monkeypatch, case, op, w_first, interp):
    sched = CASES[case][0]
    _force(monkeypatch, sched)
    mm = CASES[case][4] == "matmul"
    dtype = D.BFloat16 if mm else D.Float
    fd = _fusion(case, op, w_first, dtype)
    rows, cols = SHAPES[case]
    inputs = _inputs(op, rows, cols, torch.bfloat16 if mm else torch.float32, k=64 if mm else None)
    ck = fd.compile(inputs, arch="sm_90a")
    assert ck.name == f"circbuf_{sched}", ck.name
    assert_stores_bind_the_grid(ck)
    if interp:
        (out,) = interpret(fd, inputs)
        ref = _reference(case, op, w_first, inputs)
        if out.is_floating_point():
            tol = 2e-2 if mm else 1e-4  # a bf16 result
            assert_close(out, ref, rtol=tol, atol=tol)
        else:
            assert torch.equal(out.to(torch.int64), ref.to(torch.int64))
    return ck


@pytest.mark.parametrize("w_first", [False, True], ids=["rows_op_w", "w_op_rows"])
@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_operand_order_keeps_the_grid(monkeypatch, case, op, w_first):
    # the interpreter runs three representative ops per scheduler and order
    # (values, each element stored once); every op gets the loop check, its
    # CUDA not compiled (NVRTC is what makes this test slow; the three are)
    # (the matmul's TMA ring and wgmmas take seconds to interpret: one op)
    interp = op in (("mul",) if case == "matmul_epilogue" else ("mul", "atan2", "bitwise_or"))
    if not interp:
        monkeypatch.setattr(nvrtc, "compile_cuda", lambda *a, **k: b"")
    _check_case(monkeypatch, case, op, w_first, interp)


@pytest.mark.parametrize("w_first", [False, True], ids=["rows_op_w", "w_op_rows"])
def test_the_issue_softmax_kernel_strides_over_the_grid(w_first):
    """The reported kernel: 7874 rows of 96 halves, 985 CTAs of 8 rows; the
    row-block loop must start at blockIdx.x and step by the grid."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Half)
        w = fd.define_tensor([-1], dtype=D.Half)
        s = fd.ops.softmax(x, -1)
        fd.add_output(fd.ops.mul(w, s) if w_first else fd.ops.mul(s, w))
    ck = fd.compile(
        [torch.randn(7874, 96, dtype=torch.half), torch.randn(96, dtype=torch.half)], arch="sm_90a"
    )
    assert_stores_bind_the_grid(ck)
    loops = []
    walk(ck.kernel.body, lambda n, s: loops.append(n) if isinstance(n, ForLoop) and n.strided else None)
    assert len(loops) == 1 and str(loops[0].start) == "blockIdx.x", ck.kernel_ir


# ---------------------------------------------------------------------------- GPU


def _softmax_ref(op, w_first, x, w):
    s = x.double().softmax(-1).to(x.dtype).double()  # softmax returns the input's type
    w = w.double()
    return _ref_op(op, w, s) if w_first else _ref_op(op, s, w)


@pytest.mark.gpu
@pytest.mark.parametrize("w_first", [False, True], ids=["rows_op_w", "w_op_rows"])
@pytest.mark.parametrize("op", ["mul", "atan2"])
@pytest.mark.parametrize("dtype", [D.Half, D.Float])
@pytest.mark.parametrize("shape", [(7874, 96), (4096, 4096), (300, 4096), (6, 7, 333, 96)])
def test_gpu_broadcast_operand_times_softmax(shape, dtype, op, w_first):
    td = torch.float16 if dtype == D.Half else torch.float32
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1] * len(shape), dtype=dtype)
        w = fd.define_tensor([-1], dtype=dtype)
        s = fd.ops.softmax(x, -1)
        fd.add_output(getattr(fd.ops, op)(w, s) if w_first else getattr(fd.ops, op)(s, w))
    x, w = torch.randn(shape, dtype=td, device=DEV), torch.randn(shape[-1], dtype=td, device=DEV)
    (out,) = fd.execute([x, w])  # outputs NaN-poisoned (conftest): a row never written shows
    tol = 2e-3 if dtype == D.Half else 1e-5
    assert_close(out, _softmax_ref(op, w_first, x, w), rtol=tol, atol=tol)


GPU_SHAPES = {  # several row blocks per CTA where the scheduler loops over the grid
    "pointwise": (5000, 300),
    "pointwise_tma": (4096, 1024),
    "norm_registers": (20000, 96),
    "norm_tma": (9000, 4096),
    "outer_reduction": (4096, 1024),
    "reduction_outer": (300, 2000),
    "reduction_inner": (3000, 700),
    "matmul_epilogue": (2048, 2048),
}


@pytest.mark.gpu
@pytest.mark.parametrize("w_first", [False, True], ids=["rows_op_w", "w_op_rows"])
@pytest.mark.parametrize("op", ["mul", "atan2", "bitwise_or", "sub"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_operand_order(monkeypatch, case, op, w_first):
    _force(monkeypatch, CASES[case][0])
    mm = CASES[case][4] == "matmul"
    if mm and op in INT_OPS:
        pytest.skip("the fp32 accumulation order decides where a product truncates to an integer")
    if case.startswith("norm") and op in INT_OPS:
        pytest.skip("a softmax value an ulp below 1.0 (GPU exp2) truncates to 0 where float64's is 1.0")
    fd = _fusion(case, op, w_first, D.BFloat16 if mm else D.Float)
    rows, cols = GPU_SHAPES[case]
    inputs = _inputs(op, rows, cols, torch.bfloat16 if mm else torch.float32, DEV, k=256 if mm else None)
    (out,) = fd.execute(inputs)
    ref = _reference(case, op, w_first, inputs)
    if not out.is_floating_point():
        assert torch.equal(out.cpu().to(torch.int64), ref.to(torch.int64))
    elif mm:
        # bf16 products accumulate in fp32; the sum's rounding is the tolerance
        assert_close(out, ref, rtol=2e-2, atol=2e-2)
    else:
        assert_close(out, ref, rtol=1e-4, atol=1e-3 if CASES[case][4] != "epilogue" else 1e-5)


# ------------------------------------------------ independent parts, in place (item 2)


def _abs_min_in_place_and_or(out_order, device="cpu", n=1000):
    """abs(minimum(0, in0)) written into in0, and bitwise_or(in1, 5) of an
    int64 input expanded along its columns: two parts sharing no axis."""
    with cb.FusionDefinition() as fd:
        in0 = fd.define_tensor([-1, -1], dtype=D.Float)
        in1 = fd.define_tensor([-1, -1], dtype=D.Int64)
        t2 = fd.ops.abs(fd.ops.minimum(0.0, in0))
        t5 = fd.ops.bitwise_or(in1, 5)
        for k in out_order:
            fd.add_output(t2, alias_input=in0) if k == 0 else fd.add_output(t5)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(2, n, generator=g).to(device)
    y = (
        torch.randint(0, 9, (2, 1), generator=g).to(device).expand(2, n)
    )  # stride 0 (to() would copy it dense)
    return fd, [x, y], [x.cpu().double().clamp(max=0).abs(), y.cpu() | 5]


def _add_in_place_and_floor(out_order, device="cpu", rows=32, cols=8192):
    """cast(in0 + in2, bf16) written into in2 (in0 column-major, in2 bf16), and
    floor(in1 * 2.5) of an fp16 view starting one element into its buffer."""
    with cb.FusionDefinition() as fd:
        in0 = fd.define_tensor([-1, -1], dtype=D.Half, stride_order=[0, 1])
        in1 = fd.define_tensor([-1, -1], dtype=D.Half)
        in2 = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        t6 = fd.ops.cast(fd.ops.add(in0, in2), D.BFloat16)
        t9 = fd.ops.floor(fd.ops.mul(in1, 2.5))
        for k in out_order:
            fd.add_output(t6, alias_input=in2) if k == 0 else fd.add_output(t9)
    g = torch.Generator().manual_seed(rows + cols)
    a = torch.randn(cols, rows, generator=g, dtype=torch.float32).half().to(device).t()
    b = torch.randn(rows * cols + 1, generator=g).half().to(device)[1:].view(rows, cols)
    c = torch.randn(rows, cols, generator=g).bfloat16().to(device)
    ref6 = (a.cpu().double() + c.cpu().double()).bfloat16()
    return fd, [a, b, c], [ref6, (b.cpu().double() * 2.5).floor()]


def _check_in_place(inputs, outs, refs, written):
    """``written``: the input position written in place (refs[0]); refs[1]: the returned output."""
    assert len(outs) == 1  # an output written in place is not returned
    got = inputs[written].cpu()
    assert torch.equal(got.double(), refs[0].double()), (
        f"{int((got.double() != refs[0].double()).sum())} wrong"
    )
    assert torch.equal(outs[0].cpu().double(), refs[1].double())


@pytest.mark.parametrize("out_order", [(0, 1), (1, 0)], ids=["in_place_first", "in_place_last"])
def test_independent_parts_are_kernels_of_their_own(out_order):
    """Neither part may be left to serial loops every CTA runs: each gets a
    kernel (segment), each element stored exactly once (the interpreter
    counts), the in-place one read before written."""
    fd, inputs, refs = _abs_min_in_place_and_or(out_order, n=700)
    ck = fd.compile(inputs, arch="sm_90a")
    assert len(ck.kernels) == 2
    for k in ck.kernels:
        assert_stores_bind_the_grid(k)
    outs = interpret(fd, inputs)
    _check_in_place(inputs, outs, refs, written=0)


@pytest.mark.parametrize("out_order", [(0, 1), (1, 0)], ids=["in_place_first", "in_place_last"])
def test_independent_parts_with_views_in_place(out_order):
    fd, inputs, refs = _add_in_place_and_floor(out_order, rows=8, cols=160)
    outs = interpret(fd, inputs)
    _check_in_place(inputs, outs, refs, written=2)


def test_an_output_left_unscheduled_on_a_grid_is_refused():
    """The lowering's net under the schedulers: a manual schedule that binds
    one output to the grid and leaves the other's loops serial would have
    every CTA write all of the second."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        y = fd.define_tensor([-1], dtype=D.Float)
        a, b = fd.ops.exp(x), fd.ops.neg(y)
        fd.add_output(a)
        fd.add_output(b)
    a.split(0, 128)
    a.axis(0).parallelize(ParallelType.BIDx)
    a.axis(1).parallelize(ParallelType.TIDx)
    with pytest.raises(cb.CircbufError, match=r"output T\d+ has no axis bound to a block index.*every CTA"):
        fd.compile([torch.randn(1000), torch.randn(1000)], arch="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("out_order", [(0, 1), (1, 0)], ids=["in_place_first", "in_place_last"])
def test_gpu_independent_parts_in_place(out_order):
    for make in (_abs_min_in_place_and_or, _add_in_place_and_floor):
        fd, inputs, refs = make(out_order, device=DEV)
        written = 0 if make is _abs_min_in_place_and_or else 2
        outs = fd.execute(inputs)
        _check_in_place(inputs, outs, refs, written)


# ------------------------------------------- layer norm from primitives (item 3)


def _prim_layer_norm(shape, keepdim, var_mean):
    """nvFuser's test_prim_layer_norm_fwd: layer norm over the last axis from
    sum/div/sub/mul (or var_mean), outputs (out, mean, invstd); with keepdim the
    per-row values keep a size-1 axis and broadcast by themselves."""
    n = shape[-1]
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], contiguity=[True] * 3, dtype=D.Float)
        w = fd.define_tensor([-1], contiguity=[True], dtype=D.Float)
        b = fd.define_tensor([-1], contiguity=[True], dtype=D.Float)

        def rows(t):  # a per-row value against the rows
            return t if keepdim else fd.ops.broadcast_in_dim(t, shape=shape, broadcast_dims=[0, 1])

        if var_mean:
            var, mean = fd.ops.var_mean(x, dims=[2], correction=0, keepdim=keepdim)
            diff = fd.ops.sub(x, rows(mean))
        else:
            size = fd.define_scalar(n)
            mean = fd.ops.div(fd.ops.sum(x, dims=[2], keepdim=keepdim), size)
            diff = fd.ops.sub(x, rows(mean))
            var = fd.ops.div(fd.ops.sum(fd.ops.mul(diff, diff), dims=[2], keepdim=keepdim), size)
        invstd = fd.ops.rsqrt(fd.ops.add(var, fd.define_scalar(1e-12)))
        y = fd.ops.mul(
            fd.ops.mul(diff, rows(invstd)), fd.ops.broadcast_in_dim(w, shape=shape, broadcast_dims=[2])
        )
        fd.add_output(fd.ops.add(y, fd.ops.broadcast_in_dim(b, shape=shape, broadcast_dims=[2])))
        fd.add_output(mean)
        fd.add_output(invstd)
    return fd


def _prim_layer_norm_ref(inputs, keepdim):
    x, w, b = (t.cpu().double() for t in inputs)
    mean = x.mean(2, keepdim=True)
    invstd = ((x - mean) ** 2).mean(2, keepdim=True).add(1e-12).rsqrt()
    out = (x - mean) * invstd * w + b
    return [out, mean if keepdim else mean[..., 0], invstd if keepdim else invstd[..., 0]]


LN_SCHEDULES = {  # scheduler forced, overrides
    "norm_registers": ("normalization", {"staging": "registers"}),
    "norm_tma": ("normalization", {"staging": "tma"}),
    "reduction": ("reduction", {}),
}


@pytest.mark.parametrize("var_mean", [False, True], ids=["sum_div", "var_mean"])
@pytest.mark.parametrize("keepdim", [False, True], ids=["dropdim", "keepdim"])
@pytest.mark.parametrize("sched", sorted(LN_SCHEDULES))
def test_prim_layer_norm_lowers_and_runs(monkeypatch, sched, keepdim, var_mean):
    """keepdim=True ended in StopIteration in the loop nest: the normalization
    scheduler inlined the mean/invstd outputs' caches (one value per row, with a
    size-1 axis) into the row's element loop, so the variance's accumulation and
    the output it feeds shared one loop."""
    name, overrides = LN_SCHEDULES[sched]
    _force(monkeypatch, name)
    shape = [2, 6, 256] if sched == "norm_tma" else [2, 5, 64]
    fd = _prim_layer_norm(shape, keepdim, var_mean)
    if overrides:
        fd.fusion.schedule(**overrides)
    g = torch.Generator().manual_seed(7)
    inputs = [
        torch.randn(*shape, generator=g),
        torch.randn(shape[2], generator=g),
        torch.randn(shape[2], generator=g),
    ]
    ck = fd.compile(inputs, arch="sm_90a")
    assert ck.name == f"circbuf_{name}"
    assert_stores_bind_the_grid(ck)
    for o, r in zip(interpret(fd, inputs), _prim_layer_norm_ref(inputs, keepdim)):
        assert_close(o, r, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("var_mean", [False, True], ids=["sum_div", "var_mean"])
@pytest.mark.parametrize("keepdim", [False, True], ids=["dropdim", "keepdim"])
def test_gpu_prim_layer_norm(keepdim, var_mean):
    shape = [64, 128, 1024]
    fd = _prim_layer_norm(shape, keepdim, var_mean)
    inputs = [
        torch.randn(*shape, device=DEV),
        torch.randn(shape[2], device=DEV),
        torch.randn(shape[2], device=DEV),
    ]
    for o, r in zip(fd.execute(inputs), _prim_layer_norm_ref(inputs, keepdim)):
        assert_close(o, r, rtol=1e-4, atol=1e-4)


# ------------------------------------ lowering checks on valid fusions (item 3)


def _recomputed_broadcast(fd):
    """A broadcast read by an output and by a reduction: the scheduler gives the
    reduction its own copy, whose fresh axes must stay the original's."""
    x = fd.define_tensor([-1], dtype=D.Float)
    b = fd.ops.broadcast_in_dim(x, [2, 16, 96], [0])
    t = fd.ops.add(b, b)
    fd.add_output(t)
    fd.add_output(fd.ops.add(b, fd.ops.broadcast_in_dim(fd.ops.sum(t, [0]), [2, 16, 96], [1, 2])))
    return [(2,)], lambda x: [
        2 * x[:, None, None].expand(2, 16, 96),
        (x[:, None, None] + 2 * x.sum()).expand(2, 16, 96),
    ]


def _recomputed_broadcast_reduced(fd):
    x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    w = fd.define_tensor([-1, -1], dtype=D.Float)
    wb = fd.ops.broadcast_in_dim(w, [3, 16, 4], [0, 1])
    fd.add_output(fd.ops.mul(fd.ops.exp(wb), fd.ops.exp(x)))
    fd.add_output(fd.ops.sum(wb, [1]))
    return [(3, 16, 4), (3, 16)], lambda x, w: [
        w.exp()[..., None] * x.exp(),
        w.sum(1)[:, None].expand(3, 4),
    ]


def _fixed_size_meets_input_size(fd):
    """An input's extent and a size the fusion fixes (broadcast_in_dim to
    [2, 5, 4]) in one axis class: the loops must read one extent."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    z = fd.define_tensor([-1, -1], dtype=D.Float)
    y = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    fd.add_output(fd.ops.permute(fd.ops.broadcast_in_dim(z, [2, 5, 4], [0, 1]), [0, 1, 2]))
    fd.add_output(fd.ops.add(y, fd.ops.broadcast_in_dim(x, [2, 5, 4], [0, 2])))
    return [(2, 4), (2, 5), (2, 5, 4)], lambda x, z, y: [z[..., None].expand(2, 5, 4), y + x[:, None, :]]


def _fixed_size_meets_input_size_reduced(fd):
    w = fd.define_tensor([-1], dtype=D.Float)
    v = fd.define_tensor([-1], dtype=D.Float)
    u = fd.define_tensor([-1], dtype=D.Float)
    vb = fd.ops.broadcast_in_dim(v, [3, 16, 96], [2])
    fd.add_output(fd.ops.add(fd.ops.exp(fd.ops.broadcast_in_dim(w, [3, 16, 96], [2])), vb))
    t = fd.ops.add(fd.ops.broadcast_in_dim(u, [3, 16, 96], [0]), vb)
    fd.add_output(fd.ops.sum(fd.ops.mul(t, t), [2], keepdim=True))

    def ref(w, v, u):
        t = u[:, None, None] + v
        return [(w.exp() + v).expand(3, 16, 96), (t * t).sum(2, keepdim=True).expand(3, 16, 1)]

    return [(96,), (96,), (3,)], ref


LOWERING_CASES = {
    "recomputed_broadcast": _recomputed_broadcast,  # output left off the grid
    "recomputed_broadcast_reduced": _recomputed_broadcast_reduced,  # blockIdx.x with two extents
    "fixed_size_meets_input_size": _fixed_size_meets_input_size,  # as the fuzzer wrote it, segmented
    "fixed_size_meets_input_size_reduced": _fixed_size_meets_input_size_reduced,  # loop axis 0 differs
}


@pytest.mark.parametrize("name", sorted(LOWERING_CASES))
def test_valid_fusions_pass_the_lowering_checks(name):
    with cb.FusionDefinition() as fd:
        shapes, ref = LOWERING_CASES[name](fd)
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(*s, generator=g) for s in shapes]
    outs = interpret(fd, inputs)
    refs = ref(*[x.double() for x in inputs])
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(LOWERING_CASES))
def test_gpu_valid_fusions_pass_the_lowering_checks(name):
    with cb.FusionDefinition() as fd:
        shapes, ref = LOWERING_CASES[name](fd)
    inputs = [torch.randn(*s, device=DEV) for s in shapes]
    for o, r in zip(fd.execute(inputs), ref(*[x.double().cpu() for x in inputs])):
        assert_close(o, r, rtol=1e-5, atol=1e-5)
