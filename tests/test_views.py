"""Views, layouts and aliasing (issue 8, part 3): reshape, permute, squeeze,
expand, stride orders and outputs written in place.

Every fusion of ``CASES`` is compiled for sm_90a and run in the CPU
kernel interpreter (``circbuf.interpret``: TMA rings too) against torch;
the GPU tests run them all on the device, in float64 references,
with outputs poisoned.
"""

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.ir import reshape_groups
from circbuf.lowering.kir import TmaLoad, walk
from tests.util import TORCH, D, assert_close

DEV = "cuda"
F32 = D.Float


def _t(fd, shape, dtype=F32, **kw):
    return fd.define_tensor(shape, dtype=dtype, **kw)


# ------------------------------------------------------------------ cases
# name -> (build(fd), inputs(device) -> list, reference(*float64 inputs) -> list)
def _reshape_sum0(fd):  # nvFuser test_execute_with_tuple_and_list
    fd.add_output(fd.ops.sum(fd.ops.reshape(_t(fd, [-1, -1, -1]), [6, 4]), [0]))


def _reshape_sum_ndim(fd):  # nvFuser test_tensor_ndim
    fd.add_output(fd.ops.sum(fd.ops.reshape(_t(fd, [-1] * 12), [2] * 9 + [8]), [3]))


def _reshape_infer(fd):
    fd.add_output(fd.ops.exp(fd.ops.reshape(_t(fd, [-1, -1]), [-1, 4])))


def _reshape_fixed(fd):  # one group: [4, 6] merged to 24, split to [6, 4]
    fd.add_output(fd.ops.add(fd.ops.reshape(_t(fd, [4, 6]), [6, 4]), 1.0))


def _reshape_strided_infer(fd):  # nvFuser test_reshape_dynamic, without the scalar math
    x = _t(fd, [-1, -1, -1], contiguity=[True, True, True], stride_order=[2, 1, 0])
    fd.add_output(fd.ops.sum(fd.ops.reshape(x, [32, -1]), [1]))


def _reshape_empty(fd):  # nvFuser test_empty_reshape
    x = _t(fd, [-1, 1, -1, -1, -1], dtype=D.Int64, contiguity=[False, None, True, True, True])
    fd.add_output(fd.ops.reshape(x, [5, 0]))


def _reshape_permuted(fd):  # a reshape of a permute
    fd.add_output(fd.ops.reshape(fd.ops.permute(_t(fd, [-1, -1, -1]), [1, 0, 2]), [-1, 4]))


def _reshape_split_reduced(fd):
    fd.add_output(fd.ops.sum(fd.ops.reshape(_t(fd, [-1, -1]), [-1, 3, 4]), [1]))


def _reshape_chain(fd):
    y = fd.ops.exp(fd.ops.reshape(_t(fd, [-1, -1, -1]), [6, -1]))
    fd.add_output(fd.ops.reshape(y, [4, 3, 2]))


def _two_reshapes(fd):
    x = _t(fd, [-1, -1])
    fd.add_output(fd.ops.exp(fd.ops.reshape(x, [3, 4])))
    fd.add_output(fd.ops.neg(fd.ops.reshape(x, [4, 3])))


def _sum_then_reshape(fd):
    fd.add_output(fd.ops.reshape(fd.ops.sum(_t(fd, [-1, -1]), [1]), [2, -1]))


def _reshape_softmax(fd):
    fd.add_output(fd.ops.softmax(fd.ops.reshape(_t(fd, [-1, -1, -1]), [-1, 12]), -1))


def _reshape_layer_norm(fd):
    x, w, b = _t(fd, [-1, -1, -1]), _t(fd, [-1]), _t(fd, [-1])
    fd.add_output(fd.ops.layer_norm(fd.ops.reshape(x, [-1, fd.ops.size(x, 2)]), w, b, 1e-5))


def _reshape_broadcast_axes(fd):  # size-1 axes on both sides
    fd.add_output(fd.ops.exp(fd.ops.reshape(_t(fd, [1, -1]), [2, 1, -1])))


def _reshape_expanded(fd):
    fd.add_output(fd.ops.exp(fd.ops.reshape(fd.ops.expand(_t(fd, [-1, 1]), [-1, 3]), [-1])))


def _permute_mul(fd):
    x, y = _t(fd, [-1, -1, -1]), _t(fd, [-1, -1, -1])
    fd.add_output(fd.ops.mul(fd.ops.permute(x, [2, 0, 1]), y))


def _permute_reduce(fd):
    fd.add_output(fd.ops.sum(fd.ops.permute(_t(fd, [-1, -1, -1]), [2, 0, 1]), [2]))


def _permute_softmax(fd):
    fd.add_output(fd.ops.softmax(fd.ops.permute(_t(fd, [-1, -1]), [1, 0]), -1))


def _squeeze(fd):
    x = _t(fd, [-1, 1, -1])
    fd.add_output(fd.ops.exp(fd.ops.squeeze(x, [1])))


def _squeeze_symbolic(fd):  # the input must give axis 1 size 1
    fd.add_output(fd.ops.exp(fd.ops.squeeze(_t(fd, [-1, -1, -1]), [1])))


def _expand(fd):
    x, y = _t(fd, [-1, 1, -1]), _t(fd, [-1, -1, -1])
    e = fd.ops.expand(x, [-1, 5, -1])
    fd.add_output(fd.ops.add(e, y))
    fd.add_output(e)


def _channels_last_pointwise(fd):
    x = _t(fd, [-1, -1, -1, -1], contiguity=[True] * 4, stride_order=[3, 0, 2, 1])
    fd.add_output(fd.ops.mul(fd.ops.relu(x), 2.0))


def _channels_last_softmax(fd):
    fd.add_output(fd.ops.softmax(_t(fd, [-1, -1, -1, -1], stride_order=[3, 0, 2, 1]), -1))


def _channels_last_layer_norm_c(fd):  # over C, the axis contiguous in memory
    x = _t(fd, [-1, -1, -1, -1], stride_order=[3, 0, 2, 1])
    xp = fd.ops.permute(x, [0, 2, 3, 1])  # NHWC
    w, b = _t(fd, [-1]), _t(fd, [-1])
    fd.add_output(fd.ops.layer_norm(xp, w, b, 1e-5))


def _stride_order_output(fd):
    fd.add_output(fd.ops.stride_order(fd.ops.add(_t(fd, [-1, -1, -1]), 3.0), [0, 2, 1]))


def _channels_last_out_of_row_major(fd):
    fd.add_output(fd.ops.stride_order(fd.ops.exp(_t(fd, [-1, -1, -1, -1])), [3, 0, 2, 1]))


# a view whose result meets a tensor of higher rank: the broadcast moves above it
def _reshape_then_rank_broadcast(fd):
    x, y = _t(fd, [-1, -1]), _t(fd, [-1, -1])
    fd.add_output(fd.ops.add(fd.ops.reshape(fd.ops.exp(x), [-1]), y))


def _permute_then_rank_broadcast(fd):
    x, y = _t(fd, [-1, -1]), _t(fd, [-1, -1, -1])
    fd.add_output(fd.ops.add(fd.ops.permute(fd.ops.exp(x), [1, 0]), y))


def _expand_then_rank_broadcast(fd):
    x, y = _t(fd, [-1, 1]), _t(fd, [-1, -1, -1])
    fd.add_output(fd.ops.add(fd.ops.expand(x, [-1, 4]), y))


def _expand_meets_broadcast(fd):  # the rank broadcast keeps the expanded 8: [1, 8], as torch
    fd.add_output(fd.ops.add(fd.ops.expand(_t(fd, [1]), [8]), _t(fd, [1, 1])))


def _matmul_expanded_batch(fd):  # the batch of the matmul is the expanded 2, as torch's
    fd.add_output(fd.ops.matmul(fd.ops.expand(_t(fd, [1, -1, -1]), [2, -1, -1]), _t(fd, [-1, -1])))


def _exp_of_expand(fd):  # an op on an expanded tensor has the expanded size
    fd.add_output(fd.ops.exp(fd.ops.expand(_t(fd, [1, -1]), [8, -1])))


def _sum_over_expand(fd):  # 8 equal elements summed; the mean divides by 8
    e = fd.ops.expand(_t(fd, [1, -1]), [8, -1])
    fd.add_output(fd.ops.sum(e, [0]))
    fd.add_output(fd.ops.mean(e, [0]))


def _sum_along_expand(fd):  # one row sum per expanded row: 8 of them
    fd.add_output(fd.ops.sum(fd.ops.expand(_t(fd, [1, -1]), [8, -1]), [1]))


def _rope_like(fd):  # nvFuser's rope test: reshape, permute, broadcast_in_dim, sum
    q, c = _t(fd, [-1, -1, -1]), _t(fd, [-1, -1, -1, -1])
    qp = fd.ops.permute(fd.ops.reshape(q, [2, 3, 2, 4]), [0, 2, 1, 3])
    qb = fd.ops.broadcast_in_dim(qp, [2, 2, 3, 5, 4], [0, 1, 2, 4])
    cb_ = fd.ops.broadcast_in_dim(c, [2, 2, 3, 5, 4], [1, 2, 3, 4])
    fd.add_output(fd.ops.sum(fd.ops.mul(qb, cb_), [-1]))


def _reshape_keepdim(fd):  # a row sum reshaped to [N, 1], subtracted from the rows
    x = _t(fd, [-1, -1])
    m = fd.ops.mul(fd.ops.sum(x, [1]), 2.0)
    fd.add_output(fd.ops.sub(x, fd.ops.reshape(m, [fd.ops.size(x, 0), 1])))


def _all_ones(fd):  # every axis size 1: broadcasts of broadcasts become one
    t = fd.ops.reshape(fd.ops.exp(fd.ops.reshape(_t(fd, [-1]), [1])), [1, 1])
    fd.add_output(fd.ops.mul(t, _t(fd, [-1, -1], stride_order=[0, 1])))


def _squeeze_then_rank_broadcast(fd):
    x, y = _t(fd, [-1, 1, -1]), _t(fd, [-1, -1, -1])
    s = fd.ops.squeeze(fd.ops.exp(x), [1])
    fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(s, [-1, -1, -1], [0, 2]), y))


def _squeeze_intermediate(fd):
    x, y = _t(fd, [-1, 1, -1]), _t(fd, [-1, -1])
    fd.add_output(fd.ops.add(fd.ops.squeeze(fd.ops.exp(x), [1]), y))


def _shapes(*shapes, dtype=torch.float32):
    def make(dev):
        return [torch.randn(s, device=dev, dtype=dtype) for s in shapes]

    return make


def _channels_last(shape):
    def make(dev):
        return [torch.randn(shape, device=dev).to(memory_format=torch.channels_last)]

    return make


CASES = {
    "reshape_sum0": (_reshape_sum0, _shapes((2, 3, 4)), lambda x: [x.reshape(6, 4).sum(0)]),
    "reshape_sum_ndim": (
        _reshape_sum_ndim,
        _shapes([2] * 12),
        lambda x: [x.reshape([2] * 9 + [8]).sum(3)],
    ),
    "reshape_infer": (_reshape_infer, _shapes((6, 8)), lambda x: [x.reshape(-1, 4).exp()]),
    "reshape_fixed": (_reshape_fixed, _shapes((4, 6)), lambda x: [x.reshape(6, 4) + 1]),
    "reshape_strided_infer": (
        _reshape_strided_infer,
        lambda dev: [torch.randn(192, device=dev).as_strided((4, 8, 6), (48, 6, 1))],
        lambda x: [x.reshape(32, -1).sum(1)],
    ),
    "reshape_empty": (
        _reshape_empty,
        lambda dev: [torch.randint(0, 10, (0, 1, 2, 3, 4), device=dev)],
        lambda x: [x.reshape(5, 0)],
    ),
    "reshape_permuted": (
        _reshape_permuted,
        _shapes((2, 3, 4)),
        lambda x: [x.permute(1, 0, 2).reshape(-1, 4)],
    ),
    "reshape_permuted_strides": (  # an input stored transposed, reshaped
        _reshape_permuted,
        lambda dev: [torch.randn(4, 3, 2, device=dev).permute(2, 1, 0)],
        lambda x: [x.permute(1, 0, 2).reshape(-1, 4)],
    ),
    "reshape_split_reduced": (
        _reshape_split_reduced,
        _shapes((5, 12)),
        lambda x: [x.reshape(-1, 3, 4).sum(1)],
    ),
    "reshape_chain": (
        _reshape_chain,
        _shapes((2, 3, 4)),
        lambda x: [x.reshape(6, -1).exp().reshape(4, 3, 2)],
    ),
    "two_reshapes": (
        _two_reshapes,
        _shapes((2, 6)),
        lambda x: [x.reshape(3, 4).exp(), -x.reshape(4, 3)],
    ),
    "sum_then_reshape": (_sum_then_reshape, _shapes((6, 5)), lambda x: [x.sum(1).reshape(2, -1)]),
    "reshape_softmax": (
        _reshape_softmax,
        _shapes((4, 3, 12)),
        lambda x: [torch.softmax(x.reshape(-1, 12), -1)],
    ),
    "reshape_layer_norm": (
        _reshape_layer_norm,
        _shapes((2, 3, 8), (8,), (8,)),
        lambda x, w, b: [torch.nn.functional.layer_norm(x.reshape(-1, 8), (8,), w, b, 1e-5)],
    ),
    "reshape_broadcast_axes": (
        _reshape_broadcast_axes,
        _shapes((1, 6)),
        lambda x: [x.reshape(2, 1, -1).exp()],
    ),
    "reshape_expanded": (
        _reshape_expanded,
        _shapes((4, 1)),
        lambda x: [x.expand(4, 3).reshape(-1).exp()],
    ),
    "permute_mul": (
        _permute_mul,
        _shapes((3, 5, 4), (4, 3, 5)),
        lambda x, y: [x.permute(2, 0, 1) * y],
    ),
    "permute_reduce": (_permute_reduce, _shapes((3, 5, 4)), lambda x: [x.permute(2, 0, 1).sum(2)]),
    "permute_softmax": (_permute_softmax, _shapes((5, 7)), lambda x: [torch.softmax(x.T, -1)]),
    "squeeze": (_squeeze, _shapes((3, 1, 4)), lambda x: [x.squeeze(1).exp()]),
    "squeeze_symbolic": (_squeeze_symbolic, _shapes((3, 1, 4)), lambda x: [x.squeeze(1).exp()]),
    "expand": (
        _expand,
        _shapes((3, 1, 4), (3, 5, 4)),
        lambda x, y: [x.expand(3, 5, 4) + y, x.expand(3, 5, 4)],
    ),
    "reshape_then_rank_broadcast": (
        _reshape_then_rank_broadcast,
        _shapes((2, 3), (4, 6)),
        lambda x, y: [x.exp().reshape(-1) + y],
    ),
    "permute_then_rank_broadcast": (
        _permute_then_rank_broadcast,
        _shapes((4, 3), (2, 3, 4)),
        lambda x, y: [x.exp().T + y],
    ),
    "expand_then_rank_broadcast": (
        _expand_then_rank_broadcast,
        _shapes((3, 1), (2, 3, 4)),
        lambda x, y: [x.expand(3, 4) + y],
    ),
    "expand_meets_broadcast": (
        _expand_meets_broadcast,
        _shapes((1,), (1, 1)),
        lambda x, y: [x.expand(8) + y],
    ),
    "matmul_expanded_batch": (
        _matmul_expanded_batch,
        _shapes((1, 3, 4), (4, 5)),
        lambda a, b: [a.expand(2, 3, 4) @ b],
    ),
    "exp_of_expand": (_exp_of_expand, _shapes((1, 3)), lambda x: [x.expand(8, 3).exp()]),
    "sum_over_expand": (
        _sum_over_expand,
        _shapes((1, 3)),
        lambda x: [x.expand(8, 3).sum(0), x.expand(8, 3).mean(0)],
    ),
    "sum_along_expand": (_sum_along_expand, _shapes((1, 3)), lambda x: [x.expand(8, 3).sum(1)]),
    "rope_like": (
        _rope_like,
        _shapes((2, 3, 8), (2, 3, 5, 4)),
        lambda q, c: [(q.reshape(2, 3, 2, 4).permute(0, 2, 1, 3)[:, :, :, None, :] * c[None]).sum(-1)],
    ),
    "reshape_keepdim": (
        _reshape_keepdim,
        _shapes((5, 7)),
        lambda x: [x - (x.sum(1) * 2).reshape(-1, 1)],
    ),
    "all_ones": (_all_ones, _shapes((1,), (1, 1)), lambda x, y: [x.exp().reshape(1, 1) * y]),
    "squeeze_then_rank_broadcast": (
        _squeeze_then_rank_broadcast,
        _shapes((3, 1, 4), (3, 2, 4)),
        lambda x, y: [x.exp() + y],
    ),
    "squeeze_intermediate": (
        _squeeze_intermediate,
        _shapes((3, 1, 4), (3, 4)),
        lambda x, y: [x.exp().squeeze(1) + y],
    ),
    "channels_last_pointwise": (
        _channels_last_pointwise,
        _channels_last((2, 8, 3, 5)),
        lambda x: [torch.relu(x) * 2],
    ),
    "channels_last_softmax": (
        _channels_last_softmax,
        _channels_last((2, 3, 4, 5)),
        lambda x: [torch.softmax(x, -1)],
    ),
    "channels_last_layer_norm_c": (
        _channels_last_layer_norm_c,
        lambda dev: _channels_last((2, 8, 3, 5))(dev) + _shapes((8,), (8,))(dev),
        lambda x, w, b: [torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (8,), w, b, 1e-5)],
    ),
    "stride_order_output": (
        _stride_order_output,
        _shapes((2, 3, 4)),
        lambda x: [x + 3],
    ),
    "channels_last_out_of_row_major": (
        _channels_last_out_of_row_major,
        _shapes((2, 8, 3, 5)),
        lambda x: [x.exp()],
    ),
}


def _fusion(name):
    with cb.FusionDefinition() as fd:
        CASES[name][0](fd)
    return fd


def _uses_tma(ck) -> bool:
    found = []
    walk(ck.kernel.body, lambda n, _s: found.append(n) if isinstance(n, TmaLoad) else None)
    return bool(found)


def _check(outs, refs):
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_view_fusions_compile_and_run_on_the_interpreter(name):
    build, make, ref = CASES[name]
    fd = _fusion(name)
    inputs = make("cpu")
    ck = fd.compile(inputs, arch="sm_90a")
    if not fd.fusion.outputs:  # a reshape of an input: returned as a view of it, no kernel
        assert ck.kernels == []
    else:
        assert isinstance(ck.cubin, bytes) and len(ck.cubin) > 1000
    _check(interpret(fd, inputs), ref(*[x.double() for x in inputs]))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_view_fusions(name):
    build, make, ref = CASES[name]
    fd = _fusion(name)
    inputs = make(DEV)
    outs = fd.execute(inputs)
    _check(outs, ref(*[x.double() for x in inputs]))


# Larger shapes: several CTAs, vector accesses and the TMA schedulers next to views.
def _attention_heads(fd):  # [B, S, H*D] -> [B, H, S, D]
    x = _t(fd, [-1, -1, -1], dtype=D.BFloat16)
    y = fd.ops.permute(fd.ops.reshape(x, [fd.ops.size(x, 0), fd.ops.size(x, 1), 16, -1]), [0, 2, 1, 3])
    fd.add_output(fd.ops.cast(fd.ops.mul(y, 2.0), D.BFloat16))


def _softmax_flat_out(fd):  # normalization through a TMA ring, its output flattened
    x = _t(fd, [-1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.reshape(fd.ops.softmax(x, -1), [-1]))


def _pointwise_tma_reshape(fd):
    x, y = _t(fd, [-1, -1], dtype=D.BFloat16), _t(fd, [-1, -1, -1], dtype=D.BFloat16)
    r = fd.ops.reshape(x, [fd.ops.size(y, 0), fd.ops.size(y, 1), fd.ops.size(y, 2)])
    fd.add_output(fd.ops.cast(fd.ops.add(r, y), D.BFloat16))


def _bf16(*shapes):
    return _shapes(*shapes, dtype=torch.bfloat16)


LARGE = {
    "attention_heads": (
        _attention_heads,
        _bf16((4, 300, 16 * 64)),
        lambda x: [x.reshape(4, 300, 16, 64).permute(0, 2, 1, 3) * 2],
        {},
    ),
    "reshape_layer_norm": (
        _reshape_layer_norm,
        _shapes((8, 333, 1024), (1024,), (1024,)),
        lambda x, w, b: [torch.nn.functional.layer_norm(x.reshape(-1, 1024), (1024,), w, b, 1e-5)],
        {},
    ),
    "softmax_flat_out": (
        _softmax_flat_out,
        _bf16((257, 4096)),
        lambda x: [torch.softmax(x, -1).reshape(-1)],
        {},
    ),
    "pointwise_tma_reshape": (
        _pointwise_tma_reshape,
        _bf16((4 * 16384, 512), (4, 16384, 512)),
        lambda x, y: [x.reshape(4, 16384, 512) + y],
        {"stages": 3},
    ),
    "pointwise_tma_reshape_ws_store": (
        _pointwise_tma_reshape,
        _bf16((4 * 16384, 512), (4, 16384, 512)),
        lambda x, y: [x.reshape(4, 16384, 512) + y],
        {"stages": 3, "warp_specialized": True, "tma_store": True},
    ),
    "reshape_sum_large": (
        _reshape_split_reduced,
        _shapes((1000, 3 * 4 * 77)),
        lambda x: [x.reshape(-1, 3, 4).sum(1)],
        {},
    ),
}


def _large(name):
    build, make, ref, overrides = LARGE[name]
    with cb.FusionDefinition() as fd:
        build(fd)
    if overrides:
        fd.fusion.schedule(**overrides)
    return fd, make, ref


@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_view_fusions_compile(name):
    fd, make, _ = _large(name)
    ck = fd.compile(make("cpu"), arch="sm_90a")
    want = {
        "attention_heads": "pointwise",
        "reshape_layer_norm": "reduction",  # its rows come through a reshape: no TMA ring
        "softmax_flat_out": "normalization",
        "pointwise_tma_reshape": "pointwise_tma",
        "pointwise_tma_reshape_ws_store": "pointwise_tma",
        "reshape_sum_large": "reduction",
    }
    assert ck.name == "circbuf_" + want[name]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_view_fusions(name):
    fd, make, ref = _large(name)
    inputs = make(DEV)
    outs = fd.execute(inputs)
    refs = ref(*[x.double() for x in inputs])
    for o, r in zip(outs, refs):
        tol = 3e-2 if o.dtype == torch.bfloat16 else 1e-4
        assert_close(o, r, rtol=tol, atol=tol)


# Fixed sizes that leave a TMA ring one trip (common after reshapes to fixed
# shapes): the ring's loop is still generated.
def _fixed_outer_sum(fd):
    fd.add_output(fd.ops.sum(fd.ops.mul(_t(fd, [5, 8]), _t(fd, [5, 8])), [0]))


def _fixed_softmax(fd):
    fd.add_output(fd.ops.softmax(_t(fd, [8, 256]), -1))


def _fixed_pointwise_tma(fd):
    x = _t(fd, [64, 512], dtype=D.BFloat16)
    fd.add_output(fd.ops.cast(fd.ops.add(x, x), D.BFloat16))


FIXED = {
    "outer_sum": (
        _fixed_outer_sum,
        _shapes((5, 8), (5, 8)),
        lambda x, y: [(x * y).sum(0)],
        {},
        "outer_reduction",
    ),
    "softmax": (
        _fixed_softmax,
        _shapes((8, 256)),
        lambda x: [torch.softmax(x, -1)],
        {},
        "normalization",
    ),
    "pointwise_tma": (
        _fixed_pointwise_tma,
        _bf16((64, 512)),
        lambda x: [x + x],
        {"stages": 3},
        "pointwise_tma",
    ),
}


def _fixed(name):
    build, make, ref, overrides, _ = FIXED[name]
    with cb.FusionDefinition() as fd:
        build(fd)
    if overrides:
        fd.fusion.schedule(**overrides)
    return fd, make, ref


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_sizes_through_tma_rings_compile(name):
    fd, make, _ = _fixed(name)
    ck = fd.compile(make("cpu"), arch="sm_90a")
    assert ck.name == "circbuf_" + FIXED[name][4]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_sizes_through_tma_rings(name):
    fd, make, ref = _fixed(name)
    inputs = make(DEV)
    for o, r in zip(fd.execute(inputs), ref(*[x.double() for x in inputs])):
        tol = 3e-2 if o.dtype == torch.bfloat16 else 1e-5
        assert_close(o, r, rtol=tol, atol=tol)


# ------------------------------------------------------- printing, IR
def test_print_math_shows_the_views():
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1, -1, 1])
        r = fd.ops.reshape(x, [-1, 4])
        p = fd.ops.permute(r, [1, 0])
        s = fd.ops.squeeze(_t(fd, [-1, 1]), [1])
        e = fd.ops.expand(_t(fd, [1, -1]), [3, -1])
        fd.add_output(fd.ops.stride_order(p, [0, 1]))
        fd.add_output(fd.ops.neg(s))  # s alone would be returned as a view of T3, computed by no kernel
        fd.add_output(e)
    text = fd.fusion.print_math()
    for line in (
        "T1 = reshape(T0, [i2, 4])",  # the broadcast axis of T0 is left out
        "T2 = permute(T1, dims=[1, 0])",
        "T7 = set(T2, stride_order=[0, 1])",
        "T4 = squeeze(T3, dims=[1])",
        "T6 = expand(T5, [3, i4])",
        "i2 = ((i0 * i1) / 4)",
    ):
        assert line in text, (line, text)


def test_fixed_reshape_is_splits_and_merges_of_its_root():
    with cb.FusionDefinition() as fd:
        x = _t(fd, [4, 6, 5])
        y = fd.ops.reshape(x, [2, 12, 5])
        fd.add_output(fd.ops.exp(y))
    op = y.definition
    assert op.groups == (((0, 1), (0, 1)), ((2,), (2,)))
    assert len(y.domain.root) == 3 and y.domain.root[2] is y.logical[2]  # the kept axis is the same axis
    text = [str(t) for t in y.domain.view_transforms()]
    assert text[0].startswith("Merge(") and "{24}" in text[0]
    assert text[1].startswith("Split(") and "exact" in text[1]
    assert [str(i.extent) for i in y.logical] == ["2", "12", "5"]
    # a fusion of symbolic sizes is concretized per compile, for the sizes given
    with cb.FusionDefinition() as fd2:
        z = fd2.ops.reshape(_t(fd2, [-1, -1]), [-1, 4])
        fd2.add_output(z)
    assert not z.definition.concrete


def test_reshape_groups():
    assert reshape_groups([6, 4], [2, 3, 4]) == [((0,), (0, 1)), ((1,), (2,))]
    assert reshape_groups([2, 3, 4], [24]) == [((0, 1, 2), (0,))]
    assert reshape_groups([4, 6], [6, 4]) == [((0, 1), (0, 1))]
    assert reshape_groups([6, 1], [6]) == [((0, 1), (0,))]
    assert reshape_groups([6], [1, 6]) == [((0,), (0, 1))]
    assert reshape_groups([0, 1, 2], [5, 0]) == [((0, 1, 2), (0, 1))]


def test_dynamic_reshape_kernels_are_keyed_by_their_groups():
    fd = _fusion("reshape_infer")
    ck1 = fd.compile([torch.randn(6, 8)], arch="sm_90a")  # [6, 8] -> [12, 4]: one group of each
    ck2 = fd.compile([torch.randn(10, 8)], arch="sm_90a")
    assert ck1 is ck2  # same groups, symbolic sizes: one kernel
    ck3 = fd.compile([torch.randn(3, 4)], arch="sm_90a")  # [3, 4] -> [3, 4]: identity groups
    assert ck3 is not ck1


def test_reshape_with_scalar_sizes():  # nvFuser test_dynamic_reshape
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1, -1], contiguity=[True, True])
        d0 = fd.ops.size(x, 0)
        d1 = fd.define_scalar(dtype=D.Int32)
        d2 = fd.define_scalar(dtype=D.Int32)
        fd.add_output(fd.ops.reshape(x, [d0, d1, d2]))
    x = torch.randn(3, 4)
    for a, b in ((2, 2), (4, 1), (1, 4)):
        (y,) = interpret(fd, [x, a, b])
        assert y.shape == (3, a, b) and torch.equal(y.flatten(), x.flatten())
    with pytest.raises(
        cb.CircbufError, match=r"T0 has shape \[3, 4\] \(12 elements\), the new shape \[3, 2, 3\]"
    ):
        fd.compile([x, 2, 3], arch="sm_90a")


def test_vectorization_follows_the_real_strides():
    fd = _fusion("permute_mul")  # x read through a permute: no vector loads of x
    fd.compile([torch.randn(3, 8, 4), torch.randn(4, 3, 8)], arch="sm_90a")
    assert fd.last_params().vectorize_inputs == (False, True)
    fd = _fusion("channels_last_pointwise")  # output inherits channels-last: vectors along C
    x = torch.randn(2, 8, 3, 5).to(memory_format=torch.channels_last)
    fd.compile([x], arch="sm_90a")
    assert fd.last_params().vectorize == 4 and fd.last_params().vectorize_inputs == (True,)
    assert fd.fusion.outputs[0].domain.stride_order == [3, 0, 2, 1]
    fd = _fusion("channels_last_out_of_row_major")  # row-major in, channels-last out
    fd.compile([torch.randn(2, 8, 3, 5)], arch="sm_90a")
    assert fd.last_params().vectorize_inputs == (False,) and fd.last_params().vectorize_outputs == (True,)


def test_channels_last_pointwise_moves_16_byte_vectors():
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1, -1, -1, -1], dtype=D.BFloat16, stride_order=[3, 0, 2, 1])
        b = _t(fd, [-1], dtype=D.BFloat16)
        y = fd.ops.add(x, fd.ops.broadcast_in_dim(b, [-1, -1, -1, -1], [1]))
        fd.add_output(fd.ops.cast(fd.ops.relu(y), D.BFloat16))
    x = torch.randn(8, 64, 28, 28, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    ck = fd.compile([x, torch.randn(64, dtype=torch.bfloat16)], arch="sm_90a")
    assert ck.params.vectorize == 8 and ck.params.vectorize_inputs == (True, False)
    sass = ck.sass()
    assert "LDG.E.128" in sass and "STG.E.128" in sass


def test_outputs_are_allocated_in_their_stride_order():
    for perm in itertools.permutations(range(3)):  # nvFuser test_output_stride_order
        with cb.FusionDefinition() as fd:
            fd.add_output(fd.ops.stride_order(fd.ops.add(_t(fd, [-1, -1, -1]), 3.0), list(perm)))
        x = torch.arange(24.0).reshape(2, 3, 4)
        (out,) = interpret(fd, [x])
        assert torch.equal(out, x + 3)
        _verify_stride_order(out.stride(), perm)


def _verify_stride_order(strides, order):
    ranked = [None] * len(strides)
    for d, rank in enumerate(order):
        ranked[len(strides) - 1 - rank] = strides[d]
    assert ranked == sorted(ranked, reverse=True), (strides, order)


def test_stride_order_of_a_reduction_output():  # nvFuser test_output_stride_order_with_reduction
    for perm in itertools.permutations(range(3)):
        with cb.FusionDefinition() as fd:
            fd.add_output(fd.ops.stride_order(fd.ops.sum(_t(fd, [-1, -1, -1, -1]), [2]), list(perm)))
        x = torch.randn(2, 3, 4, 5)
        (out,) = interpret(fd, [x])
        _verify_stride_order(out.stride(), perm)
        assert_close(out, x.double().sum(2), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------- aliasing
def _running_stats():
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1, -1])
        rm = _t(fd, [-1])
        m = fd.ops.mean(x, [0])
        fd.add_output(fd.ops.add(fd.ops.mul(rm, 0.9), fd.ops.mul(m, 0.1)), alias_input=rm)
        fd.add_output(fd.ops.sub(x, fd.ops.broadcast_in_dim(m, [-1, -1], [1])))
    return fd


def _sgd_step():  # nvFuser test_alias_output_to_input, as an optimizer update
    with cb.FusionDefinition() as fd:
        p = _t(fd, [-1, -1])
        g = _t(fd, [-1, -1])
        p1 = fd.ops.sub(p, fd.ops.mul(g, 0.1))
        fd.add_output(p1, alias_input=p)
        fd.add_output(fd.ops.add(p1, 2.0))
    return fd


def test_alias_output_updates_the_input_and_is_not_returned():
    fd = _running_stats()
    assert "T6 -> T1 (in place, not returned)" in fd.fusion.print_math()
    x, rm = torch.randn(7, 5), torch.randn(5)
    rm0 = rm.clone()
    outs = interpret(fd, [x, rm])
    assert len(outs) == 1
    assert_close(rm, 0.9 * rm0.double() + 0.1 * x.double().mean(0), rtol=1e-5, atol=1e-6)
    assert_close(outs[0], x.double() - x.double().mean(0), rtol=1e-5, atol=1e-6)
    fd = _sgd_step()
    p, g = torch.randn(6, 8), torch.randn(6, 8)
    p0 = p.clone()
    (out,) = interpret(fd, [p, g])
    assert_close(p, p0.double() - 0.1 * g.double())
    assert_close(out, p0.double() - 0.1 * g.double() + 2)
    pt = torch.randn(8, 6).t()  # a transposed parameter: written through its own strides
    pt0 = pt.clone()
    interpret(fd, [pt, g])
    assert fd.last_params().vectorize_outputs == (False, True)
    assert_close(pt, pt0.double() - 0.1 * g.double())


def test_aliased_output_added_again_returns_the_input():  # nvFuser test_returning_aliased_outputs
    with cb.FusionDefinition() as fd:
        t0 = _t(fd, [-1, -1, -1, -1], contiguity=[True] * 4, stride_order=[3, 2, 1, 0])
        t4 = fd.ops.where(fd.ops.gt(t0, 0.0), t0, 0.0)
        fd.add_output(t4)
        fd.add_output(t4, t0)
        fd.add_output(t4)
        fd.add_output(t0)
    x = torch.randn(1, 2, 3, 4)
    ref = torch.relu(x)
    outs = interpret(fd, [x])
    assert len(outs) == 3 and all(o is x for o in outs)
    assert torch.equal(x, ref)


@pytest.mark.parametrize(
    "build, ref",
    [
        (
            lambda fd, x: fd.add_output(fd.ops.sub(x, fd.ops.sum(x, [1], keepdim=True)), alias_input=x),
            lambda x: x - x.sum(1, keepdim=True),
        ),
        (
            lambda fd, x: fd.add_output(fd.ops.exp(fd.ops.permute(x, [1, 0])), alias_input=x),
            lambda x: x.T.exp(),
        ),
        (
            lambda fd, x: fd.add_output(fd.ops.exp(fd.ops.reshape(x, [4, 4])), alias_input=x),
            lambda x: x.exp(),
        ),
    ],
)
def test_aliases_read_other_than_elementwise_are_segmented(build, ref):
    """x also read through a reduction or a view before its in-place write:
    as nvFuser, the readers run in a segment before the writer's (issue 16)."""
    from tests.test_segmentation import run_here

    with cb.FusionDefinition() as fd:
        x = _t(fd, [4, 4])
        build(fd, x)
    x0 = torch.randn(4, 4)
    x = x0.clone()
    assert run_here(fd, [x]) == []
    assert len(fd._get_executor()._segments[0]) == 2
    assert_close(x, ref(x0.double()))


# -------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "build, msg",
    [
        (lambda fd, x: fd.ops.reshape(x, [5, 5]), r"reshape: T0 has 24 elements, new_shape \[5, 5\] has 25"),
        (lambda fd, x: fd.ops.reshape(x, [-1, -1]), "more than one -1"),
        (
            lambda fd, x: fd.ops.reshape(x, [-1, 5]),
            r"cannot infer the -1 of \[-1, 5\] for T0 \(24 elements\)",
        ),
        (lambda fd, x: fd.ops.reshape(x, [2.0, 12]), "neither an int nor an integer scalar"),
        (
            lambda fd, x: fd.ops.reshape(x, [fd.define_scalar(), 12]),
            "must be an integer scalar, it is Double",
        ),
        (lambda fd, x: fd.ops.permute(x, [0, 0, 1]), r"permute: dims \[0, 0, 1\] are not a permutation"),
        (lambda fd, x: fd.ops.squeeze(x, [1]), "squeeze: axis 1 of T0 has extent 3, not 1"),
        (lambda fd, x: fd.ops.expand(x, [2, 5, 4]), "axis 1 of T0 has extent 3 and is not a broadcast"),
        (lambda fd, x: fd.ops.expand(x, [2, 3]), "has 2 entries, T0 has 3 axes"),
        (lambda fd, x: fd.ops.stride_order(x, [0, 1, 1]), r"stride_order: \[0, 1, 1\] is not a permutation"),
        (
            lambda fd, x: fd.ops.squeeze(fd.ops.expand(fd.define_tensor([1, 4]), [3, 4]), [0]),
            "expanded to 3; pass squeeze_expanded=True",
        ),
        (lambda fd, x: fd.define_tensor([-1, -1], stride_order=[0, 2]), "not a permutation of 0..1"),
        (
            lambda fd, x: fd.add_output(fd.ops.cast(x, D.Half), alias_input=x),
            "dtypes differ",
        ),
        (lambda fd, x: fd.add_output(fd.ops.sum(x, [0]), alias_input=x), "ranks differ"),
    ],
)
def test_view_errors_name_the_rule(build, msg):
    with cb.FusionDefinition() as fd:
        x = _t(fd, [2, 3, 4])
        with pytest.raises(cb.CircbufError, match=msg):
            build(fd, x)


def test_runtime_size_errors_name_the_view():
    fd = _fusion("squeeze_symbolic")
    with pytest.raises(cb.CircbufError, match="must be equal: squeeze of axis 1 of T0"):
        fd.compile([torch.randn(3, 2, 4)], arch="sm_90a")
    fd = _fusion("reshape_infer")
    with pytest.raises(cb.CircbufError, match=r"the new shape \[2, 4\] has 8"):
        fd.compile([torch.randn(5, 2)], arch="sm_90a")  # 10 elements: -1 becomes 2
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1, -1], stride_order=[0, 1], contiguity=[True, True])
        fd.add_output(fd.ops.exp(x))
    fd.compile([torch.randn(5, 3).t()], arch="sm_90a")  # column-major, as declared
    msg = r"axis 0 is defined contiguous but its stride is 5, not 1 \(contiguity\[1\], in stride order\)"
    with pytest.raises(cb.CircbufError, match=msg):
        fd.compile([torch.randn(3, 5)], arch="sm_90a")


def test_a_tensor_combined_with_its_own_permutation_is_refused():
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1, -1])
        fd.add_output(fd.ops.add(x, fd.ops.permute(x, [1, 0])))
    with pytest.raises(cb.CircbufError, match="axes 0 and 1 of T0 are one axis of the fusion"):
        fd.compile([torch.randn(4, 4)], arch="sm_90a")


def test_manual_schedule_needs_fixed_reshapes():
    with cb.FusionDefinition() as fd:
        y = fd.ops.exp(fd.ops.reshape(_t(fd, [-1, -1]), [-1, 4]))
        fd.add_output(y)
    y.split(0, 2)
    with pytest.raises(cb.CircbufError, match="a manually scheduled fusion needs reshapes of fixed sizes"):
        fd.compile([torch.randn(4, 4)], arch="sm_90a")


def test_define_tensor_takes_nvfusers_argument_order():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], [True, True], D.Half)
        b = fd.define_tensor([-1], D.BFloat16)  # circbuf's earlier (shape, dtype)
    assert a.dtype == D.Half and a.domain.contiguity == [True, True] and b.dtype == D.BFloat16


# ------------------------------------------------------- hypothesis
def _factor(n, rng):
    """A random shape of n elements, 1 to 3 axes."""
    dims = []
    for _ in range(rng.randint(0, 2)):
        divs = [d for d in range(2, n + 1) if n % d == 0]
        if not divs:
            break
        d = rng.choice(divs)
        dims.append(d)
        n //= d
    dims.append(n)
    rng.shuffle(dims)
    return dims


def _reshape_case(shape, seed, dim):
    import random

    rng = random.Random(seed)
    n = 1
    for s in shape:
        n *= s
    new = _factor(n, rng)
    dim = dim % len(new)
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1] * len(shape))
        r = fd.ops.reshape(x, new)
        fd.add_output(fd.ops.sum(fd.ops.mul(r, r), [dim]))
    return fd, new, dim


def _capped(shape, limit=1 << 22):
    """Drop leading axes until the tensor has at most ``limit`` elements."""
    shape = list(shape)
    while len(shape) > 1 and _numel(shape) > limit:
        shape = shape[1:]
    return shape


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    shape=st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=3),
    seed=st.integers(0, 1000),
    dim=st.integers(0, 2),
)
def test_hypothesis_reshape_then_sum_interpreted(shape, seed, dim):
    fd, new, dim = _reshape_case(shape, seed, dim)
    x = torch.randn(shape)
    (out,) = interpret(fd, [x])  # ([2, 4] summed over rows: the outer TMA ring)
    r = x.double().reshape(new)
    assert_close(out, (r * r).sum(dim), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    shape=st.lists(st.sampled_from([1, 2, 3, 5, 7, 8, 12, 64, 127, 1000]), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
    dim=st.integers(0, 2),
)
def test_hypothesis_reshape_then_sum(shape, seed, dim):
    shape = _capped(shape)
    fd, new, dim = _reshape_case(shape, seed, dim)
    x = torch.randn(shape, device=DEV)
    (out,) = fd.execute([x])
    r = x.double().reshape(new)
    tol = 1e-4 if x.numel() <= 65536 else 1e-3  # an fp32 sum of up to 520k squares in its order
    assert_close(out, (r * r).sum(dim), rtol=tol, atol=tol)


@pytest.mark.gpu
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    shape=st.lists(st.sampled_from([1, 2, 3, 5, 8, 33, 256]), min_size=2, max_size=4),
    seed=st.integers(0, 1000),
    dtype=st.sampled_from([D.Float, D.BFloat16]),
)
def test_hypothesis_permute_pointwise(shape, seed, dtype):
    import random

    shape = _capped(shape)
    if len(shape) < 2:
        shape = [3] + shape
    perm = list(range(len(shape)))
    random.Random(seed).shuffle(perm)
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1] * len(shape), dtype=dtype)
        y = _t(fd, [-1] * len(shape), dtype=dtype)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.permute(x, perm), y), dtype))
    x = torch.randn(shape, device=DEV, dtype=TORCH[dtype])
    y = torch.randn([shape[p] for p in perm], device=DEV, dtype=TORCH[dtype])
    (out,) = fd.execute([x, y])
    assert_close(out, x.double().permute(perm) + y.double())


# ------------------------------------------------------------ GPU only
@pytest.mark.gpu
def test_dynamic_reshape_new_scalars_new_plan():
    with cb.FusionDefinition() as fd:
        x = _t(fd, [-1, -1], contiguity=[True, True])
        d1 = fd.define_scalar(dtype=D.Int64)
        fd.add_output(fd.ops.reshape(x, [fd.ops.size(x, 0), d1, -1]))
    x = torch.randn(3, 4, device=DEV)
    for a in (2, 4, 1, 2):
        (y,) = fd.execute([x, a])
        assert y.shape == (3, a, 4 // a) and torch.equal(y.flatten(), x.flatten())


@pytest.mark.gpu
def test_alias_running_stats_on_gpu():
    fd = _running_stats()
    x, rm = torch.randn(1000, 257, device=DEV), torch.randn(257, device=DEV)
    rm0 = rm.clone()
    (y,) = fd.execute([x, rm])
    assert_close(rm, 0.9 * rm0.double() + 0.1 * x.double().mean(0), rtol=1e-5, atol=1e-5)
    assert_close(y, x.double() - x.double().mean(0), rtol=1e-5, atol=1e-5)
    rm1 = rm.clone()
    fd.execute([x, rm])  # the plan, now cached, writes the input again
    assert_close(rm, 0.9 * rm1.double() + 0.1 * x.double().mean(0), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 4), (1000, 1003), (3, 1 << 16)])
def test_alias_sgd_step_on_gpu(shape):
    fd = _sgd_step()
    p, g = torch.randn(shape, device=DEV), torch.randn(shape, device=DEV)
    p0 = p.clone()
    (out,) = fd.execute([p, g])
    assert_close(p, p0.double() - 0.1 * g.double())
    assert_close(out, p0.double() - 0.1 * g.double() + 2)
    pt = torch.randn(shape[::-1], device=DEV).t()  # a transposed parameter: written through its strides
    pt0 = pt.clone()
    fd.execute([pt, g])
    assert_close(pt, pt0.double() - 0.1 * g.double())


@pytest.mark.gpu
def test_aliased_output_added_again_on_gpu():
    with cb.FusionDefinition() as fd:
        t0 = _t(fd, [-1, -1, -1, -1], contiguity=[True] * 4, stride_order=[3, 2, 1, 0])
        t4 = fd.ops.where(fd.ops.gt(t0, 0.0), t0, 0.0)
        fd.add_output(t4)
        fd.add_output(t4, t0)
        fd.add_output(t4)
        fd.add_output(t0)
    x = torch.randn(1, 2, 3, 4, device=DEV)
    ref = torch.relu(x)
    outs = fd.execute([x])
    assert len(outs) == 3 and all(o.data_ptr() == x.data_ptr() for o in outs)
    assert torch.equal(x, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("perm", list(itertools.permutations(range(3))))
def test_output_stride_order_on_gpu(perm):
    with cb.FusionDefinition() as fd:
        fd.add_output(fd.ops.stride_order(fd.ops.add(_t(fd, [-1, -1, -1]), 3.0), list(perm)))
    x = torch.randn(33, 65, 129, device=DEV)
    (out,) = fd.execute([x])
    _verify_stride_order(out.stride(), perm)
    assert_close(out, x.double() + 3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [D.Float, D.BFloat16])
def test_channels_last_large(dtype):
    x = torch.randn(8, 64, 28, 28, device=DEV, dtype=TORCH[dtype]).to(memory_format=torch.channels_last)
    b = torch.randn(64, device=DEV, dtype=TORCH[dtype])
    with cb.FusionDefinition() as fd:
        xx = _t(fd, [-1, -1, -1, -1], dtype=dtype, stride_order=[3, 0, 2, 1])
        bb = _t(fd, [-1], dtype=dtype)
        y = fd.ops.add(xx, fd.ops.broadcast_in_dim(bb, [-1, -1, -1, -1], [1]))
        fd.add_output(fd.ops.cast(fd.ops.relu(y), dtype))
    (out,) = fd.execute([x, b])
    assert out.is_contiguous(memory_format=torch.channels_last)  # as torch keeps it
    assert_close(out, torch.relu(x.double() + b.double()[None, :, None, None]))
    with cb.FusionDefinition() as fd:  # a softmax over C, the axis contiguous in memory
        fd.add_output(
            fd.ops.cast(
                fd.ops.softmax(_t(fd, [-1, -1, -1, -1], dtype=dtype, stride_order=[3, 0, 2, 1]), 1), dtype
            )
        )
    (out,) = fd.execute([x])
    tol = 1e-5 if dtype == D.Float else 2e-2
    assert_close(out, torch.softmax(x.double(), 1), rtol=tol, atol=tol)
