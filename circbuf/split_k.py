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
            from .scheduler.matmul_path import _operands
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
    """The launch plan of a split-K run for one input signature. The first
    call runs the general path (each step's executor makes its plan); later
    calls take the operand views with one ``as_strided`` each (their sizes,
    strides and offsets are fixed by the signature) and launch the steps'
    plans directly: the host work of a decode step stays small."""

    __slots__ = ("runner", "split", "plans", "scalar_slots", "views", "where")

    def __init__(self, run: SplitKRun, split: SplitK, scalar_slots):
        self.runner, self.split, self.scalar_slots = run, split, scalar_slots
        self.plans = None  # per step, once made
        self.views = None  # (input position, size, stride, offset from the input's) per operand view
        self.where = None  # per reduction input: "ws", "tail" or a position among the inputs

    @staticmethod
    def _launch(plan, args, finish):
        from .runtime.executor import SegmentedPlan

        if isinstance(plan, SegmentedPlan):
            return plan.run(args)  # (a reduction fusion returns its outputs as they are)
        return plan.run(args, finish)

    def _first(self, inputs, finish):
        """The general path, recording each step's plan and the views' geometry."""
        plans = []

        def step(sub, args, fin):
            plans.append(sub._plan(args))
            return self._launch(plans[-1], args, fin)

        out = self.runner.run(self.split, inputs, step, finish)
        sk = self.split
        views = _views(sk, inputs)
        geo = []
        for j, v in zip((sk.a, sk.b, sk.a, sk.b), views[0] + (views[1] or [])):
            geo.append((j, tuple(v.shape), v.stride(), v.storage_offset() - inputs[j].storage_offset()))
        where = self.runner._sub("reduce+tail" if sk.tail else "reduce")[1]
        self.where = [w[0] if w[0] != "input" else w[1] for w in where]
        self.views, self.plans = geo, plans
        subs = [sub for sub, _ in self.runner.steps(sk)]
        kernels = [k for sub in subs for k in getattr(sub.last, "kernels", [sub.last])]
        segs = [Segment(sub.fusion, [], [], what, []) for sub, what in self.runner.steps(sk)]
        if len(segs) == len(kernels):  # what fd.last_params() and ex.last show
            self.runner.ex.last = SplitKCompiled(
                SegmentedFusion(self.runner.ex.fusion, segs), kernels, self.runner, sk
            )
        return out

    def run(self, inputs, finish=True):
        if self.plans is None:
            return self._first(inputs, finish)
        v = [inputs[j].as_strided(sz, st, inputs[j].storage_offset() + d) for j, sz, st, d in self.views]
        plans = self.plans
        ws = self._launch(plans[0], v[:2], False)[0]
        if self.split.batched == 1:
            ws = ws.unsqueeze(0)
        tail = self._launch(plans[1], v[2:], False)[0] if self.split.tail else None
        args = [ws if w == "ws" else tail if w == "tail" else inputs[w] for w in self.where]
        return self._launch(plans[-1], args, finish)
