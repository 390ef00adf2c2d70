"""Issue 10 (CPU): the normalization scheduler's grid and register cap, guards of
reduction updates, and a 1-D pointwise fusion that asks for the TMA variant."""

from __future__ import annotations

import re

import pytest
import torch

import circbuf as cb
from circbuf.interpret import interpret
from tests.util import D, norm_fusion, norm_inputs, norm_reference


def _body(ck):
    return ck.cuda[ck.cuda.index('extern "C"') :]


def test_1d_pointwise_asking_for_tma_says_why_in_params():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.silu(x), D.BFloat16))
    fd.fusion.schedule(stages=3)
    ck = fd.compile([torch.randn(1 << 16, dtype=torch.bfloat16)], arch="sm_90a")
    p = fd.last_params()
    assert isinstance(p, cb.scheduler.PointwiseParams)
    assert "1-D" in p.tma_declined and "tma_declined" in str(p)
    assert "cp.async.bulk" not in _body(ck) and "tma_load" not in _body(ck)


def test_pointwise_params_hide_an_empty_decline_note():
    assert "tma_declined" not in str(cb.scheduler.PointwiseParams())


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
def test_register_reduction_updates_keep_only_reduced_axis_guards(kind):
    # 7 rows in blocks of 2: the last block has a row out of range
    fd = norm_fusion(kind, D.BFloat16)
    ck = fd.compile(norm_inputs(kind, 7, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    body = _body(ck)
    assert fd.last_params().row_length == 4096 and fd.last_params().rows >= 2
    guard = "+ ((index_t)threadIdx.y)) < i0)"
    lines = body.splitlines()
    for k, line in enumerate(lines):
        if re.search(r"T\d+\[0\] = (T\d+\[0\] \+|cb::maximum\(T\d+\[0\])", line):  # an update
            assert guard not in lines[k - 1], (lines[k - 1], line)
    # every global store keeps its row guard
    stores = [
        k
        for k, line in enumerate(lines)
        if ".data[" in line and line.strip().startswith("cb::vec_copy<8>(&T")
    ]
    assert stores and all(
        guard in lines[k - 1] for k in stores if "T1.data" not in lines[k] and "T2.data" not in lines[k]
    )


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape", [(5, 37), (3, 300), (9, 8)])
def test_plain_reductions_with_unguarded_register_updates_on_the_interpreter(kind, shape):
    # the plain path (tma=False, one CTA per row) keeps the guards of the reduced
    # axis (its updates read global memory or a padded row): dropping one would add
    # junk into in-range rows; NaN in the output means an element was not written
    torch.manual_seed(0)
    fd = norm_fusion(kind, D.Float)
    fd.fusion.schedule(tma=False)
    ins = norm_inputs(kind, *shape, torch.float32, "cpu")
    (out,) = interpret(fd, ins)
    ref = norm_reference(kind, ins)
    assert not out.isnan().any()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize(
    "kind, shape, per_sm",
    [
        ("softmax", (32768, 4096), 3),  # 256-thread CTAs (128 x 2 rows), cap 80 registers
        ("layer_norm", (16384, 6144), 3),
        ("softmax", (8192, 16384), 2),  # 512-thread CTAs: 2, never 1 (0.70 vs 0.91 of copy on H100)
        ("layer_norm", (131072, 512), 2),
        ("rms_norm", (4096, 32768), 1),  # 1024 threads and 3 x 64 KB stages: one fits
    ],
)
def test_ctas_per_sm_rule(kind, shape, per_sm):
    """The persistent TMA ring's grid (staging='tma')."""
    fd = norm_fusion(kind, D.BFloat16)
    fd.fusion.schedule(staging="tma")
    fd.compile(norm_inputs(kind, *shape, torch.bfloat16, "cpu"), arch="sm_90a")
    p = fd.last_params()
    assert p.blocks_per_sm == per_sm and p.grid == 132 * per_sm


def test_float_max_reduction_is_one_nan_propagating_fmnmx():
    fd = norm_fusion("softmax", D.BFloat16)
    ck = fd.compile(norm_inputs("softmax", 1024, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    sass = ck.sass()
    assert "FMNMX.NAN" in sass and "max.NaN.f32" in ck.cuda


def test_grid_is_sized_for_the_ctas_the_register_cap_fits():
    fd = norm_fusion("rms_norm", D.BFloat16)
    fd.fusion.schedule(staging="tma")
    ck = fd.compile(norm_inputs("rms_norm", 32768, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    p = fd.last_params()
    assert p.blocks_per_sm >= 1 and p.grid == 132 * p.blocks_per_sm
    assert f"__launch_bounds__({p.threads * p.rows}, {p.blocks_per_sm})" in ck.cuda
    use = ck.resource_usage()
    assert use["STACK"] == 0 and use["LOCAL"] == 0
    assert use["REG"] * p.threads * p.rows * p.blocks_per_sm <= 65536


def test_blocks_per_sm_override():
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(blocks_per_sm=2, staging="tma")
    ck = fd.compile(norm_inputs("softmax", 32768, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    p = fd.last_params()
    assert p.blocks_per_sm == 2 and p.grid == 264
    assert f"__launch_bounds__({p.threads * p.rows}, 2)" in ck.cuda
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(blocks_per_sm=2)  # registers: the cap only, one row block per CTA as before
    ck = fd.compile(norm_inputs("softmax", 32768, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    p = fd.last_params()
    assert p.staging == "registers" and p.blocks_per_sm == 2 and p.grid == 16384
    assert f"__launch_bounds__({p.threads * p.rows}, 2)" in ck.cuda
    for staging in ("tma", "registers"):
        # 64 is in the table's range, too many for CTAs of 256 threads (compile); True and 0 are
        # refused at the schedule() call
        for bad, rule in ((64, "256 threads per CTA allow 1 to 8"), (True, "must be an int")):
            fd = norm_fusion("softmax", D.BFloat16)
            with pytest.raises(cb.CircbufError, match=rf"blocks_per_sm={bad}\): {rule}"):
                fd.fusion.schedule(blocks_per_sm=bad, staging=staging)
                fd.compile(norm_inputs("softmax", 32768, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
        with pytest.raises(cb.CircbufError, match=r"blocks_per_sm=0\): must be an int in \[1, 64\]"):
            fd.fusion.schedule(blocks_per_sm=0, staging=staging)
    # the ring's stages must fit that many times in an SM's shared memory
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(blocks_per_sm=8, staging="tma", stages=4)
    with pytest.raises(
        cb.CircbufError, match=r"blocks_per_sm=8\): 8 x 4 x 16384 bytes of row buffers exceed"
    ):
        fd.compile(norm_inputs("softmax", 32768, 4096, torch.bfloat16, "cpu"), arch="sm_90a")


@pytest.mark.parametrize("kind", ["softmax", "layer_norm"])
def test_rows_of_32768_are_held_in_registers_by_1024_threads(kind):
    fd = norm_fusion(kind, D.BFloat16)
    ck = fd.compile(norm_inputs(kind, 8, 32768, torch.bfloat16, "cpu"), arch="sm_90a")
    p = fd.last_params()
    assert p.threads == 1024 and p.row_length == 32768
    fd = norm_fusion(kind, D.BFloat16)
    fd.fusion.schedule(warp_specialized=True)  # the producer row doubles the threads: 512 + 512
    fd.compile(norm_inputs(kind, 8, 32768, torch.bfloat16, "cpu"), arch="sm_90a")
    assert fd.last_params().threads == 512 and fd.last_params().warp_specialized
    if kind == "layer_norm":  # weight and bias: an 8-16 byte spill at 64 registers, measured 0.78 vs 0.50
        return
    use = ck.resource_usage()
    assert use["STACK"] == 0 and use["LOCAL"] == 0


@pytest.mark.parametrize(
    "kind, shape, per_sm",
    [
        # CTAs per SM for 48 KB of rows in flight (the H100, the default target), at a
        # register cap of >= 48 where ptxas does not spill, else >= 64
        ("softmax", (32768, 4096), 3),  # 2 rows x 8 KB per 256-thread CTA
        ("layer_norm", (10000, 5000), 4),  # 10 KB: 5 wanted, 5 spill at 48 registers: 4 keep 64
        ("softmax", (10000, 5000), 5),  # 10 KB: 5 fit 48 registers
        ("rms_norm", (8192, 16384), 2),  # 32 KB, 512 threads
        ("softmax", (4096, 32768), 1),  # 64 KB, 1024 threads
        ("rms_norm", (131072, 512), 5),  # 8 rows x 1 KB per 256-thread CTA: 6 wanted, 5 at 48 registers
        ("softmax", (64, 4096), 0),  # 32 CTAs: the grid does not fill the SMs, no cap
    ],
)
def test_register_staging_ctas_per_sm(kind, shape, per_sm):
    fd = norm_fusion(kind, D.BFloat16)
    ck = fd.compile(norm_inputs(kind, *shape, torch.bfloat16, "cpu"), arch="sm_90a")
    p = fd.last_params()
    assert p.staging == "registers" and p.row_length == shape[1]
    assert p.grid == -(-shape[0] // p.rows)  # one row block per CTA
    assert p.blocks_per_sm == per_sm
    bounds = (
        f"__launch_bounds__({p.threads * p.rows}, {per_sm})"
        if per_sm
        else f"__launch_bounds__({p.threads * p.rows})"
    )
    assert bounds in ck.cuda
    # no TMA, no barriers: 16-byte loads straight from global memory
    sass = ck.sass()
    assert "LDG.E.128" in sass and "UTMALDG" not in sass and "SYNCS" not in sass
    assert "cb::tma_load" not in ck.cuda and "mbar" not in ck.cuda.split("end of prelude")[-1]
    use = ck.resource_usage()
    if per_sm:
        assert use["REG"] * p.threads * p.rows * per_sm <= 65536


@pytest.mark.parametrize(
    "overrides, staging",
    [
        ({}, "registers"),
        ({"staging": "tma"}, "tma"),
        ({"stages": 3}, "tma"),  # names of the TMA ring ask for it
        ({"warp_specialized": True}, "tma"),
        ({"war": "mbarrier"}, "tma"),
        ({"rows_in_registers": False}, "tma"),
        ({"war": "block_sync", "warp_specialized": False}, "registers"),  # the ring's defaults ask nothing
    ],
)
def test_staging_choice(overrides, staging):
    """Rows held in registers are loaded straight into them unless a TMA ring is asked for."""
    fd = norm_fusion("rms_norm", D.BFloat16)
    if overrides:
        fd.fusion.schedule(**overrides)
    fd.compile(norm_inputs("rms_norm", 1024, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    assert fd.last_params().staging == staging


@pytest.mark.parametrize(
    "overrides, cols, match",
    [
        ({"staging": "registers", "stages": 3}, 4096, r"staging='registers'\): stages describe the TMA ring"),
        (
            {"staging": "registers"},
            65536,
            r"a row of 65536 is not held in registers \(64 elements per thread\)",
        ),
        ({"staging": "registers", "rows_in_registers": False}, 4096, "not held in registers"),
        ({"staging": "smem"}, 4096, r"staging='smem'\): must be 'registers' or 'tma'"),
        (
            {"staging": "registers", "blocks_per_sm": 9},
            4096,
            r"blocks_per_sm=9\): 256 threads per CTA allow 1 to 8",
        ),
        (
            {"staging": "registers", "tma": False},
            4096,
            r"staging='registers'\): tma=False asks for the plain",
        ),
        (
            {"staging": "tma"},
            131072,
            r"staging='tma'\): 3 x 262144 bytes of row buffers exceed shared memory",
        ),
        ({"rows": 16, "threads": 128}, 4096, r"rows=16, threads=128\): 2048 threads per CTA exceed 1024"),
    ],
)
def test_staging_errors(overrides, cols, match):
    fd = norm_fusion("softmax", D.BFloat16)
    with pytest.raises(cb.CircbufError, match=match):  # at the schedule() call where the inputs do not matter
        fd.fusion.schedule(**overrides)
        fd.compile(norm_inputs("softmax", 64, cols, torch.bfloat16, "cpu"), arch="sm_90a")


def test_rows_16_byte_loads_cannot_follow():
    """A row stride 16-byte loads cannot follow (a column slice one element in): the
    plain kernel by default; a staging asked for says why."""
    x = torch.randn(64, 4104, dtype=torch.bfloat16)[:, 1:4097]
    fd = norm_fusion("softmax", D.BFloat16)
    fd.compile([x], arch="sm_90a")
    assert type(fd.last_params()).__name__ == "ReductionParams"
    for staging in ("registers", "tma"):
        fd = norm_fusion("softmax", D.BFloat16)
        fd.fusion.schedule(staging=staging)
        with pytest.raises(
            cb.CircbufError, match=rf"staging='{staging}'\): input 0: global address not 16-byte"
        ):
            fd.compile([x], arch="sm_90a")
    # rows of 12 bf16 (24 bytes) in a wider tensor: a tensor map could step over them, vectors not
    y = torch.randn(64, 16, dtype=torch.bfloat16)[:, :12]
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(staging="registers")
    with pytest.raises(cb.CircbufError, match=r"a row of 12 x 2 bytes is not a multiple of 16 bytes"):
        fd.compile([y], arch="sm_90a")


# The issue-10 shapes whose default kernels may spill, and how much: layer_norm rows of
# 16384 and 32768 held in registers under the 64-register cap (2 CTAs of 512 threads,
# 1 of 1024) spill 8-16 bytes and still run at 0.94-0.97 of copy (H100), against
# 0.77 at one CTA of 512 threads without the cap and 0.78 through the TMA ring.
ACCEPTED_SPILL = {("layer_norm", 16384), ("layer_norm", 32768)}


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
def test_issue_shapes_compile_without_spills(kind):
    from benchmarks.normalization import SHAPES
    from tests.test_compile import sass_ops

    for rows, cols in SHAPES:
        fd = norm_fusion(kind, D.BFloat16)
        ck = fd.compile(norm_inputs(kind, rows, cols, torch.bfloat16, "cpu"), arch="sm_90a")
        use = ck.resource_usage()
        assert use["LOCAL"] == 0, (rows, cols, use)
        if (kind, cols) in ACCEPTED_SPILL:
            assert use["STACK"] <= 16, (rows, cols, use)
            assert use["STACK"] > 0, f"{kind} {cols}: the spill is gone, take it out of ACCEPTED_SPILL"
        else:
            assert use["STACK"] == 0 and not [o for o in sass_ops(ck) if " STL" in o], (rows, cols, use)


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape", [(5, 40), (3, 1000), (9, 8), (7, 512), (33, 20)])
def test_register_staging_on_the_interpreter(kind, shape):
    """Rows loaded straight into registers: partial last chunks (40 and 1000 columns are
    not multiples of threads x 4), row blocks past the last row (7 rows, 8 per CTA);
    NaN in the output means an element was not written."""
    torch.manual_seed(0)
    fd = norm_fusion(kind, D.Float)
    fd.fusion.schedule(staging="registers")
    ins = norm_inputs(kind, *shape, torch.float32, "cpu")
    (out,) = interpret(fd, ins)
    assert fd.last_params().staging == "registers"
    ref = norm_reference(kind, ins)
    assert not out.isnan().any()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_fp32_rows_of_32768_spill_a_bounded_amount():
    """fp32 rows of 32768 held by 1024 threads are 32 registers of row each: under the
    64-register cap softmax and layer_norm spill (48 and 80 bytes, NVRTC 13.5) and run at
    0.85 / 0.66 of copy on H100 (0.97x / 0.69x a static torch.compile), still ahead of the
    TMA ring (0.43-0.45 of copy); rms_norm does not spill."""
    for kind, most in (("softmax", 64), ("layer_norm", 96), ("rms_norm", 0)):
        fd = norm_fusion(kind, D.Float)
        ck = fd.compile(norm_inputs(kind, 64, 32768, torch.float32, "cpu"), arch="sm_90a")
        use = ck.resource_usage()
        assert fd.last_params().staging == "registers" and fd.last_params().threads == 1024
        assert use["LOCAL"] == 0 and use["STACK"] <= most, (kind, use)


@pytest.mark.parametrize(
    "kind, shape, target, per_sm",
    [
        ("softmax", (10000, 5000), "H200", 5),  # 67 KB wanted: 7 CTAs of 10 KB, 5 at 48 registers
        ("layer_norm", (10000, 5000), "H200", 4),  # 5 spill at 48 registers
        ("layer_norm", (16384, 6144), "H200", 5),  # 12 KB: 6 wanted, 5 fit
        ("layer_norm", (16384, 6144), "H100", 4),  # 48 KB: 4 wanted
    ],
)
def test_more_ctas_per_sm_only_where_ptxas_does_not_spill(kind, shape, target, per_sm):
    """The scheduler asks for up to 5 CTAs of 256 threads (48 registers) where its
    target wants more rows in flight; a kernel ptxas spilled there is compiled again
    with one CTA fewer (``if_spilled``): the kernel kept has no stack frame."""
    from circbuf.runtime.cubin import frame_bytes

    fd = norm_fusion(kind, D.BFloat16)
    ck = fd.compile(norm_inputs(kind, *shape, torch.bfloat16, "cpu"), arch="sm_90a", target=target)
    p = fd.last_params()
    assert p.staging == "registers" and p.blocks_per_sm == per_sm
    assert f"__launch_bounds__({p.threads * p.rows}, {per_sm})" in ck.cuda
    assert frame_bytes(ck.cubin) == 0


def test_asked_blocks_per_sm_is_kept_when_it_spills():
    """blocks_per_sm=5 asked for layer_norm at 5000 columns: compiled as asked
    (48 registers, with a stack frame), not changed behind the user's back."""
    from circbuf.runtime.cubin import frame_bytes

    fd = norm_fusion("layer_norm", D.BFloat16)
    fd.fusion.schedule(blocks_per_sm=5)
    ck = fd.compile(norm_inputs("layer_norm", 10000, 5000, torch.bfloat16, "cpu"), arch="sm_90a")
    assert fd.last_params().blocks_per_sm == 5 and "__launch_bounds__(256, 5)" in ck.cuda
    assert frame_bytes(ck.cubin) > 0


def test_asked_blocks_per_sm_is_not_answered_by_the_heuristic_fallback():
    """The heuristic's 5 CTAs spilled and fell back to 4; the same params asked by an
    override are kept as asked, on the same fusion (its memo) and a fresh one."""
    for fresh in (False, True):
        fd = norm_fusion("layer_norm", D.BFloat16)
        ins = norm_inputs("layer_norm", 10000, 5000, torch.bfloat16, "cpu")
        fd.compile(ins, arch="sm_90a", target="H200")
        assert fd.last_params().blocks_per_sm == 4
        if fresh:
            fd = norm_fusion("layer_norm", D.BFloat16)
        fd.fusion.schedule(blocks_per_sm=5)
        ck = fd.compile(ins, arch="sm_90a", target="H200")
        assert fd.last_params().blocks_per_sm == 5 and "__launch_bounds__(256, 5)" in ck.cuda


@pytest.mark.parametrize("kind", ["softmax", "layer_norm"])
def test_a_grid_between_four_and_five_sms_of_row_blocks_keeps_four(kind):
    """600 row blocks fill 4 CTAs on 132 SMs, not 5: the cap of 4 (64 registers), not none."""
    fd = norm_fusion(kind, D.BFloat16)
    ck = fd.compile(norm_inputs(kind, 600, 5000, torch.bfloat16, "cpu"), arch="sm_90a")
    assert fd.last_params().blocks_per_sm == 4 and "__launch_bounds__(256, 4)" in ck.cuda
