"""Warm start: the time of a fusion's first compile in a fresh process when
its kernel is already in the disk cache (``CIRCBUF_CACHE_DIR``).

Each case runs in a new Python process (imports done before the clock starts):
define the fusion, then time ``fd.compile(inputs, arch="sm_90a")`` (CPU
tensors; no GPU needed). The first process fills the cache (cold), the next
ones find it (warm). Cases: a pointwise (x*y+1 in bf16), a normalization
(rms_norm of a [4096, 4096] bf16 tensor), a linear+gelu ([2048, 4096] x
[4096, 4096]^T + bias, then gelu, bf16) and a segmented fusion (two sums of
exp(x) over either axis of a [4096, 4096] fp32 tensor: two kernels).

    PYTHONPATH=. python benchmarks/warm_start.py               # cold, then warm x5, per case
    PYTHONPATH=. python benchmarks/warm_start.py --repeat 10
    PYTHONPATH=. python benchmarks/warm_start.py --root /work/main   # another checkout's circbuf
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = __file__.rsplit("/", 2)[0]
CASES = ("pointwise", "rms_norm", "linear_gelu", "two_sums")

CHILD = r"""
import json, sys, time
sys.path.insert(0, {root!r})
import torch
import circbuf as cb
import circbuf.compiler, circbuf.lowering, circbuf.scheduler.registry, circbuf.runtime.nvrtc  # imports off the clock
D = cb.DataType
case = {case!r}
t0 = time.perf_counter()
with cb.FusionDefinition() as fd:
    if case == "pointwise":
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        y = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(x, y), 1.0), D.BFloat16))
        ins = [torch.empty(1 << 20, dtype=torch.bfloat16)] * 2
    elif case == "rms_norm":
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.rms_norm(x, w, 1e-5))
        ins = [torch.empty(4096, 4096, dtype=torch.bfloat16), torch.empty(4096, dtype=torch.bfloat16)]
    elif case == "two_sums":
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(fd.ops.exp(x), [0]))
        fd.add_output(fd.ops.sum(x, [1]))
        ins = [torch.empty(4096, 4096)]
    else:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.linear(a, w, b)), D.BFloat16))
        ins = [torch.empty(2048, 4096, dtype=torch.bfloat16), torch.empty(4096, 4096, dtype=torch.bfloat16),
               torch.empty(4096, dtype=torch.bfloat16)]
t1 = time.perf_counter()
ck = fd.compile(ins, arch="sm_90a")
t2 = time.perf_counter()
print(json.dumps({{"define_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3, "kernels": len(ck.kernels)}}))
"""


def run_case(case: str, cache: str, root: str = ROOT) -> dict:
    env = dict(os.environ, CIRCBUF_CACHE_DIR=cache)
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=root, case=case)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="warm processes per case")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--root", default=ROOT, help="the checkout whose circbuf is timed")
    args = ap.parse_args()
    print(f"fd.compile(arch='sm_90a') in a fresh process, ms (imports not counted); circbuf from {args.root}")
    print(f"{'case':12s} {'cold':>8s} {'warm min':>9s} {'warm median':>12s}  kernels")
    with tempfile.TemporaryDirectory() as cache:
        for case in args.cases.split(","):
            cold = run_case(case, cache, args.root)
            warm = sorted(run_case(case, cache, args.root)["compile_ms"] for _ in range(args.repeat))
            print(
                f"{case:12s} {cold['compile_ms']:8.1f} {warm[0]:9.1f} {warm[len(warm) // 2]:12.1f}  {cold['kernels']}"
            )


if __name__ == "__main__":
    main()
