"""Probe (issue 17): the knobs around a fused epilogue, one at a time against the
heuristic's cooperative 128x256 kernel and ping-pong 64x256: ring depth (stages),
the setmaxnreg split (registers), the epilogue sub-tile (epilogue_tile). linear +
bias + {relu, gelu}, bf16, 8192x8192x1024, bare cuBLAS GEMM in the same run; two
timings per variant, us::

    PYTHONPATH=. python scripts/probe_epilogue_knobs.py
"""

from __future__ import annotations

import os

os.environ["CIRCBUF_CACHE_DIR"] = ""  # no disk cache: each variant compiled here

import torch  # noqa: E402

from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from benchmarks.matmul import _torch_epilogue  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

COOP = dict(tile=(128, 256, 64))
PP = dict(pingpong=True, tile=(64, 256, 64))
VARIANTS = {
    "coop (4 stages, 40/232, 64x64)": COOP,
    "coop stages=3": dict(COOP, stages=3),
    "coop registers=(24, 240)": dict(COOP, registers=(24, 240)),
    "coop epilogue_tile=(64, 32)": dict(COOP, epilogue_tile=(64, 32)),
    "coop epilogue_tile=(64, 128)": dict(COOP, epilogue_tile=(64, 128)),
    "pp 64x256": PP,
    "pp stages=3": dict(PP, stages=3),
    "pp stages=5": dict(PP, stages=5),
    "pp registers=(24, 240)": dict(PP, registers=(24, 240)),
}


def main():
    m, n, k = 8192, 8192, 1024
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 8
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    t_gemm = bench_ms(lambda: x @ w.T) * 1e3
    print(f"GPU: {gpu_name()}  linear + bias + epilogue {m}x{n}x{k} bf16, us; bare cuBLAS {t_gemm:.0f}")
    for ep in ("relu", "gelu"):
        ref = _torch_epilogue(ep)(x.double(), w.double(), bias.double())
        for tag, ov in VARIANTS.items():
            fd = mm_fusion("linear", bias=True, epilogue=ep)
            try:
                fd.fusion.schedule(**ov)
                (out,) = fd.execute([x, w, bias])
            except Exception as e:  # noqa: BLE001 - a variant that does not fit is reported
                print(f"  {ep:>4s} {tag:32s} n/a ({type(e).__name__}: {str(e)[:70]})", flush=True)
                continue
            assert (out.double() - ref).abs().max().item() < 0.1
            ts = [bench_ms(lambda fd=fd: fd.execute([x, w, bias])) * 1e3 for _ in range(2)]
            print(
                f"  {ep:>4s} {tag:32s} {ts[0]:5.0f} / {ts[1]:5.0f}  ({min(ts) / t_gemm:.3f} of bare)",
                flush=True,
            )


if __name__ == "__main__":
    main()
