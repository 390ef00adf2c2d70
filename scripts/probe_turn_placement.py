"""Probe (issue 17): where ping-pong's turn barriers sit. The ``turns`` pass
hands the tensor cores to the other warpgroup as soon as this one's MMAs are
issued (before they drain), and orders the two warpgroups' epilogues too.
Variants, each built by rewriting the pass's output in this process:

- ``issued`` (the pass as it is): MMA turn handed over after the k loop;
- ``drained``: handed over after ``WGMMA_WAIT_GROUP 0`` (the MMAs done);
- ``no epilogue order``: the epilogue turn's waits and arrives dropped (the
  two epilogues may overlap each other; the MMA order alone staggers them).
  Not valid for a kernel whose producer loads an epilogue input by TMA (a
  residual): that ring's parity waits rely on the epilogue turn, so the
  probe times bias, relu and gelu epilogues only.

linear (+ bias + relu / gelu), ping-pong 64x256, bf16, 8192x8192x1024 and
4096x14336x4096, bare cuBLAS GEMM in the same run; two timings each, us::

    PYTHONPATH=. python scripts/probe_turn_placement.py
"""

from __future__ import annotations

import os

os.environ["CIRCBUF_CACHE_DIR"] = ""  # no disk cache: the variants differ only in this process

import torch  # noqa: E402

from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from benchmarks.matmul import _torch_epilogue  # noqa: E402
from circbuf import lowering  # noqa: E402
from circbuf.lowering.kir import ForLoop, MBarrierArrive, MBarrierWait, WgmmaWait, walk  # noqa: E402
from circbuf.lowering.passes import Pass  # noqa: E402
from circbuf.lowering.turns import take_turns  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402

PP = dict(pingpong=True, tile=(64, 256, 64))
MODE = {"variant": "issued"}


def _tile_bodies(kernel):
    bodies = []
    walk(kernel.body, lambda n, s: bodies.append(n.body) if isinstance(n, ForLoop) else None)
    return bodies


def variant_turns(kernel):
    kernel = take_turns(kernel)
    if MODE["variant"] == "issued" or not kernel.turn_orders:
        return kernel
    for body in _tile_bodies(kernel):
        arrive = next(
            (n for n in body if isinstance(n, MBarrierArrive) and n.bar.name.endswith("_mma_turn")), None
        )
        if arrive is None:
            continue
        if MODE["variant"] == "drained":
            body.remove(arrive)
            drain = next(j for j, n in enumerate(body) if isinstance(n, WgmmaWait) and n.pending == 0)
            body.insert(drain + 1, arrive)
        elif MODE["variant"] == "no epilogue order":
            body[:] = [
                n
                for n in body
                if not (isinstance(n, (MBarrierArrive, MBarrierWait)) and n.bar.name.endswith("_epi_turn"))
            ]
    return kernel


def main():
    k = next(j for j, p in enumerate(lowering.PASSES) if p.name == "turns")
    p = lowering.PASSES[k]
    lowering.PASSES[k] = Pass(p.name, variant_turns, p.requires, p.provides, p.consumes, p.renames)
    print(f"GPU: {gpu_name()}  linear, ping-pong 64x256, bf16, us (two timings)")
    for m, n, kk in [(8192, 8192, 1024), (4096, 14336, 4096)]:
        x = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16) / 8
        w = torch.randn(n, kk, device="cuda", dtype=torch.bfloat16) / 8
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        t_gemm = bench_ms(lambda x=x, w=w: x @ w.T) * 1e3
        print(f"{m}x{n}x{kk}: bare cuBLAS {t_gemm:.0f}", flush=True)
        for ep in (None, "relu", "gelu"):
            ins = [x, w] if ep is None else [x, w, bias]
            want = (
                (x.double() @ w.double().T) if ep is None else _torch_epilogue(ep)(*(t.double() for t in ins))
            )
            for v in ("issued", "drained", "no epilogue order"):
                MODE["variant"] = v
                fd = mm_fusion("linear", bias=ep is not None, epilogue=ep)
                fd.fusion.schedule(**PP)
                (out,) = fd.execute(ins)
                ok = (out.double() - want).abs().max().item() < 0.1
                ts = [bench_ms(lambda fd=fd, ins=ins: fd.execute(ins)) * 1e3 for _ in range(2)]
                print(
                    f"  {ep or 'bare':>4s} {v:18s} {ts[0]:6.1f} / {ts[1]:6.1f}  ({min(ts) / t_gemm:.3f} of bare)"
                    f"{'' if ok else '  WRONG'}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
