"""Valid fusions the fuzzer found ending in the loop nest's ordering check
("no order of the loops computes each tensor before it is read", issue 16:
fuzz 722:143, 725:158, 901:14), minimized.

Two root causes, one symptom: inline positions that tie two loops into a
cycle, a loop that would have to run both before and after another.

- Outputs that feed other outputs (722:143, 901:14): ``a = neg(x)``,
  ``b = exp(a)``, ``c = sin(b)``, ``d = mul(a, c)``, with b, c and d
  returned. The pointwise scheduler computes each output into a register
  cache inlined at the thread position (the cache is computed whole, then
  stored in vectors) and inlines every other intermediate fully. So ``a``,
  inlined into both ``b``'s cache and ``d``'s, made their element loops one
  loop, while ``c``'s cache, read by ``d`` and computed from ``b``, had a
  loop of its own between them. The schedulers now end with
  :func:`circbuf.scheduler.utils.untangle_inlining` (run by
  ``registry.apply``), which lowers such a tensor's inline position: ``a``
  becomes a register array computed before the three loops. The matmul
  epilogue had the same cycle one level up: an output read by another
  tensor was read back from global memory in a tile loop of its own after
  every tile's; it is now computed into registers its store and its readers
  share, as the other schedulers do (``cache_output``).
- An outer reduction whose output keeps the reduced axes through a reshape
  (725:158): ``maximum(sum(t, [0, 1]), reshape(ceil(t), [32, 32]))`` of
  ``t = relu(x[8, 4, 32])``. The outer-reduction kernel is one pass over the
  reduced axes; its check that no output keeps one compared axis classes,
  blind to the reshape merging the two reduced axes into the output's axis
  0, so ``t``'s element loop was both the reduction's and the output's. It
  now sees through views (as ``once_per_row`` does); the plain reduction
  kernel, which recomputes ``t`` per use, runs it.

Each CPU test compiles the fusion for sm_90a and, where the kernels are
plain (no TMA), runs it on the interpreter against float64 torch; the GPU
test runs it with NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.ir import CircbufError
from circbuf.lowering.kir import Assign, ForLoop, TensorRef, TmaStore, walk
from circbuf.lowering.loop_nest import generate_loop_nest
from circbuf.scheduler.outer_reduction import OuterReductionScheduler
from circbuf.scheduler.registry import compute_params
from circbuf.scheduler.utils import prepare, untangle_inlining
from tests.test_trust_loops import _plain, assert_stores_bind_the_grid
from tests.util import D, assert_close, build_case, check_outputs, seeded, to_double

DEV = "cuda"


# ------------------------------------------------ outputs that feed outputs
def _outputs_feed_outputs(fd):
    """fuzz 901:14, minimized: a = neg(x) read by b = exp(a) and by
    d = mul(a, c), c = sin(b); b, c and d returned."""
    x = fd.define_tensor([-1], dtype=D.Float)
    a = fd.ops.neg(x)
    b = fd.ops.exp(a)
    c = fd.ops.sin(b)
    fd.add_output(fd.ops.mul(a, c))
    fd.add_output(b)
    fd.add_output(c)

    def inputs(device):
        return [torch.randn(1000, generator=seeded(901)).to(device)]

    def ref(x):
        a = -x
        b = a.exp()
        c = b.sin()
        return [a * c, b, c]

    return inputs, ref


def _bool_feeds_outputs(fd):
    """fuzz 722:143, minimized: a Bool p = gt(x, w) read by its cast (an
    output), whose silu (an output) the where(p, 2, silu) output reads; x
    strided, so it is read without vectors."""
    x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    w = fd.define_tensor([-1], dtype=D.Float)
    p = fd.ops.gt(x, w)
    a = fd.ops.cast(p, D.Float)
    s = fd.ops.silu(a)
    fd.add_output(fd.ops.where(p, 2.0, s))
    fd.add_output(a)
    fd.add_output(s)

    def inputs(device):
        g = seeded(722)
        return [
            torch.randn(7, 31, 8, generator=g)[:, :, 1::2].to(device),
            torch.randn(4, generator=g).to(device),
        ]

    def ref(x, w):
        p = x > w
        a = p.to(x.dtype)
        s = torch.nn.functional.silu(a)
        return [torch.where(p, torch.tensor(2.0, dtype=x.dtype), s), a, s]

    return inputs, ref


def _two_tangles(fd):
    """Two such ties in one fusion, the second through a tensor computed
    from the first's outputs: e = d + b, f = cos(e) returned and read by
    g = f * d."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    a = fd.ops.neg(x)
    b = fd.ops.exp(a)
    c = fd.ops.sin(b)
    d = fd.ops.mul(a, c)
    f = fd.ops.cos(fd.ops.add(d, b))
    fd.add_output(fd.ops.mul(f, d))
    fd.add_output(b)
    fd.add_output(c)
    fd.add_output(f)

    def inputs(device):
        return [torch.randn(33, 40, generator=seeded(9011)).to(device)]

    def ref(x):
        a = -x
        b = a.exp()
        c = b.sin()
        d = a * c
        f = (d + b).cos()
        return [f * d, b, c, f]

    return inputs, ref


def _softmax_outputs_feed_outputs(fd):
    """The same shape of fusion after a softmax (the normalization kernel,
    which gives each extra reader of an intermediate its own copy)."""
    x = fd.define_tensor([-1, -1], dtype=D.Float)
    s = fd.ops.softmax(x, 1)
    b = fd.ops.exp(s)
    c = fd.ops.sin(b)
    fd.add_output(fd.ops.mul(s, c))
    fd.add_output(b)
    fd.add_output(c)

    def inputs(device):
        return [torch.randn(20, 64, generator=seeded(9012)).to(device)]

    def ref(x):
        s = torch.softmax(x, 1)
        b = s.exp()
        c = b.sin()
        return [s * c, b, c]

    return inputs, ref


def _matmul_outputs_feed_outputs(fd):
    """The epilogue form: n = neg(a @ w) read by b = exp(n) and d = n * sin(b);
    b, sin(b) and d returned. b was read back from global memory in a tile
    loop after every tile's, n's element loop both before it (b) and after it
    (d). Tensor cores and TMA: the GPU test runs it."""
    a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    n = fd.ops.neg(fd.ops.matmul(a, w))
    b = fd.ops.exp(n)
    c = fd.ops.sin(b)
    fd.add_output(fd.ops.mul(n, c))
    fd.add_output(b)
    fd.add_output(c)

    def inputs(device):
        g = seeded(9013)
        xs = [torch.randn(256, 64, generator=g) * 0.1, torch.randn(64, 512, generator=g) * 0.1]
        return [t.bfloat16().to(device) for t in xs]

    def ref(a, w):
        n = -(a @ w)
        b = n.exp()
        c = b.sin()
        return [n * c, b, c]

    return inputs, ref


# ------------------------------------------------ a reduced axis kept through a view
def _outer_sum_beside_its_view(fd):
    """fuzz 725:158, minimized: t = relu(x[8, 4, 32]) summed over [0, 1] and,
    through reshape(ceil(t), [32, 32]), combined with the sums: the output's
    axis 0 is x's two reduced axes merged."""
    x = fd.define_tensor([-1, -1, -1], dtype=D.Float)
    t = fd.ops.relu(x)
    s = fd.ops.sum(t, [0, 1])
    fd.add_output(fd.ops.maximum(s, fd.ops.reshape(fd.ops.ceil(t), [32, 32])))

    def inputs(device):
        return [torch.randn(8, 4, 32, generator=seeded(725)).to(device)]

    def ref(x):
        t = torch.relu(x)
        return [torch.maximum(t.sum([0, 1]), t.ceil().reshape(32, 32))]

    return inputs, ref


def _outer_prod_beside_its_view_of_one(fd):
    """725:158 as found: x[8, 4, 1, 32], a prod over [0, 1, 2], the reshape
    to [32, -1, 32] keeping the size-1 axis."""
    x = fd.define_tensor([-1, -1, -1, -1], dtype=D.Float)
    t = fd.ops.relu(x)
    s = fd.ops.prod(t, [0, 1, 2])
    fd.add_output(fd.ops.maximum(s, fd.ops.reshape(fd.ops.ceil(t), [32, -1, 32])))

    def inputs(device):
        # values near 1: a product of 32 of them stays finite and nonzero
        return [(1 + 0.05 * torch.randn(8, 4, 1, 32, generator=seeded(7251))).to(device)]

    def ref(x):
        t = torch.relu(x)
        return [torch.maximum(t.prod(0).prod(0).prod(0), t.ceil().reshape(32, 1, 32))]

    return inputs, ref


CASES = {
    "901:14": _outputs_feed_outputs,
    "722:143": _bool_feeds_outputs,
    "901:14-two": _two_tangles,
    "901:14-softmax": _softmax_outputs_feed_outputs,
    "901:14-matmul": _matmul_outputs_feed_outputs,
    "725:158": _outer_sum_beside_its_view,
    "725:158-prod": _outer_prod_beside_its_view_of_one,
}


def _output_accesses(ck):
    """(stores, reads) of the kernel's outputs: the Assign nodes (and TMA
    stores: fp32 outputs of a matmul are staged and TMA-stored too) that write
    one and those that read one (global memory), each with its innermost loop."""
    outs = {id(p.tv) for p in ck.kernel.tensor_params if p.is_output}
    stores, reads = [], []

    def visit(node, stack):
        loop = next((s for s in reversed(stack) if isinstance(s, ForLoop)), None)
        if isinstance(node, TmaStore) and id(node.out) in outs:
            stores.append((node, loop))
        if not isinstance(node, Assign):
            return
        if id(node.lhs.tv) in outs:
            stores.append((node, loop))
        if any(isinstance(o, TensorRef) and id(o.tv) in outs for o in node.operands):
            reads.append((node, loop))

    walk(ck.kernel.body, visit)
    return stores, reads


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_runs(name):
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs("cpu")
    ck = fd.compile(xs, arch="sm_90a")
    kernels = getattr(ck, "kernels", None) or [ck]
    for k in kernels:
        assert_stores_bind_the_grid(k)
        stores, reads = _output_accesses(k)
        assert stores and not reads, k.kernel  # each output is read from registers
    if name == "901:14-matmul":
        assert [k.name for k in kernels] == ["circbuf_matmul"] and kernels[0].params.simt is None
        return  # wgmma and TMA: the GPU test runs it
    assert all(_plain(k) for k in kernels), name
    check_outputs(interpret(fd, xs), ref(*[to_double(x) for x in xs]))


def _scheduled(name):
    """The fusion of case ``name`` copied and scheduled by its scheduler
    alone (no untangle_inlining), and the scheduler's name."""
    fd, inputs, _ = build_case(CASES, name)
    xs = inputs("cpu")
    ex = fd._get_executor()
    info, _ = ex._bind(xs, need_cuda=False, target=cb.target.DEFAULT)
    f = fd.fusion.clone()
    prepare(f, info.extents)
    sched, params = compute_params(f, info, {})
    sched.schedule(f, params)
    return f, sched.name


def _positions(f):
    return {t.name: t.compute_at_pos for t in f.used_tvs() if not t.is_input}


def _neg(f):
    return next(t for t in f.used_tvs() if t.definition is not None and t.definition.op_name == "neg")


@pytest.mark.parametrize("name", ["901:14", "722:143"])
def test_untangle_lowers_the_tie_and_nothing_else(name):
    """As the pointwise scheduler leaves them, the positions have no loop
    order (the lowering check the fuzzer met); untangle_inlining lowers the
    one tensor read by two outputs' caches to the thread position, where the
    caches are, and leaves every other position alone."""
    f, sched = _scheduled(name)
    assert sched == "pointwise"
    with pytest.raises(CircbufError, match="no order of the loops"):
        generate_loop_nest(f)
    before = _positions(f)
    untangle_inlining(f)
    after = _positions(f)
    tie = (
        _neg(f) if name == "901:14" else next(t for t in f.used_tvs() if t.dtype == D.Bool and not t.is_input)
    )
    assert before[tie.name] == 4 and after[tie.name] == 2, (before, after)
    assert {k: v for k, v in after.items() if k != tie.name} == {
        k: v for k, v in before.items() if k != tie.name
    }
    generate_loop_nest(f)


@pytest.mark.parametrize("name", ["901:14-softmax", "725:158"])
def test_untangle_leaves_orderable_positions_alone(name):
    """A schedule one loop nest can run keeps its positions."""
    f, _ = _scheduled(name)
    generate_loop_nest(f)
    before = _positions(f)
    untangle_inlining(f)
    assert _positions(f) == before


def test_outer_reduction_sees_reduced_axes_through_views():
    """With the sizes fixed, the outer-reduction kernel refuses 725:158 by its
    rule (an output keeps a reduced axis, here merged by the reshape); a
    reshape that merges kept axes alone is still its."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([8, 4, 32], dtype=D.Float)
        t = fd.ops.relu(x)
        fd.add_output(fd.ops.maximum(fd.ops.sum(t, [0, 1]), fd.ops.reshape(fd.ops.ceil(t), [32, 32])))
    why = OuterReductionScheduler.can_schedule(fd.fusion)
    assert why is not None and "keeps a reduced axis" in why, why
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([64, 8, 16], dtype=D.Float)
        s = fd.ops.sum(x, [0])
        fd.add_output(fd.ops.neg(fd.ops.reshape(s, [128])))
    assert OuterReductionScheduler.can_schedule(fd.fusion) is None


def test_matmul_output_read_from_registers():
    """An epilogue output another output reads (y = gelu(a @ w) and y * 2) is
    stored and read in one tile loop, from a register value: no second tile
    loop reading it back from global memory."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.gelu(fd.ops.matmul(a, w))
        fd.add_output(y)
        fd.add_output(fd.ops.mul(y, 2.0))
    ck = fd.compile([torch.randn(256, 64).bfloat16(), torch.randn(64, 512).bfloat16()], arch="sm_90a")
    (k,) = ck.kernels
    stores, reads = _output_accesses(k)
    assert not reads, k.kernel
    assert len(stores) == 2 and stores[0][1] is stores[1][1], k.kernel  # one element loop stores both


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu(monkeypatch, name):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, inputs, ref = build_case(CASES, name)
    xs = inputs(DEV)
    check_outputs(fd.execute(xs), ref(*[to_double(x).cpu() for x in xs]))


def test_unrolled_pointwise_compiles():
    """901:14 large enough for the pointwise kernel to unroll (two vectors a
    thread): the tied tensor's register array spans the unrolled loop too."""
    fd, _, _ = build_case(CASES, "901:14")
    ck = fd.compile([torch.randn(1 << 22)], arch="sm_90a")
    assert ck.kernels[0].params.unroll > 1, ck.kernels[0].params


@pytest.mark.gpu
def test_gpu_unrolled_pointwise(monkeypatch):
    """901:14 large enough for the pointwise kernel to unroll (two vectors a
    thread): the tied tensor's register array spans the unrolled loop too."""
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    fd, _, ref = build_case(CASES, "901:14")
    x = torch.randn(1 << 22, generator=seeded(9014)).to(DEV)
    ck = fd.compile([x], arch=None)
    assert ck.kernels[0].params.unroll > 1, ck.kernels[0].params
    # exp then sin amplify fp32 rounding: at x = -5.3 (the tail of 4M normal samples),
    # exp(-x) = 200 carries ~1.2e-5 of absolute error into sin, and a * c multiplies
    # it by 5.3, so any fp32 evaluation of this chain is ~6e-5 from float64 there
    # (measured on the H100: 2.7e-5 absolute at most, 5 of 4M elements past 1e-5)
    for o, r in zip(fd.execute([x]), ref(x.double().cpu())):
        assert_close(o, r, rtol=1e-4, atol=1e-4)
