"""What every step of the GEMM ladder shares: the fusion, the wgmma fragment
layout (fixed by the hardware, not a choice a step makes), and running a step
(compile, check against torch, time against cuBLAS).

Each step is ``stepNN_*.py`` with ``build(M, N, K, target) -> fd``: the fusion
``D = A @ B.T`` (bf16 ``linear``) put in MMA form by
:func:`circbuf.scheduler.mma_form` and scheduled by hand. ``python stepNN.py``:

- with a CUDA GPU: runs it at the step's shape (``--shape M N K``), checks it
  against torch in float64 (output poisoned with NaN first), times it with
  ``triton.testing.do_bench`` (median) beside ``torch.nn.functional.linear``
  (cuBLAS) in the same run and prints TF/s and the fraction of cuBLAS;
- without one: compiles for sm_90a, prints the schedule and an excerpt of the
  kernel, and says it did not run;
- with ``CIRCBUF_INTERPRET=1`` (no GPU): runs a small shape on the CPU
  kernel interpreter against torch.

The last line is machine-readable for ``scripts/gpu_ladder.sh``:
``LADDER step=NN ok=1 tflops=... cublas=... frac=... gpu=...``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.setdefault("CIRCBUF_POISON_OUTPUTS", "1")  # the checked launch fills the output with NaN first

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import circbuf as cb  # noqa: E402
from benchmarks.common import bench_ms  # noqa: E402  (the benchmarks' timing: do_bench median)
from circbuf import knobs  # noqa: E402
from circbuf.scheduler import mma_form  # noqa: E402,F401  (the steps import it from here)

D, P = cb.DataType, cb.ParallelType
SASS_OPS = ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG", "UTMACCTL", "BAR.SYNC")


def linear_fusion(M: int, N: int, K: int):
    """``D[M, N] = A[M, K] @ B[N, K].T`` in bf16 with fp32 accumulation, fixed
    sizes (each step is compiled for one shape, as the seed's kernels are)."""
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([M, K], dtype=D.BFloat16)
        b = fd.define_tensor([N, K], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(a, b))
    return fd


# ------------------------------------------------ the wgmma fragment layout
def accumulator(acc, pos: int, bk: int, warpgroups: int = 1, rows: int = 128):
    """``acc [.., Mi{rows}, Ni{bn}, K]`` from loop position ``pos`` ->
    ``[.., (W), K/bk, bk/64, Mb, TIDx{128}, MMA j, MMA h, MMA e, 64/16, MMA 16]``.

    ``warpgroups=2`` splits the tile's rows over two consumer warpgroups
    (``threadIdx.y``). The rest is the m64nNk16 wgmma's accumulator layout:
    a warpgroup's 64 rows are 4 warps x 2 halves x 8 rows, its columns are
    groups of 8 (``j``) of 4 thread pairs (``e``); ``threadIdx.x`` is the merge
    of warp, row and column pair, and the registers ``j, h, e`` and the k16
    slice are ``Mma`` axes (one wgmma instruction covers them). Returns the
    position of the k loop."""
    p = pos
    if warpgroups == 2:
        acc.split(p, rows // 2)  # [W, Mw]
        acc.axis(p).parallelize(P.TIDy)
        p += 1
    acc.split(p, 64)  # [Mb, M64, N, K]
    m64 = p + 1
    acc.split(m64, 16).split(m64 + 1, 8)  # M64 -> [w4, h2, r8]
    acc.split(m64 + 3, 8).split(m64 + 4, 2)  # N -> [j, c4, e2]
    k = m64 + 6
    acc.split(k, bk).split(k + 1, 64).split(k + 2, 16)  # K -> [Ko, Kc, Kw, K16]
    # [.., Ko, Kc, Mb, w4, r8, c4, j, h2, e2, Kw, K16]
    acc.reorder(
        list(range(p)) + [k, k + 1, p] + [m64, m64 + 2, m64 + 4, m64 + 3, m64 + 1, m64 + 5, k + 2, k + 3]
    )
    q = p + 3
    acc.merge(q).merge(q)  # (w4 r8) c4: the warpgroup's 128 threads
    acc.axis(q).parallelize(P.TIDx)
    for m in (q + 1, q + 2, q + 3, q + 5):  # j, h, e, K16
        acc.axis(m).parallelize(P.Mma)
    return p


def epilogue(tv, pos: int, warpgroups: int = 1, rows: int = 128, cols: int = 64, buffers: int = 1, box=False):
    """An epilogue tensor ``[.., Mi, Ni]`` from ``pos`` -> sub-tiles of
    [64 x ``cols``] (``[(W), Mb, Nc(/B, B), ..]``) whose elements each thread
    holds as the accumulator fragment (``TIDx{128}, j, h, e``), or, with
    ``box``, a TMA store's [64 x cols] box (two ``Bulk`` axes). ``buffers``:
    sub-tiles alternate between that many staging buffers. Returns the axes
    that matter: ``tidy``, ``buffer``, ``m64``, ``n`` and ``inline`` (the
    position after the sub-tile loops)."""
    out = {"tidy": None}
    p = pos
    if warpgroups == 2:
        tv.split(p, rows // 2)
        tv.axis(p).parallelize(P.TIDy)
        out["tidy"] = tv.axis(p)
        p += 1
    tv.split(p, 64).split(p + 2, cols)  # [Mb, M64, Nc, Nn]
    tv.reorder(list(range(p)) + [p, p + 2, p + 1, p + 3] + list(range(p + 4, len(tv.loop))))
    lead = 2
    if buffers > 1:  # [Mb, Nc/B, B, M64, Nn]
        tv.split(p + 1, buffers)
        out["buffer"] = tv.axis(p + 2)
        lead = 3
    m64 = p + lead
    out.update(m64=tv.axis(m64), n=tv.axis(m64 + 1), inline=m64)
    if box:
        tv.axis(m64).parallelize(P.Bulk)
        tv.axis(m64 + 1).parallelize(P.Bulk)
        return out
    tv.split(m64, 16).split(m64 + 1, 8).split(m64 + 3, 8).split(m64 + 4, 2)
    tv.reorder(list(range(m64)) + [m64, m64 + 2, m64 + 4, m64 + 3, m64 + 1, m64 + 5])
    tv.merge(m64).merge(m64)
    tv.axis(m64).parallelize(P.TIDx)
    return out


def operand_boxes(xs, pos: int, bk: int, mn_first: bool):
    """A staged operand ``[.., Mi, Ni, K]`` (one of Mi, Ni a broadcast) from
    ``pos`` -> ``[.., Ko (the ring loop), Kc, MN, other, K64]``: per k step,
    ``bk/64`` TMA boxes of [MN x 64] (``Bulk``), each a 128-byte swizzled row
    per MN index, as wgmma reads them. Returns the ring loop's position."""
    xs.split(pos + 2, bk).split(pos + 3, 64)  # [Mi, Ni, Ko, Kc, K64]
    mn, other = (pos, pos + 1) if mn_first else (pos + 1, pos)
    xs.reorder(list(range(pos)) + [pos + 2, pos + 3, mn, other, pos + 4])
    xs.axis(pos + 2).parallelize(P.Bulk)
    xs.axis(pos + 4).parallelize(P.Bulk)
    xs.swizzle(128)
    return pos


def staging_tile(cs, axes):
    """The TMA store's shared staging tile ``cs`` (written by the epilogue
    threads in the fragment layout): allocated [(B), (W), 64, cols], 128-byte
    swizzled like the store's box, one sub-tile at a time, a bf16 pair per store."""
    # each warpgroup its own tile: the row split's axis, or (ping-pong) the tile loop's threadIdx.y
    tidy = axes["tidy"] or next((a for a in cs.loop if a.parallel_type == P.TIDy), None)
    alloc = ([axes["buffer"]] if "buffer" in axes else []) + ([tidy] if tidy is not None else [])
    cs.set_allocation(alloc + [axes["m64"], axes["n"]])
    cs.swizzle(128)
    cs.inline_at(axes["inline"])
    cs.axis(-1).parallelize(P.Vectorize)


# ------------------------------------------------------------ running a step
def _sass_mix(ck) -> dict | None:
    try:
        sass = ck.sass()
    except RuntimeError:  # cuobjdump is a test extra
        return None
    return {op: len(re.findall(re.escape(op), sass)) for op in SASS_OPS} | {
        "multicast": len(re.findall(r"UTMALDG\S*MULTICAST", sass))
    }


def excerpt(cuda: str, lines: int = 60) -> str:
    body = cuda[cuda.index('extern "C"') :]
    return "\n".join(body.splitlines()[:lines])


def main(build, shape, interp_shape, doc: str, step: int) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "K"), default=None)
    ap.add_argument("--full", action="store_true", help="print the whole kernel, not an excerpt")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    args, _ = ap.parse_known_args()  # a step's own flags (step 10: --pingpong)
    gpu = torch.cuda.is_available()
    interp = not gpu and knobs.interpret()
    M, N, K = args.shape or (interp_shape if interp else shape)
    target = cb.Target.from_device(torch.device("cuda")) if gpu else cb.target.DEFAULT
    if interp:  # two SMs: a persistent kernel's CTAs walk several tiles, so rings wrap
        import dataclasses

        target = dataclasses.replace(cb.target.DEFAULT, sm_count=2)
    print(doc.strip().splitlines()[0])
    print(f"D[{M}, {N}] = A[{M}, {K}] @ B[{N}, {K}].T (bf16 in and out, fp32 accumulation)\n")
    fd = build(M, N, K, target)
    print(fd.fusion.print_transforms() if args.full else _loop_domains(fd))
    dev = "cuda" if gpu else "cpu"
    g = torch.Generator(device="cpu").manual_seed(step)
    a = (torch.randn(M, K, generator=g) / 8).to(torch.bfloat16).to(dev)
    b = (torch.randn(N, K, generator=g) / 8).to(torch.bfloat16).to(dev)
    ck = fd.compile([a, b], arch=None if gpu else "sm_90a")
    print("----- the kernel" + (" -----" if args.full else " (first lines; --full for all) -----"))
    print(ck.cuda[ck.cuda.index('extern "C"') :] if args.full else excerpt(ck.cuda))
    mix = _sass_mix(ck)
    if mix is not None:
        print(f"SASS: {mix}; resources {ck.resource_usage()}")
    if not gpu and not interp:
        print(f"\nNo CUDA GPU here: compiled step {step} for sm_90a with NVRTC but did not run it.")
        return 0
    (d,) = fd.execute([a, b])
    ref = a.double() @ b.double().T
    bad = int(torch.isnan(d).sum().item())
    err = ((d.double() - ref).norm() / ref.norm()).item()
    ok = bad == 0 and err < 1e-2
    where = torch.cuda.get_device_name() if gpu else "the CPU (CIRCBUF_INTERPRET=1: the kernel interpreter)"
    print(f"\nran on {where}: |D - torch| / |torch| = {err:.2e}, unwritten (NaN) elements: {bad}")
    if not gpu:
        return 0 if ok else 1
    # timed without the NaN fill: a fresh fusion whose launch plan is made with poisoning off
    os.environ["CIRCBUF_POISON_OUTPUTS"] = "0"
    fd_timed = build(M, N, K, target)
    fd_timed.execute([a, b])
    flop = 2.0 * M * N * K
    ms = bench_ms(lambda: fd_timed.execute([a, b]), rep=args.rep)
    ms_ref = bench_ms(lambda: torch.nn.functional.linear(a, b), rep=args.rep)
    tf, tf_ref = flop / ms / 1e9, flop / ms_ref / 1e9
    name = torch.cuda.get_device_name()
    print(f"step {step}: {tf:.1f} TF/s, cuBLAS {tf_ref:.1f} TF/s ({tf / tf_ref:.2f} of cuBLAS) on {name}")
    print(
        f"LADDER step={step:02d} ok={int(ok)} shape={M}x{N}x{K} tflops={tf:.1f} cublas={tf_ref:.1f} "
        f"frac={tf / tf_ref:.3f} gpu={name.replace(' ', '_')}"
    )
    return 0 if ok else 1


def _loop_domains(fd) -> str:
    """The scheduled tensors' loop domains (``print_transforms`` without the transforms)."""
    return (
        "\n".join(line for line in fd.fusion.print_transforms().splitlines() if not line.startswith("  "))
        + "\n"
    )


def run(build, shape, interp_shape, doc, step):
    sys.exit(main(build, shape, interp_shape, doc, step))
