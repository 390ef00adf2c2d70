"""Probe (issue 18, decode): is a split-K decode step bound by its kernels or by
the host path that launches them? For each decode shape: do_bench of the call
(what the benchmark reports), the GPU time of its kernels per call (torch.profiler,
summed over the call's kernels, PDL off so that kernels do not overlap), and the
host time per call (a loop of calls, the clock stopped before the GPU finishes),
for circbuf and torch's linear (cuBLAS), same run, us::

    PYTHONPATH=. python scripts/probe_decode_host.py
"""

from __future__ import annotations

import os

import torch

from benchmarks.common import bench_ms, gpu_name, host_us_per_call, kernel_us_per_call
from tests.test_gpu_matmul import mm_fusion

SHAPES = [(1, 4096, 4096), (1, 4096, 14336), (16, 4096, 4096), (64, 4096, 4096), (1, 14336, 4096)]
CALLS = 200  # per profile and per host timing


def main():
    print(
        f"GPU: {gpu_name()}  linear x @ W.T bf16; us per call: do_bench | kernels' GPU time (distinct kernels) | host"
    )
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        fd = mm_fusion("linear")
        fd.execute([x, w])
        os.environ["CIRCBUF_PDL"] = "0"  # read at plan build: kernel times that do not overlap
        fd_serial = mm_fusion("linear")
        fd_serial.execute([x, w])
        os.environ.pop("CIRCBUF_PDL")
        rows = {
            "cuBLAS": (lambda x=x, w=w: torch.nn.functional.linear(x, w),) * 2,
            "circbuf": (
                lambda fd=fd, x=x, w=w: fd.execute([x, w]),
                lambda fd=fd_serial, x=x, w=w: fd.execute([x, w]),
            ),
        }
        cells = []
        for tag, (fn, fn_serial) in rows.items():
            h = host_us_per_call(fn, CALLS, until_done=False)
            b = bench_ms(fn) * 1e3
            ks = kernel_us_per_call(fn_serial, CALLS)
            g, nk = sum(ks.values()), len(ks)
            cells.append(f"{tag} {b:6.1f} | {g:6.1f} ({nk}) | {h:5.1f}")
        ps = fd.last_params()
        brief = " + ".join(p.brief() for p in ps) if isinstance(ps, list) else ps.brief()
        print(f"{m}x{n}x{k}: " + "  ||  ".join(cells) + f"  [{brief}]", flush=True)


if __name__ == "__main__":
    main()
