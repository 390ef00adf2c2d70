"""Circular buffering by hand: stage tiles of x in shared memory with TMA and
pipeline them, then let the normalization scheduler do the same for rms_norm.

    python examples/circular_buffer.py

Prints the kernel IR of both (the pipeline the circular-buffer pass derived:
barriers, prologue, the loop that issues ahead and waits). On a GPU it also
runs them against torch; without one it compiles for sm_90a and says so, or
with ``CIRCBUF_INTERPRET=1`` runs them on the CPU in circbuf's kernel
interpreter (fewer rows) against torch.
"""

from __future__ import annotations

import sys

import torch

import circbuf as cb
from circbuf import knobs
from circbuf.scheduler import propagate_transforms

D, P = cb.DataType, cb.ParallelType


def exp_tiles(stages: int = 3):
    """y = bf16(exp(x)), x staged through shared memory in [2 x 128] tiles."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.cast(fd.ops.exp(x), D.BFloat16)
        fd.add_output(y)
    xs = x.cache_after(op="tma")  # shared memory, filled by bulk tensor copies
    y.split(1, 128).split(0, 2)  # [I/2, 2, J/128, 128]
    y.reorder([0, 2, 1, 3])  # [I/2, J/128, 2, 128]: two serial loops, then threads
    y.axis(2).parallelize(P.TIDy)
    y.axis(3).parallelize(P.TIDx)
    propagate_transforms(fd.fusion, y)  # every tensor gets y's loop structure
    xs.axis(2).parallelize(P.Bulk)  # the [2 x 128] box moves in one copy
    xs.axis(3).parallelize(P.Bulk)
    xs.inline_at(2)  # one tile per iteration of the two serial loops
    for tv in fd.fusion.used_tvs():
        if tv is not xs and not tv.is_input and not tv.is_output:
            tv.inline_at(4)
    # a producer row of threads walks both loops issuing copies; one ring
    # of `stages` slots spans both loops (stage = linear iteration % stages)
    xs.circular_buffer(stages, type=cb.WarpSpecialized(on=P.TIDy))
    return fd


def rms_norm():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.rms_norm(x, w, 1e-6))
    fd.fusion.schedule(stages=3)  # the scheduler builds the TMA ring itself
    return fd


def main() -> int:
    gpu = torch.cuda.is_available()
    interp = not gpu and knobs.interpret()  # CIRCBUF_INTERPRET=1: execute runs CPU tensors in the interpreter
    dev = "cuda" if gpu else "cpu"
    arch = None if gpu else "sm_90a"
    x = torch.randn(12 if interp else 300, 1000, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1000, device=dev, dtype=torch.bfloat16)

    fd1 = exp_tiles()
    ck1 = fd1.compile([x], arch=arch)
    print("----- hand-scheduled, warp-specialized -----")
    print(ck1.kernel_ir)
    fd2 = rms_norm()
    ck2 = fd2.compile([x, w], arch=arch)
    print("\n----- normalization scheduler -----")
    print(ck2.params)
    print(ck2.kernel_ir)
    if not gpu and not interp:
        print("\nNo CUDA GPU here: compiled both for sm_90a with NVRTC but did not run them.")
        return 0
    (y1,) = fd1.execute([x])
    (y2,) = fd2.execute([x, w])
    ref2 = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()
    e1 = (y1.float() - torch.exp(x.float()).bfloat16().float()).abs().max().item()
    e2 = (y2.float() - ref2.float()).abs().max().item()
    where = torch.cuda.get_device_name() if gpu else "the CPU (CIRCBUF_INTERPRET=1: the kernel interpreter)"
    print(f"\nran on {where}: max error exp {e1:.3g}, rms_norm {e2:.3g}")
    return 0 if e1 < 0.5 and e2 < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
