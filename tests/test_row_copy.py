"""The realign copy (``circbuf/runtime/row_copy.py``): rows at any byte
alignment into rows 16 bytes apart, 16-byte loads and stores, a funnel shift.

CPU: which copies it takes (``job_of``), the launch geometry, the kernel
compiled for sm_90a (128-bit loads and stores, no stack frame). GPU (``-m
gpu``): bits equal to the source for every byte shift 0-15, 1-, 2-, 4- and
8-byte items, rows of 1 to 100 KB, batches and column-major operands, never
a byte written past a row (a sentinel in the padding); the realign path of a
matmul with it and with torch's ``copy_`` (``CIRCBUF_ROW_COPY=0``), same bits.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from circbuf.runtime import row_copy
from circbuf.runtime.row_copy import job_of, plan_rows
from circbuf.scheduler.realign import realigned_strides
from circbuf.target import DEFAULT


def _pair(shape, dtype, off=0, device="cpu", strides=None, dst_strides=None, sentinel=None):
    """A source view ``off`` elements into a flat buffer, and its realigned destination."""
    n = 1
    for s in shape:
        n *= s
    if strides is None:
        strides = torch.empty(shape).stride()
    span = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if n else 0
    if dtype.is_floating_point:
        flat = torch.randn(off + span + 16, device=device).to(dtype)
    else:
        flat = torch.randint(-100, 100, (off + span + 16,), device=device).to(dtype)
    src = flat[off:].as_strided(shape, strides)
    st_d = dst_strides or realigned_strides(tuple(shape), tuple(strides), src.element_size())
    dspan = 1 + sum((s - 1) * st for s, st in zip(shape, st_d)) + 16
    buf = torch.full((dspan,), sentinel if sentinel is not None else 0, dtype=dtype, device=device)
    return src, buf.as_strided(shape, st_d), buf


def test_job_of_rows_batches_and_columns():
    src, dst, _ = _pair((5, 7), torch.bfloat16, off=1)
    assert job_of(src, dst) == (5, 1, 14, 14, 0, 16, 0)
    # column-major: the rows are the columns (unit stride along axis 0)
    src, dst, _ = _pair((7, 5), torch.float16, strides=(1, 7))
    assert dst.stride() == (1, 8) and job_of(src, dst) == (5, 1, 14, 14, 0, 16, 0)
    # one batch axis, its stride not the rows' (a view of a bigger batch)
    src, dst, _ = _pair((3, 4, 9), torch.bfloat16, strides=(50, 9, 1))
    assert job_of(src, dst) == (4, 3, 18, 18, 100, 32, 128)


def test_job_of_refuses_what_the_kernel_cannot_copy():
    src, dst, _ = _pair((5, 7), torch.bfloat16)
    assert job_of(src, dst.t().contiguous().t()) is None  # a transpose (TF32's K-major copy)
    assert job_of(src.t(), dst.t()) is not None  # (the same rows, seen as columns)
    assert job_of(src, torch.empty(5, 7, dtype=torch.float16)) is None  # dtypes differ
    src4, dst4, _ = _pair((2, 2, 3, 7), torch.bfloat16)
    assert job_of(src4, dst4) is None  # two batch axes
    _, d, buf = _pair((5, 7), torch.bfloat16)
    assert job_of(src, buf[1:].as_strided((5, 7), (8, 1))) is None  # destination off 16 bytes
    assert job_of(src[:0], dst[:0]) is None  # nothing to copy


@pytest.mark.parametrize(
    "rows, row_bytes, want",
    [
        (1, 2, (1, 256, 1, 1)),
        (2047, 4094, (128, 2, 660, 1)),  # a row's 256 chunks: 128 threads, two each
        (768, 100514, (128, 2, 26, 25)),  # 25 column CTAs a row, 26 x 25 <= one wave of 660
        (4096, 200, (8, 32, 128, 1)),  # 13 chunks: 8 threads a row, 32 rows a CTA
        (3, 10**7, (128, 2, 1, 2442)),  # more column CTAs than a wave: one row CTA
        (10**6, 16, (1, 256, 660, 1)),
        (1, 2**40, (128, 2, 1, DEFAULT.max_grid_yz)),  # past gridDim.y: a column grid-stride loop
    ],
)
def test_plan_rows(rows, row_bytes, want):
    tx, ty, row_ctas, col_ctas = got = plan_rows(rows, row_bytes, 660)
    assert got == want
    chunks = -(-row_bytes // 16)
    assert tx * ty == row_copy.THREADS
    assert col_ctas * 2 * tx >= chunks or col_ctas == DEFAULT.max_grid_yz  # every chunk has a CTA
    assert row_ctas * col_ctas <= 660 or row_ctas == 1


def test_kernel_compiles_to_vector_loads_and_stores():
    from circbuf.runtime import nvrtc
    from circbuf.runtime.cubin import frame_bytes
    from circbuf.runtime.tools import cuobjdump, find_tool

    cubin = nvrtc.compile_cuda(row_copy.SOURCE, "sm_90a", "realign_rows.cu")
    assert frame_bytes(cubin) == 0  # no stack: nothing in local memory
    if find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = cuobjdump(cubin, "-sass")
    assert len(re.findall(r"LDG\.E\.128", sass)) >= 2 and len(re.findall(r"STG\.E\.128", sass)) >= 1
    assert "LDL" not in sass and "STL" not in sass


def test_cpu_inputs_take_torch_copy():
    from circbuf.realign import _row_copy

    src, dst, _ = _pair((5, 7), torch.bfloat16, off=1)
    assert _row_copy([(src, dst)]) == ((), False)


# ---------------------------------------------------------------- GPU


def _check_copy(shape, dtype, off, strides=None):
    item = torch.empty((), dtype=dtype).element_size()
    sentinel = 77 if not dtype.is_floating_point else 7.0
    src, dst, buf = _pair(shape, dtype, off, "cuda", strides, sentinel=sentinel)
    job = job_of(src, dst)
    assert job is not None
    before = buf.clone()
    row_copy.copier(torch.cuda.current_device()).bind([job])([(src, dst)])
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src.cpu()), (shape, dtype, off, src.data_ptr() % 16)
    # nothing written outside the rows: the padding and the slack keep the sentinel
    touched = torch.zeros(buf.numel(), dtype=torch.bool)
    idx = torch.arange(buf.numel()).as_strided(dst.shape, dst.stride())
    touched[idx.reshape(-1)] = True
    assert torch.equal(buf.cpu()[~touched], before.cpu()[~touched])
    return item


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16, torch.float32, torch.float64])
def test_gpu_every_shift(dtype):
    """Each byte shift a source row can have: 16 offsets of 1-byte items, 8 of 2-byte ..."""
    item = torch.empty((), dtype=dtype).element_size()
    for off in range(16 // item):
        for shape in [(3, 1), (5, 7), (4, 33), (2, 257)]:
            _check_copy(shape, dtype, off)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, strides",
    [
        ((2047, 2047), None),
        ((768, 50257), None),
        ((4097, 4095), None),
        ((3, 4100, 1), None),
        ((1, 100003), None),
        ((100003, 1), None),
        ((4095, 300), (1, 4095)),  # column-major
        ((5, 64, 129), (9000, 129, 1)),  # a batch stride that is not the rows'
    ],
)
def test_gpu_issue_shapes(shape, strides):
    for off in (0, 1, 3):
        _check_copy(shape, torch.bfloat16, off, strides)


@pytest.mark.gpu
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 600),
    cols=st.integers(1, 3000),
    batch=st.integers(0, 3),
    off=st.integers(0, 15),
    dtype=st.sampled_from([torch.int8, torch.bfloat16, torch.float16, torch.float32]),
)
def test_gpu_hypothesis_rows(rows, cols, batch, off, dtype):
    shape = (batch, rows, cols) if batch else (rows, cols)
    _check_copy(shape, dtype, off % (16 // torch.empty((), dtype=dtype).element_size()))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "first, second",
    [
        (((2047, 2047), 1), ((300, 50257), 0)),
        (((4096, 100), 3), ((64, 2047), 1)),  # 200-byte rows beside 4 KB rows: one block shape for both
        (((5, 7), 0), ((3000, 9), 5)),
    ],
)
def test_gpu_two_copies_in_one_launch(first, second):
    (sa, oa), (sb, ob) = first, second
    a, da, _ = _pair(sa, torch.bfloat16, oa, "cuda")
    b, db, _ = _pair(sb, torch.bfloat16, ob, "cuda")
    row_copy.copier(torch.cuda.current_device()).bind([job_of(a, da), job_of(b, db)])([(a, da), (b, db)])
    torch.cuda.synchronize()
    assert torch.equal(da, a) and torch.equal(db, b)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, strides",
    [
        ((100003,), (1,)),  # 1-D: one row
        ((3, 4095, 300), (4095 * 301, 1, 4095)),  # column-major rows with a batch axis
        ((2, 1, 77), (80, 77, 1)),  # a row axis of one
    ],
)
def test_gpu_one_dim_and_batched_columns(shape, strides):
    for off in (0, 1, 5):
        _check_copy(shape, torch.bfloat16, off, strides)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2047, 2047, 2047), (1000, 50257, 768)])
def test_gpu_realign_with_row_copy_and_torch_copy(monkeypatch, shape):
    """The matmul's realign path: the row copy's result bit for bit torch ``copy_``'s."""
    from tests.test_gpu_matmul import mm_fusion
    from tests.test_matmul_cp_async import operands

    a, b = operands(*shape, "matmul", torch.bfloat16, 1, 0, device="cuda")
    fd = mm_fusion("matmul")
    (out,) = fd.execute([a, b])
    plan = next(iter(fd._get_executor()._plans.values()))
    assert plan.rows == (0, 1) and plan.copy  # both operands by the row copy, one launch
    monkeypatch.setenv("CIRCBUF_ROW_COPY", "0")
    fd2 = mm_fusion("matmul")
    (ref,) = fd2.execute([a, b])
    assert next(iter(fd2._get_executor()._plans.values())).rows == ()
    assert torch.equal(out, ref)
    torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=2e-2, atol=2e-2 * shape[2] ** 0.5)
