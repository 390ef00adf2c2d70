"""Compile the matmul epilogue variants with this machine's NVRTC and report
resources and any local-memory instructions (a diagnostic for the GPU machine).

    PYTHONPATH=. python scripts/sass_probe.py
"""

import re
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from circbuf.runtime.nvrtc import nvrtc_version  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

print("NVRTC", nvrtc_version())
cases = [("matmul", e, False) for e in ("gelu", "silu", "relu", "tanh_gelu", "residual", None)]
cases.append(("linear", "gelu", True))
for kind, epi, bias in cases:
    fd = mm_fusion(kind, epilogue=epi, bias=bias)
    a = torch.randn(512, 256, dtype=torch.bfloat16)
    b = torch.randn((384, 256) if kind == "linear" else (256, 384), dtype=torch.bfloat16)
    ins = [a, b] + ([torch.randn(384, dtype=torch.bfloat16)] if bias else [])
    if epi == "residual":
        ins.append(torch.randn(512, 384, dtype=torch.bfloat16))
    ck = fd.compile(ins, arch="sm_90a")
    sass = ck.sass()
    hits = [m.start() for m in re.finditer(r"\b(LDL|STL)\b", sass)]
    print(kind, epi, bias, ck.resource_usage(), "local:", len(hits))
    for h in hits[:3]:
        print("   ", repr(sass[max(0, h - 200) : h + 80]))
