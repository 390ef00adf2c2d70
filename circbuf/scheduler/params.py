"""Heuristic parameters: frozen dataclasses with a readable ``__str__``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..target import DEFAULT


class Params:
    name = "params"

    def _shown(self) -> list:
        """Fields printed: all but those marked hide_default while at their default."""
        return [
            f
            for f in fields(self)
            if not (f.metadata.get("hide_default") and getattr(self, f.name) == f.default)
        ]

    def __str__(self):
        body = "\n".join(f"  {f.name}: {getattr(self, f.name)}" for f in self._shown())
        return f"===== {self.name} =====\n{body}\n"

    def brief(self) -> str:
        """One line, per-tensor flags left out.

        >>> PointwiseParams(vectorize=8, vectorize_inputs=(True,)).brief()
        'Pointwise params: vectorize=8, unroll=1, threads=128'
        """
        vals = [(f.name, getattr(self, f.name)) for f in self._shown()]
        return f"{self.name}: " + ", ".join(f"{k}={v}" for k, v in vals if not isinstance(v, tuple))


@dataclass(frozen=True)
class PointwiseParams(Params):
    """Flattened 1-D schedule: [BIDx, TIDx, unroll, vectorize]; with
    ``inner_threads`` (operands broadcast along rows or columns), rows and
    columns: [BIDx (rows), BIDy (columns), TIDy, TIDx, unroll (rows), vectorize].

    >>> print(PointwiseParams(vectorize=8, unroll=2, threads=128,
    ...                       vectorize_inputs=(True,), vectorize_outputs=(True,)))
    ===== Pointwise params =====
      vectorize: 8
      unroll: 2
      threads: 128
      vectorize_inputs: (True,)
      vectorize_outputs: (True,)
    <BLANKLINE>
    """

    name = "Pointwise params"
    vectorize: int = 1
    unroll: int = 1
    threads: int = 128
    vectorize_inputs: tuple = ()
    vectorize_outputs: tuple = ()
    # why a fusion that asked for the TMA variant (``schedule(stages=N)``) got this kernel;
    # printed only when set
    tma_declined: str = field(default="", metadata={"hide_default": True})
    # 0: flattened. Else the threads along the innermost axis (threadIdx.x); threads /
    # inner_threads rows side by side (threadIdx.y), each thread ``unroll`` rows
    inner_threads: int = field(default=0, metadata={"hide_default": True})


@dataclass(frozen=True)
class PointwiseTmaParams(Params):
    """Tiles of [tile_rows x tile_cols] streamed by TMA through ``stages`` slots;
    threads [threads_y x threads_x], each moving ``vectorize`` elements."""

    name = "Pointwise TMA params"
    tile_rows: int = 16
    tile_cols: int = 256
    vectorize: int = 8
    threads_x: int = 32
    threads_y: int = 4
    stages: int = 3
    prefetch: int = 2
    grid: int = DEFAULT.sm_count
    war: str = "block_sync"
    warp_specialized: bool = False
    vectorize_outputs: tuple = ()
    tma_store: bool = False  # outputs staged in shared memory, stored by TMA per tile


@dataclass(frozen=True)
class NormalizationParams(Params):
    """Inner-persistent normalization. ``staging="tma"``: rows staged through a TMA
    circular buffer by a persistent grid; ``"registers"``: each CTA loads its row block
    straight into registers (16-byte loads), one row block per CTA.

    Loop domain of the reduction: [row_iter, BIDx{grid}, TIDy{rows}, r_o, TIDx{threads}, V{vectorize}];
    the shared buffer (tma): [row_iter, BIDx, box_iter, Bulk{rows}, Bulk{box_cols}].

    >>> NormalizationParams(staging="registers", rows=2, grid=16384, row_length=4096).brief()
    'Normalization params: staging=registers, rows=2, threads=128, vectorize=8, grid=16384, blocks_per_sm=0, row_length=4096'
    """

    name = "Normalization params"
    staging: str = "tma"  # "registers": rows loaded from global memory straight into registers
    rows: int = 1
    threads: int = 128
    vectorize: int = 8
    box_cols: int = field(default=256, metadata={"tma": True})
    stages: int = field(default=2, metadata={"tma": True})
    prefetch: int = field(default=1, metadata={"tma": True})
    grid: int = DEFAULT.sm_count
    blocks_per_sm: int = 0  # > 0: __launch_bounds__ caps registers so that this many CTAs fit per SM (tma: the grid holds that many)
    war: str = field(default="block_sync", metadata={"tma": True})
    warp_specialized: bool = field(default=False, metadata={"tma": True})
    row_length: int = 0  # > 0: rows live in registers, the kernel is compiled for this length
    vectorize_inputs: tuple = ()
    vectorize_outputs: tuple = ()

    def _shown(self) -> list:
        """The TMA ring's fields only where there is one."""
        return [f for f in super()._shown() if self.staging == "tma" or not f.metadata.get("tma")]


@dataclass(frozen=True)
class OuterReductionParams(Params):
    """Outer reduction: one CTA per strip of ``cols`` columns (threadIdx.x),
    [tile_rows x cols] tiles streamed by TMA through ``stages`` slots, each
    tile split over ``threads_y`` rows of threads (threadIdx.y)."""

    name = "Outer reduction params"
    cols: int = 64
    threads_y: int = 4
    tile_rows: int = 64
    stages: int = 4
    prefetch: int = 3
    war: str = "block_sync"
    warp_specialized: bool = False


@dataclass(frozen=True)
class ReductionParams(Params):
    """One CTA per reduced row (inner) or one thread per output column (outer)."""

    name = "Reduction params"
    inner: bool = True
    threads: int = 128


@dataclass(frozen=True)
class FfmaParams(Params):
    """The FFMA path of a matmul (fp32/fp64 operands on the CUDA cores): each CTA
    computes a [bm x bn] output tile, threads [ty x tx] each a [tm x tn] block
    in registers, K walked serially ``bk`` values per step; ``vectorize_a``/``_b``:
    the axis along which each operand is loaded 16 bytes at a time ("" for
    one element per load).

    >>> FfmaParams(blocks_per_sm=2, extents=(0, 4096, 4096)).brief()
    'FFMA tile 128x128x4, 8x8 per thread, 256 threads; A 16-byte loads along K; B 16-byte loads along N; 2 CTAs/SM; compiled for N = 4096, K = 4096'
    """

    name = "FFMA matmul params"
    tile: tuple = (128, 128, 4)
    thread_tile: tuple = (8, 8)
    threads: tuple = (16, 16)  # (ty, tx)
    vectorize_a: str = "K"
    vectorize_b: str = "N"
    vectorize_outputs: tuple = ()
    blocks_per_sm: int = 0  # > 0: __launch_bounds__ caps registers so that this many CTAs fit per SM
    # (M, N, K) the kernel is compiled for, 0 where symbolic: M and N where they are
    # multiples of the tile, K of bk (no bounds checks in the loops); one kernel per shape
    extents: tuple = (0, 0, 0)
    # operand tiles staged in shared memory: [bk x bm] of A (M-contiguous) and [bk x bn]
    # of B (N-contiguous) per k step, copied by every thread (cp.async) into a ring of
    # ``stages`` slots, the next steps' copies in flight during this one's FFMAs
    smem: bool = False
    stages: int = 2

    def brief(self) -> str:
        bm, bn, bk = self.tile
        tm, tn = self.thread_tile
        ty, tx = self.threads
        loads = "; ".join(
            f"{w} 16-byte loads along {v}" if v else f"{w} element loads"
            for w, v in (("A", self.vectorize_a), ("B", self.vectorize_b))
        )
        if self.smem:
            loads = "; ".join(
                f"{w} cp.async {'16-byte' if v == m else 'element'} copies"
                for w, v, m in (("A", self.vectorize_a, "M"), ("B", self.vectorize_b, "N"))
            )
            loads = f"operand tiles in shared memory ({self.stages} stages; {loads})"
        out = f"FFMA tile {bm}x{bn}x{bk}, {tm}x{tn} per thread, {ty * tx} threads; {loads}"
        if self.blocks_per_sm:
            out += f"; {self.blocks_per_sm} CTAs/SM"
        fixed = [f"{x} = {v}" for x, v in zip("MNK", self.extents) if v]
        if fixed:
            out += f"; compiled for {', '.join(fixed)}"
        return out


@dataclass(frozen=True)
class MatmulParams(Params):
    """A Hopper matmul: [bm x bn] output tiles, K in steps of bk, operand
    tiles staged by TMA through a ``stages``-deep ring that a producer warp
    fills while two consumer warpgroups run wgmma on it; ``pingpong``: each
    warpgroup owns whole tiles (alternating), else both split one tile
    (cooperative). ``persistent``: one CTA per SM walks the tiles in bands of
    ``group`` tiles along ``raster``. ``simt`` holds the params of the
    sum-of-products path taken where the tensor cores cannot be (fp32
    operands, strides a tensor map cannot describe, K = 0).

    >>> print(MatmulParams(tile=(128, 256, 64), stages=4, grid=114).brief())
    tile 128x256x64, 4 stages (prefetch 3), persistent, cooperative, raster M/8, grid 114
    """

    name = "Matmul params"
    tile: tuple = (128, 256, 64)
    stages: int = 4
    prefetch: int = 3
    persistent: bool = True
    pingpong: bool = False
    cluster: tuple = (1, 1)
    raster: str = "M"  # the tile index that runs fastest inside a band
    group: int = 8  # tiles per band (L2 reuse of the operand panels)
    registers: tuple = (40, 232)  # setmaxnreg: producer, consumers
    # "inline": the consumers run the epilogue; "role": an epilogue warpgroup of its own,
    # fed the fp32 accumulator a [bm x en] sub-tile at a time through a ring of
    # ``handoff_stages`` shared-memory slots while the consumers go on to the next tile
    epilogue: str = field(default="inline", metadata={"hide_default": True})
    handoff_stages: int = field(default=0, metadata={"hide_default": True})
    epilogue_tile: tuple = (64, 64)
    grid: int = DEFAULT.sm_count
    # outputs: "tma" (staged in shared memory, TMA stores), "rows" (staged, the threads store
    # rows: scheduler/matmul_store.py) or "direct" (from registers)
    store: str = "tma"
    store_buffers: int = 2  # staging buffers per warpgroup that sub-tiles alternate between
    # store "direct": elements per store from registers (2: an accumulator pair, N even)
    store_vector: int = field(default=1, metadata={"hide_default": True})
    a_major: str = "K"  # which axis of A is contiguous in memory: "K" or "M"
    b_major: str = "K"  # of B: "K" (linear's [N, K] weight) or "N" (matmul's [K, N])
    # the CUDA-core paths: ReductionParams (the sum of products, the reduction
    # scheduler's) or FfmaParams (register-tiled FFMA, fp32/fp64 operands)
    simt: object = None
    # fp32 operands on TF32 tensor cores (torch allows TF32 for fp32 matmuls): K-major tiles,
    # 32 fp32 of K per 128-byte swizzled row, k8 wgmmas
    tf32: bool = field(default=False, metadata={"hide_default": True})
    # per fusion input: the epilogue reads it an accumulator pair (two elements adjacent
    # along N) at a time, one vector load (contiguous along N, N even, aligned)
    vectorize_inputs: tuple = field(default=(), metadata={"hide_default": True})
    # per fusion input: a tile of the output's shape (a residual) the producer brings into
    # shared memory by TMA, a [bm x en] sub-tile per stage of a ring of its own, while the
    # tile's MMAs run; the epilogue reads it there
    tma_inputs: tuple = field(default=(), metadata={"hide_default": True})
    # how the producer fills each operand's (A's, B's) ring slots: "tma" (a tensor map) or
    # "cp.async" (the producer warpgroup's threads, for strides or pointers TMA cannot take)
    fill: tuple = field(default=("tma", "tma"), metadata={"hide_default": True})
    # cp.async: elements per copy of each operand (8/4/2 for 16/8/4 bytes of bf16; 1: through
    # registers, rows only 2-byte aligned); 0 for a TMA fill
    copy_vector: tuple = field(default=(0, 0), metadata={"hide_default": True})
    # split-K in the kernel: K's k steps in ``split_k`` chunks, one per blockIdx.y; each
    # CTA publishes its fp32 partial tile, the last of a tile's CTAs to finish sums them in
    # chunk order (deterministic) and runs the epilogue (lowering/split_k.py)
    split_k: int = field(default=1, metadata={"hide_default": True})

    def brief(self) -> str:
        if isinstance(self.simt, FfmaParams):
            return self.simt.brief()
        if self.simt is not None:
            return f"SIMT sum of products ({self.simt.threads} threads)"
        bm, bn, bk = self.tile
        kind = "ping-pong" if self.pingpong else "cooperative"
        if self.epilogue == "role":
            kind += f", epilogue role ({self.handoff_stages} hand-off stages)"
        if any(self.tma_inputs):
            kind += f", {sum(self.tma_inputs)} epilogue input(s) by TMA"
        if self.tf32:
            kind += ", TF32"
        if self.split_k > 1:
            kind += f", split-K {self.split_k} in the kernel"
        grid = "persistent" if self.persistent else "one CTA per tile"
        return (
            f"tile {bm}x{bn}x{bk}, {self.stages} stages (prefetch {self.prefetch}), {grid}, {kind}, "
            f"raster {self.raster}/{self.group}, grid {self.grid}"
        )
