"""A Pipelined ring every thread fills by cp.async (``cache_after(op="cp.async")``
and ``circular_buffer``: the lowering's thread-filled ring outside a
warp-specialized kernel), scheduled by hand: its structure, its numbers in
the interpreter with the protocol checker on (races, unfinished copies), a
transposing copy (the box's inner dim strided in global memory: consecutive
threads walk the contiguous dim), the SASS (LDGSTS, no local memory), and
the API's errors."""

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from circbuf.ir import CircbufError, ParallelType
from circbuf.lowering.kir import BlockSync, CpAsyncArrive, CpAsyncBox, ForLoop, MBarrierWait, walk
from circbuf.scheduler import propagate_transforms
from tests.util import D, assert_close, seeded


def _nodes(kernel, kind):
    out = []
    walk(kernel.body, lambda n, s: out.append(n) if isinstance(n, kind) else None)
    return out


def manual_cp_async_exp(tidx=32, stages=2, vector=4, transposed=False, dtype=D.Float):
    """exp over a [rows, cols] tensor: rows in pairs (threadIdx.y, the outer
    serial loop), columns in tiles of ``tidx`` (threadIdx.x, the ring loop);
    each [2 x tidx] tile copied by every thread (cp.async, ``vector``
    elements a copy) into a ring of ``stages`` slots. ``transposed``: the
    slot is laid out [tidx][2] (the box's inner dim is the rows')."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        y = fd.ops.exp(x)
        fd.add_output(y)
    xs = x.cache_after(op="cp.async", vector=vector)
    y.split(1, tidx).split(0, 2)
    y.reorder([0, 2, 1, 3])  # [I/2 (outer loop), J/tidx (ring loop), TIDy 2, TIDx tidx]
    y.axis(2).parallelize(ParallelType.TIDy)
    y.axis(3).parallelize(ParallelType.TIDx)
    propagate_transforms(fd.fusion, y)
    if transposed:
        xs.reorder([0, 1, 3, 2])
    xs.axis(2).parallelize(ParallelType.Bulk)
    xs.axis(3).parallelize(ParallelType.Bulk)
    xs.inline_at(2)
    for tv in fd.fusion.used_tvs():
        if tv is not xs and not tv.is_input and not tv.is_output:
            tv.inline_at(4)
    xs.circular_buffer(stages)
    return fd


CASES = [
    # (rows, cols, tidx, stages, vector, transposed)
    (6, 128, 32, 2, 4, False),
    (5, 100, 32, 3, 4, False),  # ragged rows and columns: zero-filled copies, guarded stores
    (4, 70, 16, 2, 2, False),  # 8-byte copies
    (6, 96, 32, 2, 1, False),  # element copies along the row
    (6, 96, 32, 2, 1, True),  # the transposed slot: threads walk the columns
    (3, 37, 16, 4, 1, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_cp_async_ring_interpreted(case):
    rows, cols, tidx, stages, vector, transposed = case
    fd = manual_cp_async_exp(tidx, stages, vector, transposed)
    x = torch.randn(rows, cols, generator=seeded(rows * cols))
    (out,) = interpret(fd, [x], check=4)
    assert_close(out, torch.exp(x.double()))


def test_cp_async_ring_structure_and_sass():
    fd = manual_cp_async_exp(32, 3, 4)
    ck = fd.compile([torch.empty(64, 256)], arch="sm_90a")
    k = ck.kernel
    (ring,) = k.rings
    assert ring.fill == "cp.async" and ring.producer is None and ring.stages == 3 and ring.prefetch == 2
    assert ring.full_arrivals == 64  # one cp.async.mbarrier.arrive.noinc per thread of the CTA
    boxes = _nodes(k, CpAsyncBox)
    assert len(boxes) == 2 and all(
        b.flat and b.threads == 64 and b.vector == 4 and b.walk == 0 for b in boxes
    )
    assert len(_nodes(k, CpAsyncArrive)) == 2  # the prologue's copies and the ring loop's
    # the ring loop: the copies of the position ``prefetch`` ahead, the wait for this
    # one, the reads, one block sync (the stage read here is refilled next)
    ring_loop = next(n for n in _nodes(k, ForLoop) if any(isinstance(m, MBarrierWait) for m in n.body))
    kinds = [type(n).__name__ for n in ring_loop.body]
    assert kinds.index("IfThenElse") < kinds.index("MBarrierWait") < kinds.index("BlockSync")
    assert sum(isinstance(n, BlockSync) for n in ring_loop.body) == 1
    sass = ck.sass()
    assert "LDGSTS.E.BYPASS.128" in sass and "ARRIVES.LDGSTSBAR" in sass
    use = ck.resource_usage()
    assert use["LOCAL"] == 0


def test_transposing_copy_walks_the_contiguous_dim():
    fd = manual_cp_async_exp(32, 2, 1, transposed=True)
    ck = fd.compile([torch.empty(64, 256)], arch="sm_90a")
    boxes = _nodes(ck.kernel, CpAsyncBox)
    # box dims innermost first: the rows' (strided: one element a copy), the columns'
    assert all(b.vector == 1 and b.walk == 1 and [d[1] for d in b.dims] == [2, 32] for b in boxes)
    assert "LDGSTS.E " in ck.sass() or "LDGSTS.E\t" in ck.sass() or "LDGSTS.E [" in ck.sass()


def test_cache_after_cp_async_errors():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.Float)
        h = fd.ops.exp(x)
        y = fd.ops.exp(h)
        fd.add_output(y)
    with pytest.raises(CircbufError, match="must be a global fusion input"):
        h.cache_after(op="cp.async")
    with pytest.raises(CircbufError, match=r"vector=3\): a copy of 3 x 4 bytes is not 4, 8 or 16 bytes"):
        x.cache_after(op="cp.async", vector=3)
    with pytest.raises(CircbufError, match="supported: 'set', 'tma', 'cp.async'"):
        x.cache_after(op="bulk")
