"""Pass: split-K summed in the GEMM kernel: the last CTA of a tile adds up the partials.

Requires: indexed, allocated, wgmma_synced, roles, launch; provides: split_k, split_k_summed, named_barriers.

An MMA accumulator whose reduction has an axis parallelized on ``blockIdx.y``
(the scheduler's split of K's k steps into S chunks, :func:`circbuf.scheduler.
matmul._k_loops`) holds, after its k loop, only this CTA's chunk of the sum.
The S CTAs of a tile (one per ``blockIdx.y``) each publish that partial to a
workspace and count themselves on the tile's flag; the one that counts last
reads every chunk's partial back (its own too: no second set of registers;
of two chunks, only the other's: ``p0 + p1`` and ``p1 + p0`` are the same
bits) and adds them in chunk order, so the sum has the same bits whichever
CTA finishes last, resets the flag for the next launch, and runs the epilogue. The others skip it: no CTA ever waits for
another (no spin, no co-residency needed), and there is no second kernel.

The partials are laid out by register, not by matrix position: thread ``g``
of the sync group writes its accumulator's float4 ``r`` of chunk ``c`` to
``partials[((tile * S + c) * N/4 + r) * threads + g]``, so a warp writes 512
contiguous bytes (``N``: accumulator elements per thread; ``threads``: the
group that holds one tile: a ping-pong warpgroup, or both cooperative ones).
The runtime allocates the workspace (``Kernel.split_k``: floats and flags per
launch, as Scalars of the extents) and passes ``cb_partials`` and
``cb_tile_flags`` after the tensor maps; the flags start at zero.

Before (the consumers' tile loop)::

    FOR t in blockIdx.x..T step G
      ALLOC acc[N]
      FOR k in 0..ceilDiv(steps, S): ... WGMMA acc += A[blockIdx.y * ceilDiv(steps, S) + k] x B[..] ...
      WGMMA_WAIT_GROUP 0
      ... epilogue (reads acc, stores the tile) ...

After::

    FOR t in blockIdx.x..T step G
      ALLOC acc[N]
      FOR k ...
      WGMMA_WAIT_GROUP 0
      SPLIT_K_SUM acc: chunk blockIdx.y of S, tile t -> split_last
      IF split_last
        ... epilogue ...
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import CircbufError, DataType, ParallelType, TensorView, Var
from ..ir.scalar import Scalar
from .kir import Allocate, ForLoop, IfThenElse, Kernel, Node, Wgmma, WgmmaWait, walk

LAST = "split_last"

HELPERS = {
    "cb_split_k": """\
namespace cb {
// split-K in the kernel (lowering/split_k.py): publish this CTA's fp32 partial of a tile
// (N accumulator floats per thread, a float4 at a time: [chunk][N / 4][THREADS] floats x 4)
// and count it on the tile's flag; the CTA that counts last reads the chunks' partials
// back and adds them in chunk order (the same bits whichever CTA is last), and resets the
// flag for the next launch. True on that CTA.
template <int N, int THREADS>
__device__ __forceinline__ bool split_k_sum(float* acc, float* partials, int* flag, int chunk,
                                            int chunks, int g, int bar) {
  float4* slot = reinterpret_cast<float4*>(partials);
  #pragma unroll
  for (int r = 0; r < N / 4; ++r) {
    __stcg(&slot[(chunk * (N / 4) + r) * THREADS + g],
           make_float4(acc[4 * r], acc[4 * r + 1], acc[4 * r + 2], acc[4 * r + 3]));
  }
  asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(THREADS) : "memory");  // the group's partial is written
  int last = 0;
  if (g == 0) {
    int before;
    // release: the group's writes (ordered before by bar.sync) before the count;
    // acquire: the other CTAs' partials after it
    asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(before) : "l"(flag) : "memory");
    last = before == chunks - 1;
    if (last) *flag = 0;  // every chunk has counted: ready for the next launch
  }
  // every thread of the group learns whether it is the last (the OR of one thread's answer)
  asm volatile(
      "{ .reg .pred p, q;\\n"
      "  setp.ne.s32 p, %1, 0;\\n"
      "  barrier.red.or.pred q, %2, %3, p;\\n"
      "  selp.s32 %0, 1, 0, q; }"
      : "=r"(last) : "r"(last), "r"(bar), "n"(THREADS) : "memory");
  if (!last) return false;
  if (chunks == 2) {  // p0 + p1 == p1 + p0 bit for bit (IEEE addition commutes): the other chunk only
    #pragma unroll
    for (int r = 0; r < N / 4; ++r) {
      const float4 v = __ldcg(&slot[((1 - chunk) * (N / 4) + r) * THREADS + g]);
      acc[4 * r] += v.x; acc[4 * r + 1] += v.y; acc[4 * r + 2] += v.z; acc[4 * r + 3] += v.w;
    }
    return true;
  }
  // acc = p0 + p1 + ... in chunk order, every chunk read back (its own too: no second set of
  // registers), 8 float4s of P chunks at a time: each round trip to L2 is on the tile's
  // critical path, so two chunks' loads go together where the accumulator leaves room
  // (N <= 64 floats; 128 beside 64 more registers of loads spilled)
  constexpr int R = N / 4 < 8 ? N / 4 : 8;
  constexpr int P = N <= 64 ? 2 : 1;
  #pragma unroll
  for (int r0 = 0; r0 < N / 4; r0 += R) {
    #pragma unroll 1
    for (int c = 0; c < chunks; c += P) {
      float4 v[P][R];
      #pragma unroll
      for (int p = 0; p < P; ++p) {
        #pragma unroll
        for (int r = 0; r < R; ++r) {
          if (c + p < chunks) v[p][r] = __ldcg(&slot[((c + p) * (N / 4) + r0 + r) * THREADS + g]);
        }
      }
      #pragma unroll
      for (int p = 0; p < P; ++p) {
        #pragma unroll
        for (int r = 0; r < R; ++r) {
          float* a = &acc[4 * (r0 + r)];
          if (c + p == 0) {
            a[0] = v[p][r].x; a[1] = v[p][r].y; a[2] = v[p][r].z; a[3] = v[p][r].w;
          } else if (c + p < chunks) {
            a[0] += v[p][r].x; a[1] += v[p][r].y; a[2] += v[p][r].z; a[3] += v[p][r].w;
          }
        }
      }
    }
  }
  return true;
}
}  // namespace cb"""
}


@dataclass(eq=False)
class SplitKSum(Node):
    """Publish ``acc`` (``n`` floats per thread) as chunk ``chunk`` of
    ``chunks`` of tile ``tile``'s partials; on the group's CTA that counts
    last, ``acc`` becomes the sum of every chunk's in chunk order and
    ``last`` is true. ``gid``: the thread's index in its group of
    ``threads``, which syncs on named barrier ``barrier``."""

    acc: TensorView
    n: int
    threads: int
    gid: Scalar
    barrier: Scalar
    tile: Scalar
    chunk: Scalar
    chunks: int
    last: Var

    def lines(self, ind):
        return [
            "  " * ind + f"SPLIT_K_SUM {self.acc.name}[{self.n}]: chunk {self.chunk} of {self.chunks}, "
            f"tile {self.tile} ({self.threads} threads, bar {self.barrier}) -> {self.last}"
        ]

    def cuda(self, cg):
        cg.helpers.update(HELPERS)
        # (the tile's first float in 64 bits: a workspace may pass 2^31 floats)
        cg.emit(
            f"// split-K: this CTA's partial of the tile over chunk {cg.scalar(self.chunk)} of K; the last "
            f"of the tile's {self.chunks} CTAs sums them"
        )
        cg.emit(
            f"const bool {self.last.name} = cb::split_k_sum<{self.n}, {self.threads}>(&{self.acc.name}[0], "
            f"cb_partials + (long long)({cg.scalar(self.tile)}) * {self.chunks * self.n * self.threads}, "
            f"&cb_tile_flags[{cg.scalar(self.tile)}], "
            f"(int)({cg.scalar(self.chunk)}), {self.chunks}, (int)({cg.scalar(self.gid)}), "
            f"(int)({cg.scalar(self.barrier)}));"
        )


def _split_axis(tv: TensorView):
    return next((a for a in tv.loop if a.is_reduction and a.parallel_type == ParallelType.BIDy), None)


def split_k_sums(kernel: Kernel) -> Kernel:
    """Entry: the fix-up after the k loop of an accumulator whose K is split
    across ``blockIdx.y`` (see the module doc); other kernels pass unchanged."""
    found: list = []
    walk(
        kernel.body,
        lambda n, s: found.append((n, list(s))) if isinstance(n, Wgmma) and _split_axis(n.acc.tv) else None,
    )
    if not found:
        return kernel
    accs = {id(w.acc.tv): w.acc.tv for w, _ in found}
    if len(accs) > 1:
        raise CircbufError(f"{kernel.name}: split-K sums one accumulator per kernel, not {len(accs)}")
    acc = found[0][0].acc.tv
    role = next((r for r in kernel.roles if r.name == "consumers"), None)
    if role is None or kernel.launch.get(ParallelType.TIDx) is None:
        raise CircbufError(f"{acc.name}: split-K in the kernel needs warp-specialized consumers")
    chunks = _split_axis(acc).extent
    if not hasattr(chunks, "value"):
        raise CircbufError(f"{acc.name}: split-K's chunk count must be a constant, not {chunks}")
    chunks = chunks.value
    w, stack = found[0]
    loop = next((n for n in stack if isinstance(n, ForLoop) and n.strided), None)
    if loop is None:
        raise CircbufError(f"{acc.name}: split-K in the kernel needs a persistent tile loop")
    body = loop.body
    k_loop = next(n for n in stack if n in body)
    after = body.index(k_loop) + 1
    if not (after < len(body) and isinstance(body[after], WgmmaWait) and body[after].pending == 0):
        raise CircbufError(f"{acc.name}: split-K expects the k loop's wgmmas drained right after it")
    alloc = next(
        (n for n in body if isinstance(n, Allocate) and n.tv is acc and isinstance(n.size, int)), None
    )
    if alloc is None or alloc.size % 4:
        raise CircbufError(
            f"{acc.name}: split-K needs the accumulator's allocation in the tile loop, in float4s"
        )
    bid, threads = kernel.role_barrier(role)
    x = kernel.launch[ParallelType.TIDx]
    rows = (role.hi - role.lo) // role.groups  # thread rows (threadIdx.y) of one sync group
    y = Var(role.axis.value) - role.lo if role.lo else Var(role.axis.value)
    gid = Var("threadIdx.x") if rows == 1 else Var("threadIdx.x") + x * (y % rows)
    last = Var(LAST, dtype=DataType.Bool)
    node = SplitKSum(acc, alloc.size, threads, gid, bid, loop.index, Var("blockIdx.y"), chunks, last)
    rest = body[after + 1 :]
    body[after + 1 :] = [node, IfThenElse(last, rest)]
    kernel.split_k = dict(
        chunks=chunks,
        partials=loop.extent * (chunks * alloc.size * threads),  # floats
        flags=loop.extent,
    )
    return kernel
