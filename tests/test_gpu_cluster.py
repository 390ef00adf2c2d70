"""GPU tests of thread-block clusters with TMA multicast (issue 21) against
torch in float64: each cluster shape, cooperative and ping-pong, persistent
and not, ragged edges inside the tile grid, a linear and a batch; and a
kernel whose multicast protocol is broken on purpose under
CIRCBUF_DEBUG_HANG raises the named error instead of hanging. Outputs are
poisoned with NaN before each launch (conftest)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.test_gpu_matmul import check, mm_fusion

pytestmark = pytest.mark.gpu
DEV = "cuda"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [(2, 1), (1, 2), (2, 2)]
VARIANTS = [
    dict(),  # cooperative 128x256, persistent (non-persistent clusters are refused)
    dict(pingpong=True, tile=(128, 128, 64)),
    dict(tile=(128, 128, 64), stages=5),
]


def _id(ov):
    return ",".join(f"{k}={v}" for k, v in ov.items()) or "heuristic"


@pytest.mark.parametrize("ov", VARIANTS, ids=[_id(v) for v in VARIANTS])
@pytest.mark.parametrize("cluster", SHAPES, ids=[f"{x}x{y}" for x, y in SHAPES])
@pytest.mark.parametrize("m, n, k", [(2048, 2048, 512), (1500, 2500, 200), (4096, 4096, 4096)])
def test_cluster_matmul_matches_torch(cluster, ov, m, n, k):
    fd = mm_fusion("matmul")
    fd.fusion.schedule(cluster=cluster, **ov)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a, b])
    assert fd.last_params().cluster == cluster
    check(out, a.double() @ b.double())
    (again,) = fd.execute([a, b])  # a second launch of the same plan
    assert torch.equal(out, again)


@pytest.mark.parametrize("cluster", SHAPES, ids=[f"{x}x{y}" for x, y in SHAPES])
def test_cluster_linear_and_batch(cluster):
    fd = mm_fusion("linear", bias=True, epilogue="gelu")
    fd.fusion.schedule(cluster=cluster)
    x = torch.randn(1024, 768, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(2048, 768, device=DEV, dtype=torch.bfloat16)
    bias = torch.randn(2048, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([x, w, bias])
    check(out, torch.nn.functional.gelu(x.double() @ w.double().T + bias.double()))
    fd = mm_fusion("matmul", arank=3, brank=3)
    fd.fusion.schedule(cluster=cluster, pingpong=True, tile=(128, 128, 64))
    a = torch.randn(3, 512, 384, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(3, 384, 1024, device=DEV, dtype=torch.bfloat16)
    (out,) = fd.execute([a, b])
    check(out, a.double() @ b.double())


@pytest.mark.parametrize("cluster", SHAPES, ids=[f"{x}x{y}" for x, y in SHAPES])
def test_persistent_cluster_grid_is_resident_at_once(cluster):
    """The persistent grid (Target.cluster_slots) holds no more clusters than
    cuOccupancyMaxActiveClusters says fit at once: one more would wait for a
    whole cluster to finish (a second wave of a persistent kernel)."""
    from cuda.bindings import driver

    fd = mm_fusion("matmul")
    fd.fusion.schedule(cluster=cluster)
    a = torch.randn(8192, 1024, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(1024, 8192, device=DEV, dtype=torch.bfloat16)
    fd.execute([a, b])
    ck = fd._get_executor().last
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = ck.params.grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 128, 3, 1
    cfg.sharedMemBytes = ck.launch.smem_bytes if isinstance(ck.launch.smem_bytes, int) else 0
    err, n = driver.cuOccupancyMaxActiveClusters(ck.loaded().function, cfg)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    cs = cluster[0] * cluster[1]
    assert ck.params.grid <= n * cs, (ck.params.grid, n, cs)
    print(f"cluster {cluster}: grid {ck.params.grid}, {n} clusters resident")


BROKEN = textwrap.dedent(
    """
    import dataclasses, torch, circbuf as cb
    import circbuf.lowering as L
    from circbuf.lowering import kir
    k = [i for i, p in enumerate(L.PASSES) if p.name == "mbarriers"][0]
    orig = L.PASSES[k].fn
    def broken(kernel):  # {why}
        kernel = orig(kernel)
        def f(n, _s):
            {mutation}
        kir.walk(kernel.body, f)
        return kernel
    L.PASSES[k] = dataclasses.replace(L.PASSES[k], fn=broken)
    from tests.test_gpu_matmul import mm_fusion
    fd = mm_fusion("matmul")
    fd.fusion.schedule(cluster=(2, 2))
    a = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    try:
        fd.execute([a, b])
        torch.cuda.synchronize()
        print("NO ERROR")
    except cb.CircbufError as e:
        print("CIRCBUF_ERROR:", e)
    """
)


@pytest.mark.parametrize(
    "mutation, why, barrier",
    [
        (
            "if isinstance(n, kir.MBarrierArrive) and n.peers: n.peers = ()",
            "consumers release their own CTA's stage only: the peers' producers wait for ever",
            "_empty\\[",
        ),
        (
            # the peers' full barriers wait for ever, so their consumers never release and
            # a producer's empty wait may give up first (it did on an H100): either is named
            "if isinstance(n, kir.TmaLoad) and n.multicast: n.multicast = ()",
            "the slices land in the issuing CTA only: the peers' full barriers wait for ever",
            "_(full|empty)\\[",
        ),
    ],
    ids=["release-own-stage-only", "slices-not-multicast"],
)
def test_broken_multicast_raises_instead_of_hanging(mutation, why, barrier):
    src = BROKEN.format(mutation=mutation, why=why)
    env = dict(os.environ, CIRCBUF_DEBUG_HANG="20000", CIRCBUF_CACHE_DIR="")
    r = subprocess.run(
        [sys.executable, "-c", src], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    out = r.stdout + r.stderr
    assert "CIRCBUF_ERROR:" in out, out
    assert re.search(barrier, out) and "gave up" in out, out
