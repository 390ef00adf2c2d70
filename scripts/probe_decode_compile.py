"""Probe (issue 18): a batch-1 decode linear under torch.compile(backend="circbuf").
Static shapes define x [1, K] with M fixed to 1; this times the compiled call
against eager (cuBLAS) and names the matmul's path."""

import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from circbuf.dynamo import backend  # noqa: E402

print(f"GPU: {gpu_name()}")
for shape, (n, k) in (((1, 4096), (4096, 4096)), ((1, 1, 4096), (14336, 4096)), ((1, 4096), (4096, 14336))):
    torch._dynamo.reset()
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(*shape[:-1], k, device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(lambda x, w: F.silu(F.linear(x, w)), backend=backend, dynamic=False)
    out = fn(x, w)
    ref = F.silu(F.linear(x, w))
    err = (out.float() - ref.float()).abs().max().item()
    t_c = bench_ms(lambda fn=fn, x=x, w=w: fn(x, w))
    t_e = bench_ms(lambda x=x, w=w: F.silu(F.linear(x, w)))
    gb = n * k * 2 / t_c / 1e6
    print(
        f"x {tuple(x.shape)} w [{n}, {k}]: circbuf {t_c * 1e3:7.1f} us ({gb:5.0f} GB/s)  eager {t_e * 1e3:7.1f} us  "
        f"ratio {t_e / t_c:.3f}  max err {err:.2e}",
        flush=True,
    )
