"""Probe (issue 18, odd shapes): the realign copy of an operand into 16-byte
aligned rows, torch's strided ``copy_`` against one pitched 2-D driver copy
(``cuMemcpy2DAsync``) and a plain copy of as many bytes, on the shapes of
``benchmarks/matmul.py --odd``; GB/s of the bytes read + written.

Measured on an H200 (2026-11-26): the driver's copy won only at 100 KB rows
([768, 50257]: 71 vs 93 us), tied at 4 KB rows and lost at 8 KB rows and on
a contiguous copy from a misaligned pointer (49.8 vs 31.7 us); not adopted.
The driver copy used here is built inline (ctypes) for the comparison."""

import ctypes
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from circbuf.scheduler.realign import realigned_strides  # noqa: E402
from scripts.probe_row_copy import realign_cases  # noqa: E402


class _Memcpy2D(ctypes.Structure):  # CUDA_MEMCPY2D
    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
        ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t), ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64),
        ("dstArray", ctypes.c_void_p), ("dstPitch", ctypes.c_size_t), ("WidthInBytes", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
    ]  # fmt: skip


_copy2d = ctypes.CDLL("libcuda.so.1").cuMemcpy2DAsync_v2
_copy2d.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]


def pitched_copy(x, st):
    """A copy of 2-D ``x`` (unit-stride rows) into rows of pitch ``st[0]``, else None."""
    if x.dim() != 2 or x.stride(1) != 1 or st[1] != 1:
        return None
    item = x.element_size()
    p = _Memcpy2D(srcMemoryType=2, dstMemoryType=2, srcPitch=x.stride(0) * item, dstPitch=st[0] * item,
                  WidthInBytes=x.shape[1] * item, Height=x.shape[0])  # fmt: skip

    class Copy:
        @staticmethod
        def copy(dst, src, stream):
            p.srcDevice, p.dstDevice = src, dst
            assert _copy2d(ctypes.byref(p), stream) == 0

    return Copy


print(f"GPU: {gpu_name()}  bf16, do_bench median")
cases = realign_cases()  # (the row-copy probe's table: the --odd operands)
for name, x in cases.items():
    st = realigned_strides(tuple(x.shape), x.stride(), x.element_size())
    y1 = torch.empty_strided(x.shape, st, dtype=x.dtype, device=x.device)
    y2 = torch.empty_strided(x.shape, st, dtype=x.dtype, device=x.device)
    pc = pitched_copy(x, st)
    stream = torch.cuda.current_stream().cuda_stream
    t_torch = bench_ms(lambda y1=y1, x=x: y1.copy_(x)) * 1e3
    line = f"{name:>30s}: torch copy_ {t_torch:7.1f} us ({2 * x.numel() * 2 / t_torch / 1e3:5.0f} GB/s)"
    if pc is not None:
        t_pc = bench_ms(lambda pc=pc, y2=y2, x=x, s=stream: pc.copy(y2.data_ptr(), x.data_ptr(), s)) * 1e3
        torch.cuda.synchronize()
        ok = torch.equal(y1, y2)
        line += f" | pitched {t_pc:7.1f} us ({2 * x.numel() * 2 / t_pc / 1e3:5.0f} GB/s, equal {ok})"
    else:
        line += " | pitched: not one (transposing copy)"
    z = torch.empty(x.numel(), dtype=x.dtype, device="cuda")
    xf = torch.empty_like(z)
    t_flat = bench_ms(lambda z=z, xf=xf: z.copy_(xf)) * 1e3
    print(line + f" | flat copy of the bytes {t_flat:6.1f} us", flush=True)
