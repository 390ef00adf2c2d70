"""Valid fusions nobody scheduled by hand never end in a lowering check
(issue 16, part 3): the schedulers' can_schedule refuses what they cannot
lower, and another scheduler or the segmenter takes it. Each case came from
the randomized differential test (tests/fuzz.py, its seed:index named)."""

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from tests.util import D, assert_close


def test_unrelated_outputs_get_a_kernel_each():
    """Two outputs no loop covers together (``[5]`` and ``[n]``, joined by no
    expr) are two segments, not a pointwise kernel refused by a lowering check
    (fuzz case 104:3)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([5], dtype=D.Double)
        y = fd.define_tensor([1], dtype=D.Int64)
        z = fd.define_tensor([-1], dtype=D.Int64)
        fd.add_output(fd.ops.gcd(y, z))
        fd.add_output(fd.ops.atan(fd.ops.gt(x, 3.0)))
    inputs = [
        torch.randn(5, dtype=torch.float64),
        torch.ones(1, dtype=torch.int64),
        torch.ones(3, dtype=torch.int64),
    ]
    ck = fd.compile(inputs, arch="sm_90a")
    assert len(ck.kernels) == 2
    assert all(k.params.brief().startswith("Pointwise") for k in ck.kernels)


def _linear_fixed_k(k, n=64, dtype=D.Half):
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=dtype)
        w = fd.define_tensor([n, k], dtype=dtype)
        fd.add_output(fd.ops.linear(a, w))
    return fd


@pytest.mark.parametrize("k", [8, 16, 64])
def test_matmul_with_k_of_one_k_tile_fixed_when_compiling(k):
    """K fixed in the definition at one k tile or less: the k loop has one
    trip on the producer's side and the consumers' (fuzz 106:59, 101:192);
    it used to end in "the readers' loop ... does not match the ring's loop"."""
    fd = _linear_fixed_k(k)
    ck = fd.compile(
        [torch.randn(130, k, dtype=torch.half), torch.randn(64, k, dtype=torch.half)], arch="sm_90a"
    )
    assert "HGMMA" in ck.sass()


@pytest.mark.gpu
@pytest.mark.parametrize("m, k", [(1, 16), (130, 8), (257, 64)])
def test_matmul_with_k_of_one_k_tile_matches_torch(m, k):
    fd = _linear_fixed_k(k)
    a = torch.randn(m, k, dtype=torch.half, device="cuda")
    w = torch.randn(64, k, dtype=torch.half, device="cuda")
    (out,) = fd.execute([a, w])
    assert_close(out, a.double() @ w.double().T)


def _zero_dim_math():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([], dtype=D.BFloat16)
        s = fd.define_scalar(dtype=D.Float)
        y = fd.ops.mul(fd.ops.add(x, -1.5), s)
        fd.add_output(fd.ops.exp(y))
        fd.add_output(fd.ops.gt(y, 0.0))
    return fd


def test_zero_dim_pointwise_runs_as_one_thread(monkeypatch):
    """0-dim math with no reduction (fuzz 100:48) is a one-thread pointwise
    kernel, not a refusal: nvFuser runs it."""
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd = _zero_dim_math()
    x = torch.tensor(0.75, dtype=torch.bfloat16)
    ck = fd.compile([x, 2.0], arch="sm_90a")
    assert ck.kernels[0].params.threads == 1 and "threadIdx" not in ck.cuda[ck.cuda.index('extern "C"') :]
    e, g = interpret(fd, [x, 2.0])
    ref = (x.double() - 1.5) * 2.0
    assert_close(e, ref.exp())
    assert bool(g) == bool(ref > 0)


@pytest.mark.gpu
def test_zero_dim_pointwise_matches_torch(monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    x = torch.tensor(2.25, dtype=torch.bfloat16, device="cuda")
    e, g = _zero_dim_math().execute([x, 2.0])
    ref = (x.double() - 1.5) * 2.0
    assert_close(e, ref.exp())
    assert g.dtype == torch.bool and bool(g) == bool(ref > 0)


def _residual_square(k=64):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Half)
        w = fd.define_tensor([k, k], dtype=D.Half)
        fd.add_output(fd.ops.add(fd.ops.linear(x, w), x))  # K and N are one axis of the fusion
        fd.add_output(fd.ops.abs(x))  # an output along an operand's K axis
    return fd


def test_matmul_epilogue_reading_an_operand_along_k_is_segmented():
    """``x @ W.T + x`` with a square W, and ``abs(x)`` beside ``linear(x, w)``
    (fuzz 0:6, 0:222): the matmul kernel cannot write along K; the segmenter
    gives that part a kernel of its own (before: ValueError in _tile, or two
    extents bound to blockIdx.x)."""
    fd = _residual_square()
    ck = fd.compile(
        [torch.randn(16, 64, dtype=torch.half), torch.randn(64, 64, dtype=torch.half)], arch="sm_90a"
    )
    kinds = sorted(k.params.brief().split(" ")[0] for k in ck.kernels)
    assert (
        len(ck.kernels) == 2
        and kinds[0] == "Pointwise"
        and "tile" in " ".join(k.params.brief() for k in ck.kernels)
    )


@pytest.mark.gpu
def test_matmul_epilogue_reading_an_operand_along_k_matches_torch(monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    x = torch.randn(130, 64, dtype=torch.half, device="cuda")
    w = torch.randn(64, 64, dtype=torch.half, device="cuda") / 8
    y, a = _residual_square().execute([x, w])
    # y is Float (fp16 + fp16 computes in fp32): the linear's fp16 rounding is in it
    ref = (x.double() @ w.double().T).half().double() + x.double()
    assert_close(y, ref, rtol=2e-3, atol=2e-3)
    assert_close(a, x.double().abs())


def _column_sum():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([3, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [0]))
    return fd


def test_expanded_input_is_not_staged_by_tma():
    """An input expanded along the reduced axis (stride 0; fuzz 304:19,
    300:26) is no tensor map's: the plain kernel takes it (before: "bulk
    axes must follow the memory order" in indexing)."""
    x = torch.randn(1, 8).expand(3, 8)
    ck = _column_sum().compile([x], arch="sm_90a")
    assert "UTMALDG" not in ck.sass()
    (out,) = interpret(_column_sum(), [x])
    assert_close(out, x.double().sum(0))


@pytest.mark.gpu
def test_expanded_input_reduction_matches_torch(monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    x = torch.randn(1, 4099, device="cuda").expand(3, 4099)
    (out,) = _column_sum().execute([x])
    assert_close(out, x.double().sum(0))


@pytest.mark.parametrize("which", ["a", "b"])
def test_matmul_of_an_expanded_operand_takes_no_tensor_map(which, monkeypatch):
    """An operand expanded along M or N (stride 0) is no tensor map's (before:
    "bulk axes must follow the memory order" in indexing): its ring is filled by
    the producer's threads with cp.async (issue 18), 16 bytes a copy along the
    unit-stride axis, and it runs right in the interpreter."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.Half)
        b = fd.define_tensor([-1, -1], dtype=D.Half)
        fd.add_output(fd.ops.linear(a, b))
    A, B = torch.randn(64, 64, dtype=torch.half), torch.randn(16, 64, dtype=torch.half)
    A, B = (A[:1].expand(64, 64), B) if which == "a" else (A, B[:1].expand(16, 64))
    p = fd.compile([A, B], arch="sm_90a").kernels[0].params  # the default: copied to aligned rows
    assert p.simt is None and p.fill == ("tma", "tma")
    assert fd._get_executor().realigned == (("T0",) if which == "a" else ("T1",))
    (out,) = interpret(fd, [A, B])
    assert_close(out, (A.double() @ B.double().T).half())
    monkeypatch.setenv("CIRCBUF_CP_ASYNC", "1")  # the cp.async fill (opt-in)
    ck = fd.compile([A, B], arch="sm_90a")
    p = ck.kernels[0].params
    assert p.simt is None and p.fill == (("cp.async", "tma") if which == "a" else ("tma", "cp.async"))
    assert p.copy_vector == ((8, 0) if which == "a" else (0, 8))
    (out,) = interpret(fd, [A, B])
    assert_close(out, (A.double() @ B.double().T).half())


@pytest.mark.gpu
def test_matmul_of_an_expanded_operand_matches_torch(monkeypatch):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.Half)
        b = fd.define_tensor([-1, -1], dtype=D.Half)
        fd.add_output(fd.ops.linear(a, b))
    A = torch.randn(1, 64, dtype=torch.half, device="cuda").expand(130, 64)
    B = torch.randn(16, 64, dtype=torch.half, device="cuda")
    (out,) = fd.execute([A, B])
    assert_close(out, (A.double() @ B.double().T).half())


def test_matmul_of_a_one_column_operand_in_k_major_layout(monkeypatch):
    """B = [K, 1] with K contiguous (a permuted [1, K]; fuzz 500:115): its
    memory order puts the size-1 axis innermost, so a K-major tensor map
    would not follow it; the producer's threads fill B's ring instead
    (cp.async fill, one element a copy: no axis of B is unit-stride along the
    box's rows), where it ended in "bulk axes must follow the memory order"."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, 64], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    A, B = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(1, 64, dtype=torch.bfloat16).permute(1, 0)
    p = fd.compile([A, B], arch="sm_90a").kernels[0].params  # the default: B copied to aligned rows
    assert p.simt is None and p.fill == ("tma", "tma") and fd._get_executor().realigned == ("T1",)
    monkeypatch.setenv("CIRCBUF_CP_ASYNC", "1")  # the cp.async fill (opt-in)
    ck = fd.compile([A, B], arch="sm_90a")
    p = ck.kernels[0].params
    assert p.simt is None and p.fill == ("tma", "cp.async") and p.copy_vector == (0, 1)
    (out,) = interpret(fd, [A[:8].contiguous(), B])
    assert_close(out, (A[:8].double() @ B.double()).to(torch.bfloat16))


def test_contiguity_of_an_empty_input_is_not_checked():
    """A [3, 0, 1] input defined contiguous has torch's strides (0, 1, 1)
    (fuzz 501:143): no element is addressed, so no stride breaks a promise."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], contiguity=[True, True, True], dtype=D.Double)
        fd.add_output(fd.ops.add(x, 1.0))
    ck = fd.compile([torch.randn(3, 0, 1, dtype=torch.float64)], arch="sm_90a")  # raised before
    assert ck.kernels[0].params.brief().startswith("Pointwise")
