"""Tile shape and raster group (issue 18, 3000x5000x4000 at 0.79-0.88x
cuBLAS): the cooperative kernel's 128x256 tile, raster group 8, against
group 16 and a 256x128 tile. cuBLAS in the same run; do_bench median,
TFLOP/s (ratio to cuBLAS). A first run found 128x192 slower everywhere
(3000x5000x4000 0.757 against 0.791) and 256x128 faster there (0.878).

    PYTHONPATH=. python scripts/probe_tile_waves.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from benchmarks.matmul import inputs, tflops, torch_mm  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

SHAPES = [(3000, 5000, 4000, "matmul"), (5000, 3000, 4000, "matmul"), (3000, 3000, 3000, "matmul"),
          (6000, 5000, 4000, "matmul"), (2000, 7000, 4096, "matmul"), (4096, 4096, 4096, "matmul"),
          (8192, 8192, 1024, "matmul"), (8192, 8192, 8192, "matmul"), (3000, 5000, 4000, "linear"),
          (4096, 14336, 4096, "linear")]  # fmt: skip
VARIANTS = {
    "default": {},
    "group 16": dict(group=16),
    "256x128 s4": dict(tile=(256, 128, 64), stages=4),
    "256x128 s4 g16": dict(tile=(256, 128, 64), stages=4, group=16),
}

print(f"GPU: {gpu_name()}")
for m, n, k, kind in SHAPES:
    a, b = inputs(m, n, k, kind)
    fn = torch_mm(kind)
    t_ref = bench_ms(lambda fn=fn, a=a, b=b: fn(a, b))
    line = [f"{m}x{n}x{k} {kind}: cuBLAS {tflops(m, n, k, t_ref):.0f}"]
    for name, ov in VARIANTS.items():
        fd = mm_fusion(kind)
        if ov:
            fd.fusion.schedule(**ov)
        (out,) = fd.execute([a, b])
        torch.testing.assert_close(out.float(), fn(a.float(), b.float()), rtol=2e-2, atol=2e-1)
        t = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
        line.append(f"{name} {tflops(m, n, k, t):.0f} ({t_ref / t:.3f})")
    print(" | ".join(line), flush=True)
