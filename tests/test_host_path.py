"""The host path of a cached ``fd.execute`` (generated code: the executor's
key and lookup, each plan's launch) against the generic one, on the CPU
with the two CUDA calls stubbed: the same arguments reach the launch, the
same outputs come back, and every miss or bad input still goes the general
way."""

from __future__ import annotations

import struct

import pytest
import torch

import circbuf as cb
from circbuf.compiler import FusionExecutor
from circbuf.runtime import tensormap
from tests.util import D, axpy_fusion, norm_fusion, unary_fusion


@pytest.fixture
def cpu_launch(monkeypatch):
    """Plans for CPU tensors whose launch records (args buffer bytes, pointers)."""
    calls = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    # a tensor map's 128 bytes: its parameter's address and name, so a re-encode shows
    monkeypatch.setattr(
        tensormap,
        "encode",
        lambda spec, t, name: struct.pack("<Q", t.data_ptr()) + name.encode().ljust(120, b"\0"),
    )

    def make_plan_cpu(self, inputs):
        info, _ = self._bind(inputs, need_cuda=False)
        p = self._build_plan(self._compile(info, "sm_90a"), info, torch.device("cpu"))

        def launch(stream, addr, p=p):
            assert stream == 7 and addr == p.args_addr
            calls.append(bytes(p.argbuf))

        p.launch, p.dev_index = launch, 0
        return p.ready()

    monkeypatch.setattr(FusionExecutor, "_make_plan", make_plan_cpu)
    return calls


def _scaled():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        s = fd.define_scalar(dtype=D.Double)
        fd.add_output(fd.ops.mul(x, s))
    return fd


def _in_place():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        y = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.add(x, y), alias_input=y)
        fd.add_output(fd.ops.mul(x, y))
    return fd


def _expanded():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.broadcast_in_dim(fd.ops.exp(x), [3, fd.ops.size(x, 0)], [1]))
    return fd


def _tma_norm():
    fd = norm_fusion("rms_norm", D.BFloat16)
    fd.fusion.schedule(staging="tma")
    return fd


CASES = {
    "axpy bf16": (lambda: axpy_fusion(D.BFloat16, 2), lambda: [torch.randn(8, 64, dtype=torch.bfloat16)] * 2),
    "relu fp32 out": (
        lambda: unary_fusion("relu", D.BFloat16, 1, D.Float),
        lambda: [torch.randn(300).bfloat16()],
    ),
    "channels-last": (
        lambda: unary_fusion("exp", D.Float, 4),
        lambda: [torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)],
    ),
    "scalar": (_scaled, lambda: [torch.randn(4, 32), 2.5]),
    "in place": (_in_place, lambda: [torch.randn(64), torch.randn(64)]),
    "expanded output": (_expanded, lambda: [torch.randn(64)]),
    "tma norm": (
        _tma_norm,
        lambda: [torch.randn(256, 1024, dtype=torch.bfloat16), torch.randn(1024, dtype=torch.bfloat16)],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_generated_launch_is_the_generic_one(cpu_launch, case):
    make_fd, make_inputs = CASES[case]
    fd = make_fd()
    ins = make_inputs()
    for _ in range(2):  # the plan's first call, then a cached one
        outs = fd.execute(ins)
    plan = next(iter(fd._executor._plans.values()))
    assert plan.run is not plan.run_generic and "launch(stream(0)" in plan.run.source
    generated = cpu_launch[-1]
    ins2 = [x.clone() if isinstance(x, torch.Tensor) else x for x in ins]
    outs2 = plan.run_generic(ins2)
    generic = cpu_launch[-1]
    assert len(outs) == len(outs2)
    for o, o2 in zip(outs, outs2):
        assert (o.shape, o.stride(), o.dtype, o.device) == (o2.shape, o2.stride(), o2.dtype, o2.device)
    # the same bytes reach the launch but for the tensors' addresses
    ptrs = [8 * k for k in plan.ptr_offsets] + [m.offset for m in plan.tmaps]
    assert len(generated) == len(generic)

    def masked(buf):
        b = bytearray(buf)
        for off in ptrs:
            b[off : off + 8] = bytes(8)
        return bytes(b)

    assert masked(generated) == masked(generic)
    # each address slot holds its tensor's pointer (inputs, then outputs before finish)
    kernel_outs = plan.new_outputs(ins)  # shapes only: which tensors the slots describe
    assert len(plan.ptr_offsets) == len(plan.tpos) + len(kernel_outs)
    for k, pos in enumerate(plan.tpos):
        assert struct.unpack_from("<Q", generic, 8 * plan.ptr_offsets[k])[0] == ins2[pos].data_ptr()
    for m in plan.tmaps:  # re-encoded for the new tensors' addresses
        t = ins2[m.input_pos] if m.output < 0 else None
        if t is not None:
            assert struct.unpack_from("<Q", generic, m.offset)[0] == t.data_ptr()


def test_tensor_maps_follow_the_addresses(cpu_launch):
    fd = _tma_norm()
    x, w = torch.randn(256, 1024, dtype=torch.bfloat16), torch.randn(1024, dtype=torch.bfloat16)
    fd.execute([x, w])
    plan = next(iter(fd._executor._plans.values()))
    assert plan.tmaps
    (m,) = [m for m in plan.tmaps if m.output < 0 and m.input_pos == 0]
    for x2 in (x.clone(), x.clone(), x):
        fd.execute([x2, w])
        assert struct.unpack_from("<Q", cpu_launch[-1], m.offset)[0] == x2.data_ptr() == m.ptr


def test_in_place_output_is_the_input(cpu_launch):
    fd = _in_place()
    x, y = torch.randn(64), torch.randn(64)
    (out,) = fd.execute([x, y])
    (out,) = fd.execute([x, y])  # cached
    plan = next(iter(fd._executor._plans.values()))
    assert struct.unpack_from("<Q", cpu_launch[-1], 8 * plan.ptr_offsets[2])[0] == y.data_ptr()
    assert out.shape == (64,)


def test_misses_and_bad_inputs_go_the_general_way(cpu_launch):
    fd = axpy_fusion(D.Float, 1)
    ex = fd._get_executor()
    a = torch.randn(64)
    fd.execute([a, a])
    assert len(ex._plans) == 1
    fd.execute([a[:32], a[:32]])  # another size
    buf = torch.randn(65)
    fd.execute([buf[1:], a])  # another alignment (4 bytes, not 16)
    fd.execute([a.double().float(), a])  # same signature: no new plan
    assert len(ex._plans) == 3
    fd.fusion.schedule(vectorize=1)  # a new schedule version: new plans
    fd.execute([a, a])
    assert len(ex._plans) == 4
    with pytest.raises(cb.CircbufError, match="expected 2 inputs"):
        fd.execute([a])
    with pytest.raises(cb.CircbufError, match="expected 2 inputs"):
        fd.execute([a, a, a])
    # on these CPU tensors the general way names the first input as not on CUDA
    with pytest.raises(cb.CircbufError, match="input 0 .* is on cpu"):
        fd.execute([a, 1.0])
    with pytest.raises(cb.CircbufError, match="input 1 .* dtype torch.float64 does not match"):
        fd.execute([a, a.double()])  # a miss: the plan is made, which binds the inputs
    with pytest.raises(cb.CircbufError, match="must be a list"):
        fd.execute(iter([a, a]))
    fs = _scaled()
    x = torch.randn(4, 32)
    fs.execute([x, 2.0])
    n = len(cpu_launch)
    for bad in (torch.tensor(2.0), "2", None):  # a scalar of another type: refused before any launch
        with pytest.raises(cb.CircbufError, match="input 0 .* is on cpu"):
            fs.execute([x, bad])
    assert len(cpu_launch) == n


def test_outputs_are_new_tensors_each_call(cpu_launch):
    fd = axpy_fusion(D.BFloat16, 1)
    a = torch.randn(64, dtype=torch.bfloat16)
    (o1,) = fd.execute([a, a])
    (o2,) = fd.execute([a, a])
    assert o1.data_ptr() != o2.data_ptr() and o1.is_contiguous() and o1.shape == (64,)


def test_every_kernel_starts_with_the_grid_dependency():
    """Programmatic dependent launch: a kernel may be scheduled while the
    stream's previous kernel finishes, so its first statement waits for it
    (cb::grid_dependency) before any memory is touched."""
    import circbuf as cb

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.relu(x), cb.DataType.BFloat16))
    src = fd.compile([torch.randn(64, 64).bfloat16()], arch="sm_90a").cuda
    body = src[src.index(") {", src.index('extern "C" __global__')) + 3 :].lstrip().splitlines()
    first = next(line for line in body if not line.strip().startswith("extern __shared__"))
    assert first.strip().startswith("cb::grid_dependency();"), first
    assert "griddepcontrol.launch_dependents" in src and "griddepcontrol.wait" in src


def test_pdl_launch_attribute_layout(monkeypatch):
    """The CUlaunchAttribute the launcher attaches: an id, 4 bytes of padding,
    a 64-byte value union whose first int is the value (72 bytes)."""
    import ctypes

    from circbuf import knobs
    from circbuf.runtime.driver import _PROGRAMMATIC_STREAM_SERIALIZATION, _launch_attribute

    a = _launch_attribute(_PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    raw = bytes(a)
    assert ctypes.sizeof(a) == 72
    assert int.from_bytes(raw[0:4], "little") == 6 and int.from_bytes(raw[8:12], "little") == 1
    monkeypatch.setenv("CIRCBUF_PDL", "0")
    assert not knobs.pdl()
    monkeypatch.setenv("CIRCBUF_PDL", "1")
    assert knobs.pdl()


@pytest.mark.gpu
def test_gpu_pdl_chains_read_what_the_previous_kernel_wrote(monkeypatch):
    """Programmatic dependent launch on real launches: a segmented fusion (the
    second kernel reads the first's output) and back-to-back fusions each
    reading the previous one's result, with PDL on and off: same bits, and
    equal to torch. A kernel that read before its grid_dependency wait would
    see the previous kernel's output half written (NaN-poisoned)."""
    import circbuf as cb

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    D = cb.DataType

    def chain():
        with cb.FusionDefinition() as seg:  # two kernels: a row sum, then x scaled by it
            x = seg.define_tensor([-1, -1], dtype=D.Float)
            s = seg.ops.sum(x, [0])
            seg.add_output(seg.ops.mul(x, seg.ops.broadcast(s, [True, False])))
        with cb.FusionDefinition() as step:
            y = step.define_tensor([-1, -1], dtype=D.Float)
            step.add_output(step.ops.add(step.ops.mul(y, 0.5), 1.0))
        return seg, step

    x = torch.randn(4096, 2048, device="cuda")
    results = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("CIRCBUF_PDL", pdl)
        seg, step = chain()
        (y,) = seg.execute([x])
        for _ in range(8):
            (y,) = step.execute([y])
        torch.cuda.synchronize()
        results[pdl] = y
    ref = x.double() * x.double().sum(0, keepdim=True)
    for _ in range(8):
        ref = ref * 0.5 + 1.0
    assert torch.equal(results["1"], results["0"])
    torch.testing.assert_close(results["1"].double(), ref, rtol=1e-4, atol=1e-3)
