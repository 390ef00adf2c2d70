"""Shared helpers for tests: fusions used in several files and comparisons."""

import torch

import circbuf as cb

D = cb.DataType
TORCH = {
    D.Float: torch.float32,
    D.Double: torch.float64,
    D.Half: torch.float16,
    D.BFloat16: torch.bfloat16,
    D.Int32: torch.int32,
    D.Int64: torch.int64,
    D.Bool: torch.bool,
}
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_close(out, ref, rtol=None, atol=None):
    """``out`` against a float64 reference, with a tolerance set by out's dtype."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if not out.is_floating_point():
        assert torch.equal(out.cpu(), ref.to(out.dtype).cpu())
        return
    tol = TOL[out.dtype]
    o, r = out.double().cpu(), ref.double().cpu()
    assert not torch.isnan(o).any() or torch.isnan(r).any(), "NaN in output (unwritten element?)"
    torch.testing.assert_close(o, r, rtol=rtol or tol, atol=atol or tol, equal_nan=True)


def unary_fusion(op, dtype=D.BFloat16, rank=2, out_dtype=None):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank, dtype=dtype)
        y = getattr(fd.ops, op)(x)
        fd.add_output(fd.ops.cast(y, out_dtype or dtype))
    return fd


def axpy_fusion(dtype=D.BFloat16, rank=2):
    """``x * y + 1``, the benchmark's third op."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank, dtype=dtype)
        y = fd.define_tensor([-1] * rank, dtype=dtype)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(x, y), 1.0), dtype))
    return fd


def norm_fusion(kind, dtype, eps=1e-5):
    """softmax / layer_norm / rms_norm over the last axis of a 2-D tensor."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        if kind == "softmax":
            fd.add_output(fd.ops.softmax(x, -1))
        elif kind == "layer_norm":
            w = fd.define_tensor([-1], dtype=dtype)
            b = fd.define_tensor([-1], dtype=dtype)
            fd.add_output(fd.ops.layer_norm(x, w, b, eps))
        elif kind == "rms_norm":
            w = fd.define_tensor([-1], dtype=dtype)
            fd.add_output(fd.ops.rms_norm(x, w, eps))
        else:
            raise ValueError(kind)
    return fd


def norm_inputs(kind, rows, cols, dtype, device):
    x = torch.randn(rows, cols, dtype=dtype, device=device)
    if kind == "softmax":
        return [x]
    w = torch.randn(cols, dtype=dtype, device=device)
    if kind == "layer_norm":
        return [x, w, torch.randn(cols, dtype=dtype, device=device)]
    return [x, w]


def norm_reference(kind, inputs, eps=1e-5):
    x = inputs[0].double()
    if kind == "softmax":
        return torch.softmax(x, -1)
    if kind == "layer_norm":
        w, b = inputs[1].double(), inputs[2].double()
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps)
    w = inputs[1].double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def manual_ring_exp(tidx: int, stages: int, kind=None):
    """exp over a [rows, cols] bf16 tensor, scheduled by hand: rows in pairs
    (threadIdx.y, the outer serial loop), columns in tiles of ``tidx``
    (threadIdx.x, the ring loop), each [2 x tidx] tile staged by TMA in a
    circular buffer of ``stages`` (Pipelined by default) over the column
    loop, inside the row loop: the ring must run on across the outer loop."""
    from circbuf.ir import ParallelType
    from circbuf.scheduler import propagate_transforms

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.cast(fd.ops.exp(x), D.BFloat16)
        fd.add_output(y)
    xs = x.cache_after(op="tma")
    y.split(1, tidx).split(0, 2)
    y.reorder([0, 2, 1, 3])  # [I/2 (outer loop), J/tidx (buffered loop), TIDy 2, TIDx tidx]
    y.axis(2).parallelize(ParallelType.TIDy)
    y.axis(3).parallelize(ParallelType.TIDx)
    propagate_transforms(fd.fusion, y)
    xs.axis(2).parallelize(ParallelType.Bulk)
    xs.axis(3).parallelize(ParallelType.Bulk)
    xs.inline_at(2)
    for tv in fd.fusion.used_tvs():
        if tv is not xs and not tv.is_input and not tv.is_output:
            tv.inline_at(4)
    xs.circular_buffer(stages, type=kind)
    return fd


def manual_ws_exp(tidx: int, stages: int, registers=(40, 232)):
    """:func:`manual_ring_exp` with a warp-specialized ring: one ring over the
    row-pair loop and the column-tile loop together."""
    return manual_ring_exp(tidx, stages, cb.WarpSpecialized(registers=registers))


def manual_tma_store(transposed=False):
    """exp over a [rows, cols] fp32 tensor, scheduled by hand: one CTA per
    [8 x 32] tile (threadIdx.y x threadIdx.x), the result written to a shared
    tile and stored by one TMA copy. ``transposed`` lays the shared tile out
    column-major, which a TMA box cannot read: an error, by name."""
    from circbuf.ir import ParallelType as P
    from circbuf.scheduler import propagate_transforms

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        y = fd.ops.exp(x)
        fd.add_output(y)
    ys = y.cache_before(op="tma")
    y.split(1, 32).split(0, 8)
    y.reorder([0, 2, 1, 3])  # [I/8, J/32, 8, 32]
    propagate_transforms(fd.fusion, y)
    for tv in (y, ys):
        tv.axis(0).parallelize(P.BIDy)
        tv.axis(1).parallelize(P.BIDx)
    ys.axis(2).parallelize(P.TIDy)
    ys.axis(3).parallelize(P.TIDx)
    if transposed:
        ys.reorder([0, 1, 3, 2])
    y.axis(2).parallelize(P.Bulk)
    y.axis(3).parallelize(P.Bulk)
    ys.inline_at(2)
    return fd


def outer_fusion(op="sum", dtype=D.BFloat16, shape_rank=2, axes=(0,), weight=False):
    """``op`` over the outer ``axes`` of x (optionally x * w, w broadcast over
    the reduced axes), in fp32, cast back to ``dtype``."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1] * shape_rank, dtype=dtype)
        xf = fd.ops.cast(x, D.Float)
        if weight:
            w = fd.define_tensor([-1] * (shape_rank - len(axes)), dtype=dtype)
            wb = fd.ops.broadcast_in_dim(
                fd.ops.cast(w, D.Float), [-1] * shape_rank, list(range(len(axes), shape_rank))
            )
            xf = fd.ops.mul(xf, wb)
        y = getattr(fd.ops, op)(xf, list(axes))
        fd.add_output(fd.ops.cast(y, dtype))
    return fd


OUTER_TORCH = {
    "sum": lambda x, axes: x.sum(axes),
    "mean": lambda x, axes: x.mean(axes),
    "max": lambda x, axes: x.amax(axes),
    "min": lambda x, axes: x.amin(axes),
}


def seeded(seed: int) -> torch.Generator:
    """A CPU generator for reproducible random inputs."""
    return torch.Generator().manual_seed(seed)


def to_double(x):
    """A float tensor in float64 (a reference's precision); others unchanged."""
    return x.double() if x.is_floating_point() else x


def build_case(cases: dict, name: str):
    """``cases[name](fd)`` inside a new FusionDefinition: (fd, inputs, ref), the
    shape of the fuzz-regression test files (tests/test_trust_fuzz_*.py)."""
    with cb.FusionDefinition() as fd:
        inputs, ref = cases[name](fd)
    return fd, inputs, ref


def check_outputs(outs, refs, exact_dtype=False, written=False):
    """Each output against its reference (:func:`assert_close`). ``exact_dtype``:
    an integer output must also have the reference's dtype; ``written``: no
    float output element may be NaN even where the reference is (outputs are
    NaN-poisoned, so a NaN is an element never written)."""
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape, (o.shape, r.shape)
        if exact_dtype and not o.is_floating_point():
            assert o.dtype == r.dtype, (o.dtype, r.dtype)
        if written:
            assert not (o.is_floating_point() and o.isnan().any()), "an output element was never written"
        assert_close(o, r)
