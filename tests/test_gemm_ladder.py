"""examples/gemm_ladder/: every step compiles for sm_90a and its SASS shows what
the step claims; every step runs on the CPU kernel interpreter at a small
shape against torch; step 10 is the heuristic's kernel; on a GPU every step
runs at a real shape against torch.

Step 9 is a 2-CTA cluster with TMA multicast (``schedule(cluster=(2, 1))``).
"""

import dataclasses
import importlib
import os
import re
import subprocess
import sys

import pytest
import torch

import circbuf as cb
import circbuf.scheduler
from circbuf.interpret import interpret

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER = os.path.join(ROOT, "examples", "gemm_ladder")
sys.path.insert(0, LADDER)
STEPS = sorted(f[:-3] for f in os.listdir(LADDER) if re.fullmatch(r"step\d\d_\w+\.py", f))


def step(name):
    return importlib.import_module(name)


def number(name) -> int:
    return int(name[4:6])


def inputs(M, N, K, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=g) / 8).to(torch.bfloat16).to(device)
    b = (torch.randn(N, K, generator=g) / 8).to(torch.bfloat16).to(device)
    return a, b


def check(d, a, b):
    ref = a.double() @ b.double().T
    assert not torch.isnan(d).any(), "unwritten output elements (NaN-poisoned)"
    err = ((d.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


def test_ten_steps():
    assert [number(s) for s in STEPS] == list(range(1, 11)), STEPS


# what each step's SASS must show (counts of instructions; "multicast": UTMALDG...MULTICAST)
def _claims(n):
    c = {
        "HGMMA": True,
        "UTMALDG": True,
    }  # wgmma from step 1; TMA loads from step 1 (circbuf's only wgmma feed)
    c["UTMASTG"] = n >= 4  # the TMA store
    c["USETMAXREG"] = n >= 8  # setmaxnreg per role
    if n == 9:
        c["multicast"] = True
    return c


@pytest.mark.parametrize("name", STEPS)
def test_step_compiles_with_its_sass(name):
    s = step(name)
    M, N, K = s.SHAPE
    fd = s.build(M, N, K)
    a, b = inputs(M, N, K)
    ck = fd.compile([a, b], arch="sm_90a")
    try:
        sass = ck.sass()
    except RuntimeError as e:  # cuobjdump: the test extra
        pytest.skip(f"no cuobjdump: {e}")
    n = number(name)
    counts = {
        "HGMMA": len(re.findall(r"\bHGMMA\.", sass)),
        "UTMALDG": len(re.findall(r"\bUTMALDG\b", sass)),
        "UTMASTG": len(re.findall(r"\bUTMASTG\b", sass)),
        "USETMAXREG": len(re.findall(r"\bUSETMAXREG\b", sass)),
        "multicast": len(re.findall(r"UTMALDG\S*MULTICAST", sass)),
    }
    for op, want in _claims(n).items():
        assert (counts[op] > 0) == want, (name, op, counts)
    src = ck.cuda
    if n >= 3:
        assert "blockIdx.x" in src  # a grid of CTAs
    else:
        assert "blockIdx.x" not in src  # one CTA, one tile
    persistent = re.search(r"for \(index_t tile = \(\(index_t\)blockIdx\.x\).*; tile \+= (\d+)\)", src)
    assert (persistent is not None) == (n >= 6), name  # a tile loop striding over the grid
    assert ("runs the epilogue role" in src) == (n in (7, 8)), name
    wide = re.findall(r"HGMMA\.64x(\d+)x16", sass)
    assert set(wide) == ({"256"} if n in (9, 10) else {"128"}), (name, set(wide))
    if n == 10:  # two consumer warpgroups beside the producer
        assert "__launch_bounds__(384, 1)" in src


def test_step5_is_step4s_kernel():
    """circbuf feeds wgmma only through the warp-specialized ring, so step 5
    (the 2-stage ring) is step 4's kernel: its docstring says so."""
    s4, s5 = step("step04_tma_store"), step("step05_ring")
    a, b = inputs(1024, 512, 256)
    c4 = s4.build(1024, 512, 256).compile([a, b], arch="sm_90a").cuda
    c5 = s5.build(1024, 512, 256).compile([a, b], arch="sm_90a").cuda
    assert c4 == c5
    assert "ab_full[2]" in c4 and "mbar_arrive_expect_tx" in c4


@pytest.mark.parametrize("pingpong", [False, True], ids=["cooperative", "pingpong"])
@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (3000, 5000, 4000), (256, 1024, 128)])
def test_step10_is_the_heuristic(shape, pingpong):
    """Step 10, written by hand, generates the same CUDA source as
    ``fd.fusion.schedule()``'s heuristic (the kernel's name aside)."""
    mine, theirs = step("step10_two_consumers").same_as_heuristic(*shape, pingpong=pingpong)
    assert mine == theirs


@pytest.mark.parametrize("name", STEPS)
def test_step_runs_in_the_interpreter(name):
    """Each step at its small shape on the CPU kernel interpreter, against torch
    in float64 (a GPU of 2 SMs: persistent CTAs walk several tiles)."""
    s = step(name)
    M, N, K = s.INTERP_SHAPE
    target = dataclasses.replace(cb.target.DEFAULT, sm_count=2)
    fd = s.build(M, N, K, target)
    a, b = inputs(M, N, K, seed=number(name))
    (d,) = interpret(fd, [a, b], target=target)
    check(d, a, b)


def test_step_script_runs():
    """A step as a program: with no GPU it compiles and says it did not run;
    with CIRCBUF_INTERPRET=1 it runs its small shape on the CPU."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    path = os.path.join(LADDER, "step06_persistent.py")
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert 'extern "C"' in r.stdout
    if not torch.cuda.is_available():
        assert "did not run it" in r.stdout
        env["CIRCBUF_INTERPRET"] = "1"
        r = subprocess.run(
            [sys.executable, path], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        assert "ran on the CPU" in r.stdout and "unwritten (NaN) elements: 0" in r.stdout


def test_mma_form_refuses_what_it_cannot_take():
    from circbuf.scheduler import mma_form

    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([64, 64], dtype=cb.DataType.Float)
        b = fd.define_tensor([64, 64], dtype=cb.DataType.Float)
        fd.add_output(fd.ops.matmul(a, b))
    with pytest.raises(cb.CircbufError, match="tensor cores cannot take"):
        mma_form(fd.fusion)
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([64, 64], dtype=cb.DataType.BFloat16)
        fd.add_output(fd.ops.relu(a))
    with pytest.raises(cb.CircbufError, match="exactly one matmul"):
        mma_form(fd.fusion)
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([64, 64], dtype=cb.DataType.BFloat16)
        b = fd.define_tensor([64, 64], dtype=cb.DataType.BFloat16)
        fd.add_output(fd.ops.linear(a, b))
    fd.fusion.outputs[0].split(0, 16)
    with pytest.raises(cb.CircbufError, match="already scheduled"):
        mma_form(fd.fusion)


def test_matmul_scheduled_by_hand_without_mma_form_names_it():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([64, 64], dtype=cb.DataType.BFloat16)
        b = fd.define_tensor([64, 64], dtype=cb.DataType.BFloat16)
        fd.add_output(fd.ops.linear(a, b))
    fd.fusion.outputs[0].split(0, 16)
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    with pytest.raises(cb.CircbufError, match="mma_form"):
        fd.compile([x, x], arch="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("name", STEPS)
def test_gpu_step_matches_torch(name):
    """Each step at a real shape on the GPU against torch in float64, output
    poisoned with NaN before the launch (steps 1-2: their one-tile shapes)."""
    s = step(name)
    n = number(name)
    M, N, K = s.SHAPE if n <= 2 else (2048, 3072, 1024)
    target = cb.Target.from_device(torch.device("cuda"))
    fd = s.build(M, N, K, target)
    a, b = inputs(M, N, K, device="cuda", seed=n)
    (d,) = fd.execute([a, b])
    torch.cuda.synchronize()
    check(d, a, b)


def _one_tile(ring: bool, fill: str = "tma"):
    """Step 1's schedule, with or without the operand ring; ``fill="set"``: the
    operands written into shared memory by the threads (the MMA form built
    through the scheduler's internal translate, as no public call gives it)."""
    from circbuf.scheduler.matmul import translate
    from circbuf.scheduler.params import MatmulParams
    from circbuf.scheduler.utils import LogicalMap, concretize_broadcasts

    s = step("step01_one_tile")
    fd = s.ladder.linear_fusion(128, 128, 64)
    f = fd.fusion
    if fill == "tma":
        acc, As, Bs = cb.scheduler.mma_form(f)
    else:
        acc, As, Bs = translate(f, MatmulParams(fill=(fill, fill), copy_vector=(0, 0)))
        concretize_broadcasts(f, LogicalMap(f))
    d = f.outputs[0]

    def tiles(tv):
        tv.split(0, 128).split(2, 128).reorder([0, 2, 1, 3] + list(range(4, len(tv.loop))))
        tv.merge(0)
        return 1

    for xs, mn_first in ((As, True), (Bs, False)):
        pos = tiles(xs)
        if fill == "tma":
            r = s.operand_boxes(xs, pos, 64, mn_first)
            if ring:
                xs.circular_buffer(2, 1, cb.WarpSpecialized(on=cb.ParallelType.TIDy), axis=r)
        else:
            xs.swizzle(128)
            xs.inline_at(1)
    s.accumulator(acc, tiles(acc), 64)
    acc.inline_at(1)
    s.epilogue(d, tiles(d))
    return fd


def test_tma_operands_without_a_ring_are_refused_by_name():
    """A TMA-filled buffer with no ring has no mbarrier for its copies (it
    failed inside codegen before: an internal error)."""
    a, b = inputs(128, 128, 64)
    _one_tile(ring=True).compile([a, b], arch="sm_90a")
    with pytest.raises(cb.CircbufError, match="filled by TMA needs a ring"):
        _one_tile(ring=False).compile([a, b], arch="sm_90a")


def test_mma_operands_stored_by_the_threads_are_refused_by_name():
    """Operands the threads store into shared memory themselves are read by the
    wgmmas with no fence.proxy.async or barrier in between (it compiled before,
    unsafe on a GPU; the interpreter does not model the proxies)."""
    a, b = inputs(128, 128, 64)
    with pytest.raises(cb.CircbufError, match="written to shared memory by the threads' own stores"):
        _one_tile(ring=False, fill="set").compile([a, b], arch="sm_90a")


def test_hand_only_roles_pass_the_protocol_checker():
    """Step 8 (one consumer warpgroup, an epilogue role, setmaxnreg for three
    roles: a kernel only a hand schedule makes) under the protocol checker."""
    from circbuf.interpret import check as protocol_check

    s = step("step08_deep_ring")
    M, N, K = s.INTERP_SHAPE
    target = dataclasses.replace(cb.target.DEFAULT, sm_count=2)
    protocol_check(s.build(M, N, K, target), list(inputs(M, N, K)), schedules=1, target=target)


@pytest.mark.parametrize("name", ["step03_grid", "step08_deep_ring"])
def test_ragged_shape_in_the_interpreter(name):
    """M, N, K no multiples of the tile (rows 16-byte aligned, as TMA needs):
    zero-filled loads past the edges, clipped stores."""
    s = step(name)
    target = dataclasses.replace(cb.target.DEFAULT, sm_count=2)
    a, b = inputs(200, 312, 104)
    (d,) = interpret(s.build(200, 312, 104, target), [a, b], target=target)
    check(d, a, b)
