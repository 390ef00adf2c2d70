"""Probe (issue 17, epilogue operands): how many bytes of a bias a thread loads
ahead of the epilogue's sub-tile loops (``matmul.EPILOGUE_LOAD_AHEAD_BYTES``):
0 (a sub-tile's pairs after each sub-tile's barrier: four L2 latencies per
128x256 tile), 64 (half a tile's: two), 128 (the tile's: one, but ptxas spills
beside the 128-register accumulator). linear + bias (+ relu / gelu / silu),
bf16, the heuristic's schedule and ping-pong 64x256, bare cuBLAS in the same
run; two timings each, us::

    PYTHONPATH=. python scripts/probe_bias_ahead.py
"""

from __future__ import annotations

import os

os.environ["CIRCBUF_CACHE_DIR"] = ""  # no disk cache: the variants differ by a module constant

import torch  # noqa: E402

import circbuf.scheduler.matmul as M  # noqa: E402
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from benchmarks.matmul import _torch_epilogue  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402


def main():
    print(f"GPU: {gpu_name()}  linear + bias, bf16, us (two timings)")
    for m, n, k, schedules in [
        (8192, 8192, 1024, {"heuristic": {}, "pp 64x256": dict(pingpong=True, tile=(64, 256, 64))}),
        (4096, 14336, 4096, {"heuristic": {}}),
    ]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 8
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        t_gemm = bench_ms(lambda x=x, w=w: x @ w.T) * 1e3
        print(f"{m}x{n}x{k}: bare cuBLAS {t_gemm:.0f}", flush=True)
        for ep in (None, "relu", "gelu", "silu"):
            if ep is None:
                want = torch.nn.functional.linear(x.double(), w.double(), bias.double())
            else:
                want = _torch_epilogue(ep)(x.double(), w.double(), bias.double())
            for tag, ov in schedules.items():
                if tag != "heuristic" and ep == "silu":
                    continue
                line = f"  {ep or 'bias':>4s} {tag:10s}"
                for ahead in (0, 64, 128):
                    M.EPILOGUE_LOAD_AHEAD_BYTES = ahead
                    fd = mm_fusion("linear", bias=True, epilogue=ep)
                    if ov:
                        fd.fusion.schedule(**ov)
                    (out,) = fd.execute([x, w, bias])
                    ok = (out.double() - want).abs().max().item() < 0.1
                    ts = [bench_ms(lambda fd=fd: fd.execute([x, w, bias])) * 1e3 for _ in range(2)]
                    line += f" | {ahead:3d}: {ts[0]:6.1f} / {ts[1]:6.1f} ({min(ts) / t_gemm:.3f})"
                    line += "" if ok else " WRONG"
                print(line, flush=True)
    M.EPILOGUE_LOAD_AHEAD_BYTES = 64


if __name__ == "__main__":
    main()
