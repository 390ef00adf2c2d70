"""Probe (issue 18, odd shapes): the realign copy, circbuf's row copy
(``circbuf/runtime/row_copy.py``: 16-byte loads, a funnel shift, 16-byte
stores) against torch's ``copy_`` into the same padded rows, and a flat copy
of as many bytes (the bound); GB/s of the bytes read + written; both of a
2047^3 GEMM's operands in one launch against two ``copy_``.

    python scripts/probe_row_copy.py
"""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks.common import bench_ms, gpu_name  # noqa: E402
from circbuf.runtime import row_copy  # noqa: E402
from circbuf.scheduler.realign import realigned_strides  # noqa: E402


def dst_for(x):
    st = realigned_strides(tuple(x.shape), x.stride(), x.element_size())
    return torch.empty_strided(x.shape, st, dtype=x.dtype, device=x.device)


def gbs(nbytes, us):
    return 2 * nbytes / us / 1e3


def realign_cases() -> dict:
    """The operands ``benchmarks/matmul.py --odd`` realigns (bf16, on the GPU);
    ``scripts/probe_pitched_copy.py`` times the same ones."""
    flat = torch.randn(4096 * 4096 + 1, device="cuda").bfloat16()
    return {
        "[2047, 2047]": torch.randn(2047, 2047, device="cuda").bfloat16(),
        "[768, 50257]": torch.randn(768, 50257, device="cuda").bfloat16(),
        "[4097, 4095]": torch.randn(4097, 4095, device="cuda").bfloat16(),
        "[4096, 4096] one element off": flat[1:].view(4096, 4096),
        "[4096, 4100]": torch.randn(4096, 4100, device="cuda").bfloat16(),
        "[4095, 4096] columns (B.T)": torch.randn(4096, 4095, device="cuda").bfloat16().T,
    }


def main():
    print(f"GPU: {gpu_name()}  bf16, do_bench median, us (GB/s of bytes read + written)")
    dev = torch.cuda.current_device()
    cases = realign_cases()
    for name, x in cases.items():
        y1, y2 = dst_for(x), dst_for(x)
        nbytes = x.numel() * x.element_size()
        t_torch = bench_ms(lambda y1=y1, x=x: y1.copy_(x)) * 1e3
        bound = row_copy.copier(dev).bind([row_copy.job_of(x, y2)])
        t_row = bench_ms(lambda b=bound, x=x, y2=y2: b([(x, y2)])) * 1e3
        torch.cuda.synchronize()
        same = torch.equal(y1, y2)
        z, xf = torch.empty_like(x.reshape(-1)), torch.empty_like(x.reshape(-1))
        t_flat = bench_ms(lambda z=z, xf=xf: z.copy_(xf)) * 1e3
        print(
            f"{name:>30s}: copy_ {t_torch:7.1f} ({gbs(nbytes, t_torch):5.0f}) | row copy {t_row:7.1f} "
            f"({gbs(nbytes, t_row):5.0f}, equal {same}) | flat {t_flat:6.1f} ({gbs(nbytes, t_flat):5.0f})",
            flush=True,
        )

    a = torch.randn(2047, 2047, device="cuda").bfloat16()
    b = torch.randn(2047, 2047, device="cuda").bfloat16()
    da, db = dst_for(a), dst_for(b)
    both = row_copy.copier(dev).bind([row_copy.job_of(a, da), row_copy.job_of(b, db)])
    t2 = bench_ms(lambda: (dst_for(a).copy_(a), dst_for(b).copy_(b))) * 1e3
    t1 = bench_ms(lambda: both([(a, da), (b, db)])) * 1e3
    print(
        f"2047^3 operands: two copy_ (with their allocations) {t2:.1f} us | one row-copy launch {t1:.1f} us"
    )


if __name__ == "__main__":
    main()
