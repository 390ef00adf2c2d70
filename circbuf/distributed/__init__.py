"""Tensor-parallel ``linear`` layers whose GEMM ships its output tiles to the
peer GPUs while the tensor cores go on (issue 22).

- :func:`linear_all_gather`: column-parallel ``linear``: rank ``r`` holds
  ``w_r = w[r*N/world:(r+1)*N/world]`` and computes ``x @ w_r.T``; every
  rank gets the full ``[M, N]`` (``all_gather`` of the shards along N).
- :func:`linear_reduce_scatter`: row-parallel ``linear``: rank ``r`` holds
  ``x_r`` ``[M, K/world]`` and ``w_r`` ``[N, K/world]``; rank ``d`` gets rows
  ``[d*M/world, (d+1)*M/world)`` of ``sum_r x_r @ w_r.T``, summed in rank
  order in fp32 (deterministic).

The GEMM is circbuf's matmul kernel with its output marked
``peer_store`` (:mod:`circbuf.ir.peer`): each staged sub-tile goes by TMA
into every peer's buffer (torch's symmetric memory maps them here), and a
per-tile flag in the peers' symmetric memory is released once the tile's
writes are complete (:mod:`circbuf.lowering.peer_stores`). The consumer
side is a small kernel that waits on this rank's flags (acquire) with a
timeout: a tile that never arrives raises :class:`DistributedTimeout`
naming the tile and the rank, it does not hang the job. The reduce-scatter
then sums the ``world`` partials of its row block (a circbuf pointwise fusion).

:func:`loopback` runs the same kernels with every rank on one device (the
"peers" are extra buffers there, the flags ordinary memory), on a GPU or,
under ``CIRCBUF_INTERPRET=1``, in the CPU kernel interpreter, whose protocol
checker knows the flags.

Buffers: two symmetric output (or staging) buffers per layer shape,
used alternately, so a call needs no barrier: the flags order the ranks.
The tensor a call returns is a view of its buffer, valid until the call
after next on the same group and shape (copy it to keep it longer).
"""

from __future__ import annotations

import ctypes
import os
import struct

import torch

from .. import knobs
from ..ir import CircbufError, Const, DataType, ParallelType, evaluate
from ..ir.peer import PeerStore

__all__ = ["linear_all_gather", "linear_reduce_scatter", "loopback", "DistributedTimeout"]


def timeout_s() -> float:
    """``CIRCBUF_DIST_TIMEOUT``: seconds a rank waits for a peer's tile (default 20)."""
    raw = os.environ.get("CIRCBUF_DIST_TIMEOUT", "20")
    try:
        return float(raw)
    except ValueError:
        raise CircbufError(f"CIRCBUF_DIST_TIMEOUT={raw!r}: expected a number of seconds") from None


class DistributedTimeout(CircbufError):
    """A tile's flag did not reach its value within the timeout (a peer that
    never ran its part, or a protocol bug): named, never a hang."""


_DT = {torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half}


def _check(x, w, world, kind, where="cuda"):
    """Validate ``x`` [M, K] and ``w`` [Nr, K] of one rank (and ``world``
    unless None); raise a CircbufError naming the problem."""
    op = f"linear_{kind}"
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise CircbufError(f"{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dtype not in _DT:
            raise CircbufError(f"{op}: {name} is {t.dtype}; bfloat16 and float16 are supported")
        if t.dim() != 2:
            raise CircbufError(f"{op}: {name} must be 2-D, it has shape {tuple(t.shape)}")
        if where == "cuda" and t.device.type != "cuda":
            raise CircbufError(f"{op}: {name} is on {t.device}; the collective runs on CUDA tensors")
        if not t.is_contiguous():
            raise CircbufError(f"{op}: {name} must be contiguous (TMA reads its rows)")
    if x.dtype != w.dtype:
        raise CircbufError(f"{op}: x is {x.dtype} and w is {w.dtype}; they must match")
    if x.device != w.device:
        raise CircbufError(f"{op}: x is on {x.device} and w on {w.device}")
    if x.shape[1] != w.shape[1]:
        raise CircbufError(f"{op}: x is [M, K] = {list(x.shape)} and w [N, K] = {list(w.shape)}: K differs")
    if world is not None and world < 2:
        raise CircbufError(
            f"{op}: a group of {world} rank has nothing to exchange; call torch.nn.functional.linear"
        )
    m, k = x.shape
    n = w.shape[0]
    if 0 in (m, n, k):
        raise CircbufError(f"{op}: empty operand (M, N, K) = ({m}, {n}, {k})")
    if k % 8:
        raise CircbufError(f"{op}: K = {k} must be a multiple of 8 (16-byte rows for TMA)")
    if n % 8:
        raise CircbufError(f"{op}: N = {n} (this rank's) must be a multiple of 8 (16-byte rows for TMA)")
    if kind == "reduce_scatter" and world is not None and m % world:
        raise CircbufError(
            f"{op}: M = {m} is not divisible by the group's {world} ranks (each gets M / world rows)"
        )


def _linear_fd(dtype, kind, world):
    import circbuf as cb

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=_DT[dtype])
        w = fd.define_tensor([-1, -1], dtype=_DT[dtype])
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    y.peer_store = PeerStore(kind, world)
    fd.fusion.schedule(persistent=True, pingpong=False)
    return fd


class _Gemm:
    """The peer-storing GEMM for one (kind, world, dtype, shape, target)."""

    def __init__(self, kind, world, x, w, target=None, interpret=False):
        from ..target import DEFAULT, resolve

        self.kind, self.world, self.interpret = kind, world, interpret
        fd = _linear_fd(x.dtype, kind, world)
        ex = fd._get_executor()
        ex.may_split_k = False  # one kernel: its tiles are what the peers wait for
        xs, ws = x, w
        t = resolve(target) if target is not None else (DEFAULT if interpret else None)
        self.ck = ex.compile([xs, ws], arch="sm_90a" if interpret else None, target=t)
        tt = t if t is not None else _device_target()
        info, _ = ex._bind([xs, ws], need_cuda=False, target=tt)
        k = self.kernel = self.ck.kernel
        env = dict(info.extents)
        dims = lambda ps: tuple(int(evaluate(k.launch.get(p, Const(1)), env)) for p in ps)  # noqa: E731
        self.grid = dims((ParallelType.BIDx, ParallelType.BIDy, ParallelType.BIDz))
        self.block = dims((ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz))
        self.smem = k.smem_bytes if isinstance(k.smem_bytes, int) else int(evaluate(k.smem_bytes, env))
        peer = k.peer
        if peer is None:
            raise CircbufError(f"linear_{kind}: the matmul kernel did not take the peer stores")
        self.tiles = int(evaluate(peer["tiles"], env))
        self.stores_per_tile = peer["stores_per_tile"]
        self.nflags = world * self.tiles
        self.m, self.n = x.shape[0], w.shape[0]
        self._loaded = None

    # ------------------------------------------------------------ tensors
    def tensors(self, x, w, rank, bufs, flags):
        """The kernel's tensor arguments: x, w, the (unwritten) output, the
        ``world`` peer views, the ``world`` flag arrays."""
        m, n = self.m, self.n
        out = torch.empty((1, 1), dtype=x.dtype, device=x.device).expand(m, n)
        if self.kind == "all_gather":
            peers = [b[:, rank * n : (rank + 1) * n] for b in bufs]
        else:
            peers = [b[rank] for b in bufs]  # [M/world, N]: slot ``rank`` of each peer's staging
        return [x, w, out, *peers, *flags]

    def run(self, x, w, rank, bufs, flags, stream=None, check=0):
        ts = self.tensors(x, w, rank, bufs, flags)
        if self.interpret:
            from ..interpret import check_kernel, run_kernel

            if check:
                cp = [t.clone() if i > 2 else t for i, t in enumerate(ts)]
                check_kernel(self.kernel, cp, [rank], self.grid, self.block, schedules=check)
            run_kernel(self.kernel, ts, [rank], self.grid, self.block)
            return
        _launch(self, ts, [rank], self.grid, self.block, self.smem, stream)


def _device_target():
    from ..target import Target

    return Target.from_device()


# ---------------------------------------------------------------- launching
def _pack(kernel, tensors, scalars):
    """The argument buffer of ``kernel``: each tensor ``{T* data; index_t
    size[N]; index_t stride[N]}``, the scalars, the tensor maps."""
    from ..runtime.tensormap import encode

    ifmt = "i" if kernel.index_type == DataType.Int32 else "q"
    blobs = []
    for t in tensors:
        nd = t.dim()
        blob = struct.pack(f"<Q{nd}{ifmt}{nd}{ifmt}", t.data_ptr(), *t.shape, *t.stride())
        blobs.append(blob + b"\0" * (-len(blob) % 8))
    for v, x in zip(kernel.scalar_params, scalars):
        fmt = {DataType.Int32: "<i", DataType.Int64: "<q", DataType.Float: "<f", DataType.Double: "<d"}[
            v.dtype
        ]
        blobs.append(struct.pack(fmt, x) + b"\0" * 4 * (fmt in ("<i", "<f")))
    for spec in kernel.tensor_maps:
        t = tensors[spec.param]
        blobs.append(encode(spec, t, kernel.tensor_params[spec.param].tv.name))
    if kernel.hang_record:  # CIRCBUF_DEBUG_HANG: a record the trapped wait writes (not read here)
        rec = torch.zeros(8, dtype=torch.int32, device=tensors[0].device)
        blobs.append(struct.pack("<Q", rec.data_ptr()))
        tensors = [*tensors, rec]
    offs, off = [], 0
    for b in blobs:
        off += -off % 64
        offs.append(off)
        off += len(b)
    buf = ctypes.create_string_buffer(max(off, 8))
    for o, b in zip(offs, blobs):
        ctypes.memmove(ctypes.addressof(buf) + o, b, len(b))
    ptrs = (ctypes.c_void_p * len(blobs))(*[ctypes.addressof(buf) + o for o in offs])
    return buf, ptrs, tensors


def _launch(owner, tensors, scalars, grid, block, smem, stream=None):
    from ..runtime.driver import LoadedKernel

    k = owner.kernel
    key = (tensors[0].device.index, tuple(grid), tuple(block), smem)
    if owner._loaded is None or owner._loaded[0] != key:
        lk = LoadedKernel(getattr(owner, "cubin", None) or owner.ck.cubin, k.name)
        lk.ensure_smem(smem)
        owner._loaded = (key, lk, lk.launcher(grid, block, smem))
    # the packed arguments (tensor maps encoded) per set of addresses: a layer
    # alternates two buffers, so its calls hit this after the first two
    akey = (tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride())) for t in tensors), tuple(scalars))
    cache = owner.__dict__.setdefault("_args", {})
    got = cache.get(akey)
    if got is None:
        if len(cache) >= 8:
            cache.clear()
        got = cache[akey] = _pack(k, tensors, scalars)  # (buffer, pointers, tensors kept alive)
    s = stream if stream is not None else torch.cuda.current_stream(tensors[0].device).cuda_stream
    owner._loaded[2](s, ctypes.addressof(got[1]))


class _Waiter:
    """The consumer side: wait for every flag of one rank (:func:`flag_wait_kernel`)."""

    def __init__(self, world, interpret=False):
        from ..lowering import codegen
        from ..lowering.peer_stores import flag_wait_kernel

        self.timeout = timeout_s()
        self.kernel = flag_wait_kernel(world, int(self.timeout * 1e9))
        self.interpret = interpret
        self.cuda = codegen(self.kernel)
        if not interpret:
            from ..runtime.nvrtc import compile_cuda

            self.cubin = compile_cuda(self.cuda, _device_target().arch)
        self._loaded = None

    def run(self, flags, err, target, stream=None, check=0):
        n = flags.numel()
        grid = ((n + 127) // 128, 1, 1)
        if self.interpret:
            from ..interpret import check_kernel, run_kernel

            try:
                if check:
                    check_kernel(
                        self.kernel, [flags, err.clone()], [target], grid, (128, 1, 1), schedules=check
                    )
                run_kernel(self.kernel, [flags, err], [target], grid, (128, 1, 1))
            except CircbufError as e:
                if "waits on flag" in str(e):
                    raise DistributedTimeout(str(e)) from None
                raise
            return
        _launch(self, [flags, err], [target], grid, (128, 1, 1), 0, stream)


def _timeout_error(err, rank, tiles, kind, world, target, stores, timeout):
    code, idx, val, tgt = (int(v) for v in err.tolist())
    if not code:
        return None
    src, tile = divmod(idx, tiles)
    return DistributedTimeout(
        f"linear_{kind}: rank {rank} waited {timeout:g} s (CIRCBUF_DIST_TIMEOUT) for tile {tile} of rank "
        f"{src} of {world}: its flag holds {val}, the call needs {tgt} ({stores} stores per tile per call); "
        "that rank did not run its part of this call, or its kernel failed"
    )


def _reduce_fd(dtype, world):
    """The owner's sum of the ``world`` partials of its row block: slot 0 +
    slot 1 + ... in fp32, in that order (deterministic), one rounding. A
    pointwise fusion of the slots (views of the staging buffer): it streams
    them once at the memory's bandwidth."""
    import circbuf as cb

    with cb.FusionDefinition() as fd:
        slots = [fd.define_tensor([-1, -1], dtype=_DT[dtype]) for _ in range(world)]
        acc = fd.ops.cast(slots[0], cb.DataType.Float)
        for t in slots[1:]:
            acc = fd.ops.add(acc, fd.ops.cast(t, cb.DataType.Float))
        fd.add_output(fd.ops.cast(acc, _DT[dtype]))
    return fd


# ---------------------------------------------------------------- loopback
def loopback(kind, xs, ws, target=None, check=None, poison=True, mutate=None):
    """Every rank on one device: ``xs[r]``, ``ws[r]`` are rank ``r``'s
    operands; the peers' buffers and flags are ordinary tensors there.
    Runs the ranks' GEMMs one after the other, then each rank's flag wait
    (and for a reduce-scatter its sum). On CPU tensors (or with
    ``CIRCBUF_INTERPRET=1``) the kernels run in the interpreter, ``check``
    schedules of the protocol checker first (default ``CIRCBUF_CHECK``).
    ``mutate(kernel)``: applied to a copy of the GEMM's kernel IR before it
    runs (the protocol tests inject bugs so). Returns each rank's result."""
    if kind not in ("all_gather", "reduce_scatter"):
        raise CircbufError(f"loopback: kind {kind!r} is not 'all_gather' or 'reduce_scatter'")
    world = len(xs)
    if len(ws) != world:
        raise CircbufError(f"loopback: {len(xs)} x shards but {len(ws)} w shards")
    dev = xs[0].device
    interpret = dev.type == "cpu" or knobs.interpret()
    for x, w in zip(xs, ws):
        _check(x, w, world, kind, where=None)
    if any(x.shape != xs[0].shape for x in xs) or any(w.shape != ws[0].shape for w in ws):
        raise CircbufError("loopback: every rank's shards must have one shape")
    g = _Gemm(kind, world, xs[0], ws[0], target=target, interpret=interpret)
    if mutate is not None:
        import copy

        g.kernel = copy.deepcopy(g.kernel)
        mutate(g.kernel)
        if not interpret:
            from ..lowering import codegen
            from ..runtime.nvrtc import compile_cuda

            g.cubin = compile_cuda(codegen(g.kernel), _device_target().arch)
    if check is None:
        check = knobs.check_schedules() if interpret else 0
    m, n = g.m, g.n
    dt = xs[0].dtype
    shape = (m, n * world) if kind == "all_gather" else (world, m // world, n)
    bufs = [torch.empty(shape, dtype=dt, device=dev) for _ in range(world)]
    if poison:
        for b in bufs:
            b.fill_(float("nan"))
    flags = [torch.zeros(g.nflags, dtype=torch.int32, device=dev) for _ in range(world)]
    for r in range(world):
        g.run(xs[r], ws[r], r, bufs, flags, check=check)
    waiter = _Waiter(world, interpret=interpret)
    errs = [torch.zeros(4, dtype=torch.int32, device=dev) for _ in range(world)]
    for r in range(world):
        waiter.run(flags[r], errs[r], g.stores_per_tile, check=check)
    if not interpret:
        torch.cuda.synchronize(dev)
    for r in range(world):
        e = _timeout_error(
            errs[r].cpu(), r, g.tiles, kind, world, g.stores_per_tile, g.stores_per_tile, waiter.timeout
        )
        if e is not None:
            raise e
    if kind == "all_gather":
        return bufs
    fd = _reduce_fd(dt, world)
    if interpret:
        from ..interpret import interpret as run

        return [run(fd, list(b.unbind(0)))[0] for b in bufs]
    return [fd.execute(list(b.unbind(0)))[0] for b in bufs]


# ---------------------------------------------------------------- multi-GPU
class _Layer:
    """Symmetric buffers, flags and kernels of one (kind, group, shapes)."""

    def __init__(self, kind, x, w, group):
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.kind = kind
        self.world = world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.group = group
        dev = x.device
        self.gemm = _Gemm(kind, world, x, w)
        m, n = self.gemm.m, self.gemm.n
        shape = (m, n * world) if kind == "all_gather" else (world, m // world, n)
        gname = group.group_name if group is not None else dist.group.WORLD.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before torch 2.9, a no-op after
            symm_mem.enable_symm_mem_for_group(gname)
        self.bufs, self.handles = [], []
        for _ in range(2):  # alternate buffers: no barrier between calls (see the module doc)
            b = symm_mem.empty(shape, dtype=x.dtype, device=dev)
            b.fill_(float("nan"))  # an element no peer stores shows
            h = symm_mem.rendezvous(b, gname)
            self.handles.append(h)
            self.bufs.append([h.get_buffer(p, shape, x.dtype) for p in range(world)])
        f = symm_mem.empty(self.gemm.nflags, dtype=torch.int32, device=dev)
        f.zero_()
        hf = symm_mem.rendezvous(f, gname)
        self.handles.append(hf)
        self.flags = [hf.get_buffer(p, (self.gemm.nflags,), torch.int32) for p in range(world)]
        self.err = torch.zeros(4, dtype=torch.int32, device=dev)
        self.waiter = _Waiter(world)
        self.reduce = _reduce_fd(x.dtype, world) if kind == "reduce_scatter" else None
        self.epoch = 0
        torch.cuda.synchronize(dev)
        dist.barrier(group=group)  # every rank's flags are zero before anyone signals

    def __call__(self, x, w, check=True):
        """One call: the GEMM (stores and flags), this rank's flag wait, and
        for a reduce-scatter the sum; ``check``: wait and raise a timeout."""
        self.epoch += 1
        bufs = self.bufs[self.epoch % 2]
        stream = torch.cuda.current_stream(x.device).cuda_stream
        self.gemm.run(x, w, self.rank, bufs, self.flags, stream=stream)
        self.waiter.run(
            self.flags[self.rank], self.err, self.epoch * self.gemm.stores_per_tile, stream=stream
        )
        if check:
            torch.cuda.current_stream(x.device).synchronize()
            e = _timeout_error(
                self.err.cpu(), self.rank, self.gemm.tiles, self.kind, self.world,
                self.epoch * self.gemm.stores_per_tile, self.gemm.stores_per_tile, self.waiter.timeout,
            )  # fmt: skip
            if e is not None:
                raise e
        own = bufs[self.rank]
        if self.kind == "all_gather":
            return own
        return self.reduce.execute(list(own.unbind(0)))[0]


_LAYERS: dict = {}


def _layer(kind, x, w, group):
    import torch.distributed as dist

    _check(x, w, None, kind)
    if not dist.is_available() or not dist.is_initialized():
        raise CircbufError(
            f"linear_{kind}: torch.distributed is not initialized (init_process_group with NCCL)"
        )
    world = dist.get_world_size(group)
    _check(x, w, world, kind)
    key = (kind, id(group), tuple(x.shape), tuple(w.shape), x.dtype, x.device)
    lay = _LAYERS.get(key)
    if lay is None:
        lay = _LAYERS[key] = _Layer(kind, x, w, group)
    return lay


def linear_all_gather(x, w, group=None, check=True):
    """Column-parallel ``linear`` with its output all-gathered: this rank's
    ``x`` [M, K] and weight shard ``w`` [N/world, K]; returns the full
    ``[M, N]`` (rank ``r``'s columns ``[r*N/world, (r+1)*N/world)``) on every
    rank. ``check``: wait for the call and raise :class:`DistributedTimeout`
    if a tile never arrived (False: the check happens on the next checked
    call; the benchmark's mode)."""
    return _layer("all_gather", x, w, group)(x, w, check=check)


def linear_reduce_scatter(x, w, group=None, check=True):
    """Row-parallel ``linear`` with its partial sums reduce-scattered: this
    rank's ``x`` [M, K/world] and ``w`` [N, K/world]; returns this rank's
    rows ``[rank*M/world, (rank+1)*M/world)`` of ``sum_r x_r @ w_r.T``,
    summed in rank order (fp32, deterministic)."""
    return _layer("reduce_scatter", x, w, group)(x, w, check=check)
