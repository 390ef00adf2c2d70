"""Probe (issue 18): linear(x, w) with x defined [1, K] (M fixed to 1, as
torch.compile's static shapes define a batch-1 decode step): the tensor-core
path (now) against the SIMT sum of products it took before (forced here by
making matmul_path._mma_structure refuse), and cuBLAS, in one run."""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import circbuf as cb  # noqa: E402
import circbuf.scheduler.matmul_path as mm  # noqa: E402
from benchmarks.common import bench_ms, gpu_name  # noqa: E402

D = cb.DataType


def fusion():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    return fd


print(f"GPU: {gpu_name()}")
for n, k in ((4096, 4096), (14336, 4096), (4096, 14336)):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    fd = fusion()
    fd.execute([x, w])
    t_new = bench_ms(lambda fd=fd, x=x, w=w: fd.execute([x, w]))
    path = fd.last_params()
    keep = mm._mma_structure
    mm._mma_structure = lambda f, e: "forced: the SIMT path, as before"
    try:
        old = fusion()
        old.execute([x, w])
        t_old = bench_ms(lambda fd=old, x=x, w=w: fd.execute([x, w]))
    finally:
        mm._mma_structure = keep
    t_cub = bench_ms(lambda x=x, w=w: x @ w.T)
    print(
        f"1x{n}x{k}: tensor cores {t_new * 1e3:7.1f} us | SIMT (before) {t_old * 1e3:8.1f} us | cuBLAS {t_cub * 1e3:6.1f} us"
        f"  [{path.brief() if hasattr(path, 'brief') else path}]",
        flush=True,
    )
