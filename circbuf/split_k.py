"""The split-K run of a matmul fusion (:mod:`circbuf.scheduler.split_k` says
when and how far K is split): the partial products over chunks of K into an
fp32 workspace, then the reduction that sums them in a fixed order and runs
the fusion's epilogue once per output element.

Each step is an ordinary FusionExecutor (compiled, cached and launched as
any fusion; the interpreter runs them on the CPU), fed views of the
operands: for ``a`` [M, K] and S' chunks of kc, ``a[:, :S' kc]`` unflattened
to [M, S', kc] and moved to [S', M, kc], a batched operand whose batch
stride is kc elements; the tail (when S does not divide the k steps) is
``a[:, S' kc:]``. The workspace is the partial kernel's output, a new
tensor per call from torch's caching allocator (the same block, call after
call, once the reduction has released the last one).
"""

from __future__ import annotations

from .ir import DataType
from .runtime.executor import CompiledFusion
from .scheduler.segmenter import Segment, SegmentedFusion
from .scheduler.split_k import SplitK, reduce_fusion


def _fp32_matmul(dtype, rank: int):
    """``cast-free fp32 (a @ b)``: the partial product of one chunk of K,
    accumulated and stored in fp32 (the matmul's output typed Float: the
    MMA path stores its fp32 accumulator as is)."""
    from .frontend import FusionDefinition

    with FusionDefinition() as fd:
        a = fd.define_tensor([-1] * rank, dtype=dtype)
        b = fd.define_tensor([-1] * rank, dtype=dtype)
        c = fd.ops.matmul(a, b)
        c.dtype = DataType.Float
        fd.add_output(c)
    return fd._get_executor()


class SplitKRun:
    """The executors of one fusion's split-K steps, made on first use and
    kept for every input signature (their plans are cached per signature)."""

    def __init__(self, ex):
        self.ex = ex  # the fusion's FusionExecutor
        self._subs: dict = {}

    def _sub(self, key):
        sub = self._subs.get(key)
        if sub is None:
            f = self.ex.fusion
            from .scheduler.matmul import _operands
            from .scheduler.utils import contractions

            a = _operands(contractions(f)[0])[0]
            if key == "partial":
                sub = _fp32_matmul(a.dtype, 3)
            elif key == "tail":
                sub = _fp32_matmul(a.dtype, 2)
            else:
                from .compiler import FusionExecutor

                rf, where = reduce_fusion(f, tail=key == "reduce+tail")
                sub = (FusionExecutor(rf, is_segment=self.ex.is_segment), where)
            (sub[0] if isinstance(sub, tuple) else sub).may_split_k = False
            self._subs[key] = sub
        ov = {k: v for k, v in self.ex.fusion.schedule_overrides.items() if k != "split_k"}
        if key in ("partial", "tail") and sub.fusion.schedule_overrides != ov:
            sub.fusion.schedule_overrides = ov  # the matmul's other overrides (tile, stages, ...)
            sub.fusion.schedule_version += 1
        return sub

    def steps(self, sk: SplitK) -> list:
        """[(executor, what)] in launch order; ``what``: "partial", "tail" or "reduce"."""
        out = [(self._sub("partial" if sk.batched > 1 else "tail"), "partial")]
        if sk.tail:
            out.append((self._sub("tail"), "tail"))
        return out + [(self._sub("reduce+tail" if sk.tail else "reduce")[0], "reduce")]

    def _args(self, sk, what, inputs, views, results) -> list:
        if what == "partial":
            return views[0]
        if what == "tail":
            return views[1]
        ws = results[0][0] if sk.batched > 1 else results[0][0].unsqueeze(0)
        got = {"ws": ws, "tail": results[1][0] if sk.tail else None}
        where = self._sub("reduce+tail" if sk.tail else "reduce")[1]
        return [inputs[w[1]] if w[0] == "input" else got[w[0]] for w in where]

    def run(self, sk: SplitK, inputs, run_step, finish=True):
        """Run the steps with ``run_step(executor, args, finish)``; returns the
        reduction's result (what the fusion returns; with ``finish=False``,
        its outputs as the kernel wrote them)."""
        views = _views(sk, inputs)
        steps = self.steps(sk)
        results = []
        for k, (sub, what) in enumerate(steps):
            last = k == len(steps) - 1
            args = self._args(sk, what, inputs, views, results)
            results.append(run_step(sub, args, finish if last else False))
        return results[-1]

    def compile(self, sk: SplitK, inputs, arch, target) -> CompiledFusion:
        """Each step compiled for these inputs (the partial results stand in
        as empty tensors of their shapes); their kernels, in launch order."""
        import torch

        segs, kernels, results = [], [], []
        views = _views(sk, inputs)
        for sub, what in self.steps(sk):
            args = self._args(sk, what, inputs, views, results)
            ck = sub.compile(args, arch, target)
            cks = list(getattr(ck, "kernels", [ck]))
            kernels += cks
            info, _ = sub._bind(args, need_cuda=False)
            shapes = sub._out_shapes(info.extents)
            dev = next(x.device for x in args if isinstance(x, torch.Tensor))
            results.append([torch.empty(sh, dtype=torch.float32, device=dev) for sh in shapes])
            math = [str(e) for e in sub.fusion.exprs()]
            segs += [Segment(sub.fusion, [], [], what, math) for _ in cks]
        return SplitKCompiled(SegmentedFusion(self.ex.fusion, segs), kernels, self, sk)


def _views(sk: SplitK, inputs):
    """([a3, b3], [a2, b2]): the batched chunks [S', M, kc] @ [S', kc, N]
    and the tail [M, rest] @ [rest, N] (None when every chunk is kc)."""
    a, b = inputs[sk.a], inputs[sk.b]
    bk = b if sk.kind == "matmul" else b.t()  # [K, N]
    s, kc = sk.batched, sk.chunk
    a3 = a[:, : s * kc].unflatten(1, (s, kc)).movedim(1, 0)
    b3 = bk[: s * kc].unflatten(0, (s, kc))
    if s == 1:  # one chunk before the tail: a 2-D matmul (its result gets the batch axis)
        a3, b3 = a3[0], b3[0]
    tail = [a[:, s * kc :], bk[s * kc :]] if sk.tail else None
    return [a3, b3], tail


class SplitKCompiled(CompiledFusion):
    """The kernels of a split-K run (partial products, tail, reduction)."""

    def __init__(self, segments, kernels, run: SplitKRun, split: SplitK):
        super().__init__(segments, kernels)
        self.split_k = split
        self.runner = run

    def __str__(self):
        return f"{self.split_k}\n" + super().__str__().replace("(the fusion is segmented)", "(split-K)")


class SplitKPlan:
    """The launch plan of a split-K run for one input signature: the steps'
    plans, made on the first call."""

    __slots__ = ("runner", "split", "plans", "scalar_slots")

    def __init__(self, run: SplitKRun, split: SplitK, scalar_slots):
        self.runner, self.split, self.plans, self.scalar_slots = run, split, {}, scalar_slots

    def _step(self, sub, args, finish):
        plan = self.plans.get(id(sub))
        if plan is None:
            plan = self.plans[id(sub)] = sub._plan(args)
        from .runtime.executor import SegmentedPlan

        if isinstance(plan, SegmentedPlan):
            return plan.run(args)  # (a reduction fusion returns its outputs as they are)
        return plan.run(args, finish)

    def run(self, inputs, finish=True):
        made = len(self.plans)
        out = self.runner.run(self.split, inputs, self._step, finish)
        if not made:  # the first call: what fd.last_params() and ex.last show
            subs = [sub for sub, _ in self.runner.steps(self.split)]
            kernels = [k for sub in subs for k in getattr(sub.last, "kernels", [sub.last])]
            segs = [Segment(sub.fusion, [], [], what, []) for sub, what in self.runner.steps(self.split)]
            if len(segs) == len(kernels):
                self.runner.ex.last = SplitKCompiled(
                    SegmentedFusion(self.runner.ex.fusion, segs), kernels, self.runner, self.split
                )
        return out
