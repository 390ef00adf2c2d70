"""Timing helpers shared by the benchmarks (median of triton's do_bench)."""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def require_cuda() -> None:
    """One line and exit status 1 where there is no CUDA GPU to time on (not a
    traceback from the first CUDA tensor)."""
    if not torch.cuda.is_available():
        name = os.path.basename(sys.argv[0]) or "this benchmark"
        print(
            f"{name}: needs a CUDA GPU (torch.cuda.is_available() is False); nothing was timed",
            file=sys.stderr,
        )
        sys.exit(1)


def bench_ms(fn, warmup=25, rep=100) -> float:
    """Median milliseconds of ``fn`` on the current stream, after warm-up."""
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    except ImportError:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        times.sort()
        return times[len(times) // 2]


def static_compile(fn):
    """``fn`` under torch.compile as a user compiling it for one shape gets it:
    a fresh dynamo (``torch._dynamo.reset()``) and ``dynamic=False``. Call it
    once per shape: one compiled function fed several shapes recompiles with
    dynamic shapes, a slower kernel than a user gets, which flatters circbuf.

    >>> # comp = static_compile(torch.softmax); comp(x, -1)
    """
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def copy_bandwidth_gbs(nbytes: int) -> float:
    """Device-to-device copy of ``nbytes``: bytes read + written per second."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def write_json(name: str, rows):
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, name), "w") as f:
            json.dump(rows, f, indent=1)


def gpu_name() -> str:
    return torch.cuda.get_device_name()


def host_us_per_call(fn, n=2000, until_done=True) -> float:
    """Wall-clock microseconds per call of a host-bound ``fn`` (tiny inputs);
    ``until_done=False``: the host's own time, the clock stopped before the GPU
    finishes what the calls queued."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    if until_done:
        torch.cuda.synchronize()
    t = time.perf_counter() - t
    torch.cuda.synchronize()
    return t / n * 1e6


def kernel_us_per_call(fn, n=20) -> dict:
    """{kernel name (60 characters): its GPU time per call, us} over ``n`` calls of
    ``fn`` (torch.profiler; kernels of one name summed)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    agg = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if t and t > 0:
            agg[e.key[:60]] = agg.get(e.key[:60], 0.0) + t / n
    return agg
