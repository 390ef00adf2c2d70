"""NVRTC compiles every kernel the schedulers emit, for sm_90a, on a machine
with no GPU; the SASS uses 128-bit accesses where vectorized and never local
memory."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from tests.util import TORCH, D, axpy_fusion, norm_fusion, norm_inputs, unary_fusion


def sass_ops(ck):
    return [line.split(";")[0] for line in ck.sass().splitlines() if "/*" in line and ";" in line]


def check_clean(ck):
    use = ck.resource_usage()
    assert use["LOCAL"] == 0 and use["STACK"] == 0, use
    assert not [o for o in sass_ops(ck) if " LDL" in o or " STL" in o]
    return use


FUSIONS = {
    "silu": lambda: (unary_fusion("silu", D.BFloat16, 1), lambda dt: [torch.randn(1 << 20, dtype=dt)]),
    "gelu": lambda: (unary_fusion("gelu", D.Half, 2), lambda dt: [torch.randn(64, 1024, dtype=dt)]),
    "axpy": lambda: (axpy_fusion(D.BFloat16, 3), lambda dt: [torch.randn(4, 8, 64, dtype=dt)] * 2),
    "softmax": lambda: (
        norm_fusion("softmax", D.BFloat16),
        lambda dt: norm_inputs("softmax", 32, 4096, dt, "cpu"),
    ),
    "layer_norm": lambda: (
        norm_fusion("layer_norm", D.BFloat16),
        lambda dt: norm_inputs("layer_norm", 32, 1000, dt, "cpu"),
    ),
    "rms_norm": lambda: (
        norm_fusion("rms_norm", D.BFloat16),
        lambda dt: norm_inputs("rms_norm", 8, 8192, dt, "cpu"),
    ),
}


@pytest.mark.parametrize("name", sorted(FUSIONS))
def test_scheduler_kernels_compile_clean(name):
    fd, make = FUSIONS[name]()
    ck = fd.compile(make(torch.bfloat16 if name != "gelu" else torch.float16), arch="sm_90a")
    assert isinstance(ck.cubin, bytes) and len(ck.cubin) > 1000
    assert 'extern "C" __global__' in ck.cuda
    check_clean(ck)
    ops = sass_ops(ck)
    if name in ("silu", "gelu", "axpy"):
        assert any("LDG.E.128" in o for o in ops) and any("STG.E.128" in o for o in ops)
    else:
        assert any("SHFL.BFLY" in o for o in ops)  # warp-shuffle block reduction


def test_fp32_every_reduction_dim_compiles():
    for dims in ([0], [1], [2], [0, 2], [0, 1, 2]):
        with cb.FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
            fd.add_output(fd.ops.mean(x, dims))
            fd.add_output(fd.ops.max(x, dims))
        check_clean(fd.compile([torch.randn(3, 5, 7)], arch="sm_90a"))


def test_matmul_linear_broadcast_fusions_compile():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.linear(a, w, b)), D.BFloat16))
    check_clean(
        fd.compile(
            [
                torch.randn(16, 32, dtype=torch.bfloat16),
                torch.randn(8, 32, dtype=torch.bfloat16),
                torch.randn(8, dtype=torch.bfloat16),
            ],
            arch="sm_90a",
        )
    )


def test_noncontiguous_inputs_use_runtime_strides():
    fd = axpy_fusion(D.Float, 2)
    x = torch.randn(48, 80)[:, :64]  # rows 80 apart
    ck = fd.compile([x, x], arch="sm_90a")
    assert "T0.stride[0]" in ck.cuda and "T0.stride[1]" not in ck.cuda
    ck2 = fd.compile([torch.randn(48, 64)] * 2, arch="sm_90a")
    assert "T0.stride[" not in ck2.cuda
    check_clean(ck)
    # a dense permuted layout (a transpose) has strides the kernel computes from extents
    t = torch.randn(64, 48).t()
    ck3 = fd.compile([t, t], arch="sm_90a")
    assert "T0.stride[" not in ck3.cuda and ck3.kernel.strides[("T0", 0)] == cb.ir.Const(1)


def test_disk_cache_reuses_cubins(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCBUF_CACHE_DIR", str(tmp_path))
    fd = axpy_fusion(D.Float, 1)
    ck = fd.compile([torch.randn(100)] * 2, arch="sm_90a")
    files = list(tmp_path.glob("*.cubin"))  # beside it: the finished kernel (kernels/, test_warm_cache.py)
    assert len(files) == 1 and files[0].read_bytes() == ck.cubin
    fd2 = axpy_fusion(D.Float, 1)
    assert fd2.compile([torch.randn(100)] * 2, arch="sm_90a").cubin == ck.cubin


def test_dump_knob_prints_stages(capsys, monkeypatch):
    monkeypatch.setenv("CIRCBUF_DUMP", "fusion_ir,params,kernel_ir,cuda")
    fd = unary_fusion("exp", D.Float, 1)
    fd.compile([torch.randn(10)], arch="sm_90a")
    out = capsys.readouterr().out
    for stage in ("fusion_ir", "params", "kernel_ir", "cuda"):
        assert f"CIRCBUF_DUMP {stage}" in out
    assert "Pointwise params" in out and "__global__" in out


def test_dump_passes_prints_the_kernel_after_every_pass(capsys, monkeypatch):
    from circbuf.lowering import PASSES
    from tests.util import norm_fusion, norm_inputs

    monkeypatch.setenv("CIRCBUF_DUMP", "passes")
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(staging="tma")  # a TMA ring: the circular_buffer pass has work to show
    ck = fd.compile(norm_inputs("softmax", 64, 1024, torch.bfloat16, "cpu"), arch="sm_90a")
    out = capsys.readouterr().out
    sections = {}
    for block in out.split("===== CIRCBUF_DUMP passes =====\n")[1:]:
        head, _, body = block.partition("\n")
        sections[head] = body.strip()
    names = ["loop_nest"] + [p.name for p in PASSES]
    assert list(sections) == [f"after {n}:" for n in names]  # every pass, in the order of PASSES
    # each section is the kernel IR at that point: the pipeline appears with circular_buffer
    assert "MBARRIER_WAIT" not in sections["after tma_store:"]
    assert "MBARRIER_WAIT" in sections["after circular_buffer:"]
    assert sections[f"after {names[-1]}:"] == ck.kernel_ir.strip()


_dims = st.sampled_from([1, 2, 3, 7, 8, 16, 31, 128, 1000, 1024, 4099])


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    shape=st.lists(_dims, min_size=1, max_size=4),
    dtype=st.sampled_from([D.Float, D.BFloat16, D.Half]),
    transpose=st.booleans(),
)
def test_hypothesis_pointwise_compiles(shape, dtype, transpose):
    while len(shape) > 1 and torch.Size(shape).numel() > 1 << 24:
        shape = shape[1:]  # keep the CPU tensors small: only their layout matters here
    fd = axpy_fusion(dtype, len(shape))
    x = torch.empty(shape, dtype=TORCH[dtype])
    y = x
    if transpose:  # same shape, reversed strides
        y = torch.empty(shape[::-1], dtype=TORCH[dtype]).permute(*reversed(range(len(shape))))
    ck = fd.compile([x, y], arch="sm_90a")
    check_clean(ck)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.sampled_from([1, 7, 64]),
    cols=st.sampled_from([1, 17, 128, 1000, 32768]),
    kind=st.sampled_from(["softmax", "layer_norm", "rms_norm"]),
)
def test_hypothesis_norms_compile(rows, cols, kind):
    fd = norm_fusion(kind, D.BFloat16)
    ck = fd.compile(norm_inputs(kind, rows, cols, torch.bfloat16, "cpu"), arch="sm_90a")
    if kind == "layer_norm" and cols == 32768:
        # a spill accepted by measurement (issue 10, H100; see test_norm_schedule.ACCEPTED_SPILL):
        # 1024 threads holding the row in registers spill 8-16 bytes at the 64-register limit and
        # still run at 0.94 of copy, against 0.50 for 512 threads re-reading shared memory
        use = ck.resource_usage()
        assert fd.last_params().threads == 1024 and use["LOCAL"] == 0 and use["STACK"] <= 16, use
        return
    check_clean(ck)
