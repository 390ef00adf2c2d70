"""Run lowered kernels on the CPU, and check their pipeline protocols.

The interpreter executes the kernel IR codegen prints (:mod:`.machine`):
every thread of a CTA is a task (:mod:`.sched`), grouped by warp role, and
a seeded random scheduler decides who runs next, so producers and consumers
really interleave; mbarriers have their phases, TMA copies land at random
times after their issue through the tensor map's box, clipping and swizzle
(:mod:`.tma`), wgmmas read their operands through their descriptors. The
results match the GPU's up to the order of floating-point sums.

The checker runs the same interpreter over many schedules with happens-
before tracking (:mod:`.race`) and turns protocol bugs into
``CircbufError``\\ s naming role, barrier, stage and phase: deadlocks, races
on ring stages (a refill before the release, a read before the fill), waits
passed on the wrong phase, named barriers reached with different counts,
TMA store sources rewritten before ``wait_group.read``, ping-pong turns
not held. ``CIRCBUF_CHECK=1`` checks every kernel a fusion compiles when
:func:`interpret` runs it.

>>> import torch, circbuf as cb
>>> with cb.FusionDefinition() as fd:
...     fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
>>> x = torch.randn(300)
>>> torch.allclose(interpret(fd, [x])[0], x.exp())
True
>>> check(fd, [x], schedules=2)   # no protocol to break: passes
"""

from __future__ import annotations

import time

import torch

from .. import knobs
from ..ir import CircbufError
from ..lowering.kir import Kernel
from ..target import DEFAULT, resolve
from .machine import Launch

__all__ = [
    "Launch", "run_kernel", "interpret", "interpret_fusion", "interpret_executor", "check", "check_kernel",
    "check_executor", "launch_args", "interpreted_plan", "ProtocolError", "CHECKED",
]  # fmt: skip

# every kernel the checker passed in this process: {kernel, grid, block,
# schedules, ctas, steps, seconds} (``python -m circbuf.check`` reports them)
CHECKED: list = []


class ProtocolError(CircbufError):
    """What the checker found in a kernel: a deadlock, a race on a ring
    stage, a wait passed on the wrong phase, ... (the message names the
    role, barrier, stage and phase, and the schedule that showed it)."""


def run_kernel(
    kernel: Kernel, tensors, scalars=(), grid=(1, 1, 1), block=(1, 1, 1), seed=0, check=False, ctas=None
):
    """Run ``kernel`` on CPU ``tensors`` (its ``tensor_params``: inputs then
    outputs, written in place) with one scheduling seed. Returns the
    :class:`Launch` (``glob.counts`` holds the stores per output element)."""
    launch = Launch(kernel, list(tensors), list(scalars), grid, block, check=check)
    launch.run(seed=seed, ctas=ctas)
    return launch


def check_kernel(
    kernel: Kernel, tensors, scalars=(), grid=(1, 1, 1), block=(1, 1, 1), schedules=8, seed=0, ctas=2
):
    """The protocol checker: run ``kernel`` under ``schedules`` random
    schedules (seeds ``seed``, ``seed + 1``, ...) with happens-before
    tracking, on the first ``ctas`` CTAs and the last (None: all). Raises
    the first protocol error as a ``CircbufError``. The tensors' contents
    are overwritten (outputs partially, with a subset of the CTAs)."""
    t0 = time.perf_counter()
    launch = Launch(kernel, list(tensors), list(scalars), grid, block, check=True, count=False)
    every = launch.ctas()
    pick = every if ctas is None or len(every) <= ctas + 1 else every[:ctas] + every[-1:]
    if kernel.split_k and pick is not every:
        # split-K: every chunk (blockIdx.y) of the chosen tiles' CTAs, so that one of them sums
        xs = sorted({x for x, _, _ in every})
        keep = set(xs[:ctas] + xs[-1:])
        pick = [b for b in every if b[0] in keep]
    for s in range(seed, seed + schedules):
        try:
            launch.run(seed=s, ctas=pick)
        except ProtocolError:
            raise
        except CircbufError as e:
            raise ProtocolError(
                f"{e} [protocol checker: schedule seed {s}, CTAs {', '.join(map(str, pick))} of grid {tuple(grid)}]"
            ) from None
    CHECKED.append(
        dict(
            kernel=kernel.name, grid=tuple(grid), block=tuple(block), schedules=schedules, ctas=len(pick),
            steps=launch.steps, seconds=time.perf_counter() - t0,
        )
    )  # fmt: skip


def _compile(ex, inputs, target):
    """Compile for sm_90a (for ``target``: a Target or a known one's name;
    default the H100) with no GPU; the inputs' InputInfo for that target."""
    t = DEFAULT if target is None else resolve(target)
    ck = ex.compile(inputs, arch="sm_90a", target=t)
    info, _ = ex._bind(inputs, need_cuda=False, target=t)
    return ck, info


def _realigned(ex, inputs) -> list:
    """``inputs`` with the matmul operands a tensor map cannot describe
    copied to aligned rows, as ``fd.execute`` runs them (circbuf.realign)."""
    if ex.fusion.outputs:
        ra = ex._realign(ex._bind(inputs, need_cuda=False)[0])
        if ra:
            from ..realign import substitute

            return substitute(inputs, ra)
    return inputs


def _executor_launch(ex, inputs, target=None):
    """The plan of a compiled (sm_90a) executor for these inputs: the
    kernel, its tensors (outputs NaN-poisoned), scalars, geometry (the
    inputs realigned first, as the kernel was compiled for them)."""
    inputs = _realigned(ex, inputs)
    ck, info = _compile(ex, inputs, target)
    k = ck.kernel
    plan = ex._build_plan(ck, info, torch.device("cpu"))
    outs = plan.new_outputs(inputs)
    for o, spec in zip(outs, plan.out_specs):
        if o.is_floating_point() and spec[3] is None:  # not an input written in place
            o.fill_(float("nan"))
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)] + list(outs)
    scal = [x for d, x in zip(ex.fusion.inputs, inputs) if not isinstance(x, torch.Tensor)]
    return k, plan, outs, tensors, scal


def launch_args(fd, inputs, target=None):
    """``(kernel, tensors, scalars, grid, block)`` of an unsegmented fusion
    compiled for sm_90a (and ``target``, e.g. an H100 with 2 SMs, so that
    a persistent grid has 2 CTAs) on these CPU inputs (new NaN-poisoned
    outputs): what :func:`run_kernel` and :func:`check_kernel` take."""
    inputs = fd._flat_inputs(inputs)
    ex = fd._get_executor()
    _compile(ex, inputs, target)
    if ex._segments is not None:
        raise CircbufError("launch_args: the fusion is segmented; check(fd, inputs) runs each segment")
    k, plan, _outs, tensors, scal = _executor_launch(ex, inputs, target)
    return k, tensors, scal, plan.grid, plan.block


def interpret(fd, inputs, seed=0, check=None, check_stores=True, target=None):
    """Compile ``fd`` for sm_90a (and ``target``) on these CPU inputs and
    run its kernel(s) here, as ``fd.execute`` would (outputs poisoned with
    NaN first). ``check_stores``: every output element is stored exactly
    once. ``check``: run the protocol checker on each kernel first, with
    that many schedules (True: 8; default: ``CIRCBUF_CHECK``, 0 or a number
    of schedules). A segmented fusion runs its segmented plan."""
    return interpret_fusion(fd._get_executor(), fd._flat_inputs(inputs), seed, check, check_stores, target)


def interpret_fusion(ex, inputs, seed=0, check=None, check_stores=True, target=None):
    """:func:`interpret` for the FusionExecutor of a whole fusion (flat inputs)."""
    if check is None:
        check = knobs.check_schedules()
    ck, info = _compile(ex, inputs, target)
    kw = dict(seed=seed, check=check, check_stores=check_stores, target=target)
    if ex._segments is None or getattr(ck, "split_k", None) is not None:
        return interpret_executor(ex, inputs, **kw)
    plan = ex._segmented_plan(info)
    subs = ex._segments[1]

    def make(i, args):
        def run(a, finish, sub=subs[i]):
            return interpret_executor(sub, list(a), finish, **kw)

        plan.steps[i][0] = run
        return type("Interpreted", (), {"run": staticmethod(run)})

    plan.make = make
    return plan.run(inputs)


def interpreted_plan(ex):
    """``CIRCBUF_INTERPRET=1``: the plan ``execute`` runs for CPU inputs."""

    class InterpretedPlan:
        @staticmethod
        def run(inputs, finish=True):
            if not finish:  # a segment's plan: its kernel, handing its outputs on
                return interpret_executor(ex, list(inputs), False, check=knobs.check_schedules())
            return interpret_fusion(ex, list(inputs))

    return InterpretedPlan()


def interpret_executor(ex, inputs, finish=True, seed=0, check=False, check_stores=True, target=None):
    """:func:`interpret` for a FusionExecutor; ``finish=False``: the tensors the
    kernel wrote, as a segment hands them to the next one."""
    inputs = _realigned(ex, inputs)
    ck, info = _compile(ex, inputs, target)
    if getattr(ck, "split_k", None) is not None:  # partial products, then their reduction

        def step(sub, args, fin):
            kw = dict(seed=seed, check=check, check_stores=check_stores, target=target)
            return interpret_executor(sub, list(args), fin, **kw)

        return ck.runner.run(ck.split_k, inputs, step, finish)
    if not ex.fusion.outputs:  # inputs and views of them returned: no kernel to run
        fin = ex._finish(info.extents)
        return fin(inputs, []) if fin and finish else []
    k, plan, outs, tensors, scal = _executor_launch(ex, inputs, target)
    if plan.empty:
        return plan.finish(inputs, outs) if plan.finish and finish else outs
    if check:
        copies = [t.clone() for t in tensors]
        n = 8 if check is True else int(check)
        check_kernel(k, copies, scal, plan.grid, plan.block, schedules=n, seed=seed)
    launch = Launch(k, tensors, scal, plan.grid, plan.block, count=check_stores)
    launch.run(seed=seed)
    if check_stores:
        declared = [p for p in k.tensor_params if p.is_output]
        outs_of = {p.tv.name: t for p, t in zip(k.tensor_params, tensors) if p.is_output}
        for p, o in zip(declared, ex.fusion.outputs):
            t = outs_of[p.tv.name]
            expanded = any(ax.is_broadcast and n == 1 for ax, n in zip(o.domain.no_reductions(), t.shape))
            counts = torch.tensor(launch.glob.counts[p.tv.name], dtype=torch.int64)
            stored_once(k.name, p.tv.name, t, counts, expanded)
    return plan.finish(inputs, outs) if plan.finish and finish else outs


def check_executor(ex, inputs, target=None, schedules=None):
    """``CIRCBUF_CHECK`` on a GPU run: the checker on the kernel an
    unsegmented executor compiled for these inputs (CUDA tensors are copied
    to the CPU, strides kept), compiled again for sm_90a and ``target``."""
    n = knobs.check_schedules() if schedules is None else schedules
    if not n:
        return
    cpu = [_cpu_copy(x) if isinstance(x, torch.Tensor) else x for x in inputs]
    _compile(ex, cpu, target)
    if ex._segments is not None or not ex.fusion.outputs:
        return
    k, plan, _outs, tensors, scal = _executor_launch(ex, cpu, target)
    if not plan.empty:
        check_kernel(k, tensors, scal, plan.grid, plan.block, schedules=n)


def _cpu_copy(x):
    """``x`` on the CPU with its sizes and strides (a stride-0 axis stays one)."""
    if x.device.type == "cpu":
        return x
    base = torch.empty(0, dtype=x.dtype)
    return base.set_(x.untyped_storage().cpu(), x.storage_offset(), x.size(), x.stride())


def stored_once(kernel, name, t, counts, expanded=False):
    """Every element of output ``t`` written exactly once and nothing else in
    its span (an element of a stride-0 output shares its memory with the
    others along that axis: its address is written once per element).
    ``expanded``: the buffer holds a broadcast axis once (size 1), which a
    kernel may write any number of times: each address at least once."""
    if t.numel() == 0:
        return
    addr = torch.as_strided(torch.arange(counts.numel()), t.shape, t.stride()).reshape(-1)
    want = torch.bincount(addr, minlength=counts.numel())
    bad = ((counts < 1) & (want > 0)) | ((counts > 0) & (want == 0)) if expanded else counts != want
    bad = bad.nonzero().reshape(-1)
    if bad.numel():
        first = bad[:4]
        where = [
            tuple(int(c) for c in torch.unravel_index((addr == a).nonzero()[0, 0], t.shape))
            if want[a]
            else f"@{int(a)} (no element)"
            for a in first
        ]
        raise CircbufError(
            f"{kernel}: output {name}: {bad.numel()} addresses of {t.numel()} elements not stored "
            f"{'at least' if expanded else 'exactly'} once per element (e.g. {where} stored "
            f"{counts[first].tolist()} times for {want[first].tolist()}; {int(counts.sum())} stores in all)"
        )


def check(what, inputs=None, *args, schedules=8, seed=0, ctas=2, target=None, **kw):
    """The protocol checker (see the module doc). ``check(fd, inputs)``
    compiles the fusion for sm_90a (and ``target``: a GPU with 2 SMs gives
    a persistent kernel 2 CTAs that each run several tiles) and checks each
    of its kernels on these inputs; ``check(kernel, tensors, scalars, grid,
    block)`` checks a lowered kernel. Raises the first protocol error found
    as a ``CircbufError``."""
    if isinstance(what, Kernel):
        return check_kernel(what, inputs, *args, schedules=schedules, seed=seed, ctas=ctas, **kw)
    fd = what
    inputs = fd._flat_inputs(inputs)
    ex = fd._get_executor()
    _compile(ex, inputs, target)
    if ex._segments is not None:  # each segment on the inputs the segmented plan hands it
        interpret(fd, inputs, seed=seed, check=schedules, target=target)
        return None
    if not ex.fusion.outputs:
        return None
    k, plan, _outs, tensors, scal = _executor_launch(ex, inputs, target)
    if not plan.empty:
        check_kernel(k, tensors, scal, plan.grid, plan.block, schedules=schedules, seed=seed, ctas=ctas)
    return None
