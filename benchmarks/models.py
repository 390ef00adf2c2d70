"""Real models under torch.compile: a Llama (LlamaForCausalLM from
transformers, random weights: hidden 2048, 8 layers, 16 heads of 128, GQA
with 4 KV heads, SiLU MLP of 5632, vocab 32000, RMSNorm, rotary) in bf16,
run by eager torch, inductor (default, and max-autotune-no-cudagraphs) and
circbuf (``backend=circbuf.dynamo.backend``):

- forward (inference, ``torch.no_grad``): batch 1 x seq 2048;
- training step (forward + backward of the LM loss, no optimizer): batch 4 x seq 1024.

Prints tokens/s and ms per step (median of CUDA-event timings after warm-up),
then, for circbuf, where the GPU time goes (torch.profiler over a few steps):
the fraction in circbuf's kernels (named ``circbuf_*``) against everything
else (eager fallbacks: flash attention, embedding, cat, the loss, copies),
and the top fallbacks by kernel and by aten op. The table names the GPU.

    PYTHONPATH=. python benchmarks/models.py                       # every mode, both runs
    PYTHONPATH=. python benchmarks/models.py --modes eager,circbuf --runs forward
    PYTHONPATH=. python benchmarks/models.py --layers 2            # a shorter model
    PYTHONPATH=. python benchmarks/models.py --smoke               # tiny model, any device (a check of the script)

Needs ``pip install transformers==4.57.6`` (a test extra of circbuf).
"""

from __future__ import annotations

import argparse
import collections
import copy
import gc
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from tests.hf_models import llama, tokens  # noqa: E402

MODES = ("eager", "inductor", "inductor-max-autotune", "circbuf")
RUNS = {"forward": (1, 2048), "training": (4, 1024)}  # (batch, seq)
LLAMA = dict(hidden=2048, layers=8, heads=16, kv_heads=4, intermediate=5632, vocab=32000)
SMOKE = dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=256)


def compiled(model, mode):
    import circbuf.dynamo as cd

    # compiled statically for the one shape each run times (a fresh dynamo, dynamic=False),
    # as benchmarks.common.static_compile does: a function seen with several shapes is
    # recompiled with dynamic shapes, a slower kernel than a user gets
    torch._dynamo.reset()
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model, dynamic=False)
    if mode == "inductor-max-autotune":
        return torch.compile(model, mode="max-autotune-no-cudagraphs", dynamic=False)
    if mode == "circbuf":
        return torch.compile(model, backend=cd.backend, dynamic=False)
    raise ValueError(mode)


def step_fn(model, run, ids):
    if run == "forward":

        def step():
            with torch.no_grad():
                return model(ids).logits

    else:

        def step():
            model.zero_grad(set_to_none=True)
            loss = model(ids, labels=ids).loss
            loss.backward()
            return loss

    return step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(step, device, warmup, iters) -> float:
    """Median ms per step: CUDA events on a GPU, wall clock elsewhere."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def breakdown(step, device, steps=3, top=8) -> str:
    """Where the GPU time of ``steps`` steps goes: circbuf kernels vs the rest."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return "  (no GPU: no kernel time to split)"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    kernels: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        if not t:
            continue
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.key] += t
        elif e.key.startswith("aten::"):
            ops[e.key] += t  # the device time of kernels this aten op launched itself: an eager op
    total = sum(kernels.values()) or 1
    ours = sum(t for k, t in kernels.items() if k.startswith("circbuf_"))
    lines = [
        f"  GPU time in circbuf kernels: {100 * ours / total:.1f}%, "
        f"in everything else (eager fallbacks, copies): {100 * (total - ours) / total:.1f}%"
    ]
    ours_top = [(k, t) for k, t in kernels.most_common() if k.startswith("circbuf_")]
    lines.append("  top circbuf kernels (by name; every matmul is circbuf_matmul):")
    lines += [f"    {100 * t / total:5.1f}%  {k[:110]}" for k, t in ours_top[:top]]
    rest = [(k, t) for k, t in kernels.most_common() if not k.startswith("circbuf_")]
    lines.append("  top fallback kernels:")
    lines += [f"    {100 * t / total:5.1f}%  {k[:110]}" for k, t in rest[:top]]
    lines.append("  top eager aten ops (their kernels' time):")
    lines += [f"    {100 * t / total:5.1f}%  {k}" for k, t in ops.most_common(top)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--layers", type=int, default=LLAMA["layers"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="a tiny model and short sequences, on any device")
    args = ap.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("benchmarks/models.py needs transformers: pip install transformers==4.57.6")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("benchmarks/models.py: needs a CUDA GPU (or --smoke); nothing was timed")
    sizes = dict(SMOKE if args.smoke else LLAMA)
    if not args.smoke:
        sizes["layers"] = args.layers
    runs = {k: ((1, 32) if args.smoke else v) for k, v in RUNS.items() if k in args.runs.split(",")}
    torch.manual_seed(0)
    base = llama(**sizes).to(device=device, dtype=torch.bfloat16)
    n_params = sum(p.numel() for p in base.parameters())
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "no GPU (CPU)"
    print(f"GPU: {gpu}; torch {torch.__version__}")
    print(f"Llama {sizes} ({n_params / 1e6:.0f}M parameters), bf16, sdpa attention")
    table = []
    for run, (b, s) in runs.items():
        ids = tokens(b, s, sizes["vocab"], device)
        for mode in args.modes.split(","):
            model = copy.deepcopy(base)
            if run == "forward":
                model.eval()
            fn = compiled(model, mode)
            step = step_fn(fn, run, ids)
            t0 = time.perf_counter()
            step()  # compiles
            sync(device)
            first = time.perf_counter() - t0
            ms = time_ms(step, device, args.warmup, args.iters)
            tok = b * s / ms * 1e3
            table.append((run, f"{b}x{s}", mode, ms, tok, first))
            print(
                f"{run:9s} {b}x{s:<5d} {mode:22s} {ms:9.2f} ms {tok:11.0f} tokens/s  (first call {first:.1f} s)"
            )
            if mode == "circbuf":
                print(breakdown(step, device))
                import circbuf.dynamo as cd

                fused = [f for g in cd.records() for f in g.fusions]
                fell = [f for f in fused if f.status == "eager"]
                if fell:
                    print(f"  {len(fell)} of {len(fused)} fusions fell back to eager:")
                    for f in fell[:5]:
                        print(f"    {f.name}: {f.reason[:150]}")
            del model, fn, step
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"\nGPU: {gpu}")
    print(f"{'run':9s} {'shape':9s} {'mode':22s} {'ms':>9s} {'tokens/s':>11s} {'vs eager':>9s}")
    eager = {r: ms for r, _, m, ms, _, _ in table if m == "eager"}
    for run, shape, mode, ms, tok, _ in table:
        rel = f"{eager[run] / ms:8.2f}x" if run in eager else ""
        print(f"{run:9s} {shape:9s} {mode:22s} {ms:9.2f} {tok:11.0f} {rel:>9s}")


if __name__ == "__main__":
    main()
