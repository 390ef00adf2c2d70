"""The matmul scheduler on the CPU: the fusion IR, params, every override
set compiled for sm_90a and read back as SASS, the errors each invalid
override raises, and the SIMT path's structure."""

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.ir import Const
from circbuf.lowering.kir import (
    Assign,
    ElectOne,
    ForLoop,
    MBarrierWait,
    RingAdvance,
    RingInit,
    TmaStore,
    Wgmma,
    WgmmaWait,
    walk,
)
from tests.test_gpu_matmul import OVERRIDES, check, epilogue_input, expanded_operand, mm_fusion
from tests.util import D


@pytest.fixture(autouse=True)
def _production_kernels(monkeypatch):
    # the SASS checks are about the kernels users run: CIRCBUF_DEBUG_HANG's
    # bounded waits (scripts/gpu_check.sh sets it) cost registers and may spill
    monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)


def nodes(kernel, kind):
    out = []
    walk(kernel.body, lambda n, s: out.append(n) if isinstance(n, kind) else None)
    return out


def compile_mm(m, n, k, kind="matmul", dtype=torch.bfloat16, overrides=None, **kw):
    fd = mm_fusion(kind, D.BFloat16 if dtype == torch.bfloat16 else D.Half, **kw)
    if overrides:
        fd.fusion.schedule(**overrides)
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn((n, k) if kind == "linear" else (k, n), dtype=dtype)
    return fd, fd.compile([a, b], arch="sm_90a")


def test_a_matmul_is_one_expr_in_the_inputs_dtype():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.Half)
        x = fd.define_tensor([-1, -1], dtype=D.Half)
        c = fd.ops.matmul(a, b)
        y = fd.ops.linear(x, w)
        fd.add_output(c)
        fd.add_output(y)
    assert c.dtype == D.BFloat16 and y.dtype == D.Half
    assert [str(i.extent) for i in c.logical] == ["i0", "i1", "i4"]  # [B, M, K] @ [K, N] -> [B, M, N]
    math = fd.fusion.print_math()
    assert "T4 = matmul(T0, T1)" in math and "T5 = linear(T3, T2)" in math
    # torch's 1-D rules
    with cb.FusionDefinition() as fd:
        v = fd.define_tensor([-1], dtype=D.Float)
        m = fd.define_tensor([-1, -1], dtype=D.Float)
        assert (
            fd.ops.matmul(v, m).ndim == 1 and fd.ops.matmul(m, v).ndim == 1 and fd.ops.matmul(v, v).ndim == 0
        )


def test_params_golden():
    _, ck = compile_mm(4096, 4096, 4096)
    assert str(ck.params) == (
        "===== Matmul params =====\n"
        "  tile: (128, 256, 64)\n  stages: 4\n  prefetch: 3\n  persistent: True\n  pingpong: False\n"
        "  cluster: (1, 1)\n  raster: M\n  group: 8\n  registers: (40, 232)\n  epilogue_tile: (64, 64)\n"
        "  grid: 132\n  store: tma\n  store_buffers: 2\n  a_major: K\n  b_major: N\n  simt: None\n"
    )
    assert ck.params.brief() == (
        "tile 128x256x64, 4 stages (prefetch 3), persistent, cooperative, raster M/8, grid 132"
    )


def check_sass(ck, n_min=128):
    sass = ck.sass()
    shapes = {int(x) for x in re.findall(r"HGMMA\.64x(\d+)x16\.F32\.BF16", sass)}
    assert shapes and min(shapes) >= n_min, shapes
    for op in ("UTMALDG", "SYNCS", "UTMASTG"):
        assert op in sass, op
    # the epilogue role's 512 threads compile at 128 registers each: no role rebalances
    assert ("USETMAXREG" in sass) == (ck.params.registers is not None)
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory (spills) in a matmul kernel"
    use = ck.resource_usage()
    assert use["LOCAL"] == 0 and use["STACK"] == 0
    log = ck.compile_log()
    assert "Used" in log and "registers" in log  # the -v lines are there: the log is the real one
    # ptxas serializes wgmmas it cannot pipeline (C7510, C7511, C7515...): none here
    assert not re.search(r"C75(09|1\d)|serializ", log), log


@pytest.mark.parametrize("kind", ["matmul", "linear"])
def test_heuristic_kernel_sass(kind):
    fd, ck = compile_mm(4096, 4096, 4096, kind)
    check_sass(ck, 256)
    k = ck.kernel
    # one ring feeds both operand tiles; the readers release a stage after the
    # next k step's wait_group 1, and once more after the k loop's wait_group 0
    assert [w.pending for w in nodes(k, WgmmaWait)] == [1, 0]
    assert {w.bar.name for w in nodes(k, MBarrierWait)} == {
        "ab_full",
        "ab_empty",
    }  # the ring of operands A and B
    assert {r.ring.name for r in nodes(k, RingInit)} == {"ab_load", "ab_use"}
    (w,) = nodes(k, Wgmma)
    assert w.shape == (64, 256, 16) and w.a.swizzle == w.b.swizzle == 128
    assert w.b.transpose == (kind == "matmul")  # [K, N] is N-major
    assert "a_stage_desc + (unsigned long long)" in ck.cuda  # descriptors made once, offsets added per k step
    assert any(isinstance(e.then[0], TmaStore) for e in nodes(k, ElectOne) if e.then)


@pytest.mark.parametrize("ov", OVERRIDES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_override_sets_compile(ov):
    fd, ck = compile_mm(1000, 1032, 520, "matmul", overrides=ov)
    p = ck.params
    for key, v in ov.items():
        assert getattr(p, key) == (tuple(v) if isinstance(v, list) else v)
    check_sass(ck, 64 if p.tile[1] < 128 else 128)
    if p.pingpong:
        k = ck.kernel
        # each warpgroup owns whole tiles: it starts a tile later and skips the other's
        init = [r for r in nodes(k, RingInit) if r.ring.name.endswith("_use")][0]
        assert "threadIdx.y" in str(init.position)
        assert any(a.ring.name.endswith("_use") and str(a.count) != "1" for a in nodes(k, RingAdvance))
        assert {"acc_mma_turn", "acc_epi_turn"} <= set(k.barrier_names)
        # the turn has one slot: a phase bit, no stage index (no `% 1`, no `== 1` wrap)
        assert "acc_turn_phase ^= 1;" in ck.cuda and "acc_turn_stage" not in ck.cuda


def test_epilogues_and_bias_compile():
    for epi in ("gelu", "silu", "relu", "tanh_gelu", "residual"):
        fd = mm_fusion("matmul", epilogue=epi)
        inputs = [torch.randn(512, 256, dtype=torch.bfloat16), torch.randn(256, 384, dtype=torch.bfloat16)]
        if epi == "residual":
            inputs.append(torch.randn(512, 384, dtype=torch.bfloat16))
        check_sass(fd.compile(inputs, arch="sm_90a"))
    fd = mm_fusion("linear", bias=True, epilogue="gelu")
    ck = fd.compile(
        [
            torch.randn(512, 256, dtype=torch.bfloat16),
            torch.randn(384, 256, dtype=torch.bfloat16),
            torch.randn(384, dtype=torch.bfloat16),
        ],
        arch="sm_90a",
    )
    check_sass(ck)
    # the epilogue runs on the fp32 accumulator: no bf16 round trip before gelu
    assert "gelu" in ck.cuda and ck.params.simt is None


def input_loads(ck, k) -> list:
    """(elements per load, loads per tile and thread) of each statement that
    reads fusion input ``k``: the loops of a fixed trip count around it (the
    tile loop's trip count is not fixed)."""
    x = ck.kernel.tensor_params[k].tv
    out = []

    def visit(n, stack):
        if isinstance(n, Assign) and any(getattr(o, "tv", None) is x for o in n.operands):
            trips = 1
            for s in stack:
                if isinstance(s, ForLoop) and isinstance(s.extent, Const):
                    trips *= s.extent.value
            out.append((n.operands[0].vector if n.operands[0].tv is x else 1, trips))

    walk(ck.kernel.body, visit)
    return out


@pytest.mark.parametrize(
    "what, n, loads",
    [
        # a thread's fragment of a 128 x 256 tile: 2 rows (h) x 64 columns (8 j x 4 sub-tiles x pairs e);
        # before each was read once per accumulator element: [(1, 128)]
        ("bias_n", 1022, [(2, 32)]),  # each column once, a pair at a time
        ("bias_n", 1021, [(1, 64)]),  # N odd: a pair could straddle the end
        ("bias_n_row", 1022, [(2, 32)]),
        ("bias_n_strided", 1022, [(1, 64)]),
        ("bias_n_offset", 1022, [(1, 64)]),
        ("bias_m", 1022, [(1, 2)]),  # each row once per tile
        ("bias_m_expanded", 1022, [(1, 2)]),
        ("residual", 1022, [(2, 64)]),
        ("residual", 1021, [(1, 128)]),
        ("residual_t", 1022, [(1, 128)]),
    ],
)
def test_epilogue_input_loaded_once_per_value(what, n, loads):
    """An epilogue input is loaded outside the loops over its broadcast axes
    (a bias along N once per fragment column, not per row; along M once per
    tile), in pairs along N where its layout allows; the numerics run on the GPU
    (test_gpu_matmul.test_epilogue_inputs)."""
    fd, inputs, _ = epilogue_input(what, 257, n, 72)
    ck = fd.compile(inputs, arch="sm_90a")
    assert ck.params.simt is None
    assert input_loads(ck, 2) == loads
    assert ck.params.vectorize_inputs == ((False, False, True) if loads[0][0] == 2 else ())


@pytest.mark.parametrize("epilogue", ["relu", "gelu", "silu"])
def test_linear_bias_epilogues_do_not_spill(epilogue):
    """linear + bias + activation, the bias in pairs once per fragment column
    (zeroed registers where a load is skipped: codegen._zeroed_registers)."""
    fd = mm_fusion("linear", bias=True, epilogue=epilogue)
    m, n, k = 1024, 2048, 512
    ck = fd.compile(
        [
            torch.randn(m, k, dtype=torch.bfloat16),
            torch.randn(n, k, dtype=torch.bfloat16),
            torch.randn(n, dtype=torch.bfloat16),
        ],
        arch="sm_90a",
    )
    check_sass(ck, 256)
    assert input_loads(ck, 2) == [(2, 32)]
    assert re.search(r"cb_bfloat16 T\d+\[2\] = \{\};", ck.cuda)  # the bias pair


@pytest.mark.parametrize(
    "ov, match",
    [
        (dict(stages=1), r"stages=1\): must be an int >= 2"),
        (dict(stages=9), r"9 stages of 49152 bytes exceed"),
        (dict(prefetch=4), r"prefetch=4\): must satisfy 0 < prefetch < stages \(4\)"),
        (dict(tile=(100, 256, 64)), r"bm = 100 must be a multiple of 64 per warpgroup"),
        (dict(tile=(128, 250, 64)), r"bn = 250 must be a multiple of 16"),
        (dict(tile=(128, 256, 32)), r"bk = 32 must be 64 or 128"),
        (dict(tile=(128, 256)), r"must be \(bm, bn, bk\), three ints"),
        (
            dict(pingpong=True, tile=(128, 256, 64)),
            r"a warpgroup's 256 accumulator registers per thread do not fit",
        ),
        (dict(cluster=(3, 1)), r"the cluster must divide the tile grid"),
        (dict(cluster=(4, 4)), r"16 CTAs exceed the 8 of a portable cluster"),
        (dict(cluster=(0, 1)), r"two ints >= 1"),
        (dict(raster="Z"), r"raster='Z'\): must be 'M' or 'N'"),
        (dict(group=0), r"group=0\): must be an int >= 1"),
        (dict(persistent="yes"), r"persistent='yes'\): must be True or False"),
        (dict(registers=(41, 232)), r"two multiples of 8 in \[24, 256\]"),
        (
            dict(registers=232),
            r"schedule\(registers=232\): must be \(producer, consumers\), two multiples of 8",
        ),
        (dict(registers=(160, 240)), r"exceed the CTA's 64512"),
        # 1024 registers over the launch's 168 x 384: the second consumer's setmaxnreg.inc
        # never returned on an H100 (fuzz 784:30), though 65536 fit the SM
        (dict(registers=(48, 232)), r"= 65536 exceed the CTA's 64512 \(384 threads x 168 at launch\)"),
        (dict(registers=(200, 232)), r"producer gives registers back"),
        (dict(epilogue_tile=(32, 64)), r"a sub-tile is 64 rows"),
        (dict(pingpong=True, persistent=False), r"ping-pong needs a persistent grid"),
        (dict(bogus=1), r"bogus"),
    ],
)
def test_invalid_overrides_are_named(ov, match):
    with pytest.raises(cb.CircbufError, match=match):
        compile_mm(1024, 1024, 1024, overrides=ov)


def test_simt_path_for_what_the_tensor_cores_cannot_take():
    # fp32 operands (a row stride TMA cannot take is a cp.async fill now:
    # tests/test_matmul_cp_async.py; K = 0 a fill: tests/test_matmul_no_simt.py)
    fd = mm_fusion("matmul", D.Float)
    ck = fd.compile([torch.randn(64, 96), torch.randn(96, 128)], arch="sm_90a")
    assert ck.params.simt is not None and "HGMMA" not in ck.sass()
    fd = mm_fusion("matmul")
    ck = fd.compile(
        [torch.randn(64, 0, dtype=torch.bfloat16), torch.randn(0, 32, dtype=torch.bfloat16)], arch="sm_90a"
    )
    assert [type(k.params).__name__ for k in ck.kernels] == ["PointwiseParams"]
    # fp32 runs the FFMA kernel (tests/test_matmul_ffma.py), which takes its own overrides only
    with pytest.raises(
        cb.CircbufError, match="SIMT path .*the FFMA kernel.*, which takes thread_tile, k_step"
    ):
        fd = mm_fusion("matmul", D.Float)
        fd.fusion.schedule(stages=3)
        fd.compile([torch.randn(64, 96), torch.randn(96, 128)], arch="sm_90a")
    with pytest.raises(cb.CircbufError, match=r"SIMT path \(Double operands .*the FFMA kernel"):
        fd = mm_fusion("matmul", D.Double)
        fd.fusion.schedule(stages=3)
        fd.compile([torch.randn(64, 8).double(), torch.randn(8, 32).double()], arch="sm_90a")


def test_reduction_or_second_matmul_gets_its_own_kernel():
    """The matmul scheduler refuses them by name; segmentation runs them as
    kernels of their own (a row reduction of the output: its partials in the
    matmul's epilogue, their reduction a kernel of its own,
    tests/test_matmul_reduce.py)."""
    from circbuf.scheduler.matmul import MatmulScheduler

    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        c = fd.ops.matmul(a, b)
        fd.add_output(fd.ops.sum(c, [1]))
    assert re.match(
        r"a reduction \(T\d+\) next to a matmul needs a kernel", MatmulScheduler.can_schedule(fd.fusion)
    )
    ck = fd.compile([torch.randn(64, 64, dtype=torch.bfloat16)] * 2, arch="sm_90a")
    assert [k.name for k in ck.kernels] == ["circbuf_matmul", "circbuf_reduction"]
    assert "partial sum" in str(ck)
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(fd.ops.matmul(a, b), b))
    assert MatmulScheduler.can_schedule(fd.fusion).startswith("2 matmuls in one fusion")
    ck = fd.compile([torch.randn(64, 64, dtype=torch.bfloat16)] * 2, arch="sm_90a")
    assert [k.name for k in ck.kernels] == ["circbuf_matmul", "circbuf_matmul"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 3000),
    n8=st.integers(1, 400),
    k8=st.integers(1, 600),
    kind=st.sampled_from(["matmul", "linear"]),
)
def test_hypothesis_shapes_compile(m, n8, k8, kind):
    _, ck = compile_mm(m, 8 * n8, 8 * k8, kind)
    if getattr(ck, "split_k", None) is not None:  # partial products, then their reduction
        mms = [k for k in ck.kernels if k.name == "circbuf_matmul"]
        assert len(mms) == len(ck.kernels) - 1 and all(
            k.params.simt is None and k.kernel.smem_bytes for k in mms
        )
        return
    assert ck.params.simt is None and ck.kernel.smem_bytes


def test_block_barrier_in_thread_dependent_loop_is_refused():
    """A ping-pong warpgroup's tile loop starts at its own threadIdx.y; a
    ``__syncthreads`` inside it would be reached a different number of times
    by each warpgroup (a hang), so lowering refuses it by name."""
    from circbuf.ir import Const, Var
    from circbuf.lowering.kir import BlockSync, ForLoop
    from circbuf.lowering.sync import _check_uniform_trips

    tid = Var("threadIdx.y", lo=0, hi=Const(2))
    loop = ForLoop(Var("t"), Const(100), [BlockSync("epilogue staging")], start=tid, step=Const(264))
    with pytest.raises(cb.CircbufError, match=r"loop t, whose trip count depends on threadIdx.y"):
        _check_uniform_trips([loop])
    # the same sync in a loop every thread runs alike is fine
    _check_uniform_trips(
        [ForLoop(Var("t"), Const(100), [BlockSync("x")], start=Var("blockIdx.x"), step=Const(132))]
    )
    # and a per-warpgroup named barrier inside the thread-dependent loop is fine
    per_group = BlockSync("staging", barrier=(tid + 1, 128))
    _check_uniform_trips([ForLoop(Var("t"), Const(100), [per_group], start=tid, step=Const(264))])


@pytest.mark.parametrize(
    "kind, shapes, match",
    [
        ("matmul", [(64, 32), (48, 16)], r"= 32 and extent .* = 48 must be equal: matmul: K of T0 and T1"),
        ("linear", [(64, 32), (16, 48)], r"= 32 and extent .* = 48 must be equal: linear: K of T0 and T1"),
        (
            "linear_bias",
            [(64, 32), (16, 32), (24,)],
            r"= 16 and extent .* = 24 must be equal: linear: bias length \(T2\) and N \(T1\)",
        ),
    ],
)
def test_run_time_extent_mismatch_names_the_contraction(kind, shapes, match):
    # symbolic K (and N) are checked against the inputs; the error says which
    # rule of the matmul they break, not "the fusion combines them elementwise"
    fd = mm_fusion("linear" if kind.startswith("linear") else "matmul", bias=kind == "linear_bias")
    with pytest.raises(cb.CircbufError, match=match):
        fd.compile([torch.randn(*s, dtype=torch.bfloat16) for s in shapes], arch="sm_90a")


def test_fixed_bias_length_mismatch_is_a_definition_error():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, 32], dtype=D.BFloat16)
        w = fd.define_tensor([16, 32], dtype=D.BFloat16)
        bias = fd.define_tensor([24], dtype=D.BFloat16)
        with pytest.raises(cb.CircbufError, match=r"linear: bias T2 has length 24, N of T1 is 16"):
            fd.ops.linear(x, w, bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("what", ["batch", "rows", "linear"])
def test_expanded_operand_keeps_the_expanded_extent(what, dtype):
    # torch's shape and values: the expanded extent, not the 1 the operand is
    # stored with. A 16-bit matmul is cut from the expand, which writes the
    # operand's rows out in full, and runs on the tensor cores (segmenter
    # ``_write_out_expanded``); fp32 (TF32 off) keeps the SIMT path whole
    fd, shapes, ref = expanded_operand(what, dtype)
    inputs = [torch.randn(s, dtype=dtype) for s in shapes]
    ck = fd.compile(inputs, arch="sm_90a")
    if dtype == torch.bfloat16:
        assert [k.params.simt for k in ck.kernels if hasattr(k.params, "simt")] == [None], ck
        # the matmul segment's operand is an input with rows (no expanded axis left)
        mm = ck.segments.segments[-1].fusion
        assert not any(i.is_broadcast for i in mm.inputs[0].logical), mm.print_math()
    else:
        assert ck.params.simt is not None
    (out,) = interpret(fd, inputs)
    check(out, ref(*[x.double() for x in inputs]), rel=1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_batch_of_one_with_a_k_major_b(monkeypatch):
    """``a [1, M, K] @ w.t()[None]`` (strides (x, 1, K)): a lowering check refused
    it ("the innermost box extent (1 x 2 B)") while size-1 axes went innermost
    in the kernel's memory order; the interpreter against float64 torch."""
    monkeypatch.setenv("CIRCBUF_INTERPRET", "1")
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    x = torch.randn(1, 70, 64, dtype=torch.bfloat16)
    w = torch.randn(1, 136, 64, dtype=torch.bfloat16).transpose(1, 2)  # [1, 64, 136], K-major
    (out,) = fd.execute([x, w])
    assert fd.last_params().simt is None
    ref = x.double() @ w.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_fixed_extents_small_m_ping_pong_stores_every_tile():
    """ViT's classifier head under torch.compile (static shapes): [2, 256] @
    W.t() + bias, N = 100, fixed extents, 64x64 ping-pong tiles on a grid of 2.
    A bounds check on the ping-pong warpgroup's share of the tiles read the tile
    loop's variable as the share's outer part: tile 1 (columns 64..99) was never
    stored (NaN on the GPU). The interpreter counts every output element's stores."""
    M, N, K = 2, 100, 256
    with cb.FusionDefinition() as fd:
        b = fd.define_tensor([N], dtype=D.BFloat16)
        x = fd.define_tensor([M, K], dtype=D.BFloat16)
        w = fd.define_tensor([K, N], dtype=D.BFloat16)
        t = fd.ops.cast(fd.ops.matmul(x, w), D.Float)
        bb = fd.ops.cast(fd.ops.broadcast(b, [True, False]), D.Float)
        fd.add_output(fd.ops.cast(fd.ops.add(t, bb), D.BFloat16))
    B = torch.randn(N, dtype=torch.bfloat16)
    X = torch.randn(M, K, dtype=torch.bfloat16)
    W = torch.randn(N, K, dtype=torch.bfloat16).t()
    (out,) = interpret(fd, [B, X, W])
    p = fd.last_params()
    assert p.pingpong and p.tile[:2] == (64, 64)
    check(out, X.double() @ W.double() + B.double())
