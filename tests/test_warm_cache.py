"""The disk cache of finished kernels (circbuf/runtime/kernel_cache.py): a warm
compile skips scheduling, lowering, codegen and NVRTC, and its key holds
everything the generated code depends on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import circbuf as cb
import circbuf.compiler as C
from circbuf.runtime import nvrtc
from tests.util import D, axpy_fusion, norm_fusion, unary_fusion

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCBUF_CACHE_DIR", str(tmp_path))
    return tmp_path


def _refuse_compiling(monkeypatch):
    """Every stage a warm compile must skip raises if called."""

    def refuse(what):
        def fn(*a, **k):
            raise AssertionError(f"a warm compile called {what}")

        return fn

    for name in ("prepare", "compute_params", "apply", "lower", "codegen", "check_aliases"):
        monkeypatch.setattr(C, name, refuse(name))
    monkeypatch.setattr(nvrtc, "compile_cuda", refuse("compile_cuda"))
    monkeypatch.setattr(nvrtc, "_probe", refuse("NVRTC's arch probe"))


def _linear_gelu():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.linear(a, w, b)), D.BFloat16))
    bf = torch.bfloat16
    return fd, [torch.empty(256, 512, dtype=bf), torch.empty(384, 512, dtype=bf), torch.empty(384, dtype=bf)]


CASES = {
    "pointwise": lambda: (axpy_fusion(D.BFloat16, 1), [torch.empty(4096, dtype=torch.bfloat16)] * 2),
    "rms_norm": lambda: (
        norm_fusion("rms_norm", D.BFloat16),
        [torch.empty(512, 1024, dtype=torch.bfloat16), torch.empty(1024, dtype=torch.bfloat16)],
    ),
    "linear_gelu": _linear_gelu,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_warm_compile_does_not_schedule_lower_or_compile(cache, monkeypatch, case):
    fd, ins = CASES[case]()
    cold = fd.compile(ins, arch="sm_90a")
    assert list((cache / "kernels").glob("*.pkl"))
    fd2, ins2 = CASES[case]()  # a new definition: nothing in memory
    with monkeypatch.context() as m:
        _refuse_compiling(m)
        warm = fd2.compile(ins2, arch="sm_90a")
    assert warm.cubin == cold.cubin and warm.cuda == cold.cuda and warm.name == cold.name
    assert warm.params == cold.params and fd2.last_params() == cold.params
    assert repr(warm.launch) == repr(cold.launch)  # a TensorMapSpec compares by identity
    assert warm.fusion_ir == fd2.fusion.print_math()
    # the kernel IR is not on disk: reading it schedules and lowers again, to the same code
    from circbuf.lowering import codegen

    assert codegen(warm.kernel) == cold.cuda and warm.transforms
    # the plan built from the cached launch data is the one the cold kernel gives
    info, _ = fd2._executor._bind(ins2, need_cuda=False)
    p_warm = fd2._executor._build_plan(warm, info, torch.device("cpu"))
    p_cold = fd._executor._build_plan(cold, info, torch.device("cpu"))
    assert (p_warm.grid, p_warm.block, p_warm.smem, bytes(p_warm.argbuf)) == (
        p_cold.grid,
        p_cold.block,
        p_cold.smem,
        bytes(p_cold.argbuf),
    )


def _two_sums():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        fd.add_output(fd.ops.sum(fd.ops.exp(x), [0]))
        fd.add_output(fd.ops.sum(x, [1]))
    return fd


def test_a_warm_segmented_compile_asks_no_scheduler(cache, monkeypatch):
    """A fusion no one kernel takes: the segmenter's verdicts come from the
    disk cache (no can_schedule), each segment's kernel too."""
    from circbuf.scheduler import registry, segmenter

    x = torch.empty(256, 512)
    cold = _two_sums().compile([x], arch="sm_90a")
    assert len(cold.kernels) == 2 and list((cache / "kernels").glob("*.seg"))
    with monkeypatch.context() as m:
        _refuse_compiling(m)

        def refuse(*a, **k):
            raise AssertionError("a warm compile asked a scheduler")

        m.setattr(registry, "can_schedule", refuse)
        m.setattr(segmenter, "schedulers_taking", refuse)
        warm = _two_sums().compile([x], arch="sm_90a")
    assert [k.cuda for k in warm.kernels] == [k.cuda for k in cold.kernels]
    assert str(warm) == str(cold)
    # other sizes: another key, split afresh
    assert len(_two_sums().compile([torch.empty(64, 32)], arch="sm_90a").kernels) == 2


def test_a_fresh_process_hits_the_cache(cache):
    """Another process (another hash seed, other fusions built before) finds
    the entry: the key does not depend on process-wide counters."""
    child = f"""
import sys; sys.path.insert(0, {ROOT!r})
import torch, circbuf.compiler as C
from circbuf.runtime import nvrtc
from tests.util import D, norm_fusion
for _ in range({{n}}):
    norm_fusion("softmax", D.Float)  # moves the process-wide IterDomain ids
def refuse(*a, **k):
    raise AssertionError("scheduled")
if {{warm}}:
    C.compute_params = C.lower = nvrtc.compile_cuda = nvrtc._probe = refuse
fd = norm_fusion("layer_norm", D.BFloat16)
ins = [torch.empty(64, 2048, dtype=torch.bfloat16), torch.empty(2048, dtype=torch.bfloat16),
       torch.empty(2048, dtype=torch.bfloat16)]
print(fd.compile(ins, arch="sm_90a").name)
"""
    for n, warm, seed in ((0, False, "1"), (3, True, "2")):
        env = dict(os.environ, CIRCBUF_CACHE_DIR=str(cache), PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", child.format(n=n, warm=warm)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert "circbuf_" in out.stdout


def _key(fd, ins, arch="sm_90a", target=None):
    ex = fd._get_executor()
    info, _ = ex._bind(ins, need_cuda=False, target=target or cb.target.DEFAULT)
    return ex._warm_key(info, arch, dict(fd.fusion.schedule_overrides))


def test_the_key_changes_with_what_the_code_depends_on(cache, monkeypatch):
    bf = torch.bfloat16
    x = torch.empty(64, 128, dtype=bf)
    base = _key(axpy_fusion(D.BFloat16, 2), [x, x])
    assert base is not None and base == _key(axpy_fusion(D.BFloat16, 2), [x.clone(), x.clone()])
    keys = {"base": base}
    fd = axpy_fusion(D.BFloat16, 2)
    fd.fusion.schedule(vectorize=4)
    keys["override"] = _key(fd, [x, x])
    fd = axpy_fusion(D.BFloat16, 2)
    fd.fusion.schedule(vectorize=2)
    keys["override value"] = _key(fd, [x, x])
    xf = torch.empty(64, 128)
    keys["dtype"] = _key(axpy_fusion(D.Float, 2), [xf, xf])
    keys["size"] = _key(axpy_fusion(D.BFloat16, 2), [x[:32], x[:32]])
    xt = torch.empty(128, 64, dtype=bf).t()
    keys["stride order"] = _key(axpy_fusion(D.BFloat16, 2), [xt, x])
    keys["contiguity"] = _key(axpy_fusion(D.BFloat16, 2), [torch.empty(64, 256, dtype=bf)[:, :128], x])
    buf = torch.empty(64 * 128 + 8, dtype=bf)
    keys["alignment"] = _key(axpy_fusion(D.BFloat16, 2), [buf[1 : 1 + 64 * 128].view(64, 128), x])
    keys["alignment 8"] = _key(axpy_fusion(D.BFloat16, 2), [buf[4 : 4 + 64 * 128].view(64, 128), x])
    with cb.FusionDefinition() as fd:  # the same math over inputs declared contiguous
        a = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(a, b), 1.0), D.BFloat16))
    keys["declared contiguity"] = _key(fd, [x, x])
    with cb.FusionDefinition() as fd:  # another constant
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        b = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(a, b), 1.0000001), D.BFloat16))
    keys["constant"] = _key(fd, [x, x])
    keys["arch"] = _key(axpy_fusion(D.BFloat16, 2), [x, x], arch="sm_90")
    keys["target"] = _key(axpy_fusion(D.BFloat16, 2), [x, x], target=cb.target.H200)
    monkeypatch.setenv("CIRCBUF_FAST_MATH", "0")
    keys["fast math"] = _key(axpy_fusion(D.BFloat16, 2), [x, x])
    monkeypatch.delenv("CIRCBUF_FAST_MATH")
    monkeypatch.setenv("CIRCBUF_DEBUG_HANG", "1000")
    keys["debug hang"] = _key(axpy_fusion(D.BFloat16, 2), [x, x])
    monkeypatch.delenv("CIRCBUF_DEBUG_HANG")
    from circbuf.scheduler import registry

    monkeypatch.setattr(registry, "SCHEDULERS", registry.SCHEDULERS[1:])
    keys["schedulers"] = _key(axpy_fusion(D.BFloat16, 2), [x, x])
    monkeypatch.undo()
    assert None not in keys.values()
    seen: dict = {}
    for what, k in keys.items():
        assert k not in seen, f"{what} gives the key of {seen.get(k)}"
        seen[k] = what


def test_scalar_inputs_are_keyed_only_when_sizes_are_built_from_them(cache):
    x = torch.empty(64, dtype=torch.float32)

    def scaled():
        with cb.FusionDefinition() as fd:
            t = fd.define_tensor([-1], dtype=D.Float)
            s = fd.define_scalar(dtype=D.Double)
            fd.add_output(fd.ops.mul(t, s))
        return fd

    assert _key(scaled(), [x, 2.0]) == _key(scaled(), [x, 3.0])  # a value, not compiled in

    def filled():
        with cb.FusionDefinition() as fd:
            n = fd.define_scalar(dtype=D.Int64)
            fd.add_output(fd.ops.full([n], 1.0, D.Float))
        return fd

    assert _key(filled(), [8]) != _key(filled(), [16])  # a size


def test_every_variant_hit_is_what_a_cold_compile_gives(cache, monkeypatch):
    """Warm the cache with variants of one fusion, then compile each again
    from the cache and without it: the same code for each (no variant is
    handed another's kernel)."""
    bf = torch.bfloat16
    x = torch.empty(256, 512, dtype=bf)
    xt = torch.empty(512, 256, dtype=bf).t()
    buf = torch.empty(256 * 512 + 8, dtype=bf)
    mis = buf[1 : 1 + 256 * 512].view(256, 512)
    variants = [
        ("plain", {}, {}, [x]),
        ("transposed", {}, {}, [xt]),
        ("misaligned", {}, {}, [mis]),
        ("vectorize=2", {"vectorize": 2}, {}, [x]),
        ("accurate math", {}, {"CIRCBUF_FAST_MATH": "0"}, [x]),
    ]

    def compile_(overrides, env, ins, cached):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            if not cached:
                m.setenv("CIRCBUF_CACHE_DIR", "")
            fd = unary_fusion("gelu", D.BFloat16)
            if overrides:
                fd.fusion.schedule(**overrides)
            return fd.compile(ins, arch="sm_90a")

    for _, ov, env, ins in variants:
        compile_(ov, env, ins, True)
    assert len(list((cache / "kernels").glob("*.pkl"))) == len(variants)
    sources = set()
    for what, ov, env, ins in variants:
        warm = compile_(ov, env, ins, True)
        cold = compile_(ov, env, ins, False)
        assert warm.cuda == cold.cuda and warm.params == cold.params, what
        sources.add(warm.cuda)
    assert len(sources) == len(variants)  # each variant's code is its own


def test_a_missing_cubin_or_a_broken_entry_is_a_miss(cache):
    fd = axpy_fusion(D.Float, 1)
    ins = [torch.empty(100)] * 2
    ck = fd.compile(ins, arch="sm_90a")
    (entry,) = (cache / "kernels").glob("*.pkl")
    for cubin in cache.glob("*.cubin"):
        cubin.unlink()
    assert axpy_fusion(D.Float, 1).compile(ins, arch="sm_90a").cubin == ck.cubin  # compiled again
    entry.write_bytes(b"not a pickle")
    assert axpy_fusion(D.Float, 1).compile(ins, arch="sm_90a").cubin == ck.cubin


def test_nothing_is_cached_for_a_cubin_compile_cuda_did_not_make(cache, monkeypatch):
    monkeypatch.setattr(nvrtc, "compile_cuda", lambda *a, **k: b"")
    axpy_fusion(D.Float, 1).compile([torch.empty(100)] * 2, arch="sm_90a")
    assert not list(cache.glob("kernels/*.pkl"))


def test_dump_runs_every_stage_even_when_warm(cache, monkeypatch, capsys):
    ins = [torch.empty(100)] * 2
    axpy_fusion(D.Float, 1).compile(ins, arch="sm_90a")
    monkeypatch.setenv("CIRCBUF_DUMP", "params,cuda")
    axpy_fusion(D.Float, 1).compile(ins, arch="sm_90a")
    out = capsys.readouterr().out
    assert "CIRCBUF_DUMP params" in out and "CIRCBUF_DUMP cuda" in out


def test_no_cache_dir_no_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCBUF_CACHE_DIR", "")
    fd = axpy_fusion(D.Float, 1)
    assert _key(fd, [torch.empty(10)] * 2) is None


def test_a_loaded_kernel_is_the_one_other_sizes_share(cache):
    """Sizes with the same params share one kernel in memory whether the first
    came from the disk cache or not: the entry keeps the in-memory key."""
    fd = axpy_fusion(D.Float, 2)
    fd.compile([torch.empty(64, 64)] * 2, arch="sm_90a")  # on disk now
    fd2 = axpy_fusion(D.Float, 2)
    warm = fd2.compile([torch.empty(64, 64)] * 2, arch="sm_90a")  # loaded
    other = fd2.compile([torch.empty(64, 96)] * 2, arch="sm_90a")  # never compiled: scheduled afresh
    assert other is warm and warm.memo_key is not None
    fd3 = axpy_fusion(D.Float, 2)
    assert fd3.compile([torch.empty(64, 96)] * 2, arch="sm_90a") is fd3.compile(
        [torch.empty(64, 64)] * 2, arch="sm_90a"
    )
