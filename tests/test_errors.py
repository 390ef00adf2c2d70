"""One test per user error, checking that the message names what is wrong."""

import pytest
import torch

import circbuf as cb
from tests.util import D, axpy_fusion


def test_wrong_number_of_inputs():
    fd = axpy_fusion(D.Float, 1)
    with pytest.raises(cb.CircbufError, match=r"expected 2 inputs \(T0, T1\), got 1"):
        fd.compile([torch.randn(4)], arch="sm_90a")
    with pytest.raises(cb.CircbufError, match="expected 2 inputs"):
        fd.execute([torch.randn(4)])


def test_dtype_unlike_definition():
    fd = axpy_fusion(D.BFloat16, 1)
    with pytest.raises(
        cb.CircbufError, match=r"input 1 \(T1\): dtype torch.float32 does not match .*BFloat16"
    ):
        fd.compile([torch.randn(4, dtype=torch.bfloat16), torch.randn(4)], arch="sm_90a")


def test_rank_unlike_definition():
    fd = axpy_fusion(D.Float, 2)
    with pytest.raises(
        cb.CircbufError, match=r"input 0 \(T0\): rank 1 does not match the definition's rank 2"
    ):
        fd.compile([torch.randn(4), torch.randn(4, 4)], arch="sm_90a")


def test_inconsistent_symbolic_extents():
    fd = axpy_fusion(D.Float, 2)
    with pytest.raises(
        cb.CircbufError, match=r"extent i1 \(axis 1 of T0\) = 5 and extent i3 \(axis 1 of T1\) = 6"
    ):
        fd.compile([torch.randn(4, 5), torch.randn(4, 6)], arch="sm_90a")


def test_fixed_and_broadcast_extents_checked():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([4, 1], dtype=D.Float)
        fd.add_output(fd.ops.exp(x))
    with pytest.raises(cb.CircbufError, match="axis 0 has size 3, the definition fixes 4"):
        fd.compile([torch.randn(3, 1)], arch="sm_90a")
    with pytest.raises(cb.CircbufError, match=r"axis 1 is defined as broadcast \(1\) but has size 2"):
        fd.compile([torch.randn(4, 2)], arch="sm_90a")


def test_contiguity_checked():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float, contiguity=[True, True])
        fd.add_output(fd.ops.exp(x))
    with pytest.raises(cb.CircbufError, match="axis 0 is defined contiguous but its stride is 10"):
        fd.compile([torch.randn(4, 10)[:, :5]], arch="sm_90a")


def test_cpu_tensor_passed_to_execute():
    fd = axpy_fusion(D.Float, 1)
    with pytest.raises(cb.CircbufError, match=r"input 0 \(T0\) is on cpu; execute needs CUDA tensors"):
        fd.execute([torch.randn(4), torch.randn(4)])


def test_non_tensor_and_scalar_inputs():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        s = fd.define_scalar()
        fd.add_output(fd.ops.mul(x, s))
    with pytest.raises(cb.CircbufError, match=r"input 0 \(T0\) must be a torch.Tensor, got list"):
        fd.compile([[1.0], 2.0], arch="sm_90a")
    with pytest.raises(cb.CircbufError, match=r"input 1 \(s0\) is a scalar; got Tensor"):
        fd.compile([torch.randn(3), torch.randn(1)], arch="sm_90a")


def test_unknown_schedule_override():
    fd = axpy_fusion(D.Float, 1)
    # a name no scheduler of the fusion takes raises at the schedule() call, listing what they take
    with pytest.raises(
        cb.CircbufError,
        match=r"schedule\(swizzle=...\): no scheduler of this fusion takes swizzle; .*"
        r"the pointwise scheduler takes vectorize, unroll, threads$",
    ):
        fd.fusion.schedule(swizzle=4)
    assert fd.fusion.schedule_overrides == {}  # nothing recorded
    # a name another scheduler takes says whose it is
    with pytest.raises(cb.CircbufError, match=r"takes cols \(an override of outer_reduction\);"):
        fd.fusion.schedule(cols=64)
    # the names come from the registry (a scheduler added there is known at once)
    from circbuf.scheduler.registry import SCHEDULERS
    from tests.test_overrides import VALID

    for _, names in SCHEDULERS:
        for n in names:
            with cb.FusionDefinition() as any_fd:
                pass  # no outputs: no scheduler takes it yet, so every scheduler's names are accepted
            any_fd.fusion.schedule(**{n: VALID[n]})
    # a Fusion not built by a FusionDefinition has no check at schedule(): compile raises
    fd.fusion.check_overrides = None
    fd.fusion.schedule(swizzle=4)
    with pytest.raises(
        cb.CircbufError,
        match=r"no scheduler of this fusion takes swizzle; .*the pointwise scheduler takes vectorize",
    ):
        fd.compile([torch.randn(8)] * 2, arch="sm_90a")
    fd.fusion.schedule(vectorize=3)
    with pytest.raises(cb.CircbufError, match=r"schedule\(vectorize=3\): must be a power of two"):
        fd.compile([torch.randn(8)] * 2, arch="sm_90a")


def test_reductions_over_different_axes_are_segmented():
    """No one scheduler takes them (the reason names both); the fusion runs
    as two kernels (tests/test_segmentation.py)."""
    from circbuf.scheduler.registry import Unschedulable, candidates

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.sum(x, [1]))
    with pytest.raises(Unschedulable, match="reduce different axes"):
        candidates(fd.fusion)
    assert len(fd.compile([torch.randn(4, 4)], arch="sm_90a").kernels) == 2


def test_unknown_dump_stage(monkeypatch):
    monkeypatch.setenv("CIRCBUF_DUMP", "ptx_please")
    fd = axpy_fusion(D.Float, 1)
    with pytest.raises(cb.CircbufError, match="CIRCBUF_DUMP: unknown stage"):
        fd.compile([torch.randn(8)] * 2, arch="sm_90a")


def _plan(fd, inputs):
    """The launch plan execute would build, made on the CPU."""
    ck = fd.compile(inputs, arch="sm_90a")
    ex = fd._executor
    info, _ = ex._bind(inputs, need_cuda=False)
    return ck, ex._build_plan(ck, info, torch.device("cpu"))


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_zero_size_gives_empty_outputs(shape, monkeypatch):
    """What a user gets for empty inputs: an empty output of the right shape and
    dtype, no launch (the GPU side: test_gpu.py::test_zero_size)."""
    x = torch.randn(*shape, dtype=torch.bfloat16)
    ck, plan = _plan(axpy_fusion(D.BFloat16, 2), [x, x])
    assert ck.cubin and plan.empty  # compiled, but nothing is launched
    (out,) = plan.run([x, x])  # returns before any CUDA call when the plan is empty
    assert out.shape == shape and out.dtype == torch.bfloat16
    # a reduction whose output is empty (a TMA kernel: under CIRCBUF_DEBUG_HANG it takes a
    # host-mapped hang record, which a plan that launches nothing does not allocate)
    monkeypatch.setenv("CIRCBUF_DEBUG_HANG", "1000")
    with cb.FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor([-1, -1], dtype=D.Float), [1]))
    fd.fusion.schedule(staging="tma")
    x = torch.randn(0, 64)
    ck, plan = _plan(fd, [x])
    (out,) = plan.run([x])
    assert ck.kernel.hang_record and plan.hang is None
    assert plan.empty and out.shape == (0,) and out.dtype == torch.float32


def test_fusion_without_outputs():
    with cb.FusionDefinition() as fd:
        fd.define_tensor([-1], dtype=D.Float)
    for run in (lambda: fd.compile([torch.randn(4)], arch="sm_90a"), lambda: fd.execute([torch.randn(4)])):
        with pytest.raises(cb.CircbufError, match=r"the fusion has no outputs: .*fd.add_output"):
            run()


def test_zero_dim_outputs_of_reductions_compile_and_others_are_refused():
    # a reduction over every axis gives a 0-dim output: written by one thread, out[0]
    with cb.FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor([-1], dtype=D.Float), [0]))
    x = torch.randn(1000)
    ck, plan = _plan(fd, [x])
    assert "Tensor<float, 0> T1)" in ck.cuda  # the output param: a data pointer, no sizes
    body = ck.cuda.split("end of prelude")[1]
    assert "if ((((index_t)threadIdx.x) == 0)) {\n    T1.data[0] = T2;" in body
    assert plan.grid == (1, 1, 1) and not plan.empty
    shape, dtype = plan.out_specs[0][:2]
    out = torch.empty(*shape, dtype=dtype)  # as the plan allocates it
    assert out.shape == () and dtype == torch.float32
    # the argument buffer: the input {T* data; size[1]; stride[1]}, then the 0-dim output {T* data}
    import ctypes
    import struct

    plan.write_args([x], [out])
    raw = ctypes.string_at(plan.argbuf, len(plan.argbuf))
    assert struct.unpack_from("<Qii", raw, 0) == (x.data_ptr(), 1000, 1)
    assert len(raw) == 16 + 8 and struct.unpack_from("<Q", raw, 16) == (out.data_ptr(),)
    # pointwise math on a 0-dim reduction result, and var_mean of a 1-D tensor
    with cb.FusionDefinition() as fd:
        x1 = fd.define_tensor([-1], dtype=D.BFloat16)
        v, m = fd.ops.var_mean(fd.ops.cast(x1, D.Float), [0])
        fd.add_output(fd.ops.cast(fd.ops.mul(m, 2.0), D.BFloat16))
        fd.add_output(v)
    ck = fd.compile([torch.randn(77, dtype=torch.bfloat16)], arch="sm_90a")
    assert "Tensor<cb_bfloat16, 0>" in ck.cuda and "Tensor<float, 0>" in ck.cuda
    # no reduction: 0-dim pointwise math is one thread's (tests/test_trust_sched.py); a
    # reduction over no axis is refused
    with cb.FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.define_tensor([], dtype=D.Float)))
    assert fd.compile([torch.randn(())], arch="sm_90a").kernels[0].params.threads == 1
    with cb.FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor([-1], dtype=D.Float), []))
    with pytest.raises(
        cb.CircbufError, match=r"reduction: T1 = sum\(T0, dims=\[\], init=0.0\) reduces no axis"
    ):
        fd.compile([torch.randn(4)], arch="sm_90a")


def test_launch_plan_packs_sizes_strides_and_pointers():
    """The argument buffer a launch passes, built on the CPU: each tensor is
    {T* data; index_t size[N]; index_t stride[N]}, scalars follow."""
    import ctypes
    import struct

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        s = fd.define_scalar()
        fd.add_output(fd.ops.mul(x, s))
    xt = torch.randn(6, 10)[:, 1:8]  # non-contiguous view
    ck = fd.compile([xt, 2.5], arch="sm_90a")
    ex = fd._executor
    info, _ = ex._bind([xt, 2.5], need_cuda=False)
    plan = ex._build_plan(ck, info, torch.device("cpu"))
    out = torch.empty(6, 7)
    plan.write_args([xt, 2.5], [out])
    raw = ctypes.string_at(plan.argbuf, len(plan.argbuf))
    assert struct.unpack_from("<Q4i", raw, 0) == (xt.data_ptr(), 6, 7, 10, 1)
    assert struct.unpack_from("<Q4i", raw, 24) == (out.data_ptr(), 6, 7, 7, 1)
    assert struct.unpack_from("<d", raw, 48) == (2.5,)
    assert plan.block[0] > 1 and plan.grid[0] >= 1 and not plan.empty


@pytest.mark.parametrize(
    "arch, match",
    [
        ("sm_91", r"arch='sm_91': unknown to NVRTC; NVRTC \d+\.\d+ builds cubins for sm_75, .*sm_90,"),
        ("sm_80a", r"arch='sm_80a': unknown to NVRTC"),
        ("sm90a", r"arch='sm90a': expected sm_XY or sm_XYa"),
        ("compute_90a", r"arch='compute_90a': expected sm_XY or sm_XYa"),  # PTX only: an empty cubin
        (90, r"arch=90: expected sm_XY or sm_XYa"),
    ],
)
def test_unknown_arch_is_named(arch, match):
    fd = axpy_fusion(D.Float, 1)
    with pytest.raises(cb.CircbufError, match=match):
        fd.compile([torch.randn(8)] * 2, arch=arch)


def fd_params(fd, inputs, arch):
    return fd.compile(inputs, arch=arch).params


def test_arch_without_the_features_a_kernel_uses():
    from tests.util import manual_ws_exp, norm_fusion, norm_inputs

    # TMA and mbarrier waits: sm_90 or later; the plain kernel (tma=False) and rows loaded
    # straight into registers (the default for this row) build for sm_80
    inputs = norm_inputs("softmax", 64, 1024, torch.bfloat16, "cpu")
    assert fd_params(norm_fusion("softmax", D.BFloat16), inputs, "sm_80").staging == "registers"
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(staging="tma")
    with pytest.raises(
        cb.CircbufError,
        match=r"arch='sm_80': circbuf_normalization uses .*TMA loads \(cp.async.bulk.tensor\).*, "
        r"which need sm_90 or later; compile for sm_90a",
    ):
        fd.compile(inputs, arch="sm_80")
    assert fd.compile(inputs, arch="sm_90").cubin
    fd.fusion.schedule(tma=False)
    assert type(fd.compile(inputs, arch="sm_80").params).__name__ == "ReductionParams"
    # setmaxnreg: an arch-specific target
    ws = manual_ws_exp(128, 4)
    x = torch.randn(256, 512, dtype=torch.bfloat16)
    for arch in ("sm_90", "sm_100"):
        with pytest.raises(
            cb.CircbufError,
            match=rf"arch='{arch}': circbuf_manual uses setmaxnreg from WarpSpecialized\(registers=...\), "
            r"which needs an arch-specific target: sm_90a",
        ):
            ws.compile([x], arch=arch)
    assert "USETMAXREG" in ws.compile([x], arch="sm_90a").sass()
    # a kernel that needs nothing of Hopper builds for an older target
    assert axpy_fusion(D.Float, 1).compile([torch.randn(8)] * 2, arch="sm_80").cubin


def test_kernel_target_needs_come_from_its_nodes():
    from circbuf.lowering.kir import target_needs
    from tests.util import manual_ws_exp

    plain = axpy_fusion(D.Float, 1).compile([torch.randn(8)] * 2, arch="sm_90a")
    assert target_needs(plain.kernel) == []
    ws = manual_ws_exp(128, 4).compile([torch.randn(256, 512, dtype=torch.bfloat16)], arch="sm_90a")
    needs = {n.what: (n.sm, n.specific) for n in target_needs(ws.kernel)}
    assert needs["setmaxnreg from WarpSpecialized(registers=...)"] == (90, True)
    assert needs["TMA loads (cp.async.bulk.tensor)"] == (90, False)


def test_instruction_the_target_lacks_is_named_with_ptxas_words():
    # no kernel IR node says it, ptxas does: bf16 conversions need sm_80
    fd = axpy_fusion(D.BFloat16, 1)
    with pytest.raises(
        cb.CircbufError,
        match=r"arch='sm_75': circbuf_pointwise uses what sm_75 lacks: .*requires \.target sm_80 or higher",
    ):
        fd.compile([torch.randn(8, dtype=torch.bfloat16)] * 2, arch="sm_75")
