"""What the runtime launches: a compiled kernel and launch plans for it.

A :class:`Plan` is a ready launch for one exact input signature: grid,
block, shared memory, output specs and the packed argument buffer (tensor
maps re-encoded only when a tensor's address changes). A hit on the plan
cache (:mod:`circbuf.compiler`) costs output allocation and one
``cuLaunchKernel``. The runtime inspects no fusion IR: the compile driver
builds plans from it.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

from .. import knobs
from ..ir import CircbufError, DataType


def torch_dtype(dt: DataType):
    import torch

    return {
        DataType.Float: torch.float32,
        DataType.Double: torch.float64,
        DataType.Half: torch.float16,
        DataType.BFloat16: torch.bfloat16,
        DataType.Int32: torch.int32,
        DataType.Int64: torch.int64,
        DataType.Bool: torch.bool,
    }[dt]


@dataclass
class LaunchInfo:
    """What a launch plan needs of a lowered kernel, kept in the disk cache
    beside its cubin: launch extents (ParallelType -> Scalar of the fusion's
    extents, or None), dynamic shared memory (int or Scalar), the index type,
    the tensor maps to encode, whether it takes a hang record and the names of
    its mbarrier arrays (hang diagnostics)."""

    launch: dict
    smem_bytes: object
    index_type: DataType
    tensor_maps: list
    hang_record: bool
    barrier_names: list
    split_k: dict | None = None  # split-K's workspace: floats and flags (Scalars of the extents)

    @classmethod
    def of(cls, kernel) -> LaunchInfo:
        return cls(
            dict(kernel.launch),
            kernel.smem_bytes,
            kernel.index_type,
            list(kernel.tensor_maps),
            kernel.hang_record,
            list(kernel.barrier_names),
            dict(kernel.split_k) if kernel.split_k else None,
        )


class CompiledKernel:
    """Every stage of one compile: ``fusion_ir``, ``transforms``, ``params``,
    ``kernel_ir``, ``cuda`` (source) and ``cubin`` (bytes) for ``arch``;
    ``launch`` (:class:`LaunchInfo`) is what launching it needs.

    A kernel loaded from the disk cache (a warm start) carries no kernel IR
    or transforms: ``kernel`` and ``transforms`` schedule and lower the
    fusion again (``rebuild``) the first time they are read."""

    def __init__(
        self, name, arch, params, fusion_ir, transforms, kernel, cuda, cubin, launch=None, rebuild=None
    ):
        self.name, self.arch, self.params, self.fusion_ir = name, arch, params, fusion_ir
        self._transforms, self._kernel = transforms, kernel
        self.cuda, self.cubin = cuda, cubin
        self.launch = launch if launch is not None else LaunchInfo.of(kernel)
        self._rebuild = rebuild
        self._loaded = None
        # the compile driver's in-memory key (params, layouts, reshape groups, ...): kernels
        # of other input sizes with the same key are this one
        self.memo_key = None

    def _rebuilt(self):
        if self._kernel is None:
            ck = self._rebuild()
            self._kernel, self._transforms = ck.kernel, ck.transforms
        return self

    @property
    def kernel(self):
        return self._rebuilt()._kernel

    @property
    def transforms(self) -> str:
        return self._rebuilt()._transforms

    def __repr__(self):
        return f"CompiledKernel({self.name!r}, {self.arch!r}, {self.params!r})"

    @property
    def kernel_ir(self) -> str:
        return str(self.kernel)

    def loaded(self):
        if self._loaded is None:
            from .driver import LoadedKernel

            self._loaded = LoadedKernel(self.cubin, self.name)
        return self._loaded

    def sass(self) -> str:
        """Disassembly through ``cuobjdump -sass`` (PyPI nvidia-cuda-cuobjdump)."""
        from .tools import cuobjdump

        return cuobjdump(self.cubin, "-sass")

    def compile_log(self) -> str:
        """NVRTC's log for this kernel, compiled afresh with ``ptxas -v``
        (warnings such as C7511, wgmma serialized; registers, spills)."""
        from .nvrtc import compile_log

        return compile_log(self.cuda, self.arch, self.name + ".cu")

    def resource_usage(self) -> dict:
        """REG, STACK, SHARED, LOCAL of the kernel from ``cuobjdump -res-usage``."""
        from .tools import resource_usage

        return resource_usage(self.cubin)

    @property
    def kernels(self) -> list:
        """The fusion's kernels: this one (a segmented fusion has several)."""
        return [self]

    def __str__(self):
        return f"1 kernel: {self.name} for {self.arch} ({_brief(self.params)})"


class CompiledFusion:
    """A segmented fusion's kernels, in launch order: ``kernels[i]`` is a
    :class:`CompiledKernel` (``.cuda``, ``.cubin``, ``.params``, ``.sass()``);
    ``segments`` says which exprs each runs. ``print(ck)`` shows both."""

    def __init__(self, segments, kernels: list[CompiledKernel]):
        self.segments = segments
        self.kernels = kernels

    @property
    def params(self) -> list:
        return [k.params for k in self.kernels]

    def __getattr__(self, name):
        if name in ("cuda", "cubin", "kernel", "kernel_ir", "fusion_ir", "transforms", "name", "arch"):
            raise AttributeError(
                f"this fusion runs as {len(self.kernels)} kernels (segments): "
                f"use ck.kernels[i].{name}; print(ck) lists them"
            )
        raise AttributeError(name)

    def __str__(self):
        lines = [f"{len(self.kernels)} kernels (the fusion is segmented):"]
        for k, (seg, ck) in enumerate(zip(self.segments.segments, self.kernels)):
            if isinstance(ck, CompiledFusion):  # a segment that runs as kernels of its own (split-K)
                lines.append(f"  kernel {k}: " + str(ck).replace("\n", "\n  "))
            else:
                lines.append(f"  kernel {k}: {ck.name} ({_brief(ck.params)})")
            lines += [f"    {m}" for m in seg.math]
        return "\n".join(lines)


def _brief(params) -> str:
    brief = getattr(params, "brief", None)
    return brief() if callable(brief) else "manual schedule" if params is None else str(params)


class SegmentedPlan:
    """A segmented fusion's launch for one exact input signature: each
    segment's plan in order on torch's current stream.

    Values live in one list per call: the fusion's inputs, then constants
    (sizes a segment takes as scalars), then a slot per tensor between or
    out of segments. ``steps[i]`` = [``run(args, finish)`` of its plan (until
    the first call, one that makes the plan with ``make(i, args)`` and
    puts the plan's ``run`` here), a getter of its arguments from that list,
    the slots of its outputs, the slots dead after it (dropped, so torch's
    caching allocator hands their memory to the next allocation)].
    ``outs``: the slots of the fusion's outputs."""

    __slots__ = ("steps", "consts", "outs", "finish", "make", "made", "scalar_slots")

    def run(self, inputs):
        vals = [*inputs, *self.consts]
        for run, args_of, out_slots, dead in self.steps:
            for slot, o in zip(out_slots, run(args_of(vals), False)):
                vals[slot] = o
            for slot in dead:
                vals[slot] = None
        outs = [vals[s] for s in self.outs]
        return outs if self.finish is None else self.finish(inputs, outs)


class Plan:
    """A launch for one exact input signature.

    ``run(inputs, finish=True)`` launches (see :meth:`run_generic`): straight-line
    code generated for this plan by :meth:`ready` (each output's allocation,
    each pointer's slot in the argument buffer, the launch), since a cached
    ``execute`` is host-bound for small tensors."""

    __slots__ = (
        "ck", "grid", "block", "smem", "out_specs", "argbuf", "argptrs", "args_addr", "ptr_offsets",
        "ptr_slots", "scalar_slots", "tensor_inputs", "empty", "device", "dev_index", "poison", "launch",
        "tmaps", "hang", "name", "finish", "plain_outs", "tpos", "like", "run", "workspace",
    )  # fmt: skip

    def run_generic(self, inputs, finish: bool = True):
        """Launch; returns what ``execute`` returns, or with ``finish=False``
        the tensors the kernel wrote, one per output (a segment's, for the
        next segment to read). What the generated ``run`` does, step by step."""
        import torch

        outs = self.new_outputs(inputs)
        if not self.empty:
            self.write_args(inputs, outs)
            stream = torch._C._cuda_getCurrentRawStream(self.dev_index)
            if self.workspace is not None and stream != self.workspace.stream:
                self.workspace.use(stream)
            self.launch(stream, self.args_addr)
            if self.hang is not None:
                check_hang(self, self.hang)
        if self.finish is not None and finish:
            return self.finish(inputs, outs)
        return outs

    def ready(self):
        """Make ``run``: this plan's launch as straight-line Python (no loops
        over specs, no attribute lookups on the plan), the generic one where
        the plan lacks what it needs (``tpos``: a plan not built by the
        compile driver)."""
        if getattr(self, "tpos", None) is None or (not self.empty and getattr(self, "launch", None) is None):
            self.run = self.run_generic
            return self
        self.run = _generate_run(self)
        return self

    def new_outputs(self, inputs):
        """The tensors the kernel writes: new ones (poisoned on request), or
        the input an output is written into in place."""
        import torch

        dev = self.device
        if self.plain_outs:  # the common case, kept to one comprehension
            outs = [torch.empty(*shape, dtype=dt, device=dev) for shape, dt, _, _ in self.out_specs]
            if self.poison:
                for o in outs:
                    o.fill_(float("nan") if o.is_floating_point() else -1)
            return outs
        outs = []
        for shape, dt, strides, alias in self.out_specs:
            if alias is not None:
                outs.append(inputs[alias])
            elif strides is None:  # sizes unpacked (torch.empty(4, 8)) parse faster than a tuple
                outs.append(torch.empty(*shape, dtype=dt, device=dev))
            else:
                outs.append(torch.empty_strided(shape, strides, dtype=dt, device=dev))
        if self.poison:
            for o, spec in zip(outs, self.out_specs):
                if spec[3] is None:
                    o.fill_(float("nan") if o.is_floating_point() else -1)
        return outs

    def write_args(self, inputs, outs):
        """Put this call's data pointers and scalars into the argument buffer."""
        slots = self.ptr_slots
        k = 0
        for x in self.tensor_inputs(inputs):
            slots[self.ptr_offsets[k]] = x.data_ptr()
            k += 1
        for o in outs:
            slots[self.ptr_offsets[k]] = o.data_ptr()
            k += 1
        for pos, fmt, off in self.scalar_slots:
            struct.pack_into(fmt, self.argbuf, off, inputs[pos])
        for m in self.tmaps:  # re-encoded only when the tensor's address changes
            t = outs[m.output] if m.output >= 0 else inputs[m.input_pos]
            ptr = t.data_ptr()
            if ptr != m.ptr:
                from .tensormap import encode

                ctypes.memmove(ctypes.addressof(self.argbuf) + m.offset, encode(m.spec, t, m.name), 128)
                m.ptr = ptr


def _generate_run(p: Plan):
    """``run(inputs, finish=True)`` for plan ``p``, written out: e.g. for a
    pointwise kernel of one input and one output

    .. code-block:: python

        def run(inputs, finish=True):
            x0 = inputs[0]
            o0 = empty_like(like0)  # like0: one element expanded to the output's shape
            slots[0] = x0.data_ptr()
            slots[3] = o0.data_ptr()
            launch(stream(0), 140234)
            return [o0]
    """
    import torch

    g = {
        "plan": p,
        "empty": torch.empty,
        "empty_strided": torch.empty_strided,
        "empty_like": torch.empty_like,
        "slots": getattr(p, "ptr_slots", None),
        "launch": getattr(p, "launch", None),
        "stream": getattr(torch._C, "_cuda_getCurrentRawStream", None),
        "dev": p.device,
        "finish_fn": p.finish,
        "check_hang": check_hang,
        "pack_into": struct.pack_into,
        "argbuf": getattr(p, "argbuf", None),
        "retarget": _retarget,
    }
    body = []
    for k in p.tpos:
        body.append(f"x{k} = inputs[{k}]")
    outs = []
    for q, (shape, dt, strides, alias) in enumerate(p.out_specs):
        g[f"dt{q}"] = dt
        like = p.like[q] if p.like else None
        if alias is not None:
            body.append(f"o{q} = inputs[{alias}]")
        elif like is not None:
            g[f"like{q}"] = like
            body.append(f"o{q} = empty_like(like{q})")
        elif strides is None:
            body.append(
                f"o{q} = empty({', '.join(map(str, shape)) if shape != ((),) else '()'}, dtype=dt{q}, device=dev)"
            )
        else:
            body.append(
                f"o{q} = empty_strided({tuple(shape)!r}, {tuple(strides)!r}, dtype=dt{q}, device=dev)"
            )
        if p.poison and alias is None:
            body.append(f"o{q}.fill_(float('nan') if o{q}.is_floating_point() else -1)")
        outs.append(f"o{q}")
    if not p.empty:
        names = [f"x{k}" for k in p.tpos] + outs
        ptr_of = {}
        for name, off in zip(names, p.ptr_offsets):
            body.append(f"{name}p = {name}.data_ptr()")
            body.append(f"slots[{off}] = {name}p")
            ptr_of[name] = f"{name}p"
        for pos, fmt, off in p.scalar_slots:
            body.append(f"pack_into({fmt!r}, argbuf, {off}, inputs[{pos}])")
        for j, m in enumerate(p.tmaps):  # re-encoded only when the tensor's address changes
            g[f"m{j}"] = m
            t = f"o{m.output}" if m.output >= 0 else f"x{m.input_pos}"
            body.append(f"if {ptr_of[t]} != m{j}.ptr:")
            body.append(f"    retarget(argbuf, m{j}, {t}, {ptr_of[t]})")
        if getattr(p, "workspace", None) is not None:  # split-K's partials and flags: the stream's own
            g["ws"] = p.workspace
            body.append(f"s = stream({p.dev_index})")
            body.append("if s != ws.stream:")
            body.append("    ws.use(s)")
            body.append(f"launch(s, {p.args_addr})")
        else:
            body.append(f"launch(stream({p.dev_index}), {p.args_addr})")
        if p.hang is not None:
            body.append("check_hang(plan, plan.hang)")
    ret = f"[{', '.join(outs)}]"
    if p.finish is not None:
        body.append(f"return finish_fn(inputs, {ret}) if finish else {ret}")
    else:
        body.append(f"return {ret}")
    src = "def run(inputs, finish=True):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(src, f"<circbuf plan {p.name}>", "exec"), g)  # noqa: S102 - code from the plan's own numbers
    run = g["run"]
    run.source = src
    return run


def _retarget(argbuf, m, t, ptr):
    """Encode tensor map ``m`` for tensor ``t`` (at ``ptr``) into the argument buffer."""
    from .tensormap import encode

    ctypes.memmove(ctypes.addressof(argbuf) + m.offset, encode(m.spec, t, m.name), 128)
    m.ptr = ptr


class Workspace:
    """Split-K's workspace of one launch plan (lowering/split_k.py): fp32
    partials and int32 flags, one pair per CUDA stream the plan runs on (the
    flags count a launch's CTAs: two launches at once on one pair would mix
    their counts), allocated on the stream's first launch; the flags start
    at zero and each launch's last CTA of a tile puts its flag back.
    ``use(stream)`` writes the stream's pointers into the argument slots."""

    def __init__(self, floats: int, flags: int, device, slots, ptr_slots):
        self.floats, self.flags, self.device = max(floats, 1), max(flags, 1), device
        self.slots, self.ptr_slots = slots, ptr_slots
        self.by_stream: dict = {}
        self.stream = None

    def use(self, stream):
        import torch

        pair = self.by_stream.get(stream)
        if pair is None:
            pair = self.by_stream[stream] = (
                torch.empty(self.floats, dtype=torch.float32, device=self.device),
                torch.zeros(self.flags, dtype=torch.int32, device=self.device),
            )
        for slot, t in zip(self.slots, pair):
            self.ptr_slots[slot] = t.data_ptr()
        self.stream = stream


@dataclass
class MapSlot:
    spec: object
    input_pos: int
    offset: int
    name: str
    ptr: int = -1
    output: int = -1  # >= 0: the map describes this output (a TMA store)


def check_hang(plan, record):
    """CIRCBUF_DEBUG_HANG: wait for the kernel; a trapped barrier wait becomes a CircbufError.
    Not while the stream captures a CUDA graph (nothing runs then, and a
    synchronize would end the capture)."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        rec = record.tolist()  # host-mapped: readable after the context failed
        if rec[0]:
            names = plan.ck.launch.barrier_names
            bar = names[rec[1]] if 0 <= rec[1] < len(names) else f"#{rec[1]}"
            raise CircbufError(
                f"{plan.name}: mbarrier wait on {bar}[{rec[2]}] (parity {rec[3]}) gave up after "
                f"CIRCBUF_DEBUG_HANG={knobs.debug_hang()} tries: the pipeline protocol is stuck "
                "(a missing arrive, or bytes expected that never land). The CUDA context is unusable now."
            ) from e
        raise


__all__ = [
    "CompiledFusion", "CompiledKernel", "LaunchInfo", "MapSlot", "Plan", "SegmentedPlan", "Workspace", "check_hang",
    "torch_dtype",
]  # fmt: skip
