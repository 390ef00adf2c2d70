"""Probe (issue 18, split-K summed in the GEMM kernel): for each shape, cuBLAS and
circbuf's heuristic, then each split (1, 2, 4, 8; summed by the kernel's last CTA)
and the reduction-kernel variant (2, 4), same run, do_bench medians; every
variant's result against float64 torch and run twice for the same bits::

    PYTHONPATH=. python scripts/probe_split_k.py [--quick]

Prints us and GB/s (A + B + C bytes) or TF/s per variant, the heuristic's path.
"""

from __future__ import annotations

import sys

import torch

from benchmarks.common import bench_ms, gpu_name
from benchmarks.matmul import DECODE_VARIANTS, gbps, path, tflops
from tests.test_gpu_matmul import mm_fusion

SHAPES = [
    (1, 4096, 4096),
    (1, 4096, 14336),
    (16, 4096, 4096),
    (16, 4096, 14336),
    (64, 4096, 4096),
    (64, 4096, 14336),
    (1, 14336, 4096),
    (1, 128256, 4096),
    (3000, 5000, 4000),
    (256, 256, 65536),
]
# the decode benchmark's variants: split counts summed in the kernel and by a reduction kernel
VARIANTS = {tag: ov for tag, ov in DECODE_VARIANTS.items() if set(ov) <= {"split_k", "split_k_sum"}}


def _shape(m, n, k) -> int:
    """One shape's line; returns the variants that were wrong or not deterministic."""
    kind = "linear" if m <= 64 or n == 128256 else "matmul"
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device="cuda", dtype=torch.bfloat16, generator=g)
    fn = (lambda: torch.nn.functional.linear(a, b)) if kind == "linear" else (lambda: a @ b)
    ref = a.double() @ (b.double().T if kind == "linear" else b.double())

    def rate(t):
        return f"{gbps(m, n, k, t):5.0f} GB/s" if m <= 64 else f"{tflops(m, n, k, t):5.0f} TF/s"

    t_ref = bench_ms(fn)
    cells, bad = [f"cuBLAS {t_ref * 1e3:7.1f} us {rate(t_ref)}"], 0
    for tag, ov in [("heuristic", {})] + list(VARIANTS.items()):
        fd = mm_fusion(kind)
        if ov:
            fd.fusion.schedule(**ov)
        try:
            (o1,) = fd.execute([a, b])
            (o2,) = fd.execute([a, b])
        except Exception as e:  # noqa: BLE001 - a variant that does not apply is reported
            cells.append(f"{tag} n/a ({str(e)[:60]})")
            continue
        err = ((o1.double() - ref).norm() / ref.norm()).item()
        same = torch.equal(o1.view(torch.int16), o2.view(torch.int16))
        ok = err < 1e-2 and same and torch.isfinite(o1).all().item()
        bad += not ok
        t = bench_ms(lambda fd=fd: fd.execute([a, b]))
        flag = "" if ok else f" WRONG(err {err:.1e}, same bits {same})"
        cells.append(f"{tag} {t * 1e3:7.1f} us {rate(t)} x{t_ref / t:5.3f}{flag}")
        if tag == "heuristic":
            cells[-1] += f" [{path(fd)}]"
    print(f"{m}x{n}x{k}:\n  " + "\n  ".join(cells), flush=True)
    return bad


def main():
    quick = "--quick" in sys.argv
    print(f"GPU: {gpu_name()}  linear x @ W.T bf16 (3000x5000x4000, 256x256x65536: matmul), do_bench us")
    bad = sum(_shape(m, n, k) for m, n, k in (SHAPES[:3] if quick else SHAPES))
    print(f"variants wrong or not deterministic: {bad}")


if __name__ == "__main__":
    main()
