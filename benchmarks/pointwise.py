"""Pointwise benchmark: silu, gelu and x*y+1 on bf16 tensors of 2^28 elements
against torch eager, a static per-shape torch.compile (benchmarks.common.static_compile) and a device-to-device copy, plus the host
overhead of a cached ``fd.execute`` on a 1024-element fusion.

    PYTHONPATH=. python benchmarks/pointwise.py [--log2n 28]
    PYTHONPATH=. python benchmarks/pointwise.py --broadcast   # operands broadcast along rows or columns
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
    host_us_per_call,
    require_cuda,
    static_compile,
    write_json,
)

D = cb.DataType
F = torch.nn.functional


def make(op, rank=1):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank, dtype=D.BFloat16)
        if op == "x*y+1":
            y = fd.define_tensor([-1] * rank, dtype=D.BFloat16)
            z = fd.ops.add(fd.ops.mul(x, y), 1.0)
        else:
            z = getattr(fd.ops, op)(x)
        fd.add_output(fd.ops.cast(z, D.BFloat16))
    return fd


TORCH_FN = {
    "silu": lambda x: F.silu(x),
    "gelu": lambda x: F.gelu(x),
    "x*y+1": lambda x, y: x * y + 1,
}


def host_overhead_us(n_calls=2000):
    fd = make("x*y+1")
    x = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(1024, device="cuda", dtype=torch.bfloat16)

    per_call = host_us_per_call

    return {
        "circbuf_execute_us": per_call(lambda: fd.execute([x, y])),
        "torch_eager_add_us": per_call(lambda: torch.add(x, 1)),
        "torch_eager_x*y+1_us": per_call(lambda: x * y + 1),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--sweep", action="store_true", help="time unroll x threads variants")
    ap.add_argument("--tma-sweep", action="store_true", help="time TMA tile rows x stages x store variants")
    ap.add_argument("--broadcast", action="store_true", help="operands broadcast along rows or columns")
    args = ap.parse_args()
    require_cuda()
    if args.broadcast:
        return broadcast()
    n = 1 << args.log2n
    if args.sweep:
        return sweep(n)
    if args.tma_sweep:
        return tma_sweep(args.log2n)
    copy_gbs = copy_bandwidth_gbs(n * 2)
    rows = []
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for op in ("silu", "gelu", "x*y+1"):
        ins = [x, y] if op == "x*y+1" else [x]
        nbytes = (len(ins) + 1) * n * 2
        fd = make(op)
        (out,) = fd.execute(ins)
        ref = TORCH_FN[op](*ins)
        err = (out.float() - ref.float()).abs().max().item()
        compiled = static_compile(TORCH_FN[op])
        compiled(*ins)
        t_cb = bench_ms(lambda fd=fd, ins=ins: fd.execute(ins))
        t_eager = bench_ms(lambda op=op, ins=ins: TORCH_FN[op](*ins))
        t_comp = bench_ms(lambda c=compiled, ins=ins: c(*ins))
        # the TMA variant streams [16 x 256] tiles of a 2-D view through 3 stages,
        # storing with plain 16-byte stores or with one TMA store per tile
        ins2 = [t.view(1 << (args.log2n // 2), -1) for t in ins]
        t_tma = {}
        for store in (False, True):
            fd2 = make(op, rank=2)
            fd2.fusion.schedule(stages=3, tma_store=store)
            (o2,) = fd2.execute(ins2)
            assert (o2.view(-1).float() - out.float()).abs().max().item() <= 1e-2
            t_tma[store] = bench_ms(lambda fd2=fd2, ins2=ins2: fd2.execute(ins2))
        gbs = nbytes / t_cb / 1e6
        rows.append(
            {
                "op": op,
                "ms": t_cb,
                "GB/s": gbs,
                "of_copy": gbs / copy_gbs,
                "vs_eager": t_eager / t_cb,
                "vs_compile": t_comp / t_cb,
                "eager_ms": t_eager,
                "compile_ms": t_comp,
                "max_abs_err": err,
                "tma_ms": t_tma[False],
                "tma_of_copy": nbytes / t_tma[False] / 1e6 / copy_gbs,
                "tma_store_ms": t_tma[True],
                "tma_store_of_copy": nbytes / t_tma[True] / 1e6 / copy_gbs,
                "params": str(fd.last_params()).replace("\n", " "),
            }
        )
    host = host_overhead_us()
    print(f"GPU: {gpu_name()}   n = 2^{args.log2n} bf16   copy bandwidth {copy_gbs:.0f} GB/s")
    print(
        f"{'op':8s} {'ms':>8s} {'GB/s':>8s} {'of copy':>8s} {'x eager':>8s} {'x compile':>9s} {'max err':>8s}"
        f" | {'TMA ms':>8s} {'of copy':>8s} | {'TMA+st ms':>9s} {'of copy':>8s}"
    )
    for r in rows:
        print(
            f"{r['op']:8s} {r['ms']:8.3f} {r['GB/s']:8.0f} {r['of_copy']:8.3f} {r['vs_eager']:8.2f} "
            f"{r['vs_compile']:9.2f} {r['max_abs_err']:8.3g} | {r['tma_ms']:8.3f} {r['tma_of_copy']:8.3f}"
            f" | {r['tma_store_ms']:9.3f} {r['tma_store_of_copy']:8.3f}"
        )
    print("host overhead per call (1024 elements): " + ", ".join(f"{k} {v:.1f}" for k, v in host.items()))
    print(f"  ratio circbuf / torch eager add: {host['circbuf_execute_us'] / host['torch_eager_add_us']:.2f}")
    write_json("pointwise.json", {"gpu": gpu_name(), "copy_GBs": copy_gbs, "rows": rows, "host": host})


# (name, the inputs' axes: "M", "N" or 1 (a broadcast), fusion body, torch's): operands
# broadcast against a [M, N] output, the fusions a bias, a per-row scale or an outer
# product make
BROADCASTS = [
    ("x + bias[1, N]", [("M", "N"), (1, "N")], lambda o, x, b: o.add(x, b), lambda x, b: x + b),
    ("x + broadcast(bias[N])", [("M", "N"), ("N",)], lambda o, x, b: o.add(x, o.broadcast(b, [True, False])),
     lambda x, b: x + b),
    ("x * scale[M, 1]", [("M", "N"), ("M", 1)], lambda o, x, s: o.mul(x, s), lambda x, s: x * s),
    ("a[M, 1] * b[1, N]", [("M", 1), (1, "N")], lambda o, a, b: o.mul(a, b), lambda a, b: a * b),
    ("x * s[M, 1] + bias[1, N]", [("M", "N"), ("M", 1), (1, "N")], lambda o, x, s, b: o.add(o.mul(x, s), b),
     lambda x, s, b: x * s + b),
]  # fmt: skip


def broadcast(shapes=((8192, 8192), (16384, 1024), (1024, 16384), (65536, 80))):
    """Fusions with operands broadcast along rows or columns against eager,
    static torch.compile and the copy bandwidth (bytes: the full-size inputs
    and the output)."""
    print(f"GPU: {gpu_name()}  bf16, do_bench median")
    print(
        f"{'fusion':>24s} {'shape':>12s} {'us':>8s} {'of copy':>8s} {'x eager':>8s} {'x compile':>9s}  params"
    )
    rows = []
    for name, axes, body, ref_fn in BROADCASTS:
        for m, n in shapes:
            with cb.FusionDefinition() as fd:
                xs = [fd.define_tensor([1 if a == 1 else -1 for a in ax], dtype=D.BFloat16) for ax in axes]
                fd.add_output(fd.ops.cast(body(fd.ops, *xs), D.BFloat16))
            size = {"M": m, "N": n, 1: 1}
            ins = [torch.randn(*[size[a] for a in ax], device="cuda", dtype=torch.bfloat16) for ax in axes]
            (out,) = fd.execute(ins)
            err = (out.float() - ref_fn(*ins).float()).abs().max().item()
            compiled = static_compile(ref_fn)
            compiled(*ins)
            t_cb = bench_ms(lambda fd=fd, ins=ins: fd.execute(ins))
            t_eager = bench_ms(lambda f=ref_fn, ins=ins: f(*ins))
            t_comp = bench_ms(lambda c=compiled, ins=ins: c(*ins))
            nbytes = sum(t.numel() for t in ins if t.numel() == m * n) * 2 + m * n * 2
            of_copy = nbytes / t_cb / 1e6 / copy_bandwidth_gbs(nbytes // 2)
            p = fd.last_params()
            brief = f"inner_threads={p.inner_threads}, vectorize_inputs={p.vectorize_inputs}"
            print(
                f"{name:>24s} {f'{m}x{n}':>12s} {t_cb * 1e3:8.1f} {of_copy:8.3f} {t_eager / t_cb:8.2f} "
                f"{t_comp / t_cb:9.2f}  {brief} (max err {err:.2g})",
                flush=True,
            )
            rows.append(dict(fusion=name, m=m, n=n, ms=t_cb, of_copy=of_copy, eager_ms=t_eager,
                             compile_ms=t_comp, params=str(p).replace("\n", " "), err=err))  # fmt: skip
    write_json("pointwise_broadcast.json", rows)


def sweep(n):
    """Time schedule variants (overrides) of each op; prints ms per variant."""
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    copy_gbs = copy_bandwidth_gbs(n * 2)
    print(f"GPU: {gpu_name()} sweep, copy {copy_gbs:.0f} GB/s")
    for op in ("silu", "gelu", "x*y+1"):
        ins = [x, y] if op == "x*y+1" else [x]
        nbytes = (len(ins) + 1) * n * 2
        for threads in (128, 256, 512):
            line = []
            for unroll in (1, 2, 4, 8):
                fd = make(op)
                fd.fusion.schedule(unroll=unroll, threads=threads)
                t = bench_ms(lambda fd=fd, ins=ins: fd.execute(ins))
                line.append(f"u{unroll} {t:.3f}ms {nbytes / t / 1e6 / copy_gbs:.3f}")
            print(f"{op:6s} t{threads:<4d} " + " | ".join(line))


def tma_sweep(log2n):
    """Time the TMA variant's tile rows, stage counts and store kinds."""
    n = 1 << log2n
    shape = (1 << (log2n // 2), -1)
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16).view(shape)
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16).view(shape)
    copy_gbs = copy_bandwidth_gbs(n * 2)
    print(f"GPU: {gpu_name()} TMA sweep, copy {copy_gbs:.0f} GB/s (fraction of copy per variant)")
    for op in ("silu", "x*y+1"):
        ins = [x, y] if op == "x*y+1" else [x]
        nbytes = (len(ins) + 1) * n * 2
        for store in (False, True):
            for tile_rows in (16, 32, 64):
                line = []
                for stages in (2, 3, 4):
                    fd = make(op, rank=2)
                    fd.fusion.schedule(stages=stages, tile_rows=tile_rows, tma_store=store)
                    try:
                        t = bench_ms(lambda fd=fd, ins=ins: fd.execute(ins))
                        line.append(f"s{stages} {nbytes / t / 1e6 / copy_gbs:.3f}")
                    except cb.CircbufError as e:
                        line.append(f"s{stages} ({str(e)[:30]})")
                print(f"{op:6s} store={store!s:5s} rows={tile_rows:<3d} " + " | ".join(line))


if __name__ == "__main__":
    main()
