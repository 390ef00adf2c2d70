"""Issue 22 on GPUs: the peer-storing GEMM in loopback on one GPU (every
"peer" a buffer there) against float64 torch, a flag that is never released
raising DistributedTimeout instead of hanging, and, with two or more GPUs,
one process per rank (NCCL, symmetric memory) against cuBLAS + NCCL
all_gather_into_tensor / reduce_scatter_tensor (benchmarks/distributed.py
holds the per-rank code: ``--check`` runs the same)."""

from __future__ import annotations

import pytest
import torch

from tests.test_distributed import expected, last_flag_never_released

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cuda(ts):
    return [t.cuda() for t in ts]


@needs_gpu
@pytest.mark.parametrize(
    "kind, world, m, n, k",
    [
        ("all_gather", 2, 1024, 2048, 512),
        ("all_gather", 4, 1000, 520, 264),
        ("reduce_scatter", 2, 1024, 1024, 1024),
        ("reduce_scatter", 3, 1002, 520, 136),
    ],
)
def test_loopback_on_one_gpu(kind, world, m, n, k):
    from circbuf.distributed import loopback
    from tests.test_distributed import operands

    xs, ws = operands(kind, world, m, n, k)
    outs = loopback(kind, _cuda(xs), _cuda(ws))
    for got, want in zip(outs, expected(kind, xs, ws)):
        assert not got.isnan().any()
        scale = want.abs().max().item()
        assert (got.double().cpu() - want).abs().max().item() / scale < 2e-2


@needs_gpu
def test_a_flag_never_released_times_out_on_the_gpu(monkeypatch):
    from circbuf.distributed import DistributedTimeout, loopback
    from tests.test_distributed import operands

    monkeypatch.setenv("CIRCBUF_DIST_TIMEOUT", "2")
    xs, ws = operands("all_gather", 2, 512, 512, 256)
    with pytest.raises(
        DistributedTimeout, match=r"waited 2 s .* for tile \d+ of rank \d of 2: its flag holds 0"
    ):
        loopback("all_gather", _cuda(xs), _cuda(ws), mutate=last_flag_never_released)
    torch.cuda.synchronize()  # the context survived: the wait returned, it did not trap


CASES = [
    ("all_gather", 1024, 2048, 512),
    ("all_gather", 1000, 1040, 272),
    ("reduce_scatter", 1024, 1024, 1024),
    ("reduce_scatter", 264, 520, 272),
]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_match_cublas_and_nccl():
    from benchmarks.distributed import spawn_check

    spawn_check(2, CASES, timeout_case=True)


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 GPUs")
def test_four_gpus_match_cublas_and_nccl():
    from benchmarks.distributed import spawn_check

    spawn_check(4, [("all_gather", 1024, 2048, 512), ("reduce_scatter", 1024, 1024, 1024)])
