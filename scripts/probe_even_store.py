"""Probe (issue 18, the output side): a 16-bit output whose rows are 4- or
8-byte aligned (N = 2046, 2044, 50258), stored by rows from the staging tile
(the default since the tenth session) against from the accumulator's
registers in pairs (``store="direct"``, the default before), and the TMA
store at the aligned N; kernel time through do_bench of ``fd.execute`` on
operands already aligned (only the output's rows differ).

    python scripts/probe_even_store.py
"""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

print(f"GPU: {gpu_name()}  bf16 matmul, do_bench median, us")
for m, n, k in [(2048, 2046, 2048), (2048, 2044, 2048), (2048, 2048, 2048), (4096, 50258, 768), (4096, 50264, 768),
                (8192, 8190, 1024)]:  # fmt: skip
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(k, n, device="cuda").bfloat16()
    line = f"{m}x{n}x{k}:"
    outs = {}
    for name, ov in (("default", {}), ("direct", {"store": "direct"})):
        fd = mm_fusion("matmul")
        if ov:
            fd.fusion.schedule(**ov)
        (outs[name],) = fd.execute([a, b])
        store = fd.last_params().store
        t = bench_ms(lambda fd=fd, ins=(a, b): fd.execute(list(ins))) * 1e3
        line += f"  {name} ({store}) {t:7.1f}"
    print(line, " same:", torch.equal(outs["default"], outs["direct"]), flush=True)
