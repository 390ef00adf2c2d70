"""Outer (column) reduction benchmark: sum over axis 0 of bf16 [R, C] tensors,
the TMA strip kernel and the plain one-thread-per-column kernel side by side,
against torch eager, a static per-shape torch.compile (benchmarks.common.static_compile) and a device-to-device copy in the same run.

    PYTHONPATH=. python benchmarks/outer_reduction.py [--sweep]
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import circbuf as cb  # noqa: E402
from benchmarks.common import (  # noqa: E402
    bench_ms,
    copy_bandwidth_gbs,
    gpu_name,
    require_cuda,
    static_compile,
    write_json,
)

D = cb.DataType
SHAPES = [(32768, 4096), (8192, 16384), (65536, 1024), (16384, 3000)]


def make(**overrides):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.cast(x, D.Float), [0]), D.BFloat16))
    if overrides:
        fd.fusion.schedule(**overrides)
    return fd


def torch_fn(x):
    return x.float().sum(0).to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="time strip widths x stage counts")
    args = ap.parse_args()
    require_cuda()
    copy_gbs = copy_bandwidth_gbs(1 << 28)
    print(f"GPU: {gpu_name()}   sum over axis 0, bf16   copy bandwidth {copy_gbs:.0f} GB/s")
    if args.sweep:
        return sweep(copy_gbs)
    rows = []
    for R, C in SHAPES:
        compiled = static_compile(torch_fn)  # per shape: see static_compile
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        nbytes = (R * C + C) * 2
        ref = torch_fn(x).float()
        t = {}
        for name, ov in (("tma", {}), ("plain", {"tma": False})):
            fd = make(**ov)
            (out,) = fd.execute([x])
            err = ((out.float() - ref).abs() / (ref.abs() + 1)).max().item()
            assert err < 0.05, (name, err)
            t[name] = bench_ms(lambda fd=fd, x=x: fd.execute([x]))
            if name == "tma":
                params = str(fd.last_params()).replace("\n", " ")
        compiled(x)
        t["eager"] = bench_ms(lambda x=x: torch_fn(x))
        t["compile"] = bench_ms(lambda x=x, c=compiled: c(x))
        rows.append(
            {
                "shape": f"{R}x{C}",
                **{f"{k}_ms": v for k, v in t.items()},
                "of_copy": nbytes / t["tma"] / 1e6 / copy_gbs,
                "vs_compile": t["compile"] / t["tma"],
                "vs_eager": t["eager"] / t["tma"],
                "params": params,
            }
        )
    print(
        f"{'shape':12s} {'TMA':>7s} {'plain':>7s} {'eager':>7s} {'compile':>7s} {'of copy':>8s} {'x compile':>9s} {'x eager':>8s}"
    )
    for r in rows:
        print(
            f"{r['shape']:12s} {r['tma_ms']:7.3f} {r['plain_ms']:7.3f} {r['eager_ms']:7.3f} {r['compile_ms']:7.3f} "
            f"{r['of_copy']:8.3f} {r['vs_compile']:9.2f} {r['vs_eager']:8.2f}"
        )
    for r in rows:
        print(f"  {r['shape']}: {r['params']}")
    write_json("outer_reduction.json", {"gpu": gpu_name(), "copy_GBs": copy_gbs, "rows": rows})


def sweep(copy_gbs):
    for R, C in SHAPES[:3]:
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        nbytes = (R * C + C) * 2
        for cols in (16, 32, 64, 128):
            line = []
            for stages in (2, 4, 8):
                fd = make(cols=cols, stages=stages)
                try:
                    t = bench_ms(lambda fd=fd, x=x: fd.execute([x]))
                    line.append(f"s{stages} {nbytes / t / 1e6 / copy_gbs:.3f}")
                except cb.CircbufError as e:
                    line.append(f"s{stages} ({str(e)[:24]})")
            print(f"{R}x{C} cols={cols:<3d} " + " | ".join(line))


if __name__ == "__main__":
    main()
