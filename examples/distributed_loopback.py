"""Issue 22 in one process: a column-parallel linear whose GEMM stores each
finished tile into every rank's output buffer and releases a per-tile flag,
and a row-parallel one whose partial tiles go to the rank owning their rows,
summed there in rank order. Here every "rank" lives on one device (loopback):
on a GPU, or on the CPU in circbuf's kernel interpreter, where

    python -m circbuf.check examples/distributed_loopback.py

also runs the protocol checker on the kernels (a flag released before its
tile's data, a store after its flag, a flag never released are errors).
On a machine with several GPUs, circbuf.distributed.linear_all_gather /
linear_reduce_scatter do the same across processes (benchmarks/distributed.py).
"""

import dataclasses
import sys

import torch

from circbuf.distributed import loopback
from circbuf.target import H100

world = 2
dev = "cuda" if torch.cuda.is_available() else "cpu"
# on the CPU: small, on a one-SM "H100" so each CTA runs several tiles (the flag is deferred a tile)
m, n, k = (2048, 1024, 1024) if dev == "cuda" else (256, 256, 128)
target = None if dev == "cuda" else dataclasses.replace(H100, sm_count=1)
torch.manual_seed(0)
x = (torch.randn(m, k) / 4).to(torch.bfloat16).to(dev)
ws = [(torch.randn(n, k) / 4).to(torch.bfloat16).to(dev) for _ in range(world)]
ok = True

# all-gather: rank r computes x @ ws[r].T; every rank gets [M, world * N]
outs = loopback("all_gather", [x] * world, ws, target=target)
want = x.double() @ torch.cat(ws).double().T
for r, o in enumerate(outs):
    err = (o.double() - want).abs().max().item()
    print(f"all_gather rank {r}: {list(o.shape)}, max error {err:.3g}")
    ok &= err < 0.05 and not o.isnan().any()

# reduce-scatter: rank r holds x_r [M, K] and w_r [N, K]; rank d gets rows d*M/world.. of the sum
xs = [(torch.randn(m, k) / 4).to(torch.bfloat16).to(dev) for _ in range(world)]
outs = loopback("reduce_scatter", xs, ws, target=target)
total = sum(a.double() @ b.double().T for a, b in zip(xs, ws))
for r, o in enumerate(outs):
    err = (o.double() - total[r * m // world : (r + 1) * m // world]).abs().max().item()
    print(f"reduce_scatter rank {r}: {list(o.shape)}, max error {err:.3g}")
    ok &= err < 0.08 and not o.isnan().any()
print(f"ran on {dev}: {'ok' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
