"""GPU tests of TMA circular buffering (normalization scheduler), against torch."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import circbuf as cb
from tests.util import TORCH, D, assert_close, manual_ws_exp, norm_fusion, norm_inputs, norm_reference

pytestmark = pytest.mark.gpu
DEV = "cuda"
TOL = {D.Float: 1e-4, D.Half: 4e-3, D.BFloat16: 3e-2}


def run_norm(kind, rows, cols, dtype=D.BFloat16, expect_norm=True, **overrides):
    """Run and compare with float64 torch; ``expect_norm``: the normalization scheduler (not
    the plain reduction kernel) took it, with ``staging`` in overrides that staging."""
    fd = norm_fusion(kind, dtype)
    if overrides:
        fd.fusion.schedule(**overrides)
    inputs = norm_inputs(kind, rows, cols, TORCH[dtype], DEV)
    (out,) = fd.execute(inputs)
    kind_used = type(fd.last_params()).__name__
    if expect_norm:
        assert kind_used == "NormalizationParams", fd.last_params()
        if "staging" in overrides:
            assert fd.last_params().staging == overrides["staging"]
    assert_close(out, norm_reference(kind, inputs), rtol=TOL[dtype], atol=TOL[dtype])
    return fd


@pytest.mark.parametrize("stages", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("war", ["block_sync", "mbarrier"])
def test_stages_and_war(stages, war):
    run_norm("softmax", 3000, 1024, stages=stages, war=war)


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
def test_warp_specialized(kind, stages):
    run_norm(kind, 3001, 2048, stages=stages, warp_specialized=True)
    run_norm(kind, 3, 4096, stages=stages, warp_specialized=True)  # fewer row blocks than stages


@pytest.mark.parametrize("hang", ["", "2000000"])
def test_warp_specialized_manual_nested_ring_with_setmaxnreg(monkeypatch, hang):
    monkeypatch.setenv("CIRCBUF_DEBUG_HANG", hang)  # bounded waits on and off
    fd = manual_ws_exp(128, 3)
    a = torch.randn(37, 1000, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a])
    assert_close(out, torch.exp(a.double()))


@pytest.mark.parametrize("cols, stages", [(1000, 3), (768, 3), (1000, 2), (1024, 4), (296, 3)])
@pytest.mark.parametrize("war", ["block_sync", "mbarrier"])
def test_pipelined_ring_inside_an_outer_loop(monkeypatch, cols, stages, war):
    """The hang of issue 7: columns split by 128 (8 inner iterations for 1000)
    with 3 stages inside a row loop stopped on T4_full[0]: each row pair re-ran
    the prologue from stage 0. The ring now runs on across the row loop."""
    from tests.util import manual_ring_exp

    monkeypatch.setenv("CIRCBUF_DEBUG_HANG", "2000000")  # a protocol bug is a named error, not a hang
    fd = manual_ring_exp(128, stages, cb.Pipelined(war=war))
    a = torch.randn(37, cols, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a])
    assert_close(out, torch.exp(a.double()))


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
def test_rows_not_in_registers(kind):
    # rows short enough for registers, re-read from shared memory by every pass instead
    fd = run_norm(kind, 301, 1024, rows_in_registers=False)
    assert fd.last_params().row_length == 0


@pytest.mark.parametrize("stages, prefetch", [(3, 1), (4, 2), (4, 1), (6, 3)])
def test_prefetch_distances(stages, prefetch):
    run_norm("layer_norm", 2049, 2048, stages=stages, prefetch=prefetch)


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_fewer_iterations_than_stages(rows):
    run_norm("rms_norm", rows, 4096, stages=4)


@pytest.mark.parametrize("cols", [8, 24, 136, 1000, 4104, 3000, 16384])
@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("staging", ["tma", "registers"])
def test_row_lengths_not_multiples_of_the_box(kind, cols, staging):
    run_norm(kind, 301, cols, staging=staging)


@pytest.mark.parametrize("dtype", [D.Float, D.Half, D.BFloat16])
@pytest.mark.parametrize("staging", ["tma", "registers"])
def test_dtypes(dtype, staging):
    run_norm("layer_norm", 777, 2048, dtype, staging=staging)


def test_huge_and_fallback_shapes():
    run_norm("softmax", 65536, 1024, staging="tma")  # many row blocks per CTA
    run_norm("softmax", 65536, 1024, staging="registers")  # 8192 CTAs
    run_norm("softmax", 8, 131072, expect_norm=False)  # rows too long for shared memory
    run_norm("rms_norm", 100, 1001, expect_norm=False)  # row stride not a multiple of 16 bytes
    run_norm("layer_norm", 100, 4096, tma=False, expect_norm=False)


def test_misaligned_view_takes_the_plain_path():
    fd = norm_fusion("softmax", D.BFloat16)
    base = torch.randn(64 * 1024 + 8, device=DEV, dtype=torch.bfloat16)
    x = base[1 : 1 + 64 * 1024].view(64, 1024)
    (out,) = fd.execute([x])
    assert type(fd.last_params()).__name__ == "ReductionParams"
    assert_close(out, torch.softmax(x.double(), -1), rtol=3e-2, atol=3e-2)


def test_tensor_map_follows_new_pointers():
    fd = norm_fusion("rms_norm", D.BFloat16)
    fd.fusion.schedule(staging="tma")
    for _ in range(3):  # same shape: same plan, new addresses each call
        inputs = norm_inputs("rms_norm", 512, 2048, torch.bfloat16, DEV)
        (out,) = fd.execute(inputs)
        assert_close(out, norm_reference("rms_norm", inputs), rtol=3e-2, atol=3e-2)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.sampled_from([1, 3, 7, 64, 1000, 4099]),
    cols=st.sampled_from([8, 64, 200, 1024, 2056, 8192]),
    stages=st.integers(2, 6),
    war=st.sampled_from(["block_sync", "mbarrier", "warp_specialized"]),
    kind=st.sampled_from(["softmax", "layer_norm", "rms_norm"]),
)
def test_hypothesis_tma_norms(rows, cols, stages, war, kind):
    if war == "warp_specialized":
        run_norm(kind, rows, cols, stages=stages, warp_specialized=True)
    else:
        run_norm(kind, rows, cols, stages=stages, war=war)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each example compiles a kernel
)
@given(
    rows=st.sampled_from([1, 3, 7, 64, 1000, 4099, 10000]),
    cols=st.sampled_from([8, 64, 200, 512, 1000, 2056, 5000, 8192, 16384, 32768]),
    dtype=st.sampled_from([D.Float, D.Half, D.BFloat16]),
    kind=st.sampled_from(["softmax", "layer_norm", "rms_norm"]),
    blocks=st.sampled_from([None, 1, 2]),
)
def test_hypothesis_register_staged_norms(rows, cols, dtype, kind, blocks):
    """Rows loaded straight into registers (the default where a row fits); outputs are
    poisoned with NaN first (conftest): every element must be written."""
    ov = {"staging": "registers"}
    if blocks:
        ov["blocks_per_sm"] = blocks
    run_norm(kind, rows, cols, dtype, **ov)  # checks the staging taken


BROKEN = textwrap.dedent(
    """
    import importlib, torch, circbuf as cb
    cbp = importlib.import_module("circbuf.lowering.circular_buffer")
    from tests.util import norm_fusion, norm_inputs, D
    issue = cbp._issue
    def broken(*args, **kw):  # announce twice the bytes that will land: full[] never completes
        nodes = issue(*args, **kw)
        for n in nodes:
            if type(n).__name__ == "MBarrierArriveExpectTx":
                n.bytes = n.bytes * 2
        return nodes
    cbp._issue = broken
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(staging="tma")
    try:
        fd.execute(norm_inputs("softmax", 256, 1024, torch.bfloat16, "cuda"))
        print("NO ERROR")
    except cb.CircbufError as e:
        print("CIRCBUF_ERROR:", e)
    """
)


def test_broken_protocol_raises_instead_of_hanging():
    env = dict(os.environ, CIRCBUF_DEBUG_HANG="20000", CIRCBUF_CACHE_DIR="")
    r = subprocess.run(
        [sys.executable, "-c", BROKEN],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert "CIRCBUF_ERROR:" in r.stdout, r.stdout + r.stderr
    assert re.search(r"mbarrier wait on \w+_full\[", r.stdout), r.stdout


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("store", [False, True])
@pytest.mark.parametrize("shape", [(1, 8), (17, 1000), (300, 4096), (3, 5, 264)])
def test_pointwise_tma(stages, ws, store, shape):
    from tests.util import axpy_fusion

    fd = axpy_fusion(D.BFloat16, len(shape))
    fd.fusion.schedule(stages=stages, warp_specialized=ws, tma_store=store)
    x = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([x, y])
    assert type(fd.last_params()).__name__ == "PointwiseTmaParams"
    assert fd.last_params().tma_store == store
    assert_close(out, x.double() * y.double() + 1)


@pytest.mark.parametrize("ws", [False, True])
def test_tma_store_two_outputs_of_two_dtypes(ws):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        e = fd.ops.exp(x)
        fd.add_output(e)  # fp32
        fd.add_output(fd.ops.cast(fd.ops.mul(e, 2.0), D.BFloat16))
    fd.fusion.schedule(stages=3, warp_specialized=ws, tma_store=True)
    for rows, cols in ((1, 8), (33, 264), (1000, 4096)):
        x = torch.randn(rows, cols, device=DEV, dtype=torch.bfloat16)
        e, y = fd.execute([x])
        assert fd.last_params().tma_store
        ref = torch.exp(x.double())
        assert_close(e, ref, rtol=1e-5, atol=1e-5)
        assert_close(y, 2 * ref)


def test_manual_tma_store():
    from tests.util import manual_tma_store

    fd = manual_tma_store()
    for shape in ((8, 32), (61, 100), (1024, 4096)):
        x = torch.randn(shape, device=DEV)
        (y,) = fd.execute([x])
        assert_close(y, torch.exp(x.double()), rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.sampled_from([1, 2, 15, 16, 17, 999]),
    cols=st.sampled_from([8, 16, 248, 256, 264, 3000]),
    stages=st.integers(2, 5),
    store=st.booleans(),
)
def test_hypothesis_pointwise_tma(rows, cols, stages, store):
    from tests.util import unary_fusion

    fd = unary_fusion("gelu", D.Half, 2)
    fd.fusion.schedule(stages=stages, tma_store=store)
    x = torch.randn(rows, cols, device=DEV, dtype=torch.float16)
    (out,) = fd.execute([x])
    assert_close(out, torch.nn.functional.gelu(x.double()))


def run_outer(op, shape, axes=(0,), dtype=D.BFloat16, weight=False, expect_norm=True, **overrides):
    from tests.util import OUTER_TORCH, outer_fusion

    fd = outer_fusion(op, dtype, len(shape), axes, weight)
    if overrides:
        fd.fusion.schedule(**overrides)
    x = torch.randn(shape, device=DEV, dtype=TORCH[dtype])
    ins = [x]
    xr = x.double()
    if weight:
        w = torch.randn(shape[len(axes) :], device=DEV, dtype=TORCH[dtype])
        ins.append(w)
        xr = xr * w.double()
    (out,) = fd.execute(ins)
    if expect_norm:
        assert type(fd.last_params()).__name__ == "OuterReductionParams", fd.last_params()
    ref = OUTER_TORCH[op](xr, axes)
    tol = TOL[dtype] * (
        1 if op in ("max", "min", "mean") else max(1.0, (xr.numel() / ref.numel()) ** 0.5 / 4)
    )
    assert_close(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("shape", [(1, 8), (7, 24), (1000, 4096), (4099, 264), (20000, 64)])
def test_outer_reduction(op, shape):
    run_outer(op, shape)


@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("stages", [2, 3, 5])
@pytest.mark.parametrize("cols", [8, 32, 128])
def test_outer_reduction_stages_and_strips(ws, stages, cols):
    run_outer("sum", (3001, 1000), stages=stages, warp_specialized=ws, cols=cols)


@pytest.mark.parametrize("dtype", [D.Float, D.Half, D.BFloat16])
def test_outer_reduction_dtypes_axes_and_weights(dtype):
    run_outer("sum", (64, 30, 136), (0, 1), dtype)
    run_outer("max", (500, 3, 264), (0,), dtype)
    run_outer("sum", (777, 520), (0,), dtype, weight=True)
    run_outer("mean", (777, 520), (0,), dtype, war="mbarrier", stages=4)


def test_outer_reduction_plain_fallbacks():
    # an odd row stride cannot be described by a tensor map; tma=False asks for the plain path
    run_outer("sum", (300, 1001), expect_norm=False)
    run_outer("sum", (300, 1024), expect_norm=False, tma=False)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.sampled_from([1, 2, 31, 256, 257, 5000]),
    cols=st.sampled_from([8, 16, 24, 248, 256, 264, 3000]),
    op=st.sampled_from(["sum", "max", "mean"]),
    ws=st.booleans(),
)
def test_hypothesis_outer_reduction(rows, cols, op, ws):
    run_outer(op, (rows, cols), warp_specialized=ws)


def test_outer_reduction_two_results_of_one_input():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        xf = fd.ops.cast(x, D.Float)
        fd.add_output(fd.ops.sum(xf, [0]))
        fd.add_output(fd.ops.max(xf, [0]))
    for shape in ((1, 8), (300, 520), (5000, 4096)):
        x = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
        s, m = fd.execute([x])
        assert type(fd.last_params()).__name__ == "OuterReductionParams"
        assert_close(s, x.double().sum(0), rtol=1e-4, atol=1e-3 * shape[0] ** 0.5)
        assert_close(m, x.double().amax(0), rtol=1e-6, atol=1e-6)
