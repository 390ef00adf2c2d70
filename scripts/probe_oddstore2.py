# ruff: noqa: B023
"""Issue 18 odd-N probe, part 2 (helper oddstore): why the row store is slow.
The row-store GEMM at N = aligned (rows forced), N even but not 16-byte aligned,
N odd, against the TMA store; the realign copy through other torch ops; the
host time of one fd.execute.

    PYTHONPATH=. python scripts/probe_oddstore2.py
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from circbuf.realign import realigned  # noqa: E402
from scripts.probe_oddstore import kernels  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

T0 = time.time()


def tf(m, n, k, us):
    return 2 * m * n * k / us / 1e6


def gemm(tag, m, n, k, ov, pad=True):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    if pad:
        a = realigned(a) if (k * 2) % 16 else a
        b = realigned(b) if (n * 2) % 16 else b
    fd = mm_fusion("matmul")
    if ov:
        fd.fusion.schedule(**ov)
    try:
        (out,) = fd.execute([a, b])
    except Exception as e:  # noqa: BLE001
        print(f"  {tag:34s} ERROR {type(e).__name__}: {str(e)[:160]}", flush=True)
        return
    ref = a.float() @ b.float()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    ks = kernels(lambda: fd.execute([a, b]))
    us = max(ks.values())
    print(
        f"  {tag:34s} kernel {us:8.1f}us {tf(m, n, k, us):6.1f}TF err {err:.0e} [{fd.last_params().store}]",
        flush=True,
    )


def copies():
    print(f"\n== realign copy variants  t={time.time() - T0:.0f}s")
    for r, c in ((2047, 2047), (768, 50257)):
        x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
        cp = (c + 7) // 8 * 8
        nb = r * c * 2 * 2
        dst = torch.empty(r, cp, device="cuda", dtype=torch.bfloat16)
        var = {
            "copy_ (now)": lambda: realigned(x),
            "copy_ into preallocated": lambda: dst[:, :c].copy_(x),
            "F.pad": lambda: torch.nn.functional.pad(x, (0, cp - c)),
            "cat zeros": lambda: torch.cat([x, x.new_zeros(r, cp - c)], 1),
            "contiguous memcpy (bound)": lambda: dst.view(-1)[: r * c].copy_(x.view(-1)),
        }
        for nm, fn in var.items():
            ks = kernels(fn)
            us = sum(ks.values())
            print(f"  [{r}x{c}] {nm:28s} {us:7.1f}us {nb / us / 1e3:6.0f} GB/s  {list(ks)[:2]}", flush=True)
        y, z = torch.randn(r, c, device="cuda", dtype=torch.bfloat16), torch.empty_like(dst)
        ks = kernels(lambda: torch._foreach_copy_([dst[:, :c], z[:, :c]], [x, y]))
        print(f"  [{r}x{c}] _foreach_copy_ x2            {sum(ks.values()):7.1f}us  {ks}", flush=True)


def host():
    print(f"\n== host time of fd.execute  t={time.time() - T0:.0f}s")
    for m, n, k in ((2047, 2047, 2047), (2048, 2048, 2048)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        fd = mm_fusion("matmul")
        fd.execute([a, b])
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            fd.execute([a, b])
        h = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
        g = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b])) * 1e3
        print(f"  {m}x{n}x{k}: host {h:.1f}us/call, do_bench {g:.1f}us", flush=True)


def main():
    print(f"GPU: {gpu_name()} torch {torch.__version__}")
    print(f"\n== row store vs N's alignment (operands pre-aligned; kernel time)  t={time.time() - T0:.0f}s")
    for n in (2048, 2046, 2047, 2056):
        gemm(f"2048x{n}x2048 rows", 2048, n, 2048, {"store": "rows"})
    gemm("2048x2048x2048 tma", 2048, 2048, 2048, {})
    gemm("2048x2048x2048 direct", 2048, 2048, 2048, {"store": "direct"})
    for n in (50264, 50258, 50257):
        gemm(f"4096x{n}x768 rows", 4096, n, 768, {"store": "rows"})
    gemm("4096x50264x768 tma", 4096, 50264, 768, {})
    gemm("4096x50264x768 pp rows", 4096, 50264, 768, {"store": "rows", "pingpong": True})
    copies()
    host()
    ncu = subprocess.run("which ncu", shell=True, capture_output=True, text=True).stdout.strip()
    print(f"ncu: {ncu or 'none'}  t={time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
