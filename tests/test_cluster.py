"""Thread-block clusters with TMA multicast (issue 21), on the CPU.

``schedule(cluster=(cx, cy))``: cx CTAs along M share B's tile, cy along N share
A's; each CTA of a cluster loads a slice of each shared tile and multicasts it
(``cp.async.bulk.tensor ... .multicast::cluster``), its consumers release a stage
in every CTA whose slices land in theirs (``mapa`` + ``mbarrier.arrive.shared::cluster``),
and cluster barriers open and close the kernel. Checked here: the params' rules,
the generated CUDA and SASS, the interpreter's results against float64 torch
(outputs NaN-poisoned) for each cluster shape, and the protocol checker on
the kernels as built and with the cluster protocol broken on purpose.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import circbuf as cb
from circbuf.interpret import check_kernel, interpret, launch_args
from circbuf.lowering import kir
from circbuf.target import H100
from tests.test_interpret import _mm

BF = torch.bfloat16
SHAPES = [(2, 1), (1, 2), (2, 2)]
# (cluster, pingpong, persistent) -> M, N, K, SMs: tile grids the clusters divide, several
# k steps per tile; a persistent grid of 2 SMs per cluster walks several tiles
CASES = [
    ((2, 1), False, True, 256, 256, 256, 2),
    ((1, 2), False, True, 128, 512, 256, 2),
    ((2, 2), False, True, 256, 512, 128, 4),
    ((2, 1), True, True, 256, 256, 256, 2),
    ((1, 2), True, True, 128, 512, 128, 2),
    ((2, 2), True, True, 256, 256, 128, 4),
]
# (non-persistent cluster kernels are refused: one was not deterministic on an H100)


def _target(sms):
    return dataclasses.replace(H100, sm_count=sms)


def _case(cluster, pingpong, persistent, m, n, k):
    return _mm("matmul", m, n, k, cluster=cluster, pingpong=pingpong, persistent=persistent)


def _id(c):
    cl, pp, pers, m, n, k, sms = c
    return f"{cl[0]}x{cl[1]}-{'pingpong' if pp else 'coop'}-{'persistent' if pers else 'grid'}-{m}x{n}x{k}"


# ------------------------------------------------------------ params
def _params(m, n, k, **ov):
    fd, ins, _ = _mm("matmul", m, n, k)
    if ov:
        fd.fusion.schedule(**ov)  # (epilogue= is _mm's fusion epilogue, not the override)
    return fd.compile(ins, arch="sm_90a").kernels[0].params


@pytest.mark.parametrize(
    "ov, message",
    [
        (dict(cluster=(3, 1)), r"the cluster must divide the tile grid .*ragged clusters are not built"),
        (dict(cluster=(1, 2)), r"the cluster must divide the tile grid \(4 x 3 tiles of 128x256\)"),
        (dict(cluster=(1, 3)), r"A's 128-row tile splits into 3 slices of 42 rows, not a multiple of 8"),
        (dict(cluster=(4, 4)), r"16 CTAs exceed the 8 of a portable cluster"),
        (
            dict(cluster=(2, 1), epilogue="role"),
            r"cluster=\(2, 1\), epilogue='role'\): clusters are built for the inline epilogue only",
        ),
        (
            dict(cluster=(2, 1), fill="cp.async"),
            r"cluster=\(2, 1\), fill='cp.async'\): a multicast fill is a TMA copy",
        ),
        (dict(cluster=(2,)), r"must be \(cx, cy\), two ints >= 1"),
        (dict(cluster=(0, 1)), r"two ints >= 1"),
    ],
)
def test_cluster_override_rules(ov, message):
    with pytest.raises(cb.CircbufError, match=message):
        _params(512, 768, 256, **ov)


def test_cluster_params_and_the_heuristic_default():
    assert _params(512, 512, 256).cluster == (1, 1)  # the heuristic keeps (1, 1) until measured
    p = _params(512, 1024, 256, cluster=(2, 2), persistent=True)
    assert p.cluster == (2, 2) and "cluster: (2, 2)" in str(p)
    # a persistent grid of whole clusters
    # a persistent grid of whole clusters that are resident at once (Target.cluster_slots)
    assert _params(4096, 4096, 256, cluster=(2, 2)).grid == 120  # 30 clusters of 4 resident (H100, measured)
    assert _params(4096, 4096, 256, cluster=(2, 1)).grid == 132
    assert _params(4096, 4096, 256, cluster=(1, 1)).grid == 132


def test_the_heuristic_cluster_knob(monkeypatch):
    """CIRCBUF_MATMUL_CLUSTER picks the heuristic's cluster (the lead's switch once
    clusters measure faster); a tile grid it does not fit gets none, an override wins."""
    monkeypatch.setenv("CIRCBUF_MATMUL_CLUSTER", "2x1")
    assert _params(512, 1024, 256).cluster == (2, 1)
    assert _params(384, 1024, 256).cluster == (1, 1)  # 3 M tiles: no 2x1 cluster
    assert _params(512, 1024, 256, cluster=(1, 2)).cluster == (1, 2)
    monkeypatch.setenv("CIRCBUF_MATMUL_CLUSTER", "2by1")
    with pytest.raises(cb.CircbufError, match=r"CIRCBUF_MATMUL_CLUSTER='2by1': expected CXxCY"):
        _params(512, 1024, 256)


def test_a_slice_must_hold_whole_swizzle_atoms():
    # A (K-major) 64 rows per ping-pong tile: 2 slices of 32 rows are fine, B (N-major)
    # of bn = 128: two 64-wide boxes, one per CTA of a (2, 1) cluster
    _params(256, 256, 128, cluster=(2, 2), pingpong=True, tile=(64, 128, 64))
    with pytest.raises(cb.CircbufError, match=r"B's tile of 1 64-wide column boxes does not split into 2"):
        _params(256, 256, 128, cluster=(2, 1), pingpong=True, tile=(64, 64, 64))


# ------------------------------------------------------------ CUDA and SASS
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{x}x{y}" for x, y in SHAPES])
def test_cluster_cuda_and_sass(shape):
    fd, ins, _ = _mm("matmul", 512, 1024, 256, cluster=shape)
    k = fd.compile(ins, arch="sm_90a").kernels[0]
    cs = shape[0] * shape[1]
    assert f"__cluster_dims__({cs}, 1, 1)" in k.cuda
    assert "cb::tma_load_multicast(" in k.cuda and "cb::mbar_arrive_cluster(" in k.cuda
    assert k.cuda.count("cb::cluster_sync();") == 2  # after the barriers' init, before exit
    assert "fence_mbarrier_init" in k.cuda
    sass = k.sass()
    assert "UTMALDG.2D.MULTICAST" in sass
    assert "UCGABAR_ARV" in sass and "UCGABAR_WAIT" in sass
    use = k.resource_usage()
    assert use["LOCAL"] == 0 and use["STACK"] == 0  # the release loop spills nothing
    ring = k.kernel.rings[0]
    assert ring.fill == "multicast"
    # each empty barrier waits for the releases of every CTA its slices land in
    assert ring.empty_arrivals == 8 * (shape[0] + shape[1] - 1)
    assert f"cluster{shape}" in str(k.kernel)


def test_no_cluster_kernel_is_unchanged():
    fd, ins, _ = _mm("matmul", 512, 1024, 256)
    k = fd.compile(ins, arch="sm_90a").kernels[0]
    assert "__cluster_dims__" not in k.cuda and "cluster_sync()" not in k.cuda.split('extern "C"')[1]
    assert k.kernel.rings[0].fill == "tma" and k.kernel.cluster == (1, 1)


# ------------------------------------------------------------ interpreter and checker
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_cluster_kernels_in_the_interpreter(case):
    cluster, pingpong, persistent, m, n, k, sms = case
    fd, ins, ref = _case(cluster, pingpong, persistent, m, n, k)
    out = interpret(fd, ins, target=_target(sms))[0]  # outputs NaN-poisoned first, each stored once
    torch.testing.assert_close(out.double(), ref(), rtol=2e-2, atol=2e-2)
    if persistent:
        kern, tensors, scalars, grid, block = launch_args(fd, ins, target=_target(sms))
        assert kern.cluster == cluster and grid[0] % (cluster[0] * cluster[1]) == 0
        check_kernel(kern, tensors, scalars, grid, block, schedules=2)


def _launch(cluster=(2, 2), pingpong=False):
    # 8 k steps per tile on a 4-stage ring: the producers need every release
    fd, ins, _ = _mm("matmul", 256, 512, 512, cluster=cluster, pingpong=pingpong)
    return launch_args(fd, ins, target=_target(4))


def _only_own_release(k):
    """The consumers release a stage in their own CTA only."""
    kir.walk(k.body, lambda n, _s: setattr(n, "peers", ()) if isinstance(n, kir.MBarrierArrive) else None)


def _no_exit_barrier(k):
    """A block-wide sync before exit where a cluster barrier belongs."""
    last = [n for n in k.body if isinstance(n, kir.ClusterSync)][-1]
    k.body[k.body.index(last)] = kir.BlockSync("only this CTA's threads")


def _no_start_barrier(k):
    first = [n for n in k.body if isinstance(n, kir.ClusterSync)][0]
    k.body[k.body.index(first)] = kir.BlockSync("only this CTA's threads")


def _local_copy(k):
    """One operand's slice lands in this CTA only (no multicast): the peers'
    full barriers wait for bytes that never come."""
    load = next(n for n in _nodes(k, kir.TmaLoad) if n.multicast)
    load.multicast = ()


def _nodes(k, cls):
    out = []
    kir.walk(k.body, lambda n, _s: out.append(n) if isinstance(n, cls) else None)
    return out


@pytest.mark.parametrize(
    "mutate, message",
    [
        (_only_own_release, r"deadlock in the cluster of CTAs .*waits? on ab_empty"),
        (_no_exit_barrier, r"no cluster barrier before exit"),
        (_no_start_barrier, r"before its initialization is visible|not allocated|not initialized"),
        (_local_copy, r"deadlock in the cluster of CTAs .*ab_full"),
    ],
    ids=[
        "release-only-own-stage",
        "no-exit-cluster-barrier",
        "no-start-cluster-barrier",
        "copy-not-multicast",
    ],
)
@pytest.mark.parametrize("pingpong", [False, True], ids=["coop", "pingpong"])
def test_checker_catches_broken_cluster_protocol(mutate, message, pingpong):
    k, tensors, scalars, grid, block = _launch(pingpong=pingpong)
    check_kernel(k, [t.clone() for t in tensors], scalars, grid, block, schedules=1)  # as built: passes
    mutate(k)
    with pytest.raises(cb.CircbufError, match=message):
        check_kernel(k, tensors, scalars, grid, block, schedules=3)


@pytest.mark.parametrize(
    "layout, cluster, pingpong",
    [("linear", (2, 2), False), ("linear", (2, 1), True), ("a_m_major", (2, 2), False)],
)
def test_cluster_operand_layouts_in_the_interpreter(layout, cluster, pingpong):
    """B K-major (a linear's [N, K] weight: slices of rows) and A M-major (a
    transposed view: slices of 64-wide column boxes) multicast too."""
    if layout == "linear":
        fd, ins, ref = _mm("linear", 256, 512, 256, cluster=cluster, pingpong=pingpong)
        out = interpret(fd, ins, target=_target(4))[0]
        want = ref()
    else:
        from tests.test_gpu_matmul import mm_fusion

        fd = mm_fusion("matmul")
        fd.fusion.schedule(cluster=cluster, pingpong=pingpong)
        a = torch.randn(256, 256, dtype=BF).t()  # [M, K], M contiguous
        b = torch.randn(256, 512, dtype=BF)
        out = interpret(fd, [a, b], target=_target(4))[0]
        want = a.double() @ b.double()
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_cluster_beside_a_residual_ring():
    """gelu(linear + residual): the operands' ring is multicast, the residual's
    (loaded by the same producer lane) stays a local TMA ring."""
    from tests.test_gpu_matmul import epilogue_input

    fd, ins, ref = epilogue_input("residual", 256, 256, 256)
    fd.fusion.schedule(cluster=(2, 1))
    out = interpret(fd, ins, target=_target(2))[0]
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    k, tensors, scalars, grid, block = launch_args(fd, ins, target=_target(2))
    assert [r.fill for r in k.rings] == ["multicast", "tma"]
    check_kernel(k, tensors, scalars, grid, block, schedules=2)


def test_non_persistent_clusters_are_refused():
    """A non-persistent 2x1 cluster kernel gave two launches different bits on an
    H100 (tests/test_gpu_cluster.py, 1500x2500x200): refused by name until the race
    is found."""
    with pytest.raises(
        cb.CircbufError, match=r"cluster=\(2, 1\), persistent=False\): clusters run on a persistent"
    ):
        _params(256, 256, 128, cluster=(2, 1), persistent=False)
