"""Probe for the reduce-scatter's illegal instruction (issue 22): run ONE
variant of the loopback reduce-scatter GEMM on the GPU and print one line.
An illegal instruction loses the CUDA context, so each variant runs in its
own process (scripts/gpu_rs_repro.sh runs them one after the other).

- ``fixed``: the kernel as built (guard rows, stores predicated per peer).
- ``negative``: issue 22's first kernel: every box to every peer at row
  ``r - p * M/world`` (boxes wholly before a peer's rows, and straddling ones).
- ``straddle``: stores predicated per peer but without the guard rows: only
  the box that straddles two row blocks starts at a negative row (-4).

The mutated variants land rows in the wrong places of the (guarded) slots:
what they tell is whether the kernel runs or dies, not their numbers.

Usage: PYTHONPATH=$PWD python3 scripts/gpu_rs_probe.py fixed|negative|straddle
"""

from __future__ import annotations

import sys

import torch

from circbuf.distributed import loopback
from tests.test_distributed import _guarded_stores, expected, operands, stores_at_negative_rows


def straddle_only(kernel):
    guard = kernel.peer["guard_rows"]
    for n, _ in _guarded_stores(kernel):
        store = n.then[0]
        store.coords = [c - guard if d == 1 else c for d, c in enumerate(store.coords)]


def main():
    variant = sys.argv[1]
    mutate = {"fixed": None, "negative": stores_at_negative_rows, "straddle": straddle_only}[variant]
    xs, ws = operands("reduce_scatter", 2, 136, 200, 64, seed=3)  # 68-row blocks: a box straddles them
    try:
        outs = loopback("reduce_scatter", [x.cuda() for x in xs], [w.cuda() for w in ws], mutate=mutate)
        torch.cuda.synchronize()
        err = max(
            (o.double().cpu() - e).abs().max().item() / e.abs().max().item()
            for o, e in zip(outs, expected("reduce_scatter", xs, ws))
        )
        nan = any(o.isnan().any().item() for o in outs)
        print(f"probe {variant}: ran, max rel err {err:.2e}, NaN {nan}")
    except Exception as e:  # noqa: BLE001 - the probe reports whatever the driver said
        print(f"probe {variant}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")


if __name__ == "__main__":
    main()
