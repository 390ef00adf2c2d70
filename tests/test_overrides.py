"""schedule() overrides (issue 16): one table per scheduler validates every name at the
schedule() call (type, range) and at compile (rules that depend on the inputs); an
override the chosen kernel does not use raises; the README lists the tables."""

from __future__ import annotations

import re

import pytest
import torch

import circbuf as cb
from circbuf.scheduler.overrides import TABLES, readme_tables
from circbuf.scheduler.registry import SCHEDULERS
from tests.test_gpu_matmul import mm_fusion
from tests.util import D, axpy_fusion, norm_fusion, norm_inputs, outer_fusion

VALID = {  # a value every scheduler taking the name allows
    "vectorize": 4, "unroll": 2, "threads": 256,
    "stages": 3, "prefetch": 1, "tma": True, "war": "mbarrier", "warp_specialized": True, "tile_rows": 32,
    "tma_store": True, "cols": 64, "staging": "tma", "rows": 2, "blocks_per_sm": 2, "rows_in_registers": False,
    "persistent": True, "pingpong": False, "tile": (128, 128, 64), "cluster": (1, 1), "raster": "M", "group": 4,
    "registers": (40, 232), "epilogue_tile": (64, 64), "epilogue": "inline", "fill": "tma", "split_k": 2, "split_k_sum": "kernel", "realign": False,
    "store": "tma", "thread_tile": 8, "k_step": 4, "ffma_smem": True,
}  # fmt: skip

README = open(__file__.replace("tests/test_overrides.py", "README.md")).read()


def fusion_for(sched: str):
    """A FusionDefinition whose candidate schedulers include ``sched``."""
    if sched in ("pointwise", "pointwise_tma"):
        return axpy_fusion(D.BFloat16, 2)
    if sched == "normalization":
        return norm_fusion("layer_norm", D.BFloat16)
    if sched in ("outer_reduction", "reduction"):  # the reduction scheduler is the last candidate
        return outer_fusion("sum")
    return mm_fusion("matmul")


def inputs_for(sched: str):
    if sched in ("pointwise", "pointwise_tma"):
        return [torch.randn(256, 1024, dtype=torch.bfloat16)] * 2
    if sched == "normalization":
        return norm_inputs("layer_norm", 256, 4096, torch.bfloat16, "cpu")
    if sched in ("outer_reduction", "reduction"):
        return [torch.randn(4096, 1024, dtype=torch.bfloat16)]
    return [torch.randn(1024, 512, dtype=torch.bfloat16), torch.randn(512, 1024, dtype=torch.bfloat16)]


def bad_values(o):
    """(label, value) pairs the rule of override ``o`` refuses: wrong type, None, zero,
    a bool where an int is expected, out of range."""
    out = [("none", None), ("zero", 0)]
    out.append(("type", 5 if o.type == "str" else "x"))
    if o.type != "bool":
        out.append(("bool", True))
    if o.type == "int":
        m = re.search(r"\[(\d+), (\d+)\]", o.allowed)
        out.append(("low", -1))
        if m:
            out.append(("high", int(m.group(2)) + 1))
    elif o.type.startswith("("):
        n = o.type.count("int")
        out.append(("short", (64,) * (n - 1)))
        out.append(("low", (0,) * n))
        out.append(("bool_item", (True,) * n))
    elif o.type == "str":
        out.append(("value", "bogus"))
    return out


CASES = [
    pytest.param(s, o, label, v, id=f"{s}-{o.name}-{label}")
    for s, table in TABLES.items()
    for o in table.values()
    for label, v in bad_values(o)
]


@pytest.mark.parametrize("sched, o, label, value", CASES)
def test_bad_value_raises_at_the_schedule_call(sched, o, label, value):
    fd = fusion_for(sched)
    with pytest.raises(cb.CircbufError, match=rf"^schedule\({o.name}={re.escape(repr(value))}\): must be "):
        fd.fusion.schedule(**{o.name: value})
    assert fd.fusion.schedule_overrides == {}  # nothing recorded


@pytest.mark.parametrize("sched", list(TABLES))
def test_bad_value_raises_at_compile_without_the_call_check(sched):
    # a Fusion not built by a FusionDefinition: checked at compile, in the same words
    o = next(iter(TABLES[sched].values()))
    fd = fusion_for(sched)
    fd.fusion.check_overrides = None
    fd.fusion.schedule(**{o.name: None})
    with pytest.raises(
        cb.CircbufError, match=rf"^schedule\({o.name}=None\): must be {re.escape(o.allowed)}$"
    ):
        fd.compile(inputs_for(sched), arch="sm_90a")


def test_tables_are_the_registry_names_and_the_readme():
    assert {s.name: tuple(a) for s, a in SCHEDULERS} == {s: tuple(t) for s, t in TABLES.items()}
    # the README's tables are generated from these: regenerate with python -m circbuf.scheduler.overrides
    block = README.split("<!-- overrides:begin")[1].split("\n", 1)[1].split("<!-- overrides:end -->")[0]
    assert block == readme_tables()
    listed = {}
    for part in block.split("\n`")[0:]:
        head, _, rows = part.partition(":\n")
        listed[head.strip("`")] = re.findall(r"^\| `(\w+)` \|", rows, re.M)
    assert listed == {s: list(t) for s, t in TABLES.items()}


def _readme_call(start: str) -> dict:
    """The keyword arguments of the README's ``fd.fusion.schedule(<start>...)`` example."""
    m = re.search(r"fd\.fusion\.schedule\((" + re.escape(start) + r"[^)]*)\)", README)
    assert m, start
    return eval(f"dict({m.group(1)})")  # the README's text, as written


def test_readme_normalization_example_runs_as_written():
    ov = _readme_call('staging="tma"')
    assert set(ov) == set(TABLES["normalization"]) - {"tma"}
    fd = norm_fusion("layer_norm", D.BFloat16)
    fd.fusion.schedule(**ov)
    ck = fd.compile(norm_inputs("layer_norm", 4096, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    p = ck.params
    assert type(p).__name__ == "NormalizationParams"
    for k, v in ov.items():
        if k == "rows_in_registers":
            assert p.row_length == 0  # rows re-read from shared memory, not copied to registers
        else:
            assert getattr(p, k) == v, k
    assert "cp.async.bulk" in ck.cuda or "tma_load" in ck.cuda


@pytest.mark.parametrize(
    "start, sched, fields",
    [
        ("vectorize=4", "pointwise", None),
        ("stages=3)", "pointwise_tma", None),
        ("cols=64", "outer_reduction", None),
    ],
)
def test_readme_examples_run_as_written(start, sched, fields):
    ov = _readme_call(start.rstrip(")"))
    fd = fusion_for(sched)
    fd.fusion.schedule(**ov)
    ck = fd.compile(inputs_for(sched), arch="sm_90a")
    for k, v in ov.items():
        assert getattr(ck.params, k) == v, k


# valid values compile and the params show them
VALID_SETS = [
    ("pointwise", dict(vectorize=4, unroll=2, threads=256)),
    ("pointwise", dict(vectorize=8, unroll=16, threads=32)),
    ("pointwise_tma", dict(stages=4, prefetch=2, war="mbarrier", tile_rows=32, tma_store=True)),
    ("pointwise_tma", dict(stages=2, prefetch=1, warp_specialized=True, tma=True)),
    ("pointwise_tma", dict(tile_rows=32)),  # a TMA-ring name asks for the ring
    (
        "normalization",
        dict(staging="registers", rows=2, threads=128, blocks_per_sm=2, rows_in_registers=True),
    ),
    ("normalization", dict(prefetch=1)),  # asks for the ring
    ("normalization", dict(staging="tma", stages=2, war="block_sync", warp_specialized=False, threads=96)),
    ("reduction", dict(tma=False, threads=256)),
    ("outer_reduction", dict(cols=64, stages=3, prefetch=1, war="mbarrier")),
    ("outer_reduction", dict(cols=32, stages=2, warp_specialized=True, tma=True)),
    ("outer_reduction", dict(cols=48, warp_specialized=True)),  # 20 rows of 48 threads + the producer row
    (
        "matmul",
        dict(
            persistent=True,
            stages=4,
            prefetch=2,
            pingpong=False,
            tile=(128, 128, 64),
            cluster=(1, 1),
            raster="N",
            group=4,
            registers=(40, 232),
            epilogue_tile=(64, 64),
        ),
    ),  # fmt: skip
    ("matmul", dict(persistent=False, tile=(128, 256, 64), stages=3)),
    ("matmul", dict(epilogue="role", tile=(128, 128, 64), stages=3, raster="N")),
    ("matmul", dict(cluster=(2, 2), pingpong=True)),
]


@pytest.mark.parametrize("sched, ov", VALID_SETS)
def test_valid_values_compile_and_show_in_params(sched, ov):
    fd = fusion_for(sched)
    fd.fusion.schedule(**ov)
    ck = fd.compile(inputs_for(sched), arch="sm_90a")
    p = ck.params
    for k, v in ov.items():
        if k == "tma":
            assert type(p).__name__ == ("ReductionParams" if v is False else p.__class__.__name__)
        elif k == "rows_in_registers":
            assert (p.row_length > 0) == v
        else:
            assert getattr(p, k) == v, (k, getattr(p, k))
    if sched == "pointwise_tma":
        assert type(p).__name__ == "PointwiseTmaParams"


@pytest.mark.parametrize(
    "sched, ov, match",
    [
        # the plain pointwise kernel (threads) has no ring (stages)
        (
            "pointwise",
            dict(stages=3, threads=256),
            r"schedule\(stages=3\): the kernel chosen, pointwise \(plain\)",
        ),
        (
            "pointwise_tma",
            dict(tma=False, tile_rows=32),
            r"tile_rows=32\): .*pointwise \(plain\), does not use",
        ),
        ("pointwise_tma", dict(tma=False, prefetch=2), r"prefetch=2\): .*used by pointwise_tma \(tma ring\)"),
        (
            "normalization",
            dict(warp_specialized=True, tma=False),
            r"warp_specialized=True\): the kernel chosen, reduction \(plain\), does not use warp_specialized; "
            r"warp_specialized=True is used by normalization \(tma\)",
        ),
        ("normalization", dict(rows=4, tma=False), r"rows=4\): the kernel chosen, reduction \(plain\)"),
        ("normalization", dict(tma=False, stages=3), r"stages=3\): the kernel chosen, reduction \(plain\)"),
        ("normalization", dict(staging="registers", war="mbarrier"), r"staging='registers'\): war describe"),
        ("outer_reduction", dict(cols=64, threads=256), r"cols=64\): the kernel chosen, reduction \(plain\)"),
        (
            "outer_reduction",
            dict(tma=False, warp_specialized=True),
            r"warp_specialized=True\): the kernel chosen",
        ),
        # input-dependent rules, named by argument
        (
            "normalization",
            dict(prefetch=3, stages=3),
            r"^schedule\(prefetch=3, stages=3\): prefetch must be less",
        ),
        ("normalization", dict(prefetch=4), r"^schedule\(prefetch=4\): prefetch must be less than stages"),
        (
            "pointwise_tma",
            dict(prefetch=5, stages=2),
            r"^schedule\(prefetch=5, stages=2\): prefetch must be less",
        ),
        (
            "outer_reduction",
            dict(prefetch=6, stages=3),
            r"^schedule\(prefetch=6, stages=3\): prefetch must be less",
        ),
        (
            "normalization",
            dict(warp_specialized=True, war="block_sync"),
            r"^schedule\(war='block_sync', warp_specialized=True\): a warp-specialized ring frees",
        ),
        (
            "normalization",
            dict(rows=4, threads=512),
            r"^schedule\(rows=4, threads=512\): 2048 threads per CTA",
        ),
        (
            "pointwise_tma",
            dict(tile_rows=7),
            r"^schedule\(tile_rows=7\): tile_rows must be a multiple of the",
        ),
        ("outer_reduction", dict(cols=4), r"^schedule\(cols=4\): cols x 2 bytes must be a multiple of 16"),
        (
            "pointwise",
            dict(vectorize=16),
            r"^schedule\(vectorize=16\): vectorize x 2-byte items must be <= 16",
        ),
        (
            "matmul",
            dict(cluster=(3, 1)),
            r"^schedule\(cluster=\(3, 1\)\): the cluster must divide the tile grid \(\d+ x \d+ tiles",
        ),
    ],
)
def test_unused_or_inconsistent_overrides_are_named(sched, ov, match):
    fd = fusion_for(sched)
    fd.fusion.schedule(**ov)
    with pytest.raises(cb.CircbufError, match=match) as e:
        fd.compile(inputs_for(sched), arch="sm_90a")
    assert not re.search(r"\bT\d+\b|\{i\d+\}|circular_buffer\(", str(e.value))  # no internal names


def test_matmul_simt_path_takes_no_overrides():
    fd = mm_fusion("matmul", D.Float)
    fd.fusion.schedule(stages=3)
    with pytest.raises(cb.CircbufError, match=r"schedule\(stages\): this matmul runs on the SIMT path"):
        fd.compile([torch.randn(64, 96), torch.randn(96, 128)], arch="sm_90a")
