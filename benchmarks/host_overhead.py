"""Where the host time of a cached ``fd.execute`` goes (1024-element x*y+1),
and what a segmented fusion adds: sums of a [32, 32] tensor over both axes
(two kernels) against one of them (one kernel).

PYTHONPATH=. python benchmarks/host_overhead.py
PYTHONPATH=. python benchmarks/host_overhead.py --cpu   # no GPU: the host path up to the driver

``--cpu`` runs everything a cached ``fd.execute`` does on the host, on CPU
tensors, with the two CUDA calls stubbed (the stream query and
``cuLaunchKernelEx``, whose cost is the driver's, not circbuf's): key,
lookup, output allocation, argument buffer, launch call. Torch's eager op on
the same CPU tensors is the comparison (its time includes the op's own
arithmetic on 1024 elements, which its CUDA launch would not).
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import circbuf as cb  # noqa: E402
from benchmarks.common import host_us_per_call, require_cuda  # noqa: E402

D = cb.DataType


def cpu_main():
    """The host path with the launch stubbed, on this machine's CPU."""
    import time
    import timeit

    from circbuf.compiler import FusionExecutor

    torch._C._cuda_getCurrentRawStream = lambda index: 0  # the CUDA calls, stubbed

    def make_plan_cpu(self, inputs):
        info, _ = self._bind(inputs, need_cuda=False)
        p = self._build_plan(self._compile(info, "sm_90a"), info, torch.device("cpu"))
        p.launch, p.dev_index = (lambda stream, args: 0), 0
        return p.ready() if hasattr(p, "ready") else p

    FusionExecutor._make_plan = make_plan_cpu

    def best_us(fn, n=5000, repeat=40):
        # CPU time of this thread (time.thread_time), min of the repeats: the
        # machine may be shared, and time spent descheduled is not the path's
        return min(timeit.repeat(fn, number=n, repeat=repeat, timer=time.thread_time)) / n * 1e6

    bf = torch.bfloat16
    with cb.FusionDefinition() as relu:
        relu.add_output(relu.ops.relu(relu.define_tensor([-1], dtype=D.BFloat16)))
    with cb.FusionDefinition() as axpy:
        x = axpy.define_tensor([-1], dtype=D.BFloat16)
        y = axpy.define_tensor([-1], dtype=D.BFloat16)
        axpy.add_output(axpy.ops.cast(axpy.ops.add(axpy.ops.mul(x, y), 1.0), D.BFloat16))
    a, b = torch.randn(1024, dtype=bf), torch.randn(1024, dtype=bf)
    one = torch.randn(1, dtype=bf)
    relu.execute([a])
    axpy.execute([a, b])
    rows = {
        "circbuf relu (1 kernel)": lambda: relu.execute([a]),
        "torch.relu": lambda: torch.relu(a),
        "torch.relu, 1 element": lambda: torch.relu(one),
        "circbuf x*y+1 (1 kernel)": lambda: axpy.execute([a, b]),
        "torch x*y+1 (2 ops)": lambda: a * b + 1,
        "torch.empty(1024)": lambda: torch.empty(1024, dtype=bf, device=a.device),
    }
    print("host time per call on this CPU (launch stubbed), us; thread CPU time, min of 40 repeats")
    for k, fn in rows.items():
        print(f"  {k:26s} {best_us(fn):7.2f}")


def main():
    if "--cpu" in sys.argv:
        return cpu_main()
    require_cuda()
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        y = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(x, y), 1.0), D.BFloat16))
    a = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    fd.execute([a, b])
    ex = fd._executor
    plan = next(iter(ex._plans.values()))
    out = torch.empty(1024, device="cuda", dtype=torch.bfloat16)
    stream = torch._C._cuda_getCurrentRawStream(0)
    rows = {
        "fd.execute": lambda: fd.execute([a, b]),
        "executor.execute": lambda: ex.execute([a, b]),
        "plan.run": lambda: plan.run([a, b]),
        "torch.empty": lambda: torch.empty((1024,), dtype=torch.bfloat16, device=plan.device),
        "write_args": lambda: plan.write_args([a, b], [out]),
        "raw stream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "launch only": lambda: plan.launch(stream, plan.args_addr),
        "empty int size": lambda: torch.empty(1024, dtype=torch.bfloat16, device=plan.device),
        "a.new_empty": lambda: a.new_empty((1024,)),
        "empty_like": lambda: torch.empty_like(a),
        "key": lambda: tuple(
            [(t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.device) for t in (a, b)] + [0]
        ),
        "torch.add(x, 1)": lambda: torch.add(a, 1),
        "torch x*y+1": lambda: a * b + 1,
    }
    print(f"GPU: {torch.cuda.get_device_name()}  host time per call, us")
    us = {}
    for k, fn in rows.items():
        us[k] = host_us_per_call(fn, 5000)
        print(f"  {k:18s} {us[k]:7.2f}")
    one, two = _reductions()
    x = torch.randn(32, 32, device="cuda")
    for fd_ in (one, two):
        fd_.execute([x])
    assert len(two._executor.last.kernels) == 2 and len(one._executor.last.kernels) == 1
    t1 = host_us_per_call(lambda: one.execute([x]), 5000)
    t2 = host_us_per_call(lambda: two.execute([x]), 5000)
    print(f"  {'1 kernel: sum(x,1)':18s} {t1:7.2f}")
    print(f"  {'2 kernels: +sum(x,0)':18s} {t2:7.2f}")
    print(
        f"segmented (2 kernels) / one kernel: {t2 / t1:.2f}x vs sum(x,1), {t2 / us['fd.execute']:.2f}x vs x*y+1"
    )


def _reductions():
    """sum(x, 1) alone (one kernel) and with sum(x, 0) (two segments)."""
    fds = []
    for both in (False, True):
        with cb.FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=D.Float)
            if both:
                fd.add_output(fd.ops.sum(x, [0]))
            fd.add_output(fd.ops.sum(x, [1]))
        fds.append(fd)
    return fds


if __name__ == "__main__":
    main()
