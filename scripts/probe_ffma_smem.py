"""Issue 18: the FFMA path with its operand tiles in shared memory
(``schedule(ffma_smem=True)``: cp.async into a two-slot ring, LDS.128 reads, one
block sync a k step) against the register-only FFMA kernel and cuBLAS's fp32 GEMM
(TF32 off), matmul and linear at 2048^3 and 4096^3, triton's do_bench median.
Each kernel's result is checked against float64 (max error / max |ref|; torch's
own fp32 error beside it). Extra arguments: override sets to time as well, as
``key=value,key=value`` (e.g. ``ffma_smem=True,k_step=8``).

    PYTHONPATH=. python scripts/probe_ffma_smem.py
    PYTHONPATH=. python scripts/probe_ffma_smem.py ffma_smem=True,k_step=8 ffma_smem=True,blocks_per_sm=1
"""

from __future__ import annotations

import ast
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.common import bench_ms, gpu_name, require_cuda  # noqa: E402
from benchmarks.matmul import path, tflops, torch_mm  # noqa: E402
from circbuf import DataType  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

SHAPES = [(2048, 2048, 2048, "matmul"), (4096, 4096, 4096, "matmul"), (2048, 2048, 2048, "linear"),
          (4096, 4096, 4096, "linear")]  # fmt: skip


def _variants() -> list:
    out = [("ffma", {}), ("ffma_smem", {"ffma_smem": True})]
    for arg in sys.argv[1:]:
        ov = {}
        for part in arg.split(","):
            key, value = part.split("=", 1)
            ov[key] = ast.literal_eval(value)
        out.append((arg, ov))
    return out


def main():
    require_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"GPU: {gpu_name()}  fp32 operands, TF32 off, do_bench median")
    print(
        f"{'shape':>16s} {'kind':>6s} {'kernel':>12s} {'ms':>8s} {'TF/s':>6s} {'vs cuBLAS':>9s} {'err/max':>8s}  params"
    )
    for m, n, k, kind in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda", generator=g)
        b = torch.randn((n, k) if kind == "linear" else (k, n), device="cuda", generator=g)
        fn = torch_mm(kind)
        ref = fn(a.double(), b.double())
        scale = ref.abs().max()
        t_blas = bench_ms(lambda f=fn, a=a, b=b: f(a, b))
        err_t = ((fn(a, b).double() - ref).abs().max() / scale).item()
        shape = f"{m}x{n}x{k}"
        print(f"{shape:>16s} {kind:>6s} {'cuBLAS':>12s} {t_blas:8.3f} {tflops(m, n, k, t_blas):6.1f} "
              f"{1.0:9.3f} {err_t:8.1e}", flush=True)  # fmt: skip
        for name, ov in _variants():
            fd = mm_fusion(kind, dtype=DataType.Float)
            if ov:
                fd.fusion.schedule(**ov)
            (out,) = fd.execute([a, b])
            err = ((out.double() - ref).abs().max() / scale).item()
            ok = err <= 8 * max(err_t, 2.0**-23)
            t = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
            print(f"{'':>16s} {'':>6s} {name[:12]:>12s} {t:8.3f} {tflops(m, n, k, t):6.1f} {t_blas / t:9.3f} "
                  f"{err:8.1e}{'' if ok else ' WRONG'}  {path(fd)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
