"""circbuf quickstart: define a fusion, compile it for Hopper, run it.

    python examples/quickstart.py

On a machine with a CUDA GPU it runs the kernel on torch tensors and checks it
against torch. With no GPU it still compiles the fusion for sm_90a with NVRTC,
prints the generated kernel and its resource usage, and says it did not run it;
with ``CIRCBUF_INTERPRET=1`` it runs the kernel on the CPU in circbuf's kernel
interpreter (at a smaller size) and checks it against torch.
"""

from __future__ import annotations

import sys

import torch

import circbuf as cb
from circbuf import knobs

D = cb.DataType


def build():
    # y = bf16(gelu(x * w + b)) with a per-column bias: one kernel, fp32 math inside
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        y = fd.ops.gelu(fd.ops.add(fd.ops.mul(x, w), b))
        fd.add_output(fd.ops.cast(y, D.BFloat16))
    return fd


def main() -> int:
    fd = build()
    print(fd.fusion.print_math(), "\n")
    gpu = torch.cuda.is_available()
    interp = not gpu and knobs.interpret()  # CIRCBUF_INTERPRET=1: execute runs CPU tensors in the interpreter
    dev = "cuda" if gpu else "cpu"
    rows, cols = (48, 1024) if interp else (4096, 4096)
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device=dev)
    w = torch.randn(rows, cols, dtype=torch.bfloat16, device=dev)
    b = torch.randn(cols, dtype=torch.bfloat16, device=dev)

    ck = fd.compile([x, w, b], arch=None if gpu else "sm_90a")
    print(ck.params)
    print("----- kernel IR -----")
    print(ck.kernel_ir)
    print("----- CUDA (kernel body; the prelude is above it in ck.cuda) -----")
    print(ck.cuda[ck.cuda.index('extern "C"') :])
    try:
        print(f"cubin for {ck.arch}: {len(ck.cubin)} bytes, resources {ck.resource_usage()}")
    except RuntimeError as e:  # cuobjdump is optional
        print(f"cubin for {ck.arch}: {len(ck.cubin)} bytes ({e})")

    if not gpu and not interp:
        print("\nNo CUDA GPU here: compiled for sm_90a with NVRTC but did not run the kernel.")
        return 0
    (out,) = fd.execute([x, w, b])
    ref = torch.nn.functional.gelu(x.float() * w.float() + b.float()).bfloat16()
    err = (out.float() - ref.float()).abs().max().item()
    where = torch.cuda.get_device_name() if gpu else "the CPU (CIRCBUF_INTERPRET=1: the kernel interpreter)"
    print(f"\nran on {where}: max |circbuf - torch| = {err:.3g}")
    return 0 if err <= 0.0625 else 1


if __name__ == "__main__":
    sys.exit(main())
