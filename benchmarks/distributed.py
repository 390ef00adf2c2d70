"""Issue 22: tensor-parallel linear layers whose GEMM ships its tiles to the
peer GPUs (circbuf.distributed), against the unfused sequence (cuBLAS GEMM,
then the NCCL collective) and the GEMM alone.

    python benchmarks/distributed.py [--world 2] [--shapes 8192x8192x8192,4096x4096x4096]
                                     [--kinds all_gather,reduce_scatter] [--iters 20] [--check]

One process per GPU (torch.multiprocessing, NCCL through a file:// rendezvous,
no network). MxNxK is the whole layer: an all-gather splits N over the ranks
(each computes x @ w_r.T, [M, N/world]), a reduce-scatter splits K (each a
[M, N] partial; rank d keeps rows d*M/world..). Times are the slowest rank's
milliseconds per call (CUDA events over ``--iters`` calls after warm-up).
overlap = (gemm + collective - fused) / collective: the share of the
collective's time the fused kernel hides (1: all of it).
``--check``: correctness only (the GPU tests' entry), no timing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def init(rank, world, initfile):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{initfile}",
        rank=rank,
        world_size=world,
        device_id=torch.device("cuda", rank),
    )


def shards(kind, m, n, k, world, rank, seed=0, dtype=torch.bfloat16):
    """The whole layer's x [M, K] and w [N, K] (the same on every rank: one
    seed) and this rank's shards."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(m, k, device="cuda", generator=g) / 4).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) / 4).to(dtype)
    if kind == "all_gather":
        nr = n // world
        return x, w, x, w[rank * nr : (rank + 1) * nr].contiguous()
    kr = k // world
    return (
        x,
        w,
        x[:, rank * kr : (rank + 1) * kr].contiguous(),
        w[:, rank * kr : (rank + 1) * kr].contiguous(),
    )


def unfused(kind, xr, wr, world):
    """cuBLAS GEMM then NCCL: the sequence the fused kernel replaces."""
    import torch.distributed as dist

    y = torch.nn.functional.linear(xr, wr)
    if kind == "all_gather":
        out = torch.empty(world * y.shape[0], y.shape[1], dtype=y.dtype, device=y.device)
        dist.all_gather_into_tensor(out, y)
        return out
    out = torch.empty(y.shape[0] // world, y.shape[1], dtype=y.dtype, device=y.device)
    dist.reduce_scatter_tensor(out, y)
    return out


def as_layer_output(kind, out, world):
    """The NCCL result in the layer's layout: an all-gather's [world*M, N/world]
    blocks side by side ([M, N])."""
    return torch.cat(list(out.chunk(world)), dim=1) if kind == "all_gather" else out


def fused(kind, xr, wr, check=True):
    from circbuf.distributed import linear_all_gather, linear_reduce_scatter

    return (linear_all_gather if kind == "all_gather" else linear_reduce_scatter)(xr, wr, check=check)


def check_case(kind, m, n, k, world, rank, seed=0):
    """Two calls (both alternating buffers) against float64 and against
    cuBLAS + NCCL; returns the relative errors."""
    x, w, xr, wr = shards(kind, m, n, k, world, rank, seed)
    full = x.double() @ w.double().T
    want = full if kind == "all_gather" else full[rank * (m // world) : (rank + 1) * (m // world)]
    ref = as_layer_output(kind, unfused(kind, xr, wr, world), world).double()
    scale = want.abs().max().item()
    errs = []
    for _call in range(2):
        got = fused(kind, xr, wr).double()
        assert got.shape == want.shape, (got.shape, want.shape)
        assert not got.isnan().any(), f"{kind} {m}x{n}x{k} rank {rank}: NaN (an element no peer stored)"
        e64 = (got - want).abs().max().item() / scale
        enccl = (got - ref).abs().max().item() / scale
        errs.append((e64, enccl))
        assert e64 < 2e-2 and enccl < 2e-2, (
            f"{kind} {m}x{n}x{k} rank {rank}: rel. error {e64:.3g} (fp64), {enccl:.3g} (NCCL)"
        )
    return errs


def check_timeout(world, rank):
    """Rank 0 calls, the others do not: rank 0 raises DistributedTimeout after
    CIRCBUF_DIST_TIMEOUT seconds (no hang)."""
    import torch.distributed as dist

    from circbuf.distributed import DistributedTimeout

    os.environ["CIRCBUF_DIST_TIMEOUT"] = "3"  # read when the layer is built (its first call)
    kind, m, n, k = "all_gather", 512, 512 * world, 256
    _, _, xr, wr = shards(kind, m, n, k, world, rank, seed=3)
    fused(kind, xr, wr)  # a call every rank makes
    if rank == 0:
        try:
            fused(kind, xr, wr)
        except DistributedTimeout as e:
            msg = str(e)
        else:
            raise AssertionError("rank 0 got every tile of a call the other ranks never made")
        assert re.search(rf"rank 0 waited 3 s .* for tile \d+ of rank [1-9]\d* of {world}", msg), msg
    dist.barrier()


def worker_check(rank, world, initfile, cases, timeout_case):
    import torch.distributed as dist

    init(rank, world, initfile)
    try:
        for kind, m, n, k in cases:
            errs = check_case(kind, m, n, k, world, rank)
            if rank == 0:
                print(f"check {kind} {m}x{n}x{k} world {world}: rel. err vs fp64 / NCCL {errs}", flush=True)
        if timeout_case:
            check_timeout(world, rank)
            if rank == 0:
                print(f"check timeout world {world}: DistributedTimeout raised", flush=True)
    finally:
        dist.destroy_process_group()


def spawn_check(world, cases, timeout_case=False):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(
            worker_check, args=(world, os.path.join(d, "init"), cases, timeout_case), nprocs=world, join=True
        )


def timed(fn, iters):
    import torch.distributed as dist

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    t = torch.tensor([s.elapsed_time(e) / iters], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def circbuf_gemm(xr, wr):
    """circbuf's own GEMM of the shard (no peers): the kernel's speed apart from the overlap."""
    import circbuf as cb

    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=cb.DataType.BFloat16)
        fd.add_output(fd.ops.linear(a, b))
    fd.fusion.schedule(persistent=True, pingpong=False)
    return lambda: fd.execute([xr, wr])


def bench_case(kind, m, n, k, world, rank, iters):
    """One shape: fused, unfused, the GEMMs and the collective alone (ms, slowest rank)."""
    import torch.distributed as dist

    _, _, xr, wr = shards(kind, m, n, k, world, rank)
    fused(kind, xr, wr)  # compile, rendezvous, check
    y = torch.nn.functional.linear(xr, wr)
    t_fused = timed(lambda: fused(kind, xr, wr, check=False), iters)
    t_stores = timed(gemm_with_peer_stores(kind, xr, wr), iters)
    fused(kind, xr, wr, check=True)  # raises if a timed call timed out
    t_gemm = timed(lambda: torch.nn.functional.linear(xr, wr), iters)
    t_cb = timed(circbuf_gemm(xr, wr), iters)
    if kind == "all_gather":
        g = torch.empty(world * y.shape[0], y.shape[1], dtype=y.dtype, device=y.device)
        t_coll = timed(lambda: dist.all_gather_into_tensor(g, y), iters)
    else:
        r = torch.empty(y.shape[0] // world, y.shape[1], dtype=y.dtype, device=y.device)
        t_coll = timed(lambda: dist.reduce_scatter_tensor(r, y), iters)
    t_unfused = timed(lambda: unfused(kind, xr, wr, world), iters)
    overlap = (t_gemm + t_coll - t_fused) / t_coll if t_coll > 0 else float("nan")
    return dict(
        kind=kind, shape=f"{m}x{n}x{k}", world=world, fused_ms=t_fused, unfused_ms=t_unfused,
        peer_store_gemm_ms=t_stores,
        cublas_gemm_ms=t_gemm, circbuf_gemm_ms=t_cb, nccl_ms=t_coll,
        speedup=t_unfused / t_fused, overlap=overlap,
    )  # fmt: skip


def gemm_with_peer_stores(kind, xr, wr):
    """The fused call's GEMM kernel alone (its peer stores and flags, no
    flag wait, no sum): what the stores cost the GEMM, apart from the tail.
    Every rank runs as many, so the flags stay in step (the epoch counts them)."""
    from circbuf.distributed import _layer

    lay = _layer(kind, xr, wr, None)
    stream = torch.cuda.current_stream().cuda_stream

    def run():
        lay.epoch += 1
        lay.gemm.run(xr, wr, lay.rank, lay.bufs[lay.epoch % 2], lay.flags, stream=stream)

    return run


def worker_bench(rank, world, initfile, cases, iters, out):
    import torch.distributed as dist

    init(rank, world, initfile)
    rows = []
    try:
        for kind, m, n, k in cases:
            row = bench_case(kind, m, n, k, world, rank, iters)
            rows.append(row)
            if rank == 0:
                print(
                    f"{kind:15s} {m}x{n}x{k} world {world}: fused {row['fused_ms']:.3f} ms | unfused "
                    f"{row['unfused_ms']:.3f} (cuBLAS {row['cublas_gemm_ms']:.3f} + NCCL {row['nccl_ms']:.3f}) | "
                    f"circbuf GEMM alone {row['circbuf_gemm_ms']:.3f}, with peer stores "
                    f"{row['peer_store_gemm_ms']:.3f} | speedup {row['speedup']:.3f}x | "
                    f"overlap {row['overlap']:.2f}",
                    flush=True,
                )
        if rank == 0 and out:
            with open(out, "w") as f:
                json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    finally:
        dist.destroy_process_group()


def parse_shapes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096")
    ap.add_argument("--kinds", default="all_gather,reduce_scatter")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--check", action="store_true", help="correctness only")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "/tmp"), "bench_distributed.json"))
    a = ap.parse_args()
    if torch.cuda.device_count() < a.world:
        print(f"distributed.py: needs {a.world} GPUs, found {torch.cuda.device_count()}; nothing was timed")
        sys.exit(1)
    cases = [(kind, *s) for s in parse_shapes(a.shapes) for kind in a.kinds.split(",")]
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        if a.check:
            mp.spawn(
                worker_check, args=(a.world, os.path.join(d, "init"), cases, False), nprocs=a.world, join=True
            )
        else:
            mp.spawn(
                worker_bench,
                args=(a.world, os.path.join(d, "init"), cases, a.iters, a.json),
                nprocs=a.world,
                join=True,
            )


if __name__ == "__main__":
    main()
