"""Probe (issue 17, normalization on the H200): the register-staged kernel with up
to 5 CTAs of 256 threads per SM (a 48-register cap, kept only where ptxas does not
spill: ``NormalizationScheduler.if_spilled``) against the 64-register floor it had
(``TRY_REGISTER_CAP = 64``), both in one run on the same inputs; fractions of the
measured copy bandwidth. Only the shapes whose choice differs are timed::

    PYTHONPATH=. python scripts/probe_norm_blocks.py

The disk cache is off for the run: its key is the fusion, the inputs and circbuf's
source, not a module constant changed at run time, so the second choice would load
the first one's kernel.
"""

from __future__ import annotations

import os

os.environ["CIRCBUF_CACHE_DIR"] = ""  # before circbuf reads it: no disk cache

import torch  # noqa: E402

from benchmarks.common import bench_ms, copy_bandwidth_gbs, gpu_name  # noqa: E402
from benchmarks.normalization import KINDS, SHAPES  # noqa: E402
from circbuf.scheduler import normalization as norm  # noqa: E402
from tests.util import D, norm_fusion, norm_inputs, norm_reference  # noqa: E402


def main():
    new_cap = norm.TRY_REGISTER_CAP
    copy = copy_bandwidth_gbs(1 << 30)
    print(
        f"GPU: {gpu_name()}  copy {copy:.0f} GB/s; of copy: cap 64 (before) -> cap {new_cap} (spill-checked)"
    )
    for kind in KINDS:
        for r, c in SHAPES:
            ins = norm_inputs(kind, r, c, torch.bfloat16, "cuda")
            ref = norm_reference(kind, ins)
            got = []
            for cap in (64, new_cap):
                norm.TRY_REGISTER_CAP = cap
                fd = norm_fusion(kind, D.BFloat16)
                (out,) = fd.execute(ins)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (kind, r, c, cap, err)
                got.append((fd, fd.last_params()))
            norm.TRY_REGISTER_CAP = new_cap
            (f0, p0), (f1, p1) = got
            if p0 == p1:
                print(f"  {kind:10s} {r}x{c}: same (b{p0.blocks_per_sm})", flush=True)
                continue
            nbytes = 2 * r * c * 2
            t = [bench_ms(lambda f=f, a=ins: f.execute(a)) for f in (f0, f1, f0, f1)]
            frac = [nbytes / x / 1e6 / copy for x in t]
            print(
                f"  {kind:10s} {r}x{c}: b{p0.blocks_per_sm} {frac[0]:.3f}/{frac[2]:.3f} -> "
                f"b{p1.blocks_per_sm} {frac[1]:.3f}/{frac[3]:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
