"""Matmul benchmark: circbuf's Hopper matmul scheduler against torch
(cuBLAS) in the same run, bf16, random inputs, triton's do_bench median.

    PYTHONPATH=. python benchmarks/matmul.py            # the issue's table
    PYTHONPATH=. python benchmarks/matmul.py --sweep    # heuristic vs override sets, then clusters
    PYTHONPATH=. python benchmarks/matmul.py --clusters # cluster (2,1)/(1,2)/(2,2) vs (1,1) only
    PYTHONPATH=. python benchmarks/matmul.py --epilogue [--variants] [--only silu]
                                                        # linear + bias + act / + residual vs eager, compile;
                                                        # linear + a row amax / row sum of its output
    PYTHONPATH=. python benchmarks/matmul.py --breakdown # where the epilogue's time goes
    PYTHONPATH=. python benchmarks/matmul.py --decode [--variants]
                                                        # M = 1..64 linears: TF/s, GB/s, path (and schedules)
    PYTHONPATH=. python benchmarks/matmul.py --odd       # shapes TMA cannot describe (the cp.async fill)
    PYTHONPATH=. python benchmarks/matmul.py --edges     # 16-bit matmuls that once took the SIMT path:
                                                        # K fixed to 1, K = 0, a returned expand, realign=False
    PYTHONPATH=. python benchmarks/matmul.py --fp32 [--variants]
                                                        # fp32 operands: TF32 on (vs cuBLAS TF32), then off;
                                                        # --variants: the FFMA path's override sets (TF32 off)

TFLOP/s = 2 M N K / time. A torch.compile baseline is compiled statically
for each shape (torch._dynamo.reset(), dynamic=False).
"""

from __future__ import annotations

import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import (  # noqa: E402
    bench_ms,
    copy_bandwidth_gbs,
    gpu_name,
    require_cuda,
    static_compile,
    write_json,
)
from circbuf import DataType  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

Float = DataType.Float

# (M, N, K, kind): kind "matmul" is A @ B with B [K, N]; "linear" is x @ W.T with W [N, K]
SHAPES = [
    (2048, 2048, 2048, "matmul"),
    (4096, 4096, 4096, "matmul"),
    (8192, 8192, 8192, "matmul"),
    (8192, 8192, 1024, "matmul"),
    (4096, 14336, 4096, "linear"),
    (3000, 5000, 4000, "matmul"),
    (2048, 2048, 2048, "linear"),
    (4096, 4096, 4096, "linear"),
    (8192, 8192, 8192, "linear"),
    (4096, 128256, 4096, "linear"),  # an LM head
]
# decode: linear with a few rows (issue 18 section 2), memory-bound on the weight
DECODE_SHAPES = [
    (m, n, k, "linear")
    for m in (1, 16, 64)
    for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
]
# issue 18: operands a tensor map cannot describe, filled by the producer's threads
# (cp.async, or loads through registers where rows are only 2-byte aligned):
# (M, N, K, kind, A's element offset into its buffer, the nearest aligned shape,
# timed in the same run for the ">= 0.75 of circbuf's own TMA path" target)
ODD_SHAPES = [
    (2047, 2047, 2047, "matmul", 0, (2048, 2048, 2048)),
    (4097, 4096, 4095, "matmul", 0, (4096, 4096, 4096)),  # K = 4095
    (4096, 50257, 768, "matmul", 0, (4096, 50264, 768)),  # B's rows 100514 bytes
    (4096, 4096, 4096, "matmul", 1, (4096, 4096, 4096)),  # flat[1:1 + M * K].view(M, K)
    (4096, 4096, 4100, "matmul", 0, (4096, 4096, 4096)),  # rows of 8200 bytes: 8-byte cp.async
]
SWEEP = {
    "coop 128x256 s4": dict(tile=(128, 256, 64), stages=4),
    "coop 128x192 s5": dict(tile=(128, 192, 64), stages=5),
    "coop 128x128 s6": dict(tile=(128, 128, 64), stages=6),
    "coop 256x128 s4": dict(tile=(256, 128, 64), stages=4),
    "pp 128x128 s6": dict(pingpong=True, tile=(128, 128, 64), stages=6),
    "pp 128x192 s5": dict(pingpong=True, tile=(128, 192, 64), stages=5),
    "pp 64x256 s3": dict(pingpong=True, tile=(64, 256, 64), stages=3),
    "coop 128x256 s3": dict(tile=(128, 256, 64), stages=3),
    "coop g4": dict(group=4),
    "coop g16": dict(group=16),
    "coop raster N": dict(raster="N"),
    "non-persistent": dict(persistent=False),
}


def inputs(m, n, k, kind, a_off=0):
    """A [m, k] (``a_off`` elements into a flat buffer: a data pointer that many
    elements off) and B [k, n] (matmul) or [n, k] (linear)."""
    a = torch.randn(m * k + a_off, device="cuda", dtype=torch.bfloat16)[a_off:].view(m, k)
    b = torch.randn((n, k) if kind == "linear" else (k, n), device="cuda", dtype=torch.bfloat16)
    return a, b


def fill_path(p) -> str:
    """The path a matmul took: SIMT, or the tensor cores with each operand's fill."""
    if p.simt is not None:
        return p.brief()
    fills = []
    for x, f, v in zip("AB", p.fill, p.copy_vector):
        fills.append(
            f"{x} {f}" + (f" {v * 2}B" if f == "cp.async" and v > 1 else " via regs" if v == 1 else "")
        )
    store = {"tma": "TMA store", "rows": "row stores"}.get(p.store, f"stores of {p.store_vector * 2}B")
    return f"wgmma, {', '.join(fills)}, {store}"


def torch_mm(kind):
    return (lambda a, b: a @ b.T) if kind == "linear" else (lambda a, b: a @ b)


def tflops(m, n, k, ms):
    return 2 * m * n * k / ms / 1e9


def table():
    print(f"GPU: {gpu_name()}  bf16, do_bench median, TFLOP/s (GB/s: A and B read once, C written once)")
    print(f"{'shape':>24s} {'kind':>6s} {'cuBLAS':>8s} {'circbuf':>8s} {'GB/s':>6s} {'ratio':>6s}  params")
    rows, ratios = [], []
    for m, n, k, kind in SHAPES:
        a, b = inputs(m, n, k, kind)
        fd = mm_fusion(kind)
        (out,) = fd.execute([a, b])
        ref = torch_mm(kind)(a, b)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        fn = torch_mm(kind)
        t_torch = bench_ms(lambda f=fn, a=a, b=b: f(a, b))
        t_cb = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
        r = t_torch / t_cb
        ratios.append(r)
        print(
            f"{f'{m}x{n}x{k}':>24s} {kind:>6s} {tflops(m, n, k, t_torch):8.1f} {tflops(m, n, k, t_cb):8.1f} "
            f"{gbps(m, n, k, t_cb):6.0f} {r:6.3f}  {path(fd)} (err {err:.1e})"
        )
        rows.append(
            dict(m=m, n=n, k=k, kind=kind, torch_ms=t_torch, circbuf_ms=t_cb, params=path(fd), err=err)
        )
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geomean vs cuBLAS: {geo:.3f}x; min {min(ratios):.3f}x")
    rows += batched()
    rows += odd()
    write_json("bench_matmul.json", rows)


# batched (issue 18): attention-like [B, M, K] @ [B, K, N] with a short K (not in the geomean above)
BATCHED_SHAPES = [(32, 2048, 2048, 128)]


def batched() -> list:
    """Batched matmuls against torch.bmm (cuBLAS), same run."""
    rows = []
    for bt, m, n, k in BATCHED_SHAPES:
        a = torch.randn(bt, m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(bt, k, n, device="cuda", dtype=torch.bfloat16)
        fd = mm_fusion("matmul", arank=3, brank=3)
        (out,) = fd.execute([a, b])
        ref = torch.bmm(a, b)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        t_torch = bench_ms(lambda a=a, b=b: torch.bmm(a, b))
        t_cb = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
        shape = f"[{bt},{m},{k}]@[{bt},{k},{n}]"
        print(
            f"{shape:>24s} {'bmm':>6s} {tflops(bt * m, n, k, t_torch):8.1f} {tflops(bt * m, n, k, t_cb):8.1f} "
            f"{bt * gbps(m, n, k, t_cb):6.0f} {t_torch / t_cb:6.3f}  {path(fd)} (err {err:.1e})"
        )
        rows.append(dict(batch=bt, m=m, n=n, k=k, kind="bmm", torch_ms=t_torch, circbuf_ms=t_cb, err=err))
    return rows


def odd() -> list:
    """Shapes TMA cannot describe (rows not 16-byte aligned, a pointer one element
    off), against cuBLAS and circbuf's own path at the nearest aligned shape."""
    rows = []
    print("\nodd shapes (issue 18: each >= 2.5x cuBLAS and >= 0.75x circbuf at the nearest aligned shape)")
    print(
        f"{'shape':>24s} {'kind':>6s} {'cuBLAS':>8s} {'circbuf':>8s} {'GB/s':>6s} {'ratio':>6s} {'aligned':>8s} "
        f"{'vs TMA':>6s}  path"
    )
    for m, n, k, kind, a_off, twin in ODD_SHAPES:
        a, b = inputs(m, n, k, kind, a_off)
        fd = mm_fusion(kind)
        (out,) = fd.execute([a, b])
        ref = torch_mm(kind)(a.float(), b.float())
        err = ((out.float() - ref).norm() / ref.norm()).item()
        fn = torch_mm(kind)
        t_torch = bench_ms(lambda f=fn, a=a, b=b: f(a, b))
        t_cb = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
        p = fd.last_params()
        copied = fd._get_executor().realigned
        how = fill_path(p) + (f", {'+'.join(copied)} realigned (copied)" if copied else "")
        a2, b2 = inputs(*twin, kind)
        fd2 = mm_fusion(kind)
        fd2.execute([a2, b2])
        t_twin = bench_ms(lambda fd=fd2, a=a2, b=b2: fd.execute([a, b]))
        own = tflops(m, n, k, t_cb) / tflops(*twin, t_twin)
        tag = f"{m}x{n}x{k}" + (f"+{a_off}" if a_off else "")
        print(
            f"{tag:>24s} {kind:>6s} {tflops(m, n, k, t_torch):8.1f} {tflops(m, n, k, t_cb):8.1f} "
            f"{gbps(m, n, k, t_cb):6.0f} {t_torch / t_cb:6.3f} {tflops(*twin, t_twin):8.1f} {own:6.3f}  {how} "
            f"(err {err:.1e})"
        )
        rows.append(
            dict(
                m=m, n=n, k=k, kind=kind, a_offset=a_off, torch_ms=t_torch, circbuf_ms=t_cb,
                aligned=list(twin), aligned_ms=t_twin, path=how, params=p.brief(), err=err,
            )
        )  # fmt: skip
    return rows


def path(fd) -> str:
    """The path the last run took: one kernel's params, or each kernel's (split-K, segments)."""
    p = fd.last_params()
    if not isinstance(p, list):
        return p.brief()
    last = fd._get_executor().last
    head = f"{last.split_k}: " if getattr(last, "split_k", None) is not None else f"{len(p)} kernels: "
    return head + " + ".join(q.brief() if hasattr(q, "brief") else type(q).__name__ for q in p)


def gbps(m, n, k, ms, item=2):
    """Bytes the GEMM must move (A, B read once, C written once) per second."""
    return (m * k + n * k + m * n) * item / ms / 1e6


# --decode --variants: schedules to compare with the heuristic's on each decode shape
DECODE_VARIANTS = {
    "no split": dict(split_k=1),
    "split 2": dict(split_k=2),
    "split 4": dict(split_k=4),
    "split 8": dict(split_k=8),
    "split 2 (reduction kernel)": dict(split_k=2, split_k_sum="reduction"),
    "split 4 (reduction kernel)": dict(split_k=4, split_k_sum="reduction"),
    "pp 64x112 s10": dict(pingpong=True, tile=(64, 112, 64), stages=10, split_k=1),
}


def decode():
    """The decode shapes (M = 1, 16, 64) and the LM head: TF/s and GB/s of
    cuBLAS and circbuf in the same run, the path circbuf took, and the
    weight's copy bandwidth (a device-to-device copy of W, read + write).
    ``--variants``: GB/s of each DECODE_VARIANTS schedule too, same run."""
    print(f"GPU: {gpu_name()}  linear x @ W.T, bf16, do_bench median")
    print(
        f"{'shape':>22s} {'cuBLAS TF/s':>11s} {'GB/s':>6s} {'circbuf TF/s':>12s} {'GB/s':>6s} "
        f"{'ratio':>6s} {'W copy GB/s':>11s} {'of copy':>7s}  path"
    )
    rows = []
    for m, n, k, kind in DECODE_SHAPES + [(4096, 128256, 4096, "linear")]:
        a, b = inputs(m, n, k, kind)
        fd = mm_fusion(kind)
        (out,) = fd.execute([a, b])
        ref = torch_mm(kind)(a.double(), b.double())
        err = ((out.double() - ref).norm() / ref.norm()).item()
        (again,) = fd.execute([a, b])
        same = torch.equal(out.view(torch.int16), again.view(torch.int16))
        fn = torch_mm(kind)
        t_torch = bench_ms(lambda f=fn, a=a, b=b: f(a, b))
        t_cb = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
        dst = torch.empty_like(b)
        t_copy = bench_ms(lambda d=dst, b=b: d.copy_(b))
        copy = 2 * b.numel() * b.element_size() / t_copy / 1e6
        print(
            f"{f'{m}x{n}x{k}':>22s} {tflops(m, n, k, t_torch):11.1f} {gbps(m, n, k, t_torch):6.0f} "
            f"{tflops(m, n, k, t_cb):12.1f} {gbps(m, n, k, t_cb):6.0f} {t_torch / t_cb:6.3f} {copy:11.0f} "
            f"{gbps(m, n, k, t_cb) / copy:7.3f}  "
            f"{path(fd)} (err {err:.1e}{'' if same else ', NOT DETERMINISTIC'})",
            flush=True,
        )
        if "--variants" in sys.argv and m <= 64:
            vs = []
            for tag, ov in DECODE_VARIANTS.items():
                f2 = mm_fusion(kind)
                try:
                    f2.fusion.schedule(**ov)
                    f2.execute([a, b])
                    t = bench_ms(lambda f2=f2, a=a, b=b: f2.execute([a, b]))
                    vs.append(f"{tag} {gbps(m, n, k, t):.0f}")
                except Exception as e:  # noqa: BLE001 - a variant that does not fit is reported
                    vs.append(f"{tag} n/a({type(e).__name__})")
            print("      variants (GB/s): " + " | ".join(vs), flush=True)
        rows.append(
            dict(m=m, n=n, k=k, kind=kind, torch_ms=t_torch, circbuf_ms=t_cb, copy_gbps=copy,
                 path=path(fd), err=err, deterministic=same)
        )  # fmt: skip
    write_json("bench_matmul_decode.json", rows)


EPILOGUE_VARIANTS = {
    "coop 128x256": dict(tile=(128, 256, 64)),
    "pp 64x256": dict(pingpong=True, tile=(64, 256, 64)),
    "pp 128x128": dict(pingpong=True, tile=(128, 128, 64)),
    "pp 128x192": dict(pingpong=True, tile=(128, 192, 64)),
    "pp 64x256 s3": dict(pingpong=True, tile=(64, 256, 64), stages=3),
    "role 128x128": dict(epilogue="role", tile=(128, 128, 64)),
    "role 128x192": dict(epilogue="role", tile=(128, 192, 64)),
}
SWEEP_SHAPES = [SHAPES[k] for k in (0, 1, 3, 4, 5)]


def sweep():
    print(f"GPU: {gpu_name()}  matmul sweep, TFLOP/s (heuristic first)")
    for m, n, k, kind in SWEEP_SHAPES:
        a, b = inputs(m, n, k, kind)
        line = []
        fd = mm_fusion(kind)
        fd.execute([a, b])
        line.append(
            f"heuristic[{path(fd)}] {tflops(m, n, k, bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))):.0f}"
        )
        for tag, ov in SWEEP.items():
            fd = mm_fusion(kind)
            try:
                fd.fusion.schedule(**ov)
                fd.execute([a, b])
                line.append(
                    f"{tag} {tflops(m, n, k, bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))):.0f}"
                )
            except Exception as e:  # noqa: BLE001 - a variant that does not fit is reported, not fatal
                line.append(f"{tag} n/a({type(e).__name__}: {str(e)[:60]})")
        print(f"{m}x{n}x{k} {kind}: " + " | ".join(line))
    clusters()


# thread-block clusters with TMA multicast (issue 21): each cluster shape against (1, 1) with the
# heuristic's other choices, and against the cooperative 128x256 and ping-pong 128x128 kernels
CLUSTER_SHAPES = [(4096, 4096, 4096, "matmul"), (8192, 8192, 8192, "matmul"), (8192, 8192, 1024, "matmul")]
CLUSTERS = [(1, 1), (2, 1), (1, 2), (2, 2)]
CLUSTER_BASES = {
    "heuristic": {},
    "coop 128x256": dict(tile=(128, 256, 64)),
    "pp 128x128": dict(pingpong=True, tile=(128, 128, 64)),
}


def clusters():
    print(
        f"GPU: {gpu_name()}  clusters (TMA multicast), TFLOP/s; (x) = / cluster (1, 1) of the same base, same run"
    )
    rows = []
    for m, n, k, kind in CLUSTER_SHAPES:
        a, b = inputs(m, n, k, kind)
        t_torch = bench_ms(lambda a=a, b=b: a @ b)
        ref = (a.float() @ b.float()).double()
        line = [f"cuBLAS {tflops(m, n, k, t_torch):.0f}"]
        for base, ov in CLUSTER_BASES.items():
            one = None
            for cl in CLUSTERS:
                fd = mm_fusion(kind)
                try:
                    fd.fusion.schedule(**ov, cluster=cl)
                    (out,) = fd.execute([a, b])
                    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                    t = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
                except Exception as e:  # noqa: BLE001 - a variant that does not fit is reported, not fatal
                    line.append(f"{base} {cl} n/a({type(e).__name__}: {str(e)[:60]})")
                    continue
                one = t if cl == (1, 1) else one
                rel = f" ({one / t:.3f})" if one and cl != (1, 1) else ""
                bad = "" if err < 2e-2 else f" WRONG (rel err {err:.1e})"
                line.append(f"{base} {cl[0]}x{cl[1]} {tflops(m, n, k, t):.0f}{rel}{bad}")
                rows.append(dict(m=m, n=n, k=k, base=base, cluster=cl, ms=t, torch_ms=t_torch, err=err))
        print(f"{m}x{n}x{k} {kind}:\n  " + "\n  ".join(line), flush=True)
    write_json("bench_matmul_clusters.json", rows)


EPILOGUES = ("relu", "gelu", "tanh_gelu", "silu", "residual")


def _torch_epilogue(epilogue):
    """The fusion as a torch user writes it (linear with bias; residual: no bias, + r)."""
    F = torch.nn.functional
    act = {
        "relu": torch.relu,
        "gelu": F.gelu,
        "tanh_gelu": lambda y: F.gelu(y, approximate="tanh"),
        "silu": F.silu,
    }
    if epilogue == "residual":
        return lambda x, w, r: F.linear(x, w) + r
    return lambda x, w, bias: act[epilogue](F.linear(x, w, bias))


# linear with a second output: a row reduction of the linear's output along N (both returned;
# the amax of abs is what an fp8 cast's per-row scale needs), or the pre-activation beside gelu
ROW_REDUCTIONS = ("rowamax", "rowsum", "pre+gelu")
F_gelu = torch.nn.functional.gelu


def row_reduction_fusion(what):
    """``y = linear(x, w)``; returns y and ``max(abs(y), -1)`` or ``sum(y, -1)`` (fp32);
    "pre+gelu": ``y = linear(x, w, b)`` and ``gelu(y)``."""
    import circbuf as cb

    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        b = fd.define_tensor([-1], dtype=cb.DataType.BFloat16) if what == "pre+gelu" else None
        y = fd.ops.linear(x, w, b)
        fd.add_output(y)
        if what == "rowamax":
            fd.add_output(fd.ops.max(fd.ops.abs(y), [-1]))
        elif what == "rowsum":
            fd.add_output(fd.ops.sum(y, [-1]))
        else:
            fd.add_output(fd.ops.cast(fd.ops.gelu(y), cb.DataType.BFloat16))
    return fd


def _torch_row_reduction(what):
    """The fusion as a torch user writes it: one read of the bf16 output by the reduction."""
    F = torch.nn.functional
    if what == "rowamax":
        return lambda x, w: (lambda y: (y, y.abs().amax(-1).float()))(F.linear(x, w))
    if what == "rowsum":
        return lambda x, w: (lambda y: (y, y.sum(-1, dtype=torch.float32)))(F.linear(x, w))
    return lambda x, w, b: (lambda y: (y, F.gelu(y)))(F.linear(x, w, b))


def row_reductions(x, w, t_gemm, only):
    """linear + a row amax / row sum of its output (8192x8192x1024: within 1.15x of
    the bare GEMM is the target), and linear + bias returning both y and gelu(y),
    against eager and a static torch.compile."""
    bias = torch.randn(w.shape[0], device=w.device, dtype=w.dtype)
    for what in ROW_REDUCTIONS:
        if only and what != only:
            continue
        args = [x, w, bias] if what == "pre+gelu" else [x, w]
        eager = _torch_row_reduction(what)
        compiled = static_compile(eager)
        compiled(*args)
        fd = row_reduction_fusion(what)
        y, r = fd.execute(args)
        # the second output as the fusion defines it (of the bf16 output), in float64
        y64 = torch.nn.functional.linear(*[a.double() for a in args])
        yb = y64.to(torch.bfloat16).double()
        ref = yb.abs().amax(-1) if what == "rowamax" else yb.sum(-1) if what == "rowsum" else F_gelu(y64)
        err = ((r.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        t_eager = bench_ms(lambda f=eager, a=args: f(*a))
        t_comp = bench_ms(lambda f=compiled, a=args: f(*a))
        t_cb = bench_ms(lambda fd=fd, a=args: fd.execute(a))
        ps = fd.last_params()
        kernels = " + ".join(q.name for q in (ps if isinstance(ps, list) else [ps]))
        print(
            f"  {what:>9s}: circbuf {t_cb * 1e3:5.0f} [{kernels}]  eager {t_eager * 1e3:5.0f}  "
            f"compile {t_comp * 1e3:5.0f}  ratio {t_cb / t_gemm:.3f} (target <= {1.10 if what == 'pre+gelu' else 1.15})  "
            f"rel err {err:.2e}",
            flush=True,
        )


def epilogue():
    """linear + bias + {relu, gelu, tanh-gelu, silu} and linear + residual: the
    fused kernel (heuristic, and with ``--variants`` each schedule of
    EPILOGUE_VARIANTS) against torch eager, a static torch.compile and the bare
    cuBLAS GEMM, all in the same run; ``--only NAME`` picks one epilogue."""
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    print(
        f"GPU: {gpu_name()}  linear + epilogue (bf16), us; ratio = circbuf / bare cuBLAS GEMM (target <= 1.10)"
    )
    for m, n, k in ((8192, 8192, 1024), (4096, 14336, 4096)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 8
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        t_gemm = bench_ms(lambda x=x, w=w: x @ w.T)
        print(f"{m}x{n}x{k}: bare cuBLAS GEMM {t_gemm * 1e3:.0f} us")
        if (m, n, k) == (8192, 8192, 1024):
            row_reductions(x, w, t_gemm, only)
        for ep in EPILOGUES:
            if only and ep != only:
                continue
            args = (x, w, res) if ep == "residual" else (x, w, bias)

            def make(ep=ep):
                return mm_fusion("linear", bias=ep != "residual", epilogue=ep)

            eager = _torch_epilogue(ep)
            compiled = static_compile(eager)
            compiled(*args)
            fd = make()
            (out,) = fd.execute(list(args))
            ref = eager(*[a.double() for a in args])
            err = ((out.double() - ref).abs().max()).item()
            err_torch = ((eager(*args).double() - ref).abs().max()).item()
            t_eager = bench_ms(lambda f=eager, a=args: f(*a))
            t_comp = bench_ms(lambda f=compiled, a=args: f(*a))
            t_cb = bench_ms(lambda fd=fd, a=args: fd.execute(list(a)))
            line = (
                f"  {ep:>9s}: circbuf {t_cb * 1e3:5.0f} [{fd.last_params().brief()}]  eager {t_eager * 1e3:5.0f}  "
                f"compile {t_comp * 1e3:5.0f}  ratio {t_cb / t_gemm:.3f}  max err {err:.2e} (torch bf16 {err_torch:.2e})"
            )
            if "--variants" in sys.argv:  # the fused kernel under each schedule, same run
                vs, best = [], (t_cb, "heuristic")
                for tag, ov in EPILOGUE_VARIANTS.items():
                    f2 = make()
                    try:
                        f2.fusion.schedule(**ov)
                        f2.execute(list(args))
                        t = bench_ms(lambda f2=f2, a=args: f2.execute(list(a)))
                        vs.append(f"{tag} {t * 1e3:.0f}")
                        best = min(best, (t, tag))
                    except Exception as e:  # noqa: BLE001 - a variant that does not fit is reported
                        vs.append(f"{tag} n/a({type(e).__name__})")
                line += "\n             variants (us): " + " | ".join(vs)
                line += f"\n             heuristic / best ({best[1]}): {t_cb / best[0]:.3f} (target <= 1.03)"
            print(line, flush=True)


def breakdown():
    """Where a fused epilogue's time goes (cooperative and ping-pong, same run):
    the bare GEMM, + bias, + relu, + bias + relu, + bias + gelu, each as a
    circbuf kernel, against the bare cuBLAS GEMM."""
    print(f"GPU: {gpu_name()}  epilogue breakdown (bf16), us")
    parts = {
        "bare": dict(bias=False, epilogue=None),
        "+bias": dict(bias=True, epilogue=None),
        "+relu": dict(bias=False, epilogue="relu"),
        "+bias+relu": dict(bias=True, epilogue="relu"),
        "+bias+gelu": dict(bias=True, epilogue="gelu"),
        "+bias+silu": dict(bias=True, epilogue="silu"),
    }
    sched = {
        "coop": {},
        "coop 128x128": dict(tile=(128, 128, 64)),
        "pp 128x128": dict(pingpong=True, tile=(128, 128, 64)),
        "role 128x128": dict(epilogue="role"),
    }
    for m, n, k in ((8192, 8192, 1024), (4096, 4096, 4096)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 8
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        t_gemm = bench_ms(lambda x=x, w=w: x @ w.T)
        line = [f"cuBLAS {t_gemm * 1e3:.0f}"]
        for tag, kw in parts.items():
            args = [x, w, bias] if kw["bias"] else [x, w]
            for st, ov in sched.items():
                fd = mm_fusion("linear", **kw)
                fd.fusion.schedule(**ov)
                fd.execute(args)
                line.append(f"{tag} {st} {bench_ms(lambda fd=fd, a=args: fd.execute(a)) * 1e3:.0f}")
        print(f"{m}x{n}x{k}: " + " | ".join(line), flush=True)


# fp32 operands (issue 18): with TF32 allowed, against cuBLAS's TF32 GEMM; with it off
# (torch's default: the FFMA path), against cuBLAS's fp32 GEMM; target >= 0.8x at 4096^3
FP32_SHAPES = [  # (M, N, K, kind, with TF32, with TF32 off)
    (2048, 2048, 2048, "matmul", True, True),
    (4096, 4096, 4096, "matmul", True, True),
    (4096, 4096, 4096, "linear", True, True),
    (8192, 8192, 1024, "matmul", True, True),
    (4096, 14336, 4096, "linear", True, False),
    (2047, 2047, 2047, "matmul", True, False),
    (4095, 4097, 4093, "matmul", False, True),  # ragged: element loads along K, bounds checks
    (1024, 1024, 1024, "matmul", False, True),
]


# --fp32 --variants: the FFMA path's overrides against its heuristic (TF32 off), same inputs
FP32_VARIANTS = [
    dict(thread_tile=8, k_step=4, blocks_per_sm=1),  # 163 registers: one CTA an SM
    dict(thread_tile=8, k_step=8),  # 210 registers (at 128: a 24-byte spill)
    dict(thread_tile=4, k_step=8),
    dict(thread_tile=4, k_step=16),
]


def _ffma_variants(m, n, k, kind, a, b, t_torch) -> list:
    rows = []
    for ov in FP32_VARIANTS:
        fd = mm_fusion(kind, dtype=Float)
        fd.fusion.schedule(**ov)
        fd.execute([a, b])
        t = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
        print(
            f"{'':>24s} {'':>6s} {'ieee':>5s} {'':>8s} {tflops(m, n, k, t):8.1f} {t_torch / t:6.3f}  {ov}",
            flush=True,
        )
        rows.append(
            dict(m=m, n=n, k=k, kind=kind, tf32=False, torch_ms=t_torch, circbuf_ms=t, overrides=str(ov))
        )
    return rows


def fp32():
    """fp32 matmuls: TF32 where torch allows it, else IEEE fp32; cuBLAS under
    the same switch, in the same run."""
    print(f"GPU: {gpu_name()}  fp32 operands, do_bench median, TFLOP/s")
    print(f"{'shape':>24s} {'kind':>6s} {'math':>5s} {'cuBLAS':>8s} {'circbuf':>8s} {'ratio':>6s}  path")
    rows = []
    m_ = torch.backends.cuda.matmul
    for tf32 in (True, False):
        m_.allow_tf32 = tf32
        try:
            for m, n, k, kind, with_tf32, with_ieee in FP32_SHAPES:
                if not (with_tf32 if tf32 else with_ieee):
                    continue
                g = torch.Generator(device="cuda").manual_seed(m + n + k)
                a = torch.randn(m, k, device="cuda", generator=g)
                b = torch.randn((n, k) if kind == "linear" else (k, n), device="cuda", generator=g)
                fd = mm_fusion(kind, dtype=Float)
                (out,) = fd.execute([a, b])
                fn = torch_mm(kind)
                ref = fn(a.double(), b.double())
                err_cb = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                err_t = ((fn(a, b).double() - ref).abs().max() / ref.abs().max()).item()
                t_torch = bench_ms(lambda f=fn, a=a, b=b: f(a, b))
                t_cb = bench_ms(lambda fd=fd, a=a, b=b: fd.execute([a, b]))
                r = t_torch / t_cb
                p = fd.last_params()
                where = path(fd) + (
                    f", realigned {', '.join(fd._get_executor().realigned)}"
                    if fd._get_executor().realigned
                    else ""
                )
                print(
                    f"{f'{m}x{n}x{k}':>24s} {kind:>6s} {'tf32' if tf32 else 'ieee':>5s} "
                    f"{tflops(m, n, k, t_torch):8.1f} {tflops(m, n, k, t_cb):8.1f} {r:6.3f}  {where} "
                    f"(max err / max: circbuf {err_cb:.1e}, torch {err_t:.1e})",
                    flush=True,
                )
                rows.append(dict(m=m, n=n, k=k, kind=kind, tf32=tf32, torch_ms=t_torch, circbuf_ms=t_cb,
                                 params=str(p), err=err_cb, torch_err=err_t))  # fmt: skip
                if "--variants" in sys.argv and not tf32 and k % 8 == 0:
                    rows += _ffma_variants(m, n, k, kind, a, b, t_torch)
        finally:
            m_.allow_tf32 = False
    write_json("bench_matmul_fp32.json", rows)


def _edge_cases():
    """(name, fusion builder, inputs, torch's function, bytes the op must move)."""
    import circbuf as cb

    bf = torch.bfloat16
    B = DataType.BFloat16

    def outer(fd):
        fd.add_output(fd.ops.matmul(fd.define_tensor([-1, 1], dtype=B), fd.define_tensor([1, -1], dtype=B)))

    def empty_k(fd):
        fd.add_output(fd.ops.matmul(fd.define_tensor([-1, -1], dtype=B), fd.define_tensor([-1, -1], dtype=B)))

    def expand_returned(fd):
        x = fd.define_tensor([1, -1], dtype=B)
        e = fd.ops.expand(x, [4096, -1])
        fd.add_output(e)
        fd.add_output(fd.ops.linear(e, fd.define_tensor([-1, -1], dtype=B)))

    def odd(fd):
        empty_k(fd)
        fd.fusion.schedule(realign=False)

    def r(*s):
        return torch.randn(*s, device="cuda", dtype=bf)

    def fusion(build):
        with cb.FusionDefinition() as fd:
            build(fd)
        return fd

    n = 8192
    return [
        (
            "outer [8192, 1] @ [1, 8192]",
            fusion(outer),
            [r(n, 1), r(1, n)],
            lambda a, b: a @ b,
            2 * (n * n + 2 * n),
        ),
        ("K = 0: [8192, 0] @ [0, 8192]", fusion(empty_k), [r(n, 0), r(0, n)], lambda a, b: a @ b, 2 * n * n),
        (
            "returned expand: [1, 4096] -> [4096, 4096] @ W.T",
            fusion(expand_returned),
            [r(1, 4096), r(4096, 4096)],
            lambda x, w: (x.expand(4096, 4096), x.expand(4096, 4096) @ w.T),
            None,
        ),
        (
            "realign=False: 2047^3 (cp.async fill)",
            fusion(odd),
            [r(2047, 2047), r(2047, 2047)],
            lambda a, b: a @ b,
            None,
        ),
    ]


def edges() -> list:
    """16-bit matmuls that took the SIMT sum of products before (issue 18: none
    may): the path each takes now, against torch in the same run, and against
    the copy bandwidth where the op is a write of its output."""
    print(f"GPU: {gpu_name()}  bf16, do_bench median")
    print(f"{'case':>48s} {'torch us':>9s} {'circbuf us':>10s} {'ratio':>6s} {'of copy':>7s}  path")
    rows = []
    for name, fd, xs, fn, nbytes in _edge_cases():
        outs = fd.execute(xs)
        ref = fn(*xs)
        ref = ref if isinstance(ref, tuple) else (ref,)
        err = max(
            ((o.float() - r.float()).abs().max().item() if o.numel() else 0.0) for o, r in zip(outs, ref)
        )
        t_torch = bench_ms(lambda f=fn, xs=xs: f(*xs)) * 1e3
        t_cb = bench_ms(lambda fd=fd, xs=xs: fd.execute(xs)) * 1e3
        copy = ""
        if nbytes:
            copy = f"{nbytes / t_cb / 1e3 / copy_bandwidth_gbs(nbytes):7.3f}"
        print(
            f"{name:>48s} {t_torch:9.1f} {t_cb:10.1f} {t_torch / t_cb:6.3f} {copy:>7s}  {path(fd)} (max err {err:.1e})"
        )
        rows.append(dict(case=name, torch_us=t_torch, circbuf_us=t_cb, path=path(fd), err=err))
    return rows


if __name__ == "__main__":
    require_cuda()
    if "--sweep" in sys.argv:
        sweep()
    elif "--clusters" in sys.argv:
        clusters()
    elif "--epilogue" in sys.argv:
        epilogue()
    elif "--breakdown" in sys.argv:
        breakdown()
    elif "--decode" in sys.argv:
        decode()
    elif "--fp32" in sys.argv:
        fp32()
    elif "--edges" in sys.argv:
        write_json("bench_matmul_edges.json", edges())
    elif "--odd" in sys.argv:
        print(f"GPU: {gpu_name()}  bf16, do_bench median, TFLOP/s")
        write_json("bench_matmul_odd.json", odd())
    else:
        table()
