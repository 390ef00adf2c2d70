"""GPU tests of a row reduction fused into the matmul's epilogue
(scheduler/matmul_reduce.py): ``y = linear(x, w)`` with ``max(abs(y), -1)``,
``max(y, -1)`` or ``sum(y, -1)``, against float64 torch of the bf16 output.
Outputs are poisoned with NaN before each launch (conftest), so an unwritten
partial or element fails."""

import pytest
import torch

from tests.test_matmul_reduce import reference, row_fusion

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _run(what, m, n, k, nan=False, **ov):
    torch.manual_seed(m + 7 * n + 13 * k)
    fd = row_fusion(what)
    if ov:
        fd.fusion.schedule(**ov)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=DEV) / 4
    w = torch.randn(n, k, dtype=torch.bfloat16, device=DEV) / 4
    if nan:
        x[m // 2, k // 3] = float("nan")
    y, r = fd.execute([x, w])
    y_ref, r_ref = reference(what, x.cpu(), w.cpu())
    torch.testing.assert_close(y.double().cpu(), y_ref.double(), rtol=1.6e-2, atol=1.6e-2, equal_nan=True)
    # the reduction of the stored bf16 values: max exact, sum an fp32 accumulation of them
    rd, yd = r.double().cpu(), y.double().cpu()
    if what == "sum":
        torch.testing.assert_close(rd, yd.sum(-1), rtol=1e-5, atol=1e-4 * max(n, 1) ** 0.5, equal_nan=True)
    else:
        # exact against the kernel's own stored y (y_ref rounds an fp64 product: at 4096x4096x1024
        # an H200 gave 2 of 4096 row maxima an ulp apart from it, as y itself is), near r_ref
        mine = (yd.abs() if what == "amax" else yd).amax(-1) if n else rd
        torch.testing.assert_close(rd, mine, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(rd, r_ref, rtol=1.6e-2, atol=1.6e-2, equal_nan=True)
    if nan:
        assert torch.isnan(r[m // 2]) and not torch.isnan(r[: m // 2]).any()
    return fd, x, w, r


@pytest.mark.parametrize("what", ["amax", "max", "sum"])
@pytest.mark.parametrize(
    "m, n, k",
    [(67, 131, 40), (131, 1, 24), (37, 389, 72), (1000, 1000, 512), (4096, 4096, 1024), (257, 8191, 136)],
)
@pytest.mark.parametrize(
    "ov", [{}, dict(pingpong=True), dict(pingpong=False)], ids=["heuristic", "pp", "coop"]
)
def test_fused_row_reduction(what, m, n, k, ov):
    fd, *_ = _run(what, m, n, k, **ov)
    assert "partial" in str(fd._get_executor().last)  # the partials came from the GEMM's epilogue


@pytest.mark.parametrize("what", ["amax", "sum"])
def test_nan_propagates(what):
    _run(what, 300, 700, 128, nan=True)


def test_deterministic():
    fd, x, w, r = _run("sum", 2048, 3000, 512)
    for _ in range(3):
        assert torch.equal(fd.execute([x, w])[1], r)
