"""circbuf matmul: a bf16 matmul with a gelu epilogue on Hopper's tensor cores.

    python examples/matmul.py

The fusion is the one ARCHITECTURE.md shows: ``gelu(a @ b)`` cast to bf16,
scheduled persistent with a 4-stage ring. With a CUDA GPU it runs and checks
against torch; without one it compiles for sm_90a with NVRTC, prints the
params, the kernel IR (producer warp, consumer warpgroups, wgmmas, the TMA
store epilogue) and the SASS instruction mix, and says it did not run it; with
``CIRCBUF_INTERPRET=1`` it runs a smaller one on the CPU in circbuf's kernel
interpreter (the wgmmas through their descriptors) against torch.
"""

from __future__ import annotations

import re
import sys

import torch

import circbuf as cb
from circbuf import knobs

D = cb.DataType


def build():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        c = fd.ops.matmul(a, b)  # bf16 out, fp32 accumulate
        fd.add_output(fd.ops.cast(fd.ops.gelu(c), D.BFloat16))
    fd.fusion.schedule(persistent=True, stages=4)
    return fd


def main() -> int:
    fd = build()
    print(fd.fusion.print_math(), "\n")
    gpu = torch.cuda.is_available()
    interp = not gpu and knobs.interpret()  # CIRCBUF_INTERPRET=1: execute runs CPU tensors in the interpreter
    dev = "cuda" if gpu else "cpu"
    m, n, k = (128, 256, 512) if interp else (2048, 2048, 1024)  # interpreted: 8 k steps, 4 stages
    a = torch.randn(m, k, dtype=torch.bfloat16, device=dev) / 8
    b = torch.randn(k, n, dtype=torch.bfloat16, device=dev) / 8
    ck = fd.compile([a, b], arch=None if gpu else "sm_90a")
    print(ck.params)
    print("----- kernel IR -----")
    print(ck.kernel_ir)
    try:
        sass = ck.sass()
        mix = {op: len(re.findall(op, sass)) for op in ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG")}
        shapes = set(re.findall(r"HGMMA\.\S+", sass))
        print(f"SASS: {mix}; {shapes}; resources {ck.resource_usage()}")
    except RuntimeError as e:  # cuobjdump is optional
        print(f"cubin for {ck.arch}: {len(ck.cubin)} bytes ({e})")
    if not gpu and not interp:
        print("\nNo CUDA GPU here: compiled for sm_90a with NVRTC but did not run the kernel.")
        return 0
    (out,) = fd.execute([a, b])
    ref = torch.nn.functional.gelu(a.double() @ b.double())
    err = ((out.double() - ref).norm() / ref.norm()).item()
    where = torch.cuda.get_device_name() if gpu else "the CPU (CIRCBUF_INTERPRET=1: the kernel interpreter)"
    print(f"\nran on {where}: |circbuf - torch| / |torch| = {err:.2e}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
