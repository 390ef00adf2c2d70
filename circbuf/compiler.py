"""The compile driver: fusion -> segments -> schedule -> lower -> codegen ->
NVRTC, per segment, and the launch plans the runtime runs. The only module
that sees every layer.

A :class:`FusionExecutor` (held by a FusionDefinition) keeps two caches:

- plans, keyed by the exact inputs' dtypes, shapes, strides and pointer
  alignment: a ready launch (grid, outputs, packed arguments), or for a
  segmented fusion one per segment; a hit costs a dict lookup, output
  allocation and one ``cuLaunchKernelEx`` per kernel, in code generated for
  the fusion's inputs (``execute``) and for the plan (``Plan.run``);
- compiled kernels, keyed by heuristic params + layout specialization
  (contiguity, index type, arch): new shapes with the same params reuse them;
  and by the warm key (``_warm_key``), which also keys the disk cache of
  finished kernels (:mod:`circbuf.runtime.kernel_cache`): a kernel compiled
  in an earlier process is loaded without scheduling, lowering or codegen.
  A segmented fusion has one executor per segment, each with its caches.

A fusion no scheduler takes whole is segmented
(:mod:`circbuf.scheduler.segmenter`): each segment is a fusion of its own,
tensors between segments are allocated in global memory in the fusion's
dtypes and freed (back to torch's caching allocator, which reuses them) after
their last reader. Cubins are also cached on disk by NVRTC source hash
(see ``runtime/nvrtc.py``).

>>> # ex = FusionExecutor(fd.fusion); ck = ex.compile(inputs, "sm_90a"); ex.execute(inputs)
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import operator
import struct

from . import knobs
from .ir import (
    CircbufError,
    Const,
    DataType,
    Fusion,
    LinearOp,
    LoadStoreOp,
    MatmulOp,
    MemoryType,
    ParallelType,
    ReshapeOp,
    TensorView,
    Var,
    evaluate,
)
from .ir.fingerprint import Unfingerprintable, fingerprint
from .lowering import codegen, lower
from .lowering.kir import target_needs
from .runtime import driver, kernel_cache
from .runtime.cubin import frame_bytes
from .runtime.executor import (
    CompiledFusion,
    CompiledKernel,
    MapSlot,
    Plan,
    SegmentedPlan,
    Workspace,
    torch_dtype,
)
from .runtime.precision import allows_tf32
from .scheduler import InputInfo, TensorInfo
from .scheduler.registry import Unschedulable, apply, compute_params, if_spilled
from .scheduler.segmenter import segment
from .scheduler.utils import AxisExtentsDiffer, canonicalize_extents, check_aliases, contractions, prepare
from .target import DEFAULT, Target, resolve

_INT32_LIMIT = 2**31 - 1


class FusionExecutor:
    """Compiles and runs one Fusion; held by a FusionDefinition."""

    MAX_PLANS = 4096

    def __init__(self, fusion: Fusion, is_segment: bool = False):
        self.fusion = fusion
        self.is_segment = is_segment  # a segment of a segmented fusion: not split further
        self._segments = None  # (SegmentedFusion, executor per segment) once the fusion is split
        # the split made for each set of sizes that are 0 (``_segments`` is the one for the
        # inputs being compiled): a loop over an empty axis writes nothing, so an output with
        # elements beside one is cut apart only for the sizes that make it empty
        self._splits: dict = {}
        self.n_inputs = len(fusion.inputs)
        self._tpos = [k for k, x in enumerate(fusion.inputs) if isinstance(x, TensorView)]
        tp = self._tpos
        self._tensor_inputs = lambda inputs: [inputs[k] for k in tp]
        self._shape_scalars = _shape_scalar_positions(fusion)
        self._plans: dict = {}  # never rebound: the generated execute holds its get
        self._key_fn = None  # the plan key of a call's inputs (_key_source), made on first use
        self._compiled: dict = {}
        self._by_sig: dict = {}  # warm key (_warm_key) -> CompiledKernel
        self._fingerprint = None  # the fusion's, once a warm key needed it
        # scalar inputs no size is built from: their values are not compiled in
        shape_names = {fusion.inputs[k].name for k in self._shape_scalars}
        self._value_scalars = {
            x.name for x in fusion.inputs if isinstance(x, Var) and x.name not in shape_names
        }
        self._split_run = None  # circbuf.split_k.SplitKRun once a call splits K
        self.realigned = ()  # names of the operands the last plan copied (circbuf.realign)
        self.may_split_k = True  # False for the steps of a split-K run (never split again)
        # an fp32 matmul runs on TF32 tensor cores when torch would (circbuf.runtime.precision):
        # the setting is part of the plan's key (a call after it changes makes a new plan)
        self._fp32_mm = any(
            isinstance(e, (MatmulOp, LinearOp)) and e.inputs[0].dtype == DataType.Float
            for e in fusion.exprs()
        )
        self.last: CompiledKernel | CompiledFusion | None = None

    # ------------------------------------------------------------- bind
    def _bind(self, inputs, need_cuda: bool, target: Target = DEFAULT):
        """Check the inputs against the definition; their InputInfo (for ``target``, or
        with ``need_cuda``, the target of the device they are on) and that device."""
        import torch

        f = self.fusion
        if not isinstance(inputs, (list, tuple)):
            raise CircbufError("inputs must be a list of tensors and scalars")
        if len(inputs) != self.n_inputs:
            names = ", ".join(x.name for x in f.inputs)
            raise CircbufError(f"expected {self.n_inputs} inputs ({names}), got {len(inputs)}")
        env: dict = {}
        where: dict = {}
        infos = []
        device = None
        made = []  # (label, axis, extent expression, size): checked once every size is bound
        for k, (d, x) in enumerate(zip(f.inputs, inputs)):
            if isinstance(d, Var):
                if isinstance(x, torch.Tensor) or not isinstance(x, (int, float, bool)):
                    raise CircbufError(f"input {k} ({d.name}) is a scalar; got {type(x).__name__}")
                if d.dtype.is_int and not isinstance(x, int):
                    raise CircbufError(f"input {k} ({d.name}) is an integer scalar; got {x!r}")
                infos.append(None)
                env[d.name] = x  # sizes may be built from scalars (reshape)
                continue
            label = f"input {k} ({d.name})"
            if not isinstance(x, torch.Tensor):
                raise CircbufError(f"{label} must be a torch.Tensor, got {type(x).__name__}")
            if x.dtype != torch_dtype(d.dtype):
                raise CircbufError(f"{label}: dtype {x.dtype} does not match the definition's {d.dtype.name}")
            if x.dim() != d.ndim:
                raise CircbufError(f"{label}: rank {x.dim()} does not match the definition's rank {d.ndim}")
            if need_cuda and not x.is_cuda:
                raise CircbufError(
                    f"{label} is on {x.device}; execute needs CUDA tensors (compile() accepts CPU tensors)"
                )
            if device is None:
                device = x.device
            elif x.device != device:
                raise CircbufError(f"{label} is on {x.device} but earlier inputs are on {device}")
            _check_contiguity(label, d, x)
            for a, (ax, size) in enumerate(zip(d.logical, x.shape)):
                if ax.is_broadcast:
                    if size != 1:
                        raise CircbufError(
                            f"{label}: axis {a} is defined as broadcast (1) but has size {size}"
                        )
                elif isinstance(ax.extent, Var):
                    env[ax.extent.name] = size
                    where[ax.extent.name] = f"axis {a} of {d.name}"
                elif not isinstance(ax.extent, Const):  # a size made from others (a row's partials)
                    made.append((label, a, ax.extent, size))
                elif size != ax.extent.value:
                    raise CircbufError(
                        f"{label}: axis {a} has size {size}, the definition fixes {ax.extent.value}"
                    )
            align = 16
            ptr = x.data_ptr()
            while align > 1 and ptr % align:
                align //= 2
            infos.append(TensorInfo(tuple(x.shape), tuple(x.stride()), x.element_size(), align))
        for label, a, e, size in made:
            if evaluate(e, env) != size:
                raise CircbufError(
                    f"{label}: axis {a} has size {size}, the definition makes it {e} = {evaluate(e, env)}"
                )
        for name, e in f.derived_extents.items():  # in definition order: later ones may use earlier ones
            try:
                env[name] = evaluate(e, env)
            except ZeroDivisionError:
                raise CircbufError(f"size {name} = {e} divides by zero for these inputs") from None
            if env[name] < 0:
                raise CircbufError(f"size {name} = {e} is {env[name]} for these inputs; sizes are >= 0")
        for a, b in f.extent_equalities:
            va, vb = evaluate(a, env), evaluate(b, env)
            if va != vb:
                why = f.equality_reasons.get((str(a), str(b)), "the fusion combines them elementwise")
                raise CircbufError(
                    f"extent {a} ({where.get(str(a), a)}) = {va} and extent {b} "
                    f"({where.get(str(b), b)}) = {vb} must be equal: {why}"
                )
        if need_cuda and device is None:  # only scalar inputs: run on the current device
            if not torch.cuda.is_available():
                raise CircbufError("execute needs a CUDA device (compile() works without one)")
            device = torch.device("cuda", torch.cuda.current_device())
        if need_cuda:
            target = Target.from_device(device)  # read once per device
        return InputInfo(tuple(infos), env, target, tf32=self._fp32_mm and allows_tf32()), device

    # ---------------------------------------------------------- compile
    def _layout(self, info: InputInfo, out_shapes):
        """Per tensor parameter (inputs, then outputs): (memory order of its
        axes, contiguity per axis) as the kernel is specialized for, and the
        index type. Inputs' come from their strides; an output's from its
        stride order, or from the input it is written into."""
        layouts = []
        biggest = 0
        for t in info.tensors:
            if t is None:
                continue
            layouts.append(_layout_of(t.sizes, t.strides))
            if all(s > 0 for s in t.sizes):
                biggest = max(biggest, sum((s - 1) * abs(st) for s, st in zip(t.sizes, t.strides)) + 1)
        for k, (o, shape) in enumerate(zip(self.fusion.outputs, out_shapes)):
            j = self.fusion.aliases.get(k)
            if j is not None:
                t = info.tensors[j]
                layouts.append(_layout_of(t.sizes, t.strides))
                continue
            layouts.append((tuple(o.domain.allocation_order()), tuple(True for _ in shape)))
            n = 1
            for s in shape:
                n *= s
            biggest = max(biggest, n)
        index_type = DataType.Int32 if biggest < _INT32_LIMIT // 2 else DataType.Int64
        return tuple(layouts), index_type

    def _out_shapes(self, env):
        """Shapes the kernel writes: a broadcast axis is one element wide."""
        return [tuple(evaluate(i.extent, env) for i in o.domain.no_reductions()) for o in self.fusion.outputs]

    def _out_strides(self, info: InputInfo, out_shapes) -> list:
        """Strides of each output: dense in its stride order, or those of the
        input it is written into."""
        out = []
        for k, (o, shape) in enumerate(zip(self.fusion.outputs, out_shapes)):
            j = self.fusion.aliases.get(k)
            out.append(
                info.tensors[j].strides
                if j is not None
                else _strides_in_order(shape, o.domain.allocation_order())
            )
        return out

    def _finish(self, env):
        """What turns the kernel's outputs into what ``execute`` returns, or
        None when they are returned as they are. An output with broadcast
        axes expanded to an extent (``broadcast_in_dim(t, [3, 3], [0])``) is
        returned as a stride-0 expanded view of the one element the kernel
        wrote, as torch's ``expand`` and nvFuser return it; a fusion input
        added as an output is returned itself."""
        f = self.fusion
        views = []
        for o in f.outputs:
            ids = o.domain.no_reductions()
            if any(i.is_broadcast and i.expanded_extent is not None for i in ids):
                views.append(
                    tuple(
                        evaluate(
                            i.expanded_extent
                            if i.is_broadcast and i.expanded_extent is not None
                            else i.extent,
                            env,
                        )
                        for i in ids
                    )
                )
            else:
                views.append(None)
        # an output written into an input is that input (nvFuser returns it when it is also added plainly)
        returns = [
            ("input", f.aliases[k]) if kind == "output" and k in f.aliases else (kind, k)
            for kind, k in f.returns
        ]
        if all(v is None for v in views) and returns == [("output", k) for k in range(len(f.outputs))]:
            return None
        # a reshape or squeeze of an input is that input reshaped: a view of it, as nvFuser's alias
        shaped = [
            (j, tuple(evaluate(i.extent, env) for i in tv.domain.no_reductions())) for j, tv in f.input_views
        ]
        for (j, shape), (_, tv) in zip(shaped, f.input_views):
            x = f.inputs[j]
            in_shape = [evaluate(i.extent, env) for i in x.logical]
            if math.prod(in_shape) != math.prod(shape):  # no kernel's reshape checks it
                raise CircbufError(
                    f"reshape {x.name} -> {tv.name}: {x.name} has shape {in_shape} "
                    f"({math.prod(in_shape)} elements), the new shape {list(shape)} has {math.prod(shape)}"
                )
        returns = [
            ("input", shaped[k][0], shaped[k][1]) if kind == "view" else (kind, k, None)
            for kind, k in returns
        ]

        def finish(inputs, outs):
            outs = [o if v is None else o.expand(*v) for o, v in zip(outs, views)]
            return [
                outs[k] if kind == "output" else inputs[k] if shape is None else inputs[k].reshape(shape)
                for kind, k, shape in returns
            ]

        return finish

    def _compile(self, info: InputInfo, arch: str) -> CompiledKernel:
        """The kernel for ``info`` on ``arch``: from this executor's memory, from
        the disk cache (a warm start: no scheduling, lowering or codegen), or
        compiled afresh (and put in both)."""
        overrides = dict(self.fusion.schedule_overrides)
        key = self._warm_key(info, arch, overrides)
        if key is not None and not self.is_segment and kernel_cache.has_verdicts(key):
            # split for these inputs before: no one kernel takes it (or not for these sizes)
            raise Unschedulable("segmented for these inputs before (the disk cache says so)")
        if key is not None:
            ck = self._by_sig.get(key)
            if ck is None:
                ck = kernel_cache.load(
                    key,
                    arch,
                    lambda: self._compile_fresh(info, arch, overrides, memo=False),
                    self.fusion.print_math,
                )
                if ck is not None and ck.memo_key is not None:
                    # the kernel other sizes with these params share, as a cold compile finds it
                    ck = self._compiled.setdefault(ck.memo_key, ck)
            if ck is not None:
                self._remember(key, ck)
                return ck
        ck = self._compile_fresh(info, arch, overrides)
        if key is not None:
            self._remember(key, ck)
            kernel_cache.store(key, ck)
        return ck

    def _remember(self, key, ck):
        if len(self._by_sig) >= self.MAX_PLANS:
            self._by_sig.clear()
        self._by_sig[key] = ck

    def _warm_key(self, info: InputInfo, arch: str, overrides: dict) -> str | None:
        """The disk cache's key for this fusion compiled for ``info`` on ``arch``:
        everything the kernel depends on (the fusion's structure, the inputs'
        dtypes, sizes, strides and pointer alignment, the sizes and the scalars
        sizes are built from, the overrides, the target, arch, the knobs that
        change the code, the schedulers in play, circbuf's source and NVRTC's
        release). None: not cached (a manual schedule, CIRCBUF_DUMP asking for
        the stages, a fusion the fingerprint cannot write)."""
        if not knobs.cache_dir() or knobs.dump_stages() or self.fusion.manual_schedule:
            return None
        if self._fingerprint is None:
            try:
                self._fingerprint = fingerprint(self.fusion)
            except Unfingerprintable:
                self._fingerprint = ""
        if not self._fingerprint:
            return None
        from .scheduler import registry

        if set(overrides) & registry.deprecated_names():  # renamed at compile, with a warning each time
            return None
        try:
            ov = fingerprint(dict(sorted(overrides.items())))
        except Unfingerprintable:
            return None
        from .runtime.nvrtc import nvrtc_identity

        values = self._value_scalars
        env = sorted((k, v) for k, v in info.extents.items() if k not in values)
        parts = (
            "circbuf-kernel-1",
            kernel_cache.source_hash(),
            nvrtc_identity(),
            self._fingerprint,
            ov,
            repr(self.is_segment),
            repr(info.tensors),
            repr(env),
            repr(info.target),
            repr(info.tf32),
            arch,
            repr((knobs.debug_hang(), knobs.fast_math(), knobs.cp_async(), knobs.matmul_cluster())),
            repr([s[0].name for s in registry.SCHEDULERS]),
        )
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def _compile_fresh(
        self, info: InputInfo, arch: str, overrides: dict, memo: bool = True, again=None
    ) -> CompiledKernel:
        """Schedule, lower, generate and compile (``memo``: a kernel of the same
        params and layout in memory is reused, and this one kept there; off to
        rebuild the kernel IR of a kernel loaded from the disk cache). A kernel
        ptxas spilled to local memory is compiled again from the params its
        scheduler names instead (``if_spilled``), when it names any: ``again``
        is that try's (scheduler, params)."""
        out_shapes = self._out_shapes(info.extents)
        layouts, index_type = self._layout(info, out_shapes)
        manual = self.fusion.manual_schedule
        fusion = self.fusion if manual else self.fusion.clone()
        if manual:
            if overrides:
                raise CircbufError("schedule() overrides do not apply to a manually scheduled fusion")
            for e in fusion.exprs():
                if isinstance(e, (MatmulOp, LinearOp)):
                    # a matmul lowers only through the matmul scheduler's MMA (or SIMT) translation
                    raise CircbufError(
                        f"{type(e).__name__[:-2].lower()} {e.out.name}: manual scheduling of a fusion with a "
                        "matmul needs its MMA form first: call circbuf.scheduler.mma_form(fd.fusion) before "
                        "transforming (examples/gemm_ladder/), or leave its tensors untransformed and tune it "
                        "with fd.fusion.schedule(tile=..., stages=...)"
                    )
                _check_manual_staging(e)
                if isinstance(e, ReshapeOp) and not e.concrete:
                    raise CircbufError(
                        f"{e}: a manually scheduled fusion needs reshapes of fixed sizes "
                        "(this one depends on the inputs' sizes)"
                    )
            sched, params, views = None, None, ()
            canonicalize_extents(fusion)
        else:
            views = prepare(fusion, info.extents)
            if fusion.aliases and not self.is_segment:
                try:
                    check_aliases(fusion)
                except CircbufError as e:  # segmented: x's other readers run before the in-place write
                    raise Unschedulable(str(e)) from None
            sched, params = again or compute_params(fusion, info, overrides)
        # whether a spill sends these params on to others: the same params asked by an
        # override (kept as asked) are another kernel
        alt = if_spilled(sched, params, overrides, info.target) if sched is not None else None
        key = (
            alt,
            params,
            layouts,
            views,
            index_type,
            arch,
            info.target,  # lowering checks its limits
            id(self.fusion) if manual else None,
            knobs.debug_hang(),
            knobs.fast_math(),
            knobs.cp_async(),
        )
        ck = self._compiled.get(key) if memo else None
        if ck is not None:
            return ck
        fusion_ir = self.fusion.print_math()
        knobs.dump("fusion_ir", fusion_ir)
        if sched is not None:
            knobs.dump("params", params)
            apply(sched, fusion, params)
        transforms = fusion.print_transforms()
        knobs.dump("transforms", transforms)
        name = f"circbuf_{sched.name if sched else 'manual'}"
        kernel = lower(
            fusion,
            contiguity=[c for _, c in layouts],
            index_type=index_type,
            name=name,
            orders=[o for o, _ in layouts],
            after_pass=_dump_pass,
            target=info.target,
            fast_math=knobs.fast_math(),
        )
        knobs.dump("kernel_ir", kernel)
        _check_target(kernel, arch)
        src = codegen(kernel, debug_hang=knobs.debug_hang())
        knobs.dump("cuda", src)
        from .runtime.nvrtc import compile_cuda

        cubin = compile_cuda(src, arch, name + ".cu")
        if alt is not None and frame_bytes(cubin):
            ck = self._compile_fresh(info, arch, overrides, memo, again=(sched, alt))
            if memo:
                self._compiled[key] = ck  # these params spill: the same inputs take the other's kernel
            return ck
        ck = CompiledKernel(name, arch, params, fusion_ir, transforms, kernel, src, cubin)
        ck.memo_key = key if not manual else None
        if memo:
            self._compiled[key] = ck
        return ck

    def _check_outputs(self):
        if not self.fusion.outputs and not self.fusion.returns:
            raise CircbufError("the fusion has no outputs: mark its results with fd.add_output(tensor)")

    def compile(self, inputs, arch: str | None = None, target=None) -> CompiledKernel:
        """Compile for ``inputs`` (CPU tensors are fine) without launching, for ``target``
        (a Target or a known one's name); by default the current GPU's, or with no GPU
        or an explicit ``arch``, circbuf.target.DEFAULT (an H100)."""
        self._check_outputs()
        if target is not None:
            target = resolve(target)
            if arch is None:
                arch = target.arch
        elif arch is None:
            arch, target = _default_arch(), _default_target()
        else:
            target = DEFAULT
        from .runtime.nvrtc import parse_arch

        parse_arch(arch)  # a string NVRTC cannot build a cubin for is named before any work
        info, _ = self._bind(inputs, need_cuda=False, target=target)
        if not self.fusion.outputs:  # every output is an input or a view of one: no kernel
            from .scheduler.segmenter import SegmentedFusion

            self._finish(info.extents)  # a view's sizes are checked here
            self.last = CompiledFusion(SegmentedFusion(self.fusion, []), [])
            return self.last
        ra = self._realign(info)
        self.realigned = ()
        if ra:  # the kernels of the copies' signature (the copies are torch's, not kernels of ours)
            from .realign import substitute

            ck = self.compile(substitute(inputs, ra, copy=False), arch, target)
            self.realigned = tuple(self.fusion.inputs[j].name for j, _ in ra)
            return ck
        sk = self._split_k(info)
        if sk is not None:
            self.last = self._split_runner().compile(sk, inputs, arch, target)
            return self.last
        self._select_split(info.extents)
        if self._segments is None:
            try:
                ck = self._compile(info, arch)
            except (Unschedulable, AxisExtentsDiffer):
                if self.is_segment or self.fusion.manual_schedule:
                    raise
                self._segment(info, arch)
        if self._segments is not None:
            ck = self._compile_segments(inputs, info.extents, arch, target)
        self.last = ck
        return ck

    # ------------------------------------------------------- realign
    def _realign(self, info: InputInfo) -> tuple:
        """Inputs (positions) to copy into rows a tensor map can describe before
        the matmul runs (circbuf.scheduler.realign), or ()."""
        if self.fusion.manual_schedule or not self.fusion.outputs or not contractions(self.fusion):
            return ()
        from .scheduler.realign import choose

        return choose(self.fusion, info, self.fusion.schedule_overrides)

    # ------------------------------------------------------- split-K
    def _split_k(self, info: InputInfo):
        """How these inputs split the matmul's K (circbuf.scheduler.split_k), or None."""
        if not self.may_split_k or self.fusion.manual_schedule or not contractions(self.fusion):
            return None
        from .scheduler.split_k import choose

        sk = choose(self.fusion, info, self.fusion.schedule_overrides)
        return None if sk is None or sk.in_kernel else sk  # (in the kernel: the matmul params say so)

    def _split_runner(self):
        if self._split_run is None:
            from .split_k import SplitKRun

            self._split_run = SplitKRun(self)
        return self._split_run

    # ------------------------------------------------------- segments
    def _segment(self, info: InputInfo, arch: str):
        """Split the fusion (once per set of empty sizes: :meth:`_select_split`):
        no one scheduler takes it whole, or two axes it joins through a
        broadcast have different extents for these inputs' sizes (each
        segment then covers axes of one extent), or an output with elements
        meets an axis of extent 0 (:func:`.scheduler.utils.unwritten_output`).
        The schedulers' verdicts on the groups the segmenter tried are kept in
        the disk cache under the inputs' warm key: a warm start splits the
        fusion without asking them again."""
        env = info.extents
        key = self._warm_key(info, arch, dict(self.fusion.schedule_overrides))
        cached = kernel_cache.load_verdicts(key) if key is not None else None
        verdicts = dict(cached) if cached is not None else {}
        seg = segment(self.fusion, env, verdicts, info.target)
        if key is not None and cached is None:
            kernel_cache.store_verdicts(key, verdicts)
        knobs.dump("segments", seg)
        subs = [FusionExecutor(s.fusion, is_segment=True) for s in seg.segments]
        if key is not None:
            # a segment is determined by this fusion, these sizes and the schedulers (all in
            # ``key``) and its place: that stands for its fingerprint, which would walk the
            # whole cut-out copy of the fusion each segment carries
            for k, sub in enumerate(subs):
                sub._fingerprint = hashlib.sha256(f"{key}:segment {k}".encode()).hexdigest()
        self._segments = (seg, subs)
        self._splits[_empty_sizes(env)] = self._segments

    def _select_split(self, env: dict):
        """``_segments`` for the sizes in ``env``: the split made for the first
        inputs whose sizes of 0 were these (None: not split yet). Sizes with
        elements share one split, made for the first of them, as nvFuser
        keys its concretized fusions by the extents that are 0 at run time."""
        self._segments = self._splits.get(_empty_sizes(env))

    def _give_overrides(self):
        """Each segment gets the schedule() overrides its schedulers take; a
        name no segment's scheduler takes is an error."""
        seg, subs = self._segments
        asked = {k: v for k, v in self.fusion.schedule_overrides.items() if k not in seg.ignored_overrides}
        taken = set()
        for s, sub in zip(seg.segments, subs):
            mine = {k: v for k, v in asked.items() if k in s.overrides}
            taken |= set(mine)
            if sub.fusion.schedule_overrides != mine:
                sub.fusion.schedule_overrides = mine
                sub.fusion.schedule_version += 1
        unknown = [k for k in asked if k not in taken]
        if unknown:
            takers = "; ".join(f"segment {k} ({s.scheduler})" for k, s in enumerate(seg.segments))
            raise CircbufError(
                f"schedule({'=..., '.join(unknown)}=...): the fusion runs as {len(subs)} segments and no "
                f"segment's scheduler takes {', '.join(unknown)}: {takers}"
            )

    def _compile_segments(self, inputs, env: dict, arch: str, target: Target) -> CompiledFusion:
        """Compile each segment for the sizes its inputs will have (tensors
        between segments stand in as empty ones of the right shape)."""
        import torch

        self._give_overrides()
        seg, subs = self._segments
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        vals, kernels = {}, []
        for s, sub in zip(seg.segments, subs):
            args = [_source(kind, k, inputs, vals, env) for kind, k in s.inputs]
            for q, shape in self._handover_views(s, env).items():
                args[q] = args[q].expand(shape)
            kernels.append(sub.compile(args, arch, target))
            info, _ = sub._bind(args, need_cuda=False)
            shapes = sub._out_shapes(info.extents)
            for name, o, shape, st in zip(
                s.outputs, sub.fusion.outputs, shapes, sub._out_strides(info, shapes)
            ):
                vals[name] = torch.empty_strided(shape, st, dtype=torch_dtype(o.dtype), device=device)
        return CompiledFusion(seg, kernels)

    def _handover_views(self, s, env: dict) -> dict:
        """``{k: shape}``: segment ``s`` reads its input ``k``, an earlier
        segment's output, as the expand of what that segment wrote. An expand
        the fusion returns is written as its one element (returned as torch's
        stride-0 view), and a matmul's segment reads it as rows (the
        segmenter's ``_write_out_expanded``); the runtime copies such an
        operand dense first (scheduler/realign.py)."""
        # (an operand the fusion does not return is written out in full by its segment)
        returned = {o.name: o for o in self.fusion.outputs}
        views = {}
        for q, (kind, x) in enumerate(s.inputs):
            if kind != "tensor":
                continue
            read, written = s.fusion.inputs[q], returned.get(x)
            if written is not None and any(
                w.is_broadcast and w.expanded_extent is not None and not r.is_broadcast
                for w, r in zip(written.logical, read.logical)
            ):
                views[q] = tuple(evaluate(i.extent, env) for i in read.logical)
        return views

    def _segmented_plan(self, info: InputInfo) -> SegmentedPlan:
        """Each segment's plan is made on the first run, when the tensors
        between segments exist."""
        self._give_overrides()
        seg, subs = self._segments
        p = SegmentedPlan()
        env = info.extents  # sizes a segment takes as scalars are fixed for this signature
        consts = sorted({x for s in seg.segments for kind, x in s.inputs if kind == "extent"})
        names = sorted({name for s in seg.segments for name in s.outputs})
        p.consts = [env[x] for x in consts] + [None] * len(names)
        n_in = len(self.fusion.inputs)
        where = {("extent", x): n_in + k for k, x in enumerate(consts)}
        where.update({("tensor", x): n_in + len(consts) + k for k, x in enumerate(names)})
        p.steps = []
        for k, s in enumerate(seg.segments):
            idx = [j if kind == "input" else where[(kind, j)] for kind, j in s.inputs]
            dead = {
                where[("tensor", x)] for kind, x in s.inputs if kind == "tensor" and seg.last_use.get(x) == k
            }
            p.steps.append(
                [
                    _first_run(p, k),
                    _getter(idx, self._handover_views(s, env)),
                    [where[("tensor", x)] for x in s.outputs],
                    sorted(dead),
                ]
            )
        p.outs = [where[("tensor", o.name)] for o in self.fusion.outputs]
        p.finish = self._finish(info.extents)
        # (position, -, -) per scalar input: the executor checks their types on each call
        p.scalar_slots = [(k, None, None) for k, x in enumerate(self.fusion.inputs) if isinstance(x, Var)]

        def make(i, args):
            return subs[i]._plan(args)

        def made(i, plan):
            # after the step's first run succeeded (a split-K segment's plan compiles its
            # kernels then): later calls run the plan directly
            p.steps[i][0] = plan.run
            if i == len(subs) - 1:
                self.last = CompiledFusion(seg, [sub.last for sub in subs])

        p.make, p.made = make, made
        return p

    # ---------------------------------------------------------- execute
    def execute(self, inputs):
        """Hot path: the signature's key, a dict lookup, then the plan's
        launch; replaced on the first call by straight-line code for this
        fusion's inputs (:meth:`_fast_execute`)."""
        self.execute = self._fast_execute()
        return self.execute(inputs)

    def _key_source(self) -> str | None:
        """The plan cache's key of ``inputs`` as a Python expression over the
        fusion's inputs ``x0, x1, ...``: per tensor its dtype, shape, strides,
        pointer alignment (``data_ptr() & 15``) and device, then the schedule
        version and the scalars sizes are built from. None when no tensor
        names the device (the current one does: :meth:`_plan` adds it)."""
        if not self._tpos:
            return None
        parts = []
        for k in self._tpos:
            parts += [f"x{k}.dtype", f"x{k}.shape", f"x{k}.stride()", f"x{k}.data_ptr() & 15", f"x{k}.device"]
        parts.append("fusion.schedule_version")
        parts += [f"x{k}" for k in self._shape_scalars]  # scalars sizes are built from (full, reshape)
        if self._fp32_mm:
            parts.append("tf32()")  # torch's fp32 matmul precision, read at each call
        return "(" + ", ".join(parts) + ",)"

    def _fast_execute(self):
        """``execute`` for this fusion as straight-line code: unpack the inputs,
        look the key up, check the scalar inputs' types, run the plan; any
        miss or bad input goes the general way (:meth:`_plan`), which makes
        the plan or raises the error naming the input."""
        key = self._key_source()
        if key is None:
            return lambda inputs: self._plan(inputs).run(inputs)
        n = self.n_inputs
        xs = "".join(f"x{k}, " for k in range(n))
        scalars = [k for k, x in enumerate(self.fusion.inputs) if isinstance(x, Var)]
        bad = "".join(f" or not isinstance(x{k}, _SCALAR)" for k in scalars)
        src = (
            "def execute(inputs):\n"
            "    try:\n"
            f"        {xs}= inputs if inputs.__class__ in _SEQ else ()\n"  # a list or tuple
            f"        plan = plans_get({key})\n"
            "    except (TypeError, AttributeError, ValueError):\n"
            "        plan = None\n"
            f"    if plan is None{bad}:\n"
            "        return slow(inputs)\n"
            "    return plan.run(inputs)\n"
        )
        g = {
            "plans_get": self._plans.get,
            "fusion": self.fusion,
            "tf32": allows_tf32,
            "slow": lambda inputs: self._plan(inputs).run(inputs),
            "_SCALAR": (int, float, bool),
            "_SEQ": (list, tuple),
        }
        exec(compile(src, "<circbuf execute>", "exec"), g)  # noqa: S102 - code from the fusion's input count
        return g["execute"]

    def _plan(self, inputs):
        """The launch plan for these inputs' signature, made on a miss."""
        try:
            if not isinstance(inputs, (list, tuple)) or len(inputs) != self.n_inputs:
                raise TypeError
            if self._key_fn is None:
                src = self._key_source()
                names = "".join(f"x{k}, " for k in range(self.n_inputs))
                self._key_fn = (
                    eval(f"lambda {names}: {src}", {"fusion": self.fusion, "tf32": allows_tf32})  # noqa: S307 - see _key_source
                    if src is not None
                    else False
                )
            if self._key_fn:
                key = self._key_fn(*inputs)
            else:  # no tensor names the device: the current one does
                import torch

                key = (
                    self.fusion.schedule_version,
                    *(inputs[k] for k in self._shape_scalars),
                    self._fp32_mm and allows_tf32(),
                    torch.cuda.current_device() if torch.cuda.is_available() else None,
                )
            plan = self._plans.get(key)
        except (TypeError, AttributeError):
            self._bind(inputs, need_cuda=True)  # raises the message naming the bad input
            raise
        if plan is None:
            plan = self._make_plan(inputs)
            if len(self._plans) >= self.MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        elif plan.scalar_slots:
            for pos, _, _ in plan.scalar_slots:  # a plan never checked these values
                if not isinstance(inputs[pos], (int, float, bool)):
                    self._bind(inputs, need_cuda=True)
        return plan

    def _make_plan(self, inputs) -> Plan:
        import torch

        self._check_outputs()
        ra = self._realign(self._bind(inputs, need_cuda=False)[0])
        self.realigned = ()
        if ra:  # operands copied to rows a tensor map describes first (scheduler/realign.py)
            from .realign import RealignPlan

            scalars = [(k, None, None) for k, x in enumerate(self.fusion.inputs) if isinstance(x, Var)]
            return RealignPlan(self, ra, scalars)
        if knobs.interpret() and not any(getattr(x, "is_cuda", False) for x in inputs):
            from .interpret import interpreted_plan

            return interpreted_plan(self)  # CIRCBUF_INTERPRET=1: CPU tensors run in the interpreter
        info, device = self._bind(inputs, need_cuda=True)
        if not self.fusion.outputs:  # every output is an input, returned as is: nothing to run
            p = Plan()
            p.out_specs, p.poison, p.empty, p.device, p.plain_outs = [], False, True, device, True
            # read on every later call of this signature: scalar inputs' types are checked again
            p.scalar_slots = [(k, None, None) for k, x in enumerate(self.fusion.inputs) if isinstance(x, Var)]
            p.finish = self._finish(info.extents)
            p.tpos, p.like, p.name, p.hang, p.tmaps, p.workspace = (
                self._tpos,
                None,
                "no kernel",
                None,
                [],
                None,
            )
            return p.ready()
        sk = self._split_k(info)
        if sk is not None:
            from .split_k import SplitKPlan

            scalars = [(k, None, None) for k, x in enumerate(self.fusion.inputs) if isinstance(x, Var)]
            return SplitKPlan(self._split_runner(), sk, scalars)
        self._select_split(info.extents)
        if self._segments is None:
            try:
                with torch.cuda.device(device):
                    ck = self._compile(info, info.target.arch)
                    ck.loaded()
            except (Unschedulable, AxisExtentsDiffer):
                if self.is_segment or self.fusion.manual_schedule:
                    raise
                self._segment(info, info.target.arch)
        if self._segments is not None:
            return self._segmented_plan(info)
        if knobs.check_schedules():  # CIRCBUF_CHECK: the protocol checker on CPU copies, first
            from .interpret import check_executor

            check_executor(self, inputs, info.target)
        self.last = ck
        p = self._build_plan(ck, info, device)
        ck.loaded().ensure_smem(p.smem)
        p.launch = ck.loaded().launcher(p.grid, p.block, p.smem)
        p.dev_index = driver.device_index(device)
        return p.ready()

    def _build_plan(self, ck: CompiledKernel, info: InputInfo, device) -> Plan:
        """Launch geometry, output specs and the packed argument buffer for
        one input signature (no CUDA calls: testable on the CPU)."""
        k = ck.launch
        env = dict(info.extents)
        p = Plan()
        p.ck, p.device, p.poison = ck, device, knobs.poison_outputs()
        out_shapes = self._out_shapes(env)
        out_strides = self._out_strides(info, out_shapes)
        p.out_specs = []
        for q, (shape, o) in enumerate(zip(out_shapes, self.fusion.outputs)):
            dt, alias, strides = torch_dtype(o.dtype), self.fusion.aliases.get(q), tuple(out_strides[q])
            if strides == _strides_in_order(shape, range(len(shape))):
                p.out_specs.append((shape or ((),), dt, None, alias))
            else:
                p.out_specs.append((shape, dt, strides, alias))
        p.plain_outs = all(st is None and a is None for _, _, st, a in p.out_specs)
        ev = {name: env[name] for name in env}
        p.grid = tuple(
            _launch_dim(k.launch.get(pt), ev)
            for pt in (ParallelType.BIDx, ParallelType.BIDy, ParallelType.BIDz)
        )
        p.block = tuple(
            _launch_dim(k.launch.get(pt), ev)
            for pt in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz)
        )
        p.smem = int(evaluate(k.smem_bytes, ev)) if not isinstance(k.smem_bytes, int) else k.smem_bytes
        if p.smem > info.target.smem_per_block:
            raise CircbufError(
                f"{ck.name} needs {p.smem} bytes of shared memory; the limit per block is {info.target.smem_per_block}"
            )
        # launch unless nothing is to be written: an output with elements next to
        # an empty one (the sum of a [0, 8] tensor beside its exp) still gets them
        p.empty = _all_outputs_empty(out_shapes) or 0 in p.grid
        if max(p.grid[1:]) > info.target.max_grid_yz or p.grid[0] > _INT32_LIMIT:
            raise CircbufError(f"grid {p.grid} exceeds the launch limits")
        # a kernel compiled with __cluster_dims__(cs, 1, 1): whole clusters of CTAs
        cs = 1
        for pt in (ParallelType.CIDx, ParallelType.CIDy):
            cs *= _launch_dim(k.launch.get(pt), ev)
        if cs > 1 and (cs > info.target.max_cluster_size or p.grid[0] % cs):
            raise CircbufError(
                f"{ck.name}: grid {p.grid} is not a whole number of clusters of {cs} CTAs "
                f"(at most {info.target.max_cluster_size} per cluster)"
            )
        knobs.dump("launch", f"{ck.name}: grid {p.grid} block {p.block} smem {p.smem}")
        # argument buffer: each tensor param is {T* data; index_t size[N]; index_t stride[N]}
        ifmt = "i" if k.index_type == DataType.Int32 else "q"
        blobs, p.ptr_offsets, p.scalar_slots = [], [], []
        tensors = [t for t in info.tensors if t is not None]
        sizes_strides = [(t.sizes, t.strides) for t in tensors]
        sizes_strides += list(zip(out_shapes, out_strides))
        off = 0
        for sizes, strides in sizes_strides:
            blob = struct.pack(f"<Q{len(sizes)}{ifmt}{len(sizes)}{ifmt}", 0, *sizes, *strides)
            blob += b"\0" * (-len(blob) % 8)
            p.ptr_offsets.append(off)
            blobs.append((off, blob))
            off += len(blob)
        scal_pos = [i for i, x in enumerate(self.fusion.inputs) if isinstance(x, Var)]
        for pos in scal_pos:
            v = self.fusion.inputs[pos]
            fmt = {
                DataType.Double: "<d",
                DataType.Float: "<f",
                DataType.Int64: "<q",
                DataType.Int32: "<i",
                DataType.Bool: "<?",
            }[v.dtype]
            p.scalar_slots.append((pos, fmt, off))
            blobs.append((off, b"\0" * 8))
            off += 8
        p.tmaps, ws, p.hang, off = self._pack_tensor_maps_and_hang_record(
            ck, info, out_shapes, out_strides, blobs, off, p.empty, ev
        )
        p.name = ck.name
        p.argbuf = ctypes.create_string_buffer(max(off, 8) + (-max(off, 8) % 8))
        for o, blob in blobs:
            ctypes.memmove(ctypes.addressof(p.argbuf) + o, blob, len(blob))
        base = ctypes.addressof(p.argbuf)
        p.argptrs = (ctypes.c_void_p * max(len(blobs), 1))(*[base + o for o, _ in blobs])
        p.args_addr = ctypes.addressof(p.argptrs)
        p.ptr_slots = (ctypes.c_uint64 * (len(p.argbuf) // 8)).from_buffer(p.argbuf)
        p.ptr_offsets = [o // 8 for o in p.ptr_offsets]
        p.workspace = None if ws is None or p.empty else Workspace(ws[0], ws[1], device, ws[2], p.ptr_slots)
        p.tensor_inputs = self._tensor_inputs
        p.finish = self._finish(env)
        p.tpos = self._tpos
        p.like = self._templates(p.out_specs, device)
        return p.ready()

    @staticmethod
    def _templates(out_specs, device) -> list:
        """Per output: a one-element tensor expanded to its shape, whose
        ``torch.empty_like`` allocates a dense row-major output faster than
        ``torch.empty`` parses its arguments; None for an output written in
        place or with strides of its own (``torch.empty_strided``)."""
        import torch

        out = []
        for shape, dt, strides, alias in out_specs:
            t = None
            if strides is None and alias is None:
                shape = () if shape == ((),) else tuple(shape)
                t = torch.empty((), dtype=dt, device=device).expand(shape)
                o = torch.empty_like(t)
                if o.stride() != _strides_in_order(shape, range(len(shape))) and o.numel() > 1:
                    t = None  # torch suggested another memory format for this shape
            out.append(t)
        return out

    def _pack_tensor_maps_and_hang_record(self, ck, info, out_shapes, out_strides, blobs, off, empty, env):
        """Tensor maps, split-K's workspace and the hang record follow the scalars in the parameters."""
        k = ck.launch
        maps = []
        tpos = self._tpos
        for spec in k.tensor_maps:
            from .runtime.tensormap import check_map, map_geometry

            if spec.param >= len(tpos):  # an output, allocated contiguous by the plan
                o = spec.param - len(tpos)
                name = self.fusion.outputs[o].name
                shape = list(out_shapes[o])
                strides = list(out_strides[o])
                item = self.fusion.outputs[o].dtype.size
                if not empty:
                    _check_not_empty(name, shape)
                    dims, gstr, box = map_geometry(spec, shape, strides, item)
                    check_map(name, 256, dims, gstr, box, item)
                maps.append(MapSlot(spec, -1, off, name, output=o))
            else:
                name = self.fusion.inputs[tpos[spec.param]].name
                t = info.tensors[tpos[spec.param]]
                if not empty:
                    _check_not_empty(name, t.sizes)
                    dims, gstr, box = map_geometry(spec, t.sizes, t.strides, t.itemsize)
                    check_map(name, t.align, dims, gstr, box, t.itemsize)
                maps.append(MapSlot(spec, tpos[spec.param], off, name))
            blobs.append((off, b"\0" * 128))
            off += 128
        workspace = None
        sk = getattr(k, "split_k", None)
        if sk:
            # the plan's, per stream, allocated at its first launch there (runtime Workspace);
            # its two pointers follow the tensor maps
            floats, flags = int(evaluate(sk["partials"], env)), int(evaluate(sk["flags"], env))
            workspace = (floats, flags, [off // 8, off // 8 + 1])
            blobs += [(off, b"\0" * 8), (off + 8, b"\0" * 8)]
            off += 16
        hang = None
        if k.hang_record:
            if not empty:  # an empty plan launches nothing: no record to read
                import torch

                hang = torch.zeros(4, dtype=torch.int32, pin_memory=True)
            blobs.append((off, struct.pack("<Q", 0 if hang is None else hang.data_ptr())))
            off += 8
        return maps, workspace, hang, off


def _first_run(p: SegmentedPlan, k: int):
    """Step ``k``'s run before its plan exists: make it, then run it."""

    def run(args, finish):
        plan = p.make(k, args)
        outs = plan.run(args, finish)
        p.made(k, plan)
        return outs

    return run


def _getter(idx: list, views: dict | None = None):
    """``vals -> [vals[i] for i in idx]``, as fast as Python gets it;
    ``views[q]``: argument ``q`` is expanded to that shape."""
    if views:
        plain = _getter(idx)
        return lambda vals: tuple(x.expand(views[q]) if q in views else x for q, x in enumerate(plain(vals)))
    if not idx:  # a segment of no inputs (a full(...) reduced)
        return lambda vals: ()
    if len(idx) == 1:
        (i,) = idx
        return lambda vals: (vals[i],)
    return operator.itemgetter(*idx)


def _source(kind, k, inputs, vals, env):
    """A segment's input: a fusion input, an earlier segment's output, or a size."""
    return inputs[k] if kind == "input" else vals[k] if kind == "tensor" else env[k]


def _empty_sizes(env: dict) -> frozenset:
    """The names of the sizes that are 0 in ``env``."""
    return frozenset(k for k, v in env.items() if type(v) is int and v == 0)


def _all_outputs_empty(out_shapes) -> bool:
    """No output has elements: nothing to launch, no tensor map to check."""
    return all(0 in s for s in out_shapes)


def _check_not_empty(name, sizes) -> None:
    """A tensor map cannot describe an empty tensor; the schedulers stage no
    empty tensor by TMA when a kernel still has elements to write."""
    if 0 in sizes:
        raise CircbufError(
            f"{name} has no elements but is staged by TMA in a kernel that writes other outputs; "
            "schedule(tma=False) takes the plain kernel"
        )


def _check_target(kernel, arch: str):
    """Refuse, by name, a target without what the kernel's instructions need
    (TMA and mbarrier waits: sm_90; setmaxnreg: an arch-specific sm_90a)."""
    from .runtime.nvrtc import parse_arch

    sm, suffix = parse_arch(arch)  # the device's arch too: NVRTC may not know a newer GPU
    unmet: dict = {}  # requirement -> what needs it
    for need in target_needs(kernel):
        if not need.allows(sm, suffix):
            unmet.setdefault(str(need), []).append(need.what)
    if unmet:
        uses = "; ".join(
            f"uses {', '.join(whats)}, which {'needs' if len(whats) == 1 else 'need'} {req}"
            for req, whats in unmet.items()
        )
        raise CircbufError(
            f"arch={arch!r}: {kernel.name} {uses}; compile for sm_90a, or schedule the fusion "
            "without them (e.g. fd.fusion.schedule(tma=False))"
        )


def _dump_pass(name, kernel):
    if "passes" in knobs.dump_stages():  # the kernel IR is printed only when asked for
        knobs.dump("passes", f"after {name}:\n{kernel}")


def _launch_dim(ext, env) -> int:
    return 1 if ext is None else int(evaluate(ext, env))


def _shape_scalar_positions(fusion: Fusion) -> list[int]:
    """Positions of the scalar inputs some extent is built from: a launch
    plan holds for their values only."""
    from .ir.scalar import free_vars

    names: dict = {}
    for tv in fusion.tvs:
        for i in tv.logical + tv.domain.view_ids():
            free_vars(i.extent, names)
            if i.expanded_extent is not None:
                free_vars(i.expanded_extent, names)
    for e in fusion.derived_extents.values():
        free_vars(e, names)
    for a, b in fusion.extent_equalities:
        free_vars(a, names)
        free_vars(b, names)
    return [k for k, x in enumerate(fusion.inputs) if isinstance(x, Var) and x.name in names]


def _layout_of(sizes, strides) -> tuple:
    """(memory order, contiguity) of a tensor with these sizes and strides,
    as the kernel is specialized for: row-major when the axes of size > 1
    are in row-major stride order, else every axis by decreasing stride, a
    size-1 axis by its own stride too (ties keep the axes' order); an axis is
    contiguous when its stride is the next inner axis' stride times that
    axis' size (size-1 axes always are). (Size-1 axes went innermost once: a
    batch of one then led a K-major operand's TMA box; and outermost: then an
    M of 1 with unit stride, the contiguous axis the matmul picked, did not.)

    >>> _layout_of((2, 3, 4, 5), (60, 1, 15, 3))   # channels-last
    ((0, 2, 3, 1), (True, True, True, True))
    >>> _layout_of((1, 64, 256), (16384, 1, 64))   # a batch of one K-major B
    ((0, 2, 1), (True, True, True))
    >>> _layout_of((2, 1, 64), (8, 1, 16))         # M = 1, unit stride: the contiguous axis
    ((2, 0, 1), (False, True, True))
    >>> _layout_of((2, 1, 128), (1024, 1, 8))      # the same, batch axes in row-major order
    ((0, 2, 1), (True, True, False))
    """
    n = len(sizes)
    big = [d for d in range(n) if sizes[d] > 1]
    by_stride = sorted(big, key=lambda d: -strides[d])
    # a size-1 axis of unit stride under an innermost axis that is not: that axis
    # is the contiguous one a tensor map steps through (an M of 1 laid out M-major)
    unit_one = big and strides[big[-1]] != 1 and any(sizes[d] == 1 and strides[d] == 1 for d in range(n))
    if by_stride == big and not unit_one:
        order = tuple(range(n))
    else:
        order = tuple(sorted(range(n), key=lambda d: -strides[d]))  # (stable: ties in axis order)
    contig = [True] * n
    expect = 1
    for d in reversed(order):
        if sizes[d] > 1:
            contig[d] = strides[d] == expect
        expect = strides[d] * sizes[d] if sizes[d] > 1 else expect * max(sizes[d], 1)
    return order, tuple(contig)


def _strides_in_order(shape, order) -> tuple:
    """Dense strides of ``shape`` laid out in ``order`` (outermost first)."""
    out = [0] * len(shape)
    s = 1
    for d in reversed(order):
        out[d] = s
        s *= max(shape[d], 1)
    return tuple(out)


def _check_contiguity(label, d: TensorView, x) -> None:
    """The tensor's strides keep the definition's promises
    (:meth:`TensorDomain.broken_contiguity`)."""
    broken = d.domain.broken_contiguity(tuple(x.shape), x.stride())
    if broken is not None:
        a, stride, expect, pos = broken
        where = f" (contiguity[{pos}], in stride order)" if d.domain.stride_order is not None else ""
        raise CircbufError(
            f"{label}: axis {a} is defined contiguous but its stride is {stride}, not {expect}{where}"
        )


def _default_arch() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            from .runtime.driver import device_arch

            return device_arch()
    except Exception:  # noqa: BLE001 - no usable GPU: build for Hopper
        pass
    return DEFAULT.arch


def _default_target() -> Target:
    """The current GPU's target; DEFAULT (an H100) with none."""
    try:
        import torch

        if torch.cuda.is_available():
            return Target.from_device()
    except Exception:  # noqa: BLE001 - no usable GPU: build for Hopper
        pass
    return DEFAULT


__all__ = ["FusionExecutor"]


def _check_manual_staging(e) -> None:
    """Rules of shared-memory staging the lowering relies on and that only a
    hand schedule can break (the schedulers keep them): a TMA-filled buffer
    rotates through a ring (``circular_buffer``), whose mbarriers its copies
    complete on; an MMA reads operands that TMA or cp.async copies wrote (the
    wgmmas read shared memory through the async proxy, and no fence or barrier
    is placed after the threads' own stores into a buffer they read)."""
    if isinstance(e, LoadStoreOp) and e.kind == "tma" and e.out.memory_type == MemoryType.Shared:
        if not e.out.circular:
            raise CircbufError(
                f"{e.out.name}: a buffer filled by TMA needs a ring for its copies to complete on: "
                f"call {e.out.name}.circular_buffer(stages, ...) (at least 2 stages)"
            )
    if getattr(e, "op_name", None) == "mma":
        for x in e.tv_inputs():
            d = x.definition
            if x.memory_type == MemoryType.Shared and not (
                isinstance(d, LoadStoreOp) and d.kind in ("tma", "cp.async")
            ):
                raise CircbufError(
                    f"{e.out.name} = mma(...): its operand {x.name} is written to shared memory by the threads' "
                    "own stores, which the wgmmas (the async proxy) may not see: stage it with "
                    "cache_after(op='tma') through a WarpSpecialized ring (circbuf.scheduler.mma_form does)"
                )
