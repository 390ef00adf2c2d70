"""Probe (issue 18): 16-bit matmuls with a vector operand or an expanded
operand, now on the tensor cores (a one-row view of the vector; the expand
written out), against the SIMT sum of products they took before (the 1-D
matmul expr built as the frontend built it, or the expand kept in the
matmul's segment) and cuBLAS, in one run.
"""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import circbuf as cb  # noqa: E402
import circbuf.frontend_matmul as fm  # noqa: E402
import circbuf.scheduler.matmul as mm  # noqa: E402 (its can_schedule asks _split_for_tensor_cores)
from benchmarks.common import bench_ms, gpu_name  # noqa: E402

D = cb.DataType


def vector_fusion():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    return fd


def expanded_fusion(m):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(fd.ops.expand(x, [m, -1]), w))
    return fd


def brief(fd):
    p = fd.last_params()
    ps = p if isinstance(p, list) else [p]
    return " + ".join(
        ("SIMT" if getattr(q, "simt", None) is not None else type(q).__name__.replace("Params", ""))
        for q in ps
    )


def timed(make, args):
    fd = make()
    fd.execute(args)
    return bench_ms(lambda: fd.execute(args)) * 1e3, brief(fd)


print(f"GPU: {gpu_name()}  bf16, do_bench median, us")
for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(k, device="cuda", dtype=torch.bfloat16)
    t_new, p_new = timed(vector_fusion, [x, w])
    keep = fm.VECTOR_AS_MATRIX
    fm.VECTOR_AS_MATRIX = ()  # the one 1-D expr, as before
    try:
        t_old, p_old = timed(vector_fusion, [x, w])
    finally:
        fm.VECTOR_AS_MATRIX = keep
    t_cub = bench_ms(lambda x=x, w=w: torch.nn.functional.linear(x, w)) * 1e3
    gbs = n * k * 2 / (t_new * 1e-6) / 1e9
    print(
        f"linear x[{k}] W[{n},{k}]: now {t_new:7.1f} ({p_new}, {gbs:.0f} GB/s) | before {t_old:8.1f} ({p_old}) | "
        f"cuBLAS {t_cub:6.1f} | now/cuBLAS time {t_new / t_cub:.2f}",
        flush=True,
    )
for m, n, k in ((4096, 4096, 4096), (128, 4096, 4096)):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    t_new, p_new = timed(lambda m=m: expanded_fusion(m), [x, w])
    keep = mm._split_for_tensor_cores
    mm._split_for_tensor_cores = lambda f, e: None  # the expand kept in the matmul's segment, as before
    try:
        t_old, p_old = timed(lambda m=m: expanded_fusion(m), [x, w])
    finally:
        mm._split_for_tensor_cores = keep
    t_cub = bench_ms(lambda x=x, w=w, m=m, k=k: torch.nn.functional.linear(x.expand(m, k), w)) * 1e3
    print(
        f"linear x[1,{k}].expand({m}) W[{n},{k}]: now {t_new:7.1f} ({p_new}) | before {t_old:8.1f} ({p_old}) | "
        f"cuBLAS {t_cub:6.1f}",
        flush=True,
    )
