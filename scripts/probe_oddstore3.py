"""Issue 18 odd-N probe, part 3 (helper oddstore): the branch-free row store
against the same probes as part 1, in one process per code version.

    PYTHONPATH=. python scripts/probe_oddstore3.py TAG [--short] [--unroll 8]
"""

from __future__ import annotations

import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms  # noqa: E402
from circbuf.realign import realigned  # noqa: E402
from scripts.probe_oddstore import kernels  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

TAG = sys.argv[1] if len(sys.argv) > 1 else "?"
SHORT = "--short" in sys.argv
if "--unroll" in sys.argv:  # the row loop's unroll (give the run a cache dir of its own)
    import circbuf.scheduler.matmul_store as ms

    ms.ROW_UNROLL = int(sys.argv[sys.argv.index("--unroll") + 1])


def tf(m, n, k, us):
    return 2 * m * n * k / us / 1e6


def gemm(tag, m, n, k, ov):
    """The GEMM kernel alone, operands pre-realigned."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    a = realigned(a) if (k * 2) % 16 else a
    b = realigned(b) if (n * 2) % 16 else b
    fd = mm_fusion("matmul")
    if ov:
        fd.fusion.schedule(**ov)
    try:
        (out,) = fd.execute([a, b])
    except Exception as e:  # noqa: BLE001
        print(f"[{TAG}] {tag:30s} ERROR {type(e).__name__}: {str(e)[:120]}", flush=True)
        return
    ref = a.float() @ b.float()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    us = max(kernels(lambda: fd.execute([a, b])).values())
    print(
        f"[{TAG}] {tag:30s} kernel {us:7.1f}us {tf(m, n, k, us):6.1f}TF err {err:.0e} [{fd.last_params().store}]",
        flush=True,
    )


def e2e(m, n, k):
    """As benchmarks/matmul.py --odd times it (fd.execute, realign copies included)."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    fd = mm_fusion("matmul")
    (out,) = fd.execute([a, b])
    ref = a.double() @ b.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    t_cub = bench_ms(lambda: a @ b) * 1e3
    t = bench_ms(lambda: fd.execute([a, b])) * 1e3
    ks = kernels(lambda: fd.execute([a, b]))
    torch.cuda.synchronize()
    h0 = time.perf_counter()
    for _ in range(100):
        fd.execute([a, b])
    host = (time.perf_counter() - h0) / 100 * 1e6
    torch.cuda.synchronize()
    parts = " + ".join(f"{v:.1f}" for v in sorted(ks.values(), reverse=True))
    print(
        f"[{TAG}] e2e {m}x{n}x{k}: {t:7.1f}us {tf(m, n, k, t):6.1f}TF = {t_cub / t:.2f}x cuBLAS ({t_cub:.1f}us); "
        f"kernels {parts}us; host {host:.1f}us/call; err {err:.0e}",
        flush=True,
    )
    return t


def main():
    t0 = time.time()
    if SHORT:
        gemm("2047^3 rows", 2047, 2047, 2047, {})
        gemm("4096x50257x768 rows", 4096, 50257, 768, {})
        return
    for n in (2048, 2046, 2047):
        gemm(f"2048x{n}x2048 rows", 2048, n, 2048, {"store": "rows"})
    gemm("2047^3 (default)", 2047, 2047, 2047, {})
    gemm("2047^3 coop128", 2047, 2047, 2047, {"tile": (128, 128, 64)})
    gemm("2047^3 pp128", 2047, 2047, 2047, {"pingpong": True})
    gemm("2047^3 coop256x128", 2047, 2047, 2047, {"tile": (256, 128, 64)})
    gemm("2048^3 tma (twin)", 2048, 2048, 2048, {})
    for n in (50264, 50258, 50257):
        gemm(f"4096x{n}x768 rows", 4096, n, 768, {"store": "rows"})
    gemm("50257 coop128", 4096, 50257, 768, {"tile": (128, 128, 64)})
    gemm("50257 pp128", 4096, 50257, 768, {"pingpong": True})
    gemm("50257 coop256x128", 4096, 50257, 768, {"tile": (256, 128, 64)})
    gemm("4096x50264x768 tma (twin)", 4096, 50264, 768, {})
    t1 = e2e(2047, 2047, 2047)
    t2 = e2e(4096, 50257, 768)
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    fd = mm_fusion("matmul")
    fd.execute([a, a])
    tw1 = bench_ms(lambda: fd.execute([a, a])) * 1e3
    a2 = torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16)
    b2 = torch.randn(768, 50264, device="cuda", dtype=torch.bfloat16)
    fd2 = mm_fusion("matmul")
    fd2.execute([a2, b2])
    tw2 = bench_ms(lambda: fd2.execute([a2, b2])) * 1e3
    print(
        f"[{TAG}] vs aligned twin (TF/s ratio): 2047^3 {tf(2047, 2047, 2047, t1) / tf(2048, 2048, 2048, tw1):.3f} "
        f"(twin {tw1:.1f}us); 50257 {tf(4096, 50257, 768, t2) / tf(4096, 50264, 768, tw2):.3f} (twin {tw2:.1f}us)"
    )
    print(f"[{TAG}] done {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
