"""GPU tests of small-M tiles and split-K (issue 18 section 2) against torch
in float64 (fp32 for the LM-head-sized weights), outputs NaN-poisoned
(conftest): hypothesis over shapes and split counts (primes, M = 1, splits
that do not divide the k steps), the decode shapes, determinism (two runs,
the same bits) and the workspace coming back from the caching allocator."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_gpu_matmul import check, mm_fusion

pytestmark = pytest.mark.gpu
DEV = "cuda"
BF = torch.bfloat16


def _inputs(kind, m, n, k, bias=False):
    a = torch.randn(m, k, device=DEV, dtype=BF)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device=DEV, dtype=BF)
    return [a, b] + ([torch.randn(n, device=DEV, dtype=BF)] if bias else [])


def _ref(kind, ins, epilogue=None, dt=torch.float64):
    a, b = ins[0].to(dt), ins[1].to(dt)
    y = a @ (b.T if kind == "linear" else b)
    if len(ins) > 2:
        y = y + ins[2].to(dt)
    if epilogue == "gelu":
        y = torch.nn.functional.gelu(y)
    return y.double()


def _same_bits(x, y):
    return torch.equal(x.view(torch.int16), y.view(torch.int16))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.sampled_from([1, 2, 3, 7, 16, 31, 64, 65, 127, 200]),
    n8=st.integers(1, 300),
    k8=st.integers(1, 400),
    split=st.integers(1, 9),
    kind=st.sampled_from(["matmul", "linear"]),
    bias=st.booleans(),
    where=st.sampled_from(["kernel", "reduction"]),
)
def test_hypothesis_split_k(m, n8, k8, split, kind, bias, where):
    n, k = 8 * n8, 8 * k8
    split = min(split, -(-k // 64))  # at most one split per k step (more is refused: test_split_k.py)
    fd = mm_fusion(kind, bias=bias and kind == "linear", epilogue="gelu")
    fd.fusion.schedule(split_k=split, split_k_sum=where)
    ins = _inputs(kind, m, n, k, bias and kind == "linear")
    (out,) = fd.execute(ins)
    check(out, _ref(kind, ins, "gelu"))
    (again,) = fd.execute(ins)
    assert _same_bits(out, again)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.sampled_from([1, 2, 5, 31, 64, 97]),
    n=st.integers(1, 700),
    k=st.integers(1, 2000),
    split=st.integers(1, 5),
    kind=st.sampled_from(["matmul", "linear"]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    where=st.sampled_from(["kernel", "reduction"]),
)
def test_hypothesis_split_k_any_k_and_dtype(m, n, k, split, kind, dtype, where):
    """K and N of any size (rows not 16 bytes apart: realigned operands, row stores), fp16 too;
    the same bits twice."""
    from tests.util import D

    split = min(split, -(-k // 64))
    fd = mm_fusion(kind, {torch.bfloat16: D.BFloat16, torch.float16: D.Half}[dtype])
    fd.fusion.schedule(split_k=split, split_k_sum=where)
    a = torch.randn(m, k, device=DEV, dtype=dtype)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device=DEV, dtype=dtype)
    (out,) = fd.execute([a, b])
    check(out, _ref(kind, [a, b]))
    (again,) = fd.execute([a, b])
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))


DECODE = [
    (m, n, k) for m in (1, 16, 64) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
]


@pytest.mark.parametrize("m, n, k", DECODE)
def test_decode_shapes(m, n, k):
    fd = mm_fusion("linear")
    ins = _inputs("linear", m, n, k)
    (out,) = fd.execute(ins)
    check(out, _ref("linear", ins, dt=torch.float32))
    (again,) = fd.execute(ins)
    assert _same_bits(out, again), "split-K must give the same bits every run"


@pytest.mark.parametrize("where", ["kernel", "reduction"])
@pytest.mark.parametrize("split", [2, 3, 7])
def test_split_with_a_tail_and_bias_is_deterministic(split, where):
    fd = mm_fusion("linear", bias=True, epilogue="gelu")
    fd.fusion.schedule(split_k=split, split_k_sum=where)
    ins = _inputs("linear", 5, 1000, 1000, bias=True)  # 16 k steps: a tail for 3 and 7
    outs = [fd.execute(ins)[0] for _ in range(3)]
    check(outs[0], _ref("linear", ins, "gelu"))
    assert all(_same_bits(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("m, n, k, split", [(1, 4096, 4096, 16), (256, 256, 8192, 16), (200, 1000, 3000, 5)])
def test_split_in_the_kernel_same_bits_and_flags_back_to_zero(m, n, k, split):
    """Many CTAs per tile racing to be last: the sum has the same bits on every
    run (chunk order, whichever CTA sums), and every tile's flag is back at 0."""
    fd = mm_fusion("matmul", epilogue="gelu")
    fd.fusion.schedule(split_k=split, split_k_sum="kernel")
    ins = _inputs("matmul", m, n, k)
    outs = [fd.execute(ins)[0] for _ in range(5)]
    assert fd.last_params().split_k == split
    check(outs[0], _ref("matmul", ins, "gelu"))
    assert all(_same_bits(outs[0], o) for o in outs[1:])
    torch.cuda.synchronize()
    ex = fd._get_executor()
    (plan,) = [p for p in ex._plans.values() if getattr(p, "workspace", None) is not None]
    ((_, flags),) = plan.workspace.by_stream.values()
    assert flags.count_nonzero().item() == 0


def test_split_in_the_kernel_on_two_streams_at_once():
    """The same fusion and shapes launched on two streams without a sync between
    them: each stream counts on flags of its own (one set would mix the two
    launches' counts: a tile summed twice, or never)."""
    fd = mm_fusion("linear")
    fd.fusion.schedule(split_k=8, split_k_sum="kernel")
    ins = _inputs("linear", 1, 4096, 8192)
    want = _ref("linear", ins, dt=torch.float32)
    (first,) = fd.execute(ins)  # (the plan, on the default stream)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    outs = []
    for _ in range(20):
        for s in streams:
            with torch.cuda.stream(s):
                outs.append(fd.execute(ins)[0])
    torch.cuda.synchronize()
    check(first, want)
    assert all(_same_bits(first, o) for o in outs)
    (plan,) = [p for p in fd._get_executor()._plans.values() if getattr(p, "workspace", None) is not None]
    assert len(plan.workspace.by_stream) == 3


def test_workspace_comes_back_from_the_caching_allocator():
    fd = mm_fusion("linear")
    fd.fusion.schedule(split_k=2, split_k_sum="reduction")
    ins = _inputs("linear", 16, 4096, 4096)
    assert fd.compile(ins).split_k.splits == 2
    for _ in range(3):
        fd.execute(ins)
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    for _ in range(10):
        fd.execute(ins)
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved() == reserved


@pytest.mark.parametrize(
    "kind, ashape, bshape, split",
    [("linear", (1, 1, 4096), (4096, 4096), None), ("matmul", (4, 33, 2048), (4, 2048, 200), 5)],
)
def test_split_in_the_kernel_on_batched_operands(kind, ashape, bshape, split):
    """A rank-3 decode linear (the heuristic's split) and a batched matmul (asked):
    one kernel, against torch, the same bits twice."""
    fd = mm_fusion(kind, arank=len(ashape), brank=len(bshape))
    if split:
        fd.fusion.schedule(split_k=split)
    a, b = torch.randn(*ashape, device=DEV, dtype=BF), torch.randn(*bshape, device=DEV, dtype=BF)
    (out,) = fd.execute([a, b])
    (again,) = fd.execute([a, b])
    assert fd.last_params().split_k == (split or fd.last_params().split_k) and fd.last_params().split_k > 1
    check(out, (a.double() @ (b.double().T if kind == "linear" else b.double())))
    assert _same_bits(out, again)
