"""Lowering structure: loop nests, allocation, indexing, predicates, syncs,
for scheduler-built and hand-scheduled fusions (no GPU needed)."""

import copy

import pytest
import torch

import circbuf as cb
from circbuf.ir import Const, MemoryType, ParallelType
from circbuf.lowering import codegen, lower
from circbuf.lowering.kir import Assign, BlockReduce, BlockSync, ForLoop, IfThenElse, walk
from circbuf.scheduler import InputInfo, TensorInfo, propagate_transforms, schedule
from tests.util import D, axpy_fusion, norm_fusion


def scheduled(fd, shapes, itemsize=2, overrides=None):
    f = copy.deepcopy(fd.fusion)
    infos, env = [], {}
    for x, shape in zip([i for i in f.inputs if hasattr(i, "logical")], shapes):
        strides, s = [], 1
        for d in reversed(shape):
            strides.insert(0, s)
            s *= d
        infos.append(TensorInfo(tuple(shape), tuple(strides), itemsize, 16))
        for ax, n in zip(x.logical, shape):
            if hasattr(ax.extent, "name"):
                env[ax.extent.name] = n
    params = schedule(f, InputInfo(tuple(infos), env), overrides or {})
    return f, params


def nodes(kernel, kind):
    out = []
    walk(kernel.body, lambda n, s: out.append((n, s)) if isinstance(n, kind) else None)
    return out


def test_pointwise_structure_vectorized_and_predicated():
    f, params = scheduled(axpy_fusion(D.BFloat16), [(1024, 4096)] * 2)
    assert params.vectorize == 8 and params.vectorize_inputs == (True, True)
    k = lower(f)
    assert k.launch[ParallelType.TIDx].value == params.threads
    vec = [a for a, _ in nodes(k, Assign) if a.lhs.vector > 1]
    assert len(vec) == 3  # two vector loads, one vector store
    guarded = [n for n, _ in nodes(k, IfThenElse)]
    assert len(guarded) == 3  # only global accesses are predicated
    # the flattened contiguous index folds back: no division by i1 anywhere
    src = codegen(k)
    assert "/ i1" not in src and "% i1" not in src


def test_non_divisible_inner_extent_drops_vector_width():
    f, params = scheduled(axpy_fusion(D.BFloat16), [(3, 1001)] * 2)
    assert params.vectorize == 1
    k = lower(f)
    assert not [a for a, _ in nodes(k, Assign) if a.lhs.vector > 1]


def test_softmax_structure_three_row_passes():
    f, params = scheduled(norm_fusion("softmax", D.BFloat16), [(64, 4096)], overrides={"tma": False})
    assert params.inner
    k = lower(f)
    top_loops = [n for n in k.body if isinstance(n, ForLoop)]
    assert len(top_loops) == 3  # max pass, sum pass, normalize+store pass
    brs = [n for n, _ in nodes(k, BlockReduce)]
    assert [b.expr.op_name for b in brs] == ["max", "sum"]
    # each block reduction follows its loop at the top level
    order = [type(n).__name__ for n in k.body if not type(n).__name__ == "Allocate"]
    assert order.index("BlockReduce") > order.index("ForLoop")
    text = str(k)
    assert "block_reduce[threadIdx.x](max)" in text and "block_reduce[threadIdx.x](sum)" in text


def test_outer_reduction_has_no_block_reduce():
    """The plain outer path (tma=False): one thread per column, no block reduction."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [0]))
    f, params = scheduled(fd, [(1000, 300)], itemsize=4, overrides={"tma": False})
    assert not params.inner
    k = lower(f)
    assert not nodes(k, BlockReduce)
    assert len([n for n in k.body if isinstance(n, ForLoop)]) == 1


def test_reduction_output_written_by_one_thread():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [1]))
    f, _ = scheduled(fd, [(8, 3000)], itemsize=4)
    src = codegen(lower(f))
    assert "((index_t)threadIdx.x) == 0" in src


def manual_relu():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        t1 = fd.ops.relu(x)  # cast + relu
        out = fd.ops.cast(t1, D.BFloat16)
        fd.add_output(out)
    return fd, out


def test_manual_schedule_lowers_as_written():
    fd, out = manual_relu()
    out.split(0, 128)
    out.axis(0).parallelize(ParallelType.BIDx)
    out.axis(1).parallelize(ParallelType.TIDx)
    propagate_transforms(fd.fusion, out)
    for tv in fd.fusion.used_tvs():
        if not tv.is_input and not tv.is_output:
            tv.inline_at(2)
    assert fd.fusion.manual_schedule
    ck = fd.compile([torch.randn(1000, dtype=torch.bfloat16)], arch="sm_90a")
    assert ck.params is None and ck.name == "circbuf_manual"
    assert "FOR" not in ck.kernel_ir  # both axes are parallel: no loops
    assert ck.resource_usage()["LOCAL"] == 0


def test_manual_shared_memory_gets_raw_sync():
    fd, out = manual_relu()
    out.split(0, 128)
    out.axis(0).parallelize(ParallelType.BIDx)
    out.axis(1).parallelize(ParallelType.TIDx)
    propagate_transforms(fd.fusion, out)
    relu = out.definition.inputs[0]
    cast = relu.definition.inputs[0]
    cast.set_memory_type(MemoryType.Shared).inline_at(1)
    relu.inline_at(2)
    k = lower(fd.fusion)
    syncs = [n for n, _ in nodes(k, BlockSync)]
    assert len(syncs) == 1 and "RAW" in syncs[0].reason
    assert k.smem_bytes == Const(128 * 4)
    ck = fd.compile([torch.randn(1000, dtype=torch.bfloat16)], arch="sm_90a")
    assert "__syncthreads();  // RAW on" in ck.cuda


def test_bad_inline_position_is_named():
    fd, out = manual_relu()
    out.split(0, 128)
    relu = out.definition.inputs[0]
    relu.split(0, 64)
    relu.inline_at(2)
    with pytest.raises(cb.CircbufError, match="loop axis 0 differs"):
        lower(fd.fusion)


def test_symbolic_local_buffer_is_an_error():
    fd, out = manual_relu()
    out.split(0, 128)
    out.axis(1).parallelize(ParallelType.TIDx)
    with pytest.raises(cb.CircbufError, match="symbolic extent"):
        lower(fd.fusion)


def test_vectorize_needs_a_copy():
    fd, out = manual_relu()
    out.split(0, 4)
    propagate_transforms(fd.fusion, out)
    relu = out.definition.inputs[0]
    relu.axis(1).parallelize(ParallelType.Vectorize)
    for tv in fd.fusion.used_tvs():
        if not tv.is_input and not tv.is_output:
            tv.inline_at(1)
    with pytest.raises(cb.CircbufError, match="vectorized loop must hold exactly one copy"):
        lower(fd.fusion)


def test_reduction_inline_past_reduction_axis_is_an_error():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        s = fd.ops.sum(x, [0])  # loop [r, i]
        y = fd.ops.exp(s)
        fd.add_output(y)
    s.inline_at(1)
    with pytest.raises(cb.CircbufError, match="cannot inline past its reduction axis"):
        lower(fd.fusion)
