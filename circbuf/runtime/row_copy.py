"""The realign copy: rows at any byte alignment copied into rows 16 bytes
apart, with 16-byte loads and stores (torch's ``copy_`` into a padded
destination reads and writes one element at a time: 1.1-2.1 TB/s on an
H200; this copy 1.7-3.0 TB/s, 1.25-1.9x faster: scripts/probe_row_copy.py).

Each thread writes one 16-byte chunk of a destination row. Its source bytes
start ``shift`` bytes past a 16-byte boundary (the same shift for the whole
row), so the thread loads the two aligned vectors they straddle and funnels
them into one::

    src row  ..|xx a b c d e f g|h y y y y y y y|..   shift = 2 bytes
    dst row    |a b c d e f g h|                      one st.global.v4

The neighbouring thread loads the same second vector as its first: one warp
brings each 128-byte line in once (L1), so the copy reads every byte once
from memory. The second vector is read only where the chunk needs it, and
neither ever lies past the 16-byte block holding the row's last byte: the
copy reads nothing outside the source tensor.

The kernel is fixed CUDA (no fusion makes it, so no IR describes it); its
arguments are byte counts, so one cubin serves every dtype. Up to
``MAX_JOBS`` copies run in one launch (``blockIdx.z`` picks the copy): a
GEMM realigning both operands pays one launch. The destination must be
16-byte aligned (``job_of`` checks it once per plan; torch's caching
allocator hands out blocks aligned to 512 bytes, call after call).

>>> plan_rows(rows=2047, row_bytes=4094, resident=660)   # threads a row, rows a CTA, CTAs
(128, 2, 660, 1)
>>> plan_rows(rows=768, row_bytes=100514, resident=660)   # 100 KB rows: 25 CTAs share one
(128, 2, 26, 25)
>>> plan_rows(rows=4096, row_bytes=200, resident=660)
(8, 32, 128, 1)
"""

from __future__ import annotations

import ctypes
import functools

from ..target import DEFAULT

MAX_JOBS = 2
THREADS = 256  # a CTA's threads; 8 CTAs fill an SM's 2048

SOURCE = r"""
// the realign copy (circbuf/runtime/row_copy.py): rows at any alignment -> rows 16 bytes apart
struct RowCopy {
  const unsigned char* src;   // the first row's first byte, any alignment
  unsigned char* dst;         // 16-byte aligned
  long long rows;             // rows of one batch
  long long batches;
  long long row_bytes;        // bytes a row holds (written exactly: the padding is not touched)
  long long src_pitch, src_batch;  // bytes between rows, between batches
  long long dst_pitch, dst_batch;  // multiples of 16
};
struct RowCopies { RowCopy job[2]; };  // blockIdx.z picks one

// bytes [shift, shift + 16) of the 32 bytes hi:lo (shift the same for the whole row)
__device__ __forceinline__ uint4 funnel16(uint4 lo, uint4 hi, int shift) {
  unsigned w0 = lo.x, w1 = lo.y, w2 = lo.z, w3 = lo.w, w4 = hi.x;
  switch (shift >> 2) {  // whole words first (the same for a row's threads)
    case 1: w0 = lo.y; w1 = lo.z; w2 = lo.w; w3 = hi.x; w4 = hi.y; break;
    case 2: w0 = lo.z; w1 = lo.w; w2 = hi.x; w3 = hi.y; w4 = hi.z; break;
    case 3: w0 = lo.w; w1 = hi.x; w2 = hi.y; w3 = hi.z; w4 = hi.w; break;
    default: break;
  }
  const unsigned bits = (shift & 3) * 8;  // then the bytes left
  return make_uint4(__funnelshift_r(w0, w1, bits), __funnelshift_r(w1, w2, bits),
                    __funnelshift_r(w2, w3, bits), __funnelshift_r(w3, w4, bits));
}

// the first n < 16 bytes of v to p (16-byte aligned): a copy never writes past a row's last byte
__device__ __forceinline__ void store_head(unsigned char* p, uint4 v, int n) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // (unrolled: w stays in registers)
    const int m = n - 4 * i;  // this word's bytes to store
    if (m >= 4) {
      reinterpret_cast<unsigned*>(p)[i] = w[i];
    } else if (m >= 2) {
      *reinterpret_cast<unsigned short*>(p + 4 * i) = (unsigned short)w[i];
      if (m == 3) p[4 * i + 2] = (unsigned char)(w[i] >> 16);
    } else if (m == 1) {
      p[4 * i] = (unsigned char)w[i];
    }
  }
}

// chunk k of a row: its source bytes start `shift` bytes into aligned[k], `n` of them (16 but
// the row's last chunk); the second vector is loaded only where its bytes are needed
struct Chunk {
  uint4 lo, hi;
  int n;
};
__device__ __forceinline__ Chunk load_chunk(const uint4* __restrict__ aligned, int shift, long long k,
                                            long long row_bytes) {
  const long long left = row_bytes - k * 16;
  Chunk c;
  c.n = left < 16 ? (int)left : 16;
  c.lo = __ldg(aligned + k);
  c.hi = shift + c.n > 16 ? __ldg(aligned + k + 1) : c.lo;
  return c;
}
__device__ __forceinline__ void store_chunk(unsigned char* __restrict__ dst, long long k, const Chunk& c,
                                            int shift) {
  const uint4 v = funnel16(c.lo, c.hi, shift);
  if (c.n == 16) {
    reinterpret_cast<uint4*>(dst)[k] = v;
  } else {
    store_head(dst + k * 16, v, c.n);  // the row's last, short chunk
  }
}

extern "C" __global__ void __launch_bounds__(256) realign_rows(const RowCopies copies) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the source may be the last kernel's output
#endif
  const RowCopy& job = copies.job[blockIdx.z];
  const long long chunks = (job.row_bytes + 15) >> 4;  // 16-byte chunks of a destination row
  const long long all_rows = job.rows * job.batches;
  const long long span = 2LL * blockDim.x;  // a CTA's columns: two chunks a thread, loads first
  // CTAs: blockIdx.y over column blocks, blockIdx.x over groups of blockDim.y rows
  for (long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y; row < all_rows;
       row += (long long)gridDim.x * blockDim.y) {
    const long long batch = row / job.rows, r = row - batch * job.rows;
    const unsigned char* src = job.src + batch * job.src_batch + r * job.src_pitch;
    unsigned char* dst = job.dst + batch * job.dst_batch + r * job.dst_pitch;
    const int shift = (int)((unsigned long long)src & 15);  // the same for every chunk of the row
    const uint4* aligned = reinterpret_cast<const uint4*>(src - shift);
    for (long long k = blockIdx.y * span + threadIdx.x; k < chunks; k += (long long)gridDim.y * span) {
      // both chunks' loads in flight before either store
      const long long k2 = k + blockDim.x;
      const Chunk first = load_chunk(aligned, shift, k, job.row_bytes);
      Chunk second;
      if (k2 < chunks) second = load_chunk(aligned, shift, k2, job.row_bytes);
      store_chunk(dst, k, first, shift);
      if (k2 < chunks) store_chunk(dst, k2, second, shift);
    }
  }
}
"""


class _Job(ctypes.Structure):
    _fields_ = [
        ("src", ctypes.c_uint64), ("dst", ctypes.c_uint64), ("rows", ctypes.c_int64),
        ("batches", ctypes.c_int64), ("row_bytes", ctypes.c_int64), ("src_pitch", ctypes.c_int64),
        ("src_batch", ctypes.c_int64), ("dst_pitch", ctypes.c_int64), ("dst_batch", ctypes.c_int64),
    ]  # fmt: skip


class _Jobs(ctypes.Structure):
    _fields_ = [("job", _Job * MAX_JOBS)]


def plan_rows(
    rows: int, row_bytes: int, resident: int, tx: int | None = None, max_cols: int = DEFAULT.max_grid_yz
) -> tuple:
    """``(threads per row, rows per CTA, row CTAs, column CTAs)``: a thread
    copies two 16-byte chunks of a row (up to 128 threads on 256 chunks
    share one), the CTA's other threads further rows; at most ``resident``
    CTAs (what the GPU holds at once: one wave), grid-stride loops over the
    rest (``tx``: threads per row, given; ``max_cols``: gridDim.y's limit)."""
    chunks = max(1, -(-row_bytes // 16))
    if tx is None:
        tx = 1
        while tx < min(-(-chunks // 2), THREADS // 2):
            tx *= 2
    ty = THREADS // tx
    cols = min(-(-chunks // (2 * tx)), max_cols)
    return tx, ty, max(1, min(-(-rows // ty), resident // cols)), cols


def job_of(src, dst) -> tuple | None:
    """The copy ``src`` -> ``dst`` as ``(rows, batches, row_bytes, src_pitch,
    src_batch, dst_pitch, dst_batch)`` in bytes, or None where this kernel
    cannot make it: the same axis must be unit-stride on both sides (no
    transpose), ``dst``'s rows 16 bytes apart, at most one batch axis."""
    n = src.dim()
    if n == 0 or n > 3 or src.shape != dst.shape or src.dtype != dst.dtype or src.numel() == 0:
        return None
    item = src.element_size()
    sizes, ss, ds = list(src.shape), list(src.stride()), list(dst.stride())
    # the unit-stride axis (the last two's) is the rows' bytes; the other of the two the rows
    unit = n - 1
    if n >= 2 and ds[-1] != 1:
        unit = n - 2
    if ds[unit] != 1 or (sizes[unit] > 1 and ss[unit] != 1):
        return None
    if n == 1:
        rows, pitch_s, pitch_d = 1, 0, 0
    else:
        other = n - 1 if unit == n - 2 else n - 2
        rows, pitch_s, pitch_d = sizes[other], ss[other] * item, ds[other] * item
    batches, batch_s, batch_d = (sizes[0], ss[0] * item, ds[0] * item) if n == 3 else (1, 0, 0)
    if dst.data_ptr() % 16 or pitch_d % 16 or batch_d % 16:
        return None
    return rows, batches, sizes[unit] * item, pitch_s, batch_s, pitch_d, batch_d


class RowCopier:
    """The realign copy on one device. ``copier.bind(jobs)`` (``job_of``'s
    answers, at most ``MAX_JOBS``) fixes a launch's geometry once; the bound
    launch then copies ``(src, dst)`` pairs of those shapes and strides on
    torch's current stream, each call."""

    def __init__(self, device_index: int):
        import torch

        from ..target import Target
        from . import driver, nvrtc

        self.device_index = device_index
        self.target = target = Target.from_device(device_index)
        cubin = nvrtc.compile_cuda(SOURCE, target.arch, "realign_rows.cu")
        with torch.cuda.device(device_index):
            self.kernel = driver.LoadedKernel(cubin, "realign_rows")
            # one wave: as many CTAs as the SMs hold at once (5 each at 46 registers a thread)
            self.resident = target.sm_count * driver.blocks_per_sm(self.kernel, THREADS)

    def bind(self, jobs) -> BoundCopy:
        assert 0 < len(jobs) <= MAX_JOBS
        shapes = [(rows * batches, row_bytes) for rows, batches, row_bytes, *_ in jobs]
        # one launch: the widest rows' block, as many CTAs as either copy asks along each grid
        # axis (CTAs past a copy's rows or columns exit; the grid may then exceed one wave)
        tx = max(plan_rows(r, b, self.resident)[0] for r, b in shapes)
        plans = [plan_rows(r, b, self.resident, tx, self.target.max_grid_yz) for r, b in shapes]
        grid = (max(p[2] for p in plans), max(p[3] for p in plans), len(jobs))
        launch = self.kernel.launcher(grid, (tx, THREADS // tx, 1), 0)
        return BoundCopy(launch, jobs, self.device_index)


class BoundCopy:
    """One launch of the realign copy for fixed shapes and strides:
    ``bound(pairs)`` copies each ``(src, dst)``."""

    __slots__ = ("launch", "args", "params", "device_index")

    def __init__(self, launch, jobs, device_index: int):
        self.launch, self.args, self.device_index = launch, _Jobs(), device_index
        for k, (rows, batches, row_bytes, sp, sb, dp, db) in enumerate(jobs):
            self.args.job[k] = _Job(0, 0, rows, batches, row_bytes, sp, sb, dp, db)
        # the kernel's one argument, the jobs, passed by value: kernelParams[0] points at them
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.args))

    def __call__(self, pairs) -> None:
        import torch

        for job, (src, dst) in zip(self.args.job, pairs):
            job.src, job.dst = src.data_ptr(), dst.data_ptr()
        # (the driver copies the arguments at the launch: the struct is free to change after)
        stream = torch._C._cuda_getCurrentRawStream(self.device_index)  # (as the executor's plans)
        self.launch(stream, ctypes.addressof(self.params))


@functools.cache
def copier(device_index: int) -> RowCopier:
    """The process's copier for one device (its cubin compiled once, then the disk cache's)."""
    return RowCopier(device_index)
