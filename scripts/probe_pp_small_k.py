"""Probe (issue 17, the heuristic): cooperative 128x256 (the heuristic's
choice) against ping-pong 64x256 for linear with fused epilogues at small K,
where the epilogue is a large share of a tile's time; bf16, bare cuBLAS in the
same run, two timings each, us; the last column pp / coop (best of two)::

    PYTHONPATH=. python scripts/probe_pp_small_k.py
"""

from __future__ import annotations

import torch

from benchmarks.common import bench_ms, gpu_name
from benchmarks.matmul import _torch_epilogue
from tests.test_gpu_matmul import mm_fusion

SHAPES = [(8192, 8192, 1024), (4096, 4096, 1024), (16384, 8192, 512), (2048, 8192, 1024), (8192, 8192, 2048)]
EPILOGUES = [None, "bias", "relu", "gelu", "silu", "tanh_gelu", "residual"]
VARIANTS = {"coop 128x256": dict(tile=(128, 256, 64)), "pp 64x256": dict(pingpong=True, tile=(64, 256, 64))}


def main():
    print(f"GPU: {gpu_name()}  linear (+ epilogue), bf16, us (two timings); pp / coop")
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 8
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        t_gemm = bench_ms(lambda x=x, w=w: x @ w.T) * 1e3
        print(f"{m}x{n}x{k}: bare cuBLAS {t_gemm:.0f}", flush=True)
        for ep in EPILOGUES:
            if ep is None:
                ins, want = [x, w], x.double() @ w.double().T
            elif ep == "bias":
                ins = [x, w, bias]
                want = torch.nn.functional.linear(*(t.double() for t in ins))
            else:
                ins = [x, w, res if ep == "residual" else bias]
                want = _torch_epilogue(ep)(*(t.double() for t in ins))
            line, best = f"  {ep or 'bare':>9s}", {}
            for tag, ov in VARIANTS.items():
                fd = mm_fusion(
                    "linear", bias=ep not in (None, "residual"), epilogue=None if ep == "bias" else ep
                )
                fd.fusion.schedule(**ov)
                (out,) = fd.execute(ins)
                ok = (out.double() - want).abs().max().item() < 0.1
                ts = [bench_ms(lambda fd=fd, ins=ins: fd.execute(ins)) * 1e3 for _ in range(2)]
                best[tag] = min(ts)
                line += f" | {tag} {ts[0]:6.1f} / {ts[1]:6.1f} ({min(ts) / t_gemm:.3f})" + (
                    "" if ok else " WRONG"
                )
            print(line + f" | pp/coop {best['pp 64x256'] / best['coop 128x256']:.3f}", flush=True)


if __name__ == "__main__":
    main()
