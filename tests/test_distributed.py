"""Issue 22 on the CPU: the GEMM that ships its output tiles to peer GPUs.

The kernels (NVRTC for sm_90a: TMA stores per peer, the release flags in
SASS), the loopback mode in the kernel interpreter against float64 torch
with NaN-poisoned buffers, the protocol checker passing the kernels as built
and naming each injected bug (a flag released before its tile's data, a
store after its tile's flag, a flag never released), and the API's errors."""

from __future__ import annotations

import collections
import re

import pytest
import torch

import circbuf as cb
from circbuf.distributed import DistributedTimeout, linear_all_gather, linear_reduce_scatter, loopback
from circbuf.interpret import ProtocolError
from circbuf.ir import CircbufError
from circbuf.ir.peer import PeerStore
from circbuf.lowering import kir
from circbuf.lowering.peer_stores import PeerSignal, PeerTmaStore
from tests.test_interpret import ONE_SM

BF = torch.bfloat16


@pytest.fixture(autouse=True)
def _production_kernels(monkeypatch):
    monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)
    monkeypatch.delenv("CIRCBUF_CHECK", raising=False)


def peer_fd(kind, world, dtype=cb.DataType.BFloat16):
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        w = fd.define_tensor([-1, -1], dtype=dtype)
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    y.peer_store = PeerStore(kind, world)
    return fd


def operands(kind, world, m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "all_gather":  # one x, a weight shard per rank
        x = torch.randn(m, k, generator=g).div(4).to(BF)
        return [x] * world, [torch.randn(n, k, generator=g).div(4).to(BF) for _ in range(world)]
    xs = [torch.randn(m, k, generator=g).div(4).to(BF) for _ in range(world)]
    return xs, [torch.randn(n, k, generator=g).div(4).to(BF) for _ in range(world)]


def expected(kind, xs, ws):
    world = len(xs)
    if kind == "all_gather":
        full = xs[0].double() @ torch.cat(ws).double().T
        return [full] * world
    total = sum(x.double() @ w.double().T for x, w in zip(xs, ws))
    rows = total.shape[0] // world
    return [total[r * rows : (r + 1) * rows] for r in range(world)]


# ------------------------------------------------------------ the kernels
@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_the_kernel_stores_to_every_peer_and_releases_a_flag_per_tile(kind):
    fd = peer_fd(kind, 2)
    x, w = torch.randn(1024, 512, dtype=BF), torch.randn(1024, 512, dtype=BF)
    ck = fd.compile([x, w], arch="sm_90a")
    k = ck.kernel
    assert k.peer["kind"] == kind and k.peer["world"] == 2 and k.peer["stores_per_tile"] == 2
    names = [p.tv.name for p in k.tensor_params]
    assert names[-4:] == ["P0", "P1", "F0", "F1"] and [v.name for v in k.scalar_params] == ["cb_rank"]
    stores = []
    kir.walk(k.body, lambda n, _s: stores.append(n) if isinstance(n, kir.TmaStore) else None)
    assert {s.peer for s in stores} == {0, 1} and all(isinstance(s, PeerTmaStore) for s in stores)
    # each peer's map describes its own parameter
    assert sorted(k.tensor_maps[s.map_index].param for s in stores) == [names.index("P0"), names.index("P1")]
    text = str(k)
    assert "PEER_SIGNAL (wait_group 4)" in text and "PEER_SIGNAL (wait_group 0)" in text
    if kind == "reduce_scatter":  # peer 1 holds rows M/2.., its tiles start at row block 1 on rank 0
        assert "(i0 / 2)" in text and "tile_it" in text
    cuda = ck.cuda
    assert cuda.count("cb::tma_store(") == 2 and "red.relaxed.sys.global.add.u32" in cuda
    assert cuda.count("cb::fence_acq_rel_sys();") == 2  # one release per signal, for every peer
    assert "fence.proxy.async.global" in cuda
    sass = ck.sass()
    ops = collections.Counter(
        re.findall(r"\b(UTMASTG|REDG\.E\.ADD\.STRONG\.SYS|MEMBAR\.ALL\.SYS|FENCE\.VIEW\.ASYNC\.G)\b", sass)
    )
    assert ops["UTMASTG"] >= 2 and ops["REDG.E.ADD.STRONG.SYS"] == 4 and ops["MEMBAR.ALL.SYS"] == 2, ops
    assert ops["FENCE.VIEW.ASYNC.G"] >= 2, ops


def test_the_flag_wait_kernel_compiles_with_its_timeout():
    from circbuf.lowering import codegen
    from circbuf.lowering.peer_stores import flag_wait_kernel
    from circbuf.runtime.nvrtc import compile_cuda

    src = codegen(flag_wait_kernel(2, 5_000_000_000))
    assert "ld.acquire.sys.global.u32" in src and "%globaltimer" in src and "5000000000ull" in src
    assert compile_cuda(src, "sm_90a")[:4] == b"\x7fELF"


@pytest.mark.parametrize(
    "ov, why",
    [
        (dict(pingpong=True), "pingpong=True"),
        (dict(persistent=False), "persistent=False"),
        (dict(epilogue="role"), "epilogue='role'"),
    ],
)
def test_a_peer_store_needs_the_cooperative_persistent_tma_kernel(ov, why):
    fd = peer_fd("all_gather", 2)
    fd.fusion.schedule(**ov)
    with pytest.raises(CircbufError, match=re.escape(why)):
        fd.compile([torch.randn(512, 256, dtype=BF), torch.randn(256, 256, dtype=BF)], arch="sm_90a")


# ------------------------------------------------------------ loopback in the interpreter
@pytest.mark.parametrize(
    "kind, world, m, n, k",
    [
        ("all_gather", 2, 256, 256, 128),  # 2 tiles per rank on one SM: the deferred flag runs
        ("all_gather", 3, 200, 136, 72),  # ragged tiles, 3 peers
        ("reduce_scatter", 2, 256, 256, 128),
        ("reduce_scatter", 2, 136, 200, 64),  # a tile straddles the two row blocks
        ("reduce_scatter", 3, 390, 136, 64),  # 3 row blocks, the tile order rotated per rank
    ],
)
def test_loopback_matches_float64_torch(kind, world, m, n, k):
    xs, ws = operands(kind, world, m, n, k)
    outs = loopback(kind, xs, ws, target=ONE_SM, poison=True)
    for got, want in zip(outs, expected(kind, xs, ws)):
        assert not got.isnan().any(), "an element no peer stored"
        tol = 0.02 if kind == "all_gather" else 0.04
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=0.02)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_the_checker_passes_the_kernels_as_built(kind):
    xs, ws = operands(kind, 2, 256, 256, 128, seed=1)
    outs = loopback(kind, xs, ws, target=ONE_SM, check=3)
    for got, want in zip(outs, expected(kind, xs, ws)):
        torch.testing.assert_close(got.double(), want, atol=0.04, rtol=0.02)


def _signals(kernel):
    found = []
    kir.walk(kernel.body, lambda n, s: found.append((n, s)) if isinstance(n, PeerSignal) else None)
    return found


def _tile_loop_signal(kernel):
    return next((n, s) for n, s in _signals(kernel) if n.tile is not None)


def flag_before_the_data(kernel):
    """The tile's own flag released right after its stores, without waiting
    for their bulk groups (a missing wait_group)."""
    sig, stack = _tile_loop_signal(kernel)
    holder = kir.parent_list(kernel.body, sig)
    holder.insert(holder.index(sig), kir.Let(sig.prev, sig.tile))
    sig.pending = 99


def store_after_the_flag(kernel):
    """The tile's flag released first in its iteration, before the tile's stores."""
    sig, stack = _tile_loop_signal(kernel)
    elect = stack[-1]
    loop = next(n for n in reversed(stack) if isinstance(n, kir.ForLoop) and n.strided)
    loop.body.remove(elect)
    loop.body.insert(0, elect)
    elect.then.insert(0, kir.Let(sig.prev, sig.tile))


def last_flag_never_released(kernel):
    sig, _ = next((n, s) for n, s in _signals(kernel) if n.tile is None)
    kir.parent_list(kernel.body, sig).remove(sig)


@pytest.mark.parametrize(
    "bug, error, match",
    [
        (
            flag_before_the_data,
            ProtocolError,
            r"releases the flag of tile \d+ while its TMA store to peer \d .* in flight",
        ),
        (
            store_after_the_flag,
            ProtocolError,
            r"stores tile \d+ to peer \d .* after that tile's flag was released",
        ),
        (last_flag_never_released, DistributedTimeout, r"waits on flag F\[\d+\] >= 2 .* holds 0"),
    ],
)
def test_the_checker_names_each_injected_bug(bug, error, match):
    xs, ws = operands("all_gather", 2, 256, 256, 128, seed=2)
    with pytest.raises(error, match=match):
        loopback("all_gather", xs, ws, target=ONE_SM, check=4, mutate=bug)


# ------------------------------------------------------------ TMA coordinates
def _guarded_stores(kernel):
    found = []
    kir.walk(
        kernel.body,
        lambda n, s: (
            found.append((n, s))
            if isinstance(n, kir.IfThenElse) and isinstance(n.then[0], PeerTmaStore)
            else None
        ),
    )
    return found


def stores_at_negative_rows(kernel):
    """Issue 22's first reduce-scatter: every box stored to every peer at row
    ``r - p * M/world``, the rows of other blocks left to TMA's clipping (the
    GEMM died with CUDA_ERROR_ILLEGAL_INSTRUCTION on an H100)."""
    guard = kernel.peer["guard_rows"]
    for n, _ in _guarded_stores(kernel):
        store = n.then[0]
        store.coords = [c - guard if d == 1 else c for d, c in enumerate(store.coords)]
        holder = kir.parent_list(kernel.body, n)
        holder[holder.index(n)] = store


def test_a_reduce_scatter_stores_no_box_before_its_peers_rows():
    """Each box goes only to the peers whose row block it overlaps, after the
    slot's ``guard`` scratch rows: no coordinate is negative, which the
    interpreter enforces for every bulk tensor copy (the hardware's rule,
    :func:`circbuf.runtime.tensormap.check_coords`)."""
    fd = peer_fd("reduce_scatter", 2)
    ck = fd.compile([torch.randn(136, 64, dtype=BF), torch.randn(200, 64, dtype=BF)], arch="sm_90a")
    k = ck.kernel
    assert k.peer["guard_rows"] == 64  # the store box's rows
    guarded = _guarded_stores(k)
    assert sorted(n.then[0].peer for n, _ in guarded) == [0, 1]
    assert "(i0 / 2) < (row0 + 64)" in str(k) and "((row0 - (i0 / 2)) + 64)" in str(k)
    xs, ws = operands("reduce_scatter", 2, 136, 200, 64, seed=3)
    with pytest.raises(CircbufError, match=r"tensor map for P\d: coordinate 1 of a bulk tensor copy is -\d+"):
        loopback("reduce_scatter", xs, ws, target=ONE_SM, mutate=stores_at_negative_rows)


def test_tma_coordinates_before_the_tensor_are_refused():
    from circbuf.runtime.tensormap import check_coords

    check_coords("T", [0, 192])  # past the end: clipped, fine
    with pytest.raises(CircbufError, match="coordinate 1 of a bulk tensor copy is -8: no box may start"):
        check_coords("T", [64, -8])


# ------------------------------------------------------------ bad input
def test_bad_input_names_the_problem():
    x, w = torch.randn(64, 64, dtype=BF), torch.randn(64, 64, dtype=BF)
    with pytest.raises(CircbufError, match="on cpu; the collective runs on CUDA tensors"):
        linear_all_gather(x, w)
    with pytest.raises(CircbufError, match="float32; bfloat16 and float16"):
        linear_reduce_scatter(x.float(), w.float())
    with pytest.raises(CircbufError, match="x is torch.bfloat16 and w is torch.float16"):
        loopback("all_gather", [x, x], [w.half(), w.half()])
    with pytest.raises(CircbufError, match="K differs"):
        loopback("all_gather", [x, x], [w[:, :32].contiguous()] * 2)
    with pytest.raises(CircbufError, match="a group of 1 rank has nothing to exchange"):
        loopback("all_gather", [x], [w])
    with pytest.raises(CircbufError, match="M = 63 is not divisible by the group's 2 ranks"):
        loopback("reduce_scatter", [x[:63].contiguous()] * 2, [w] * 2)
    with pytest.raises(CircbufError, match="N = 60 .* multiple of 8"):
        loopback("all_gather", [x, x], [w[:60].contiguous()] * 2)
    with pytest.raises(CircbufError, match="must be contiguous"):
        loopback("all_gather", [x.T, x.T], [w, w])
    with pytest.raises(CircbufError, match="kind 'all_reduce'"):
        loopback("all_reduce", [x, x], [w, w])


def test_the_loopback_example_passes_circbuf_check():
    """``python -m circbuf.check examples/distributed_loopback.py``: every
    kernel of both collectives (the GEMMs, the flag waits, the sum) under
    the checker, then the results against torch."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CIRCBUF_CHECK", None)
    r = subprocess.run(
        [sys.executable, "-m", "circbuf.check", "--schedules", "2", "examples/distributed_loopback.py"],
        capture_output=True, text=True, timeout=900, env=env, cwd=root,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "ran on cpu: ok" in r.stdout
    assert "circbuf_matmul" in r.stdout and "circbuf_flag_wait" in r.stdout, r.stdout[-3000:]


def test_the_packed_arguments_match_the_executors(monkeypatch):
    """The layer's own argument packing (peer views and flags are parameters
    the executor does not know) gives each parameter the bytes the compile
    driver's plan gives it: tensors, a scalar, tensor maps (their encoding
    faked: no driver here)."""
    import ctypes

    from circbuf.distributed import _pack
    from circbuf.runtime import tensormap
    from tests.test_gpu_matmul import mm_fusion

    monkeypatch.setattr(
        tensormap,
        "encode",
        lambda spec, t, name: bytes([spec.param + 1]) * 64 + t.data_ptr().to_bytes(8, "little") * 8,
    )
    fd = mm_fusion("linear", epilogue="scale")
    x, w = torch.randn(300, 256, dtype=BF), torch.randn(520, 256, dtype=BF)
    inputs = [x, w, 0.5]
    ex = fd._get_executor()
    ck = ex.compile(inputs, arch="sm_90a")
    info, _ = ex._bind(inputs, need_cuda=False)
    plan = ex._build_plan(ck, info, torch.device("cpu"))
    outs = plan.new_outputs(inputs)
    plan.write_args(inputs, outs)
    k = ck.kernel
    buf, ptrs, _ = _pack(k, [x, w, *outs], [0.5])
    sizes = [24] * len(k.tensor_params) + [8] * len(k.scalar_params) + [128] * len(k.tensor_maps)
    assert len(ptrs) == len(sizes) == len(plan.argptrs)
    for i, n in enumerate(sizes):
        assert ctypes.string_at(ptrs[i], n) == ctypes.string_at(plan.argptrs[i], n), i
