"""Probe: programmatic dependent launch (``CIRCBUF_PDL``, ``cb::grid_dependency``)
on plans of several kernels, on and off in the same run: split-K decode
(partial products, then their reduction), a vector linear (three kernels),
a segmented reduction pair, and an odd-shape matmul (torch's realign copies,
then the GEMM). do_bench medians, us."""

import os
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import circbuf as cb  # noqa: E402
from benchmarks.common import bench_ms, gpu_name  # noqa: E402

D = cb.DataType


def linear2d():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    return fd


def linear1d():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    return fd


def two_sums():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.sum(x, [1]))
    return fd


def matmul():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    return fd


def bf16(*s):
    return torch.randn(*s, device="cuda").bfloat16()


CASES = [
    ("linear 1x4096x4096 (split-K)", linear2d, lambda: [bf16(1, 4096), bf16(4096, 4096)]),
    ("linear 1x4096x14336 (split-K)", linear2d, lambda: [bf16(1, 14336), bf16(4096, 14336)]),
    ("linear 16x4096x4096 (split-K)", linear2d, lambda: [bf16(16, 4096), bf16(4096, 4096)]),
    ("linear x[4096] W[4096,4096] (3 kernels)", linear1d, lambda: [bf16(4096), bf16(4096, 4096)]),
    (
        "sum(x, 0), sum(x, 1) 4096x4096 fp32 (2 kernels)",
        two_sums,
        lambda: [torch.randn(4096, 4096, device="cuda")],
    ),
    ("matmul 2047^3 (realign copies + GEMM)", matmul, lambda: [bf16(2047, 2047), bf16(2047, 2047)]),
    ("matmul 4096^3 (1 kernel)", matmul, lambda: [bf16(4096, 4096), bf16(4096, 4096)]),
]
print(f"GPU: {gpu_name()}  do_bench median, us (PDL on / off)")
for name, make, inputs in CASES:
    xs = inputs()
    t = {}
    outs = {}
    for pdl in ("1", "0"):
        os.environ["CIRCBUF_PDL"] = pdl  # read when a plan's launcher is made
        fd = make()
        outs[pdl] = fd.execute(xs)
        t[pdl] = bench_ms(lambda fd=fd, xs=xs: fd.execute(xs)) * 1e3
    same = all(torch.equal(a, b) for a, b in zip(outs["1"], outs["0"]))
    print(
        f"{name:>48s}: on {t['1']:8.1f} | off {t['0']:8.1f} | on/off {t['1'] / t['0']:.3f} | same bits {same}",
        flush=True,
    )
os.environ["CIRCBUF_PDL"] = "1"
