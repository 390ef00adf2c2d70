"""Issue 18 odd-N probe (helper oddstore): where the time of an odd-shape bf16
matmul goes. For each shape: the default run's kernels (torch.profiler:
realign copies vs GEMM), then the GEMM alone on pre-realigned operands under
store / ping-pong / tile / epilogue-role variants, against the aligned twin.

    PYTHONPATH=. python scripts/probe_oddstore.py [--phase 1|2]
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from benchmarks.common import kernel_us_per_call as kernels  # noqa: E402
from circbuf.realign import realigned  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

T0 = time.time()
OUT = os.environ.get("OUT", "/tmp")
RES = {}


def tf(m, n, k, ms):
    return 2 * m * n * k / ms / 1e9


def run_variant(tag, m, n, k, a, b, ref, ov):
    fd = mm_fusion("matmul")
    if ov:
        fd.fusion.schedule(**ov)
    try:
        (out,) = fd.execute([a, b])
    except Exception as e:  # noqa: BLE001
        print(f"  {tag:28s} ERROR {type(e).__name__}: {str(e)[:150]}")
        return None
    err = ((out.float() - ref).norm() / ref.norm()).item()
    ms = bench_ms(lambda: fd.execute([a, b]))
    ks = kernels(lambda: fd.execute([a, b]))
    gemm = max(ks.values()) if ks else float("nan")
    p = fd.last_params()
    brief = p.brief() if hasattr(p, "brief") else str(p)
    st = getattr(p, "store", "?")
    print(
        f"  {tag:28s} {ms * 1e3:8.1f}us {tf(m, n, k, ms):6.1f}TF  kernel {gemm:8.1f}us "
        f"{tf(m, n, k, gemm / 1e3):6.1f}TF err {err:.1e} [{st}] {brief[:90]}",
        flush=True,
    )
    RES[tag] = dict(ms=ms, kernel_us=gemm, kernels=ks, err=err, params=brief)
    return gemm


VARIANTS = {
    "coop256 rows(def)": {},
    "coop256 direct": {"store": "direct"},
    "coop256 rows e32": {"epilogue_tile": (64, 32)},
    "coop128 rows": {"tile": (128, 128, 64)},
    "coop128 direct": {"tile": (128, 128, 64), "store": "direct"},
    "pp128 rows": {"pingpong": True},
    "pp128 direct": {"pingpong": True, "store": "direct"},
    "pp128x192 rows": {"pingpong": True, "tile": (128, 192, 64)},
    "role128 direct": {"epilogue": "role"},
    "coop256x128 rows": {"tile": (256, 128, 64)},
}
TWIN = {
    "coop256 tma(def)": {},
    "coop128 tma": {"tile": (128, 128, 64)},
    "pp128 tma": {"pingpong": True},
    "role128": {"epilogue": "role"},
}


def shape(m, n, k, twin):
    print(f"\n== {m}x{n}x{k} (twin {twin})  t={time.time() - T0:.0f}s", flush=True)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    t_cub = bench_ms(lambda: a @ b)
    print(f"  cuBLAS {t_cub * 1e3:.1f}us {tf(m, n, k, t_cub):.1f}TF kernels {kernels(lambda: a @ b)}")
    fd = mm_fusion("matmul")
    fd.execute([a, b])
    t = bench_ms(lambda: fd.execute([a, b]))
    ks = kernels(lambda: fd.execute([a, b]))
    print(
        f"  default e2e {t * 1e3:.1f}us {tf(m, n, k, t):.1f}TF ({t_cub / t:.2f}x cuBLAS); kernels (us/call):"
    )
    for kk, v in sorted(ks.items(), key=lambda x: -x[1]):
        print(f"     {v:8.1f}  {kk}")
    print(f"     sum {sum(ks.values()):.1f}us; realigned {fd._get_executor().realigned}")
    RES[f"{m}x{n}x{k} e2e"] = dict(ms=t, kernels=ks, cublas_ms=t_cub)
    # copies alone
    for nm, x in (("A", a), ("B", b)):
        if x.stride(0) * 2 % 16:
            tc = bench_ms(lambda x=x: realigned(x))
            nb = x.numel() * 2 * 2
            print(f"  realign copy {nm}: {tc * 1e3:.1f}us {nb / tc / 1e6:.0f} GB/s")
    aa = realigned(a) if a.stride(0) * 2 % 16 else a
    bb = realigned(b) if b.stride(0) * 2 % 16 else b
    for tag, ov in VARIANTS.items():
        run_variant(tag, m, n, k, aa, bb, ref, ov)
    a2 = torch.randn(twin[0], twin[2], device="cuda", dtype=torch.bfloat16)
    b2 = torch.randn(twin[2], twin[1], device="cuda", dtype=torch.bfloat16)
    ref2 = a2.float() @ b2.float()
    for tag, ov in TWIN.items():
        run_variant("twin " + tag, *twin, a2, b2, ref2, ov)
    del ref, ref2


def main():
    print(f"GPU: {gpu_name()} torch {torch.__version__}")
    shape(2047, 2047, 2047, (2048, 2048, 2048))
    shape(4096, 50257, 768, (4096, 50264, 768))
    with open(os.path.join(OUT, "probe_oddstore.json"), "w") as f:
        json.dump(RES, f, indent=1, default=str)
    print(f"done t={time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
