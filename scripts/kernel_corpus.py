"""Compile a corpus of fusions (every scheduler and variant) for sm_90a and
write each kernel's CUDA (from ``extern "C"`` on) and kernel IR to a
directory, so that a lowering refactor can be checked to leave the
generated code unchanged: run it before and after, then ``diff -r``.

    python scripts/kernel_corpus.py OUT_DIR [--sass] [-k SUBSTRING]

``--sass`` also writes the SASS instruction counts of each kernel (slow).
No GPU is needed (NVRTC compiles without one).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import circbuf as cb  # noqa: E402
from tests.test_gpu_matmul import mm_fusion  # noqa: E402
from tests.util import D, axpy_fusion, manual_ws_exp, norm_fusion, norm_inputs, outer_fusion  # noqa: E402

BF, H = torch.bfloat16, torch.float16
TD = {BF: D.BFloat16, H: D.Half, torch.float32: D.Float}


def _pointwise(rank, shape, dtype=BF, **ov):
    def make():
        fd = axpy_fusion(TD[dtype], rank)
        if ov:
            fd.fusion.schedule(**ov)
        return fd, [torch.randn(*shape, dtype=dtype)] * 2

    return make


def _pointwise_broadcast(rows, cols):
    """``x * s[M, 1] + bias[1, N]``: the rows-and-columns schedule."""

    def make():
        with cb.FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
            s = fd.define_tensor([-1, 1], dtype=D.BFloat16)
            b = fd.define_tensor([1, -1], dtype=D.BFloat16)
            fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(x, s), b), D.BFloat16))
        return fd, [
            torch.randn(rows, cols, dtype=BF),
            torch.randn(rows, 1, dtype=BF),
            torch.randn(1, cols, dtype=BF),
        ]

    return make


def _norm(kind, rows, cols, dtype=BF, **ov):
    def make():
        fd = norm_fusion(kind, TD[dtype])
        if ov:
            fd.fusion.schedule(**ov)
        return fd, norm_inputs(kind, rows, cols, dtype, "cpu")

    return make


def _outer(op, shape, axes, weight=False, **ov):
    def make():
        fd = outer_fusion(op, D.Half, len(shape), axes, weight)
        if ov:
            fd.fusion.schedule(**ov)
        ins = [torch.randn(*shape, dtype=H)]
        if weight:
            ins.append(torch.randn(*shape[len(axes) :], dtype=H))
        return fd, ins

    return make


def _plain_reduction(shape):
    def make():
        with cb.FusionDefinition() as fd:
            x = fd.define_tensor([-1] * len(shape), dtype=D.Float)
            fd.add_output(fd.ops.sum(fd.ops.exp(x), [len(shape) - 1]))
        return fd, [torch.randn(*shape)]

    return make


def _mm(kind, m, n, k, dtype=BF, bias=False, epilogue=None, **ov):
    def make():
        fd = mm_fusion(kind, TD[dtype], bias=bias, epilogue=epilogue)
        if ov:
            fd.fusion.schedule(**ov)
        a = torch.randn(m, k, dtype=dtype)
        b = torch.randn((n, k) if kind == "linear" else (k, n), dtype=dtype)
        ins = [a, b]
        if bias:
            ins.append(torch.randn(n, dtype=dtype))
        if epilogue == "residual":
            ins.append(torch.randn(m, n, dtype=dtype))
        return fd, ins

    return make


def _manual_ws():
    def make():
        return manual_ws_exp(128, 3), [torch.randn(37, 1000, dtype=BF)]

    return make


def _segmented():
    def make():
        with cb.FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
            w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
            bias = fd.define_tensor([-1], dtype=D.BFloat16)
            g = fd.define_tensor([-1], dtype=D.BFloat16)
            b = fd.define_tensor([-1], dtype=D.BFloat16)
            y = fd.ops.linear(x, w, bias)
            fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.layer_norm(y, g, b, 1e-5)), D.BFloat16))
        ins = [torch.randn(256, 128, dtype=BF), torch.randn(384, 128, dtype=BF), torch.randn(384, dtype=BF)]
        ins += [torch.randn(384, dtype=BF), torch.randn(384, dtype=BF)]
        return fd, ins

    return make


def _hang(make):
    def made():
        fd, ins = make()
        return fd, ins, {"CIRCBUF_DEBUG_HANG": "2000000"}

    return made


CORPUS = {
    # pointwise
    "pw_plain": _pointwise(2, (64, 1024)),
    "pw_plain_1d": _pointwise(1, (4096,)),
    "pw_broadcast_rows_columns": _pointwise_broadcast(8192, 4096),
    "pw_tma": _pointwise(2, (1000, 1024), stages=3),
    "pw_tma_ws": _pointwise(3, (3, 77, 512), H, stages=4, warp_specialized=True),
    "pw_tma_pipe_3d": _pointwise(3, (3, 77, 512), H, stages=4, warp_specialized=False),
    "pw_tma_store": _pointwise(2, (1000, 1024), stages=3, tma_store=True),
    "pw_tma_store_ws": _pointwise(2, (1000, 1024), stages=3, tma_store=True, warp_specialized=True),
    "pw_manual_ws_setmaxnreg": _manual_ws(),
    # normalization
    **{
        f"norm_{kind}_{name}": _norm(kind, 4096, 4096, **ov)
        for kind in ("softmax", "layer_norm", "rms_norm")
        for name, ov in (
            ("registers", {}),
            ("tma", {"staging": "tma"}),
            ("ws", {"warp_specialized": True, "stages": 3}),
        )
    },
    "norm_softmax_tma_mbar": _norm("softmax", 3000, 1024, stages=4, war="mbarrier"),
    "norm_softmax_tma_blocksync": _norm("softmax", 3000, 1024, stages=2, war="block_sync"),
    "norm_softmax_ws_small": _norm("softmax", 3, 4096, stages=2, warp_specialized=True),
    "norm_layer_norm_tma_bps2": _norm("layer_norm", 1024, 4096, blocks_per_sm=2, staging="tma"),
    "norm_softmax_fp32_tma": _norm("softmax", 1000, 1000, torch.float32, staging="tma"),
    # outer reduction
    "outer_max_pipe": _outer("max", (100, 3, 264), (0,), stages=3, warp_specialized=False),
    "outer_max_ws": _outer("max", (100, 3, 264), (0,), stages=3, warp_specialized=True),
    "outer_mean_ws": _outer("mean", (4, 100, 264), (0, 1), stages=3, warp_specialized=True),
    "outer_sum_weight_pipe": _outer("sum", (999, 136), (0,), True, stages=3, warp_specialized=False),
    "outer_sum_weight_ws": _outer("sum", (999, 136), (0,), True, stages=3, warp_specialized=True),
    # plain reduction
    "reduction_inner": _plain_reduction((128, 1000)),
    # matmul
    "mm_coop": _mm("matmul", 1000, 1032, 520),
    "mm_coop_fp16": _mm("matmul", 1024, 1024, 512, H),
    "mm_coop_gelu": _mm("matmul", 512, 384, 256, epilogue="gelu"),
    "mm_coop_nonpersistent": _mm("matmul", 1000, 1032, 520, persistent=False),
    "mm_lin_bias_gelu": _mm("linear", 1000, 1032, 520, bias=True, epilogue="gelu"),
    "mm_lin_bias_gelu_fp16": _mm("linear", 512, 384, 256, H, bias=True, epilogue="gelu"),
    "mm_residual": _mm("matmul", 512, 384, 256, epilogue="residual"),
    "mm_coop_t128_s6": _mm("matmul", 1000, 1032, 520, tile=(128, 128, 64), stages=6),
    "mm_coop_s5_p2": _mm("matmul", 1000, 1032, 520, tile=(128, 128, 64), stages=5, prefetch=2),
    "mm_coop_t256": _mm("linear", 777, 1000, 296, tile=(256, 128, 64)),
    "mm_decode_split_k": _mm("linear", 1, 4096, 4096, bias=True, split_k=2),  # summed in the kernel
    "mm_coop_split_k": _mm("matmul", 256, 256, 8192, epilogue="gelu", split_k=8),
    "mm_simt_ragged": _mm("matmul", 77, 100, 300),  # B's rows of 200 bytes: a cp.async fill since issue 18
    "mm_simt_fp32": _mm("matmul", 77, 100, 300, torch.float32),
    "mm_cp_async_odd_k": _mm(
        "matmul", 2047, 2047, 2047, fill="cp.async"
    ),  # rows 2-byte aligned: via registers
    "mm_cp_async_8b_pp": _mm("matmul", 1000, 1032, 516, pingpong=True, fill="cp.async"),  # 8-byte A rows
    "mm_rows_odd_n": _mm("matmul", 2047, 2047, 2047),  # output rows 2-byte aligned: row store
    "mm_rows_pp_bias_gelu": _mm("linear", 1000, 1031, 520, bias=True, epilogue="gelu", pingpong=True),
    "mm_pp": _mm("matmul", 1000, 1032, 520, persistent=True, pingpong=True),
    "mm_pp_regs": _mm("matmul", 1000, 1032, 520, pingpong=True, tile=(64, 256, 64), registers=(24, 240)),
    "mm_pp_bias_gelu": _mm("linear", 1000, 1032, 520, bias=True, epilogue="gelu", pingpong=True),
    "mm_pp_silu_fp16": _mm("matmul", 520, 264, 136, H, epilogue="silu", pingpong=True),
    "mm_pp_lin_fp16_bias": _mm("linear", 1024, 1024, 512, H, bias=True, pingpong=True, tile=(64, 256, 64)),
    # bounded waits (CIRCBUF_DEBUG_HANG): the hang record names barrier and stage
    "hang_mm_pp": _hang(_mm("matmul", 1000, 1032, 520, pingpong=True)),
    "hang_norm_ws": _hang(_norm("softmax", 3000, 1024, stages=3, warp_specialized=True)),
    "hang_pw_tma": _hang(_pointwise(2, (1000, 1024), stages=3)),
    # segmented: a matmul and a normalization kernel
    "seg_linear_layer_norm_gelu": _segmented(),
}


def _body(cuda: str) -> str:
    return cuda[cuda.index('extern "C"') :]


def _sass_counts(sass: str) -> str:
    ops = collections.Counter(
        m.group(1).split(".")[0]
        for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    )
    return "\n".join(f"{op} {n}" for op, n in sorted(ops.items())) + f"\nTOTAL {sum(ops.values())}\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for name, make in CORPUS.items():
        if args.k not in name:
            continue
        try:
            fd, ins, *env = make()
            old = {k: os.environ.get(k) for k in (env[0] if env else {})}
            os.environ.update(env[0] if env else {})
            try:
                ck = fd.compile(ins, arch="sm_90a")
            finally:
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k)
                    else:
                        os.environ[k] = v
            kernels = ck.kernels
            for k, kern in enumerate(kernels):
                tag = name if len(kernels) == 1 else f"{name}.{k}"
                with open(os.path.join(args.out, f"{tag}.cu"), "w") as f:
                    f.write(_body(kern.cuda))
                with open(os.path.join(args.out, f"{tag}.kir"), "w") as f:
                    f.write(str(kern.kernel) + "\n")
                if args.sass:
                    with open(os.path.join(args.out, f"{tag}.sass"), "w") as f:
                        f.write(_sass_counts(kern.sass()))
            print(f"ok   {name} ({type(ck.params).__name__ if len(kernels) == 1 else 'segmented'})")
        except Exception:  # noqa: BLE001 - a corpus entry that fails is reported, the rest still run
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"{failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
