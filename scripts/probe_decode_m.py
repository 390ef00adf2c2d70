"""Probe (issue 18): why an M = 1 decode GEMM streams B slower than M = 16 with
the same kernel (64 CTAs of 64x64, unsplit). Times linear(x[M, K], W[N, K]) for
several M with split_k=1, GB/s of W, cuBLAS beside."""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

print(f"GPU: {gpu_name()}")
n, k = 4096, 14336
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
for m in (1, 2, 4, 8, 16, 32, 64):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    fd = mm_fusion("linear")
    fd.fusion.schedule(split_k=1)
    fd.execute([x, w])
    t = bench_ms(lambda fd=fd, x=x: fd.execute([x, w]))
    tc = bench_ms(lambda x=x: x @ w.T)
    gb = n * k * 2 / t / 1e6
    print(f"M={m:3d}  circbuf {t * 1e3:7.1f} us {gb:6.0f} GB/s   cuBLAS {tc * 1e3:7.1f} us", flush=True)
# M = 1 as a row of a [64, K] buffer (same pointer and stride; only the tensor map's rows differ)
big = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
fd = mm_fusion("linear")
fd.fusion.schedule(split_k=1)
x1 = big[:1]
fd.execute([x1, w])
t = bench_ms(lambda: fd.execute([x1, w]))
print(f"M=1 view of [64, K]: {t * 1e3:7.1f} us", flush=True)
t = bench_ms(lambda: fd.execute([big[:16], w]))
print(f"M=16 view of [64, K]: {t * 1e3:7.1f} us", flush=True)
