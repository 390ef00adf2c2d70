"""Issue 17: one Target. The table of GPU limits, a target read from a device's
properties, the compile-only default (an H100), limits reaching the schedulers and
lowering, the normalization rule derived from bandwidth, and no hardware literal
written outside circbuf/target.py."""

from __future__ import annotations

import dataclasses
import io
import math
import pathlib
import re
import tokenize
from types import SimpleNamespace

import pytest
import torch

import circbuf as cb
from circbuf import target as tg
from circbuf.scheduler import InputInfo
from circbuf.scheduler.normalization import H100_ROW_BYTES_IN_FLIGHT, MIN_REGISTER_CAP, row_bytes_in_flight
from tests.util import D, manual_ws_exp, norm_fusion, norm_inputs


def _props(**kw):
    """A stand-in for torch.cuda.get_device_properties() of an H100 SXM."""
    p = dict(
        name="NVIDIA H100 80GB HBM3",
        major=9,
        minor=0,
        multi_processor_count=132,
        shared_memory_per_block_optin=232448,
        shared_memory_per_multiprocessor=233472,
        regs_per_multiprocessor=65536,
        max_threads_per_block=1024,
        max_threads_per_multi_processor=2048,
        L2_cache_size=52428800,
        memory_clock_rate=2619000,  # kHz
        memory_bus_width=5120,
    )
    p.update(kw)
    return SimpleNamespace(**p)


def test_table_of_known_targets():
    h100, h200 = tg.H100, tg.H200
    for t in (h100, h200):
        assert (t.arch, t.sm_count, t.smem_per_block, t.smem_per_sm) == (
            "sm_90a",
            132,
            227 * 1024,
            228 * 1024,
        )
        assert (t.registers_per_sm, t.registers_per_thread) == (65536, 255)
        assert (t.max_threads_per_block, t.max_threads_per_sm) == (1024, 2048)
    assert (h100.l2_bytes, h200.l2_bytes) == (50 * 2**20, 60 * 2**20)
    assert (h100.peak_bandwidth, h100.copy_bandwidth) == (3.35e12, 3.0e12)
    assert (h200.peak_bandwidth, h200.copy_bandwidth) == (4.8e12, 4.2e12)
    assert tg.DEFAULT is h100
    assert tg.resolve("H200") is h200 and tg.resolve("h100") is h100 and tg.resolve(h200) is h200
    text = str(h200)
    assert text.startswith("Target H200 (sm_90a): 132 SMs")
    assert (
        "232448 bytes per block (opt-in)" in text and "4.20 TB/s measured copy" in text and "L2 60 MB" in text
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        h100.sm_count = 114


@pytest.mark.parametrize("bad", ["A100", 132, {"sm_count": 132}])
def test_unknown_target_is_named(bad):
    with pytest.raises(cb.CircbufError, match=r"target=.*expected a circbuf.Target .*H100 SXM, H200"):
        tg.resolve(bad)


def test_from_props_of_a_known_gpu_is_its_table_entry():
    t = tg.Target.from_props(_props())
    assert t == dataclasses.replace(tg.H100, name="NVIDIA H100 80GB HBM3")
    # what an H200 reports (read on one, issue 17)
    h200 = tg.Target.from_props(
        _props(name="NVIDIA H200", L2_cache_size=62914560, memory_clock_rate=3201000, memory_bus_width=6016)
    )
    assert h200 == dataclasses.replace(tg.H200, name="NVIDIA H200")


def test_from_props_of_an_unknown_gpu_reads_its_limits():
    # an H100 PCIe: 114 SMs, HBM2e at 1593 MHz on a 5120-bit bus
    t = tg.Target.from_props(
        _props(
            name="NVIDIA H100 PCIe",
            multi_processor_count=114,
            memory_clock_rate=1593000,
            L2_cache_size=50 << 20,
        )
    )
    assert (t.name, t.arch, t.sm_count) == ("NVIDIA H100 PCIe", "sm_90a", 114)
    peak = 1593e6 * 2 * 5120 / 8
    assert t.peak_bandwidth == pytest.approx(peak) and t.copy_bandwidth == pytest.approx(
        peak * tg.COPY_FRACTION
    )
    # a property this torch lacks keeps the default's value; the arch follows the capability
    old = tg.Target.from_props(SimpleNamespace(name="NVIDIA A100-SXM4-80GB", major=8, minor=0))
    assert old.arch == "sm_80" and old.sm_count == tg.DEFAULT.sm_count


def test_from_device_reads_props_once_per_device(monkeypatch):
    calls = []

    def fake(index):
        calls.append(index)
        return _props(name="NVIDIA H200") if index == 1 else _props()

    monkeypatch.setattr(torch.cuda, "get_device_properties", fake)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    tg._from_index.cache_clear()
    try:
        assert tg.Target.from_device().copy_bandwidth == tg.H100.copy_bandwidth
        assert tg.Target.from_device(torch.device("cuda", 1)).name == "NVIDIA H200"
        assert tg.Target.from_device(0) is tg.Target.from_device(torch.device("cuda", 0))
        assert calls == [0, 1]
    finally:
        tg._from_index.cache_clear()


def _norm(kind, rows, cols, target=None, arch="sm_90a"):
    fd = norm_fusion(kind, D.BFloat16)
    ck = fd.compile(norm_inputs(kind, rows, cols, torch.bfloat16, "cpu"), arch=arch, target=target)
    return ck


def test_compile_only_default_is_the_h100():
    assert InputInfo((), {}).target is tg.DEFAULT is tg.H100
    a = _norm("layer_norm", 4096, 4096)
    b = _norm("layer_norm", 4096, 4096, target="H100")
    assert a.params == b.params and a.cuda == b.cuda
    c = _norm("layer_norm", 4096, 4096, target=tg.H100, arch=None)  # the target names its arch
    assert c.arch == "sm_90a" and c.cuda == a.cuda
    if not torch.cuda.is_available():
        from circbuf.compiler import _default_target

        assert _default_target() is tg.H100


def test_rows_in_flight_follow_bandwidth_by_littles_law():
    # the H100's measured 48 KB exactly; the H200 in proportion to its measured copy bandwidth
    assert row_bytes_in_flight(tg.H100) == H100_ROW_BYTES_IN_FLIGHT == 48 * 1024
    assert row_bytes_in_flight(tg.H200) == round(48 * 1024 * 4.2 / 3.0)
    half = dataclasses.replace(tg.H100, sm_count=66)  # half the SMs: each draws twice the bandwidth
    assert row_bytes_in_flight(half) == 2 * 48 * 1024


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
def test_h200_keeps_more_rows_in_flight(kind):
    # rows of 4096 in CTAs of 2 rows: 16 KB (x the inputs read per row) of rows per CTA
    h100, h200 = _norm(kind, 4096, 4096), _norm(kind, 4096, 4096, target=tg.H200)
    p, q = h100.params, h200.params
    cta = p.threads * p.rows
    cta_bytes = p.rows * 4096 * 2
    cap = min(2048 // cta, 65536 // (MIN_REGISTER_CAP * cta))
    assert p.blocks_per_sm == min(math.ceil(48 * 1024 / cta_bytes), cap) == 3
    assert q.blocks_per_sm == min(math.ceil(row_bytes_in_flight(tg.H200) / cta_bytes), cap) == 4
    assert dataclasses.replace(q, blocks_per_sm=3) == p  # nothing else differs
    assert f"__launch_bounds__({cta}, 3)" in h100.cuda and f"__launch_bounds__({cta}, 4)" in h200.cuda


def test_sm_count_and_shared_memory_reach_the_matmul_scheduler():
    with cb.FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.linear(a, w))
    x = [torch.empty(4096, 256, dtype=torch.bfloat16), torch.empty(4096, 256, dtype=torch.bfloat16)]
    p = fd.compile(x, arch="sm_90a").params
    assert (p.tile, p.stages, p.grid) == ((128, 256, 64), 4, 132)
    small = dataclasses.replace(tg.H100, name="small", sm_count=114, smem_per_block=180 * 1024)
    q = fd.compile(x, arch="sm_90a", target=small).params
    # 4 x 48 KB stages beside 32 KB of output staging no longer fit in 180 KB; 114 persistent CTAs
    assert (q.stages, q.grid) == (3, 114)


def test_sm_count_reaches_the_normalization_ring_grid():
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.schedule(staging="tma")
    x = norm_inputs("softmax", 8192, 4096, torch.bfloat16, "cpu")
    p = fd.compile(x, arch="sm_90a").params
    q = fd.compile(x, arch="sm_90a", target=dataclasses.replace(tg.H100, sm_count=100)).params
    per_sm = p.grid // 132
    assert per_sm >= 1 and p.grid == 132 * per_sm and q.grid == 100 * per_sm


def test_lowering_checks_the_targets_thread_limit():
    fd = manual_ws_exp(128, 2)  # 2 rows of 128 consumers + a producer row: 384 threads
    x = [torch.empty(64, 512, dtype=torch.bfloat16)]
    assert "384" in fd.compile(x, arch="sm_90a").cuda
    narrow = dataclasses.replace(tg.H100, name="narrow", max_threads_per_block=256)
    with pytest.raises(cb.CircbufError, match="384 threads with the producer row exceed 256"):
        fd.compile(x, arch="sm_90a", target=narrow)


# hardware constants that used to be written where they were used (issue 17)
_STRAY = {"132", "232448", "233472", "65536", "65535"}
_STRAY_PRODUCTS = {("228", "1024"), ("227", "1024")}


def _stray_literals(path):
    """Number tokens of the old constants in ``path`` (comments and docstrings aside)."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)]
    found = []
    for k, t in enumerate(toks):
        if t.type != tokenize.NUMBER:
            continue
        if t.string in _STRAY:
            found.append(f"{path}:{t.start[0]}: {t.string}")
        elif (
            k + 2 < len(toks)
            and toks[k + 1].string == "*"
            and (t.string, toks[k + 2].string) in _STRAY_PRODUCTS
        ):
            found.append(f"{path}:{t.start[0]}: {t.string} * {toks[k + 2].string}")
    return found


def test_no_hardware_literal_outside_target():
    root = pathlib.Path(cb.__file__).parent
    files = [p for p in root.rglob("*.py") if p.name != "target.py"]
    assert len(files) > 30
    assert [f for p in files for f in _stray_literals(p)] == []
    # the check sees them where they are
    assert len(_stray_literals(root / "target.py")) >= 3


def test_stray_literal_check_catches_one(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("# 132 SMs in a comment is fine\nSMEM = 228 * 1024\ngrid = min(tiles, 132)\n")
    assert [re.sub(r".*:(\d+): ", r"\1 ", s) for s in _stray_literals(p)] == ["2 228 * 1024", "3 132"]


@pytest.mark.gpu
def test_from_device_matches_the_driver():
    """On a GPU: the limits torch reports are the driver's (what the runtime read before)."""
    from cuda.bindings import driver as drv

    from circbuf.runtime.driver import check, device_arch, init

    init()
    a = drv.CUdevice_attribute
    dev = check(drv.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")

    def attr(x):
        return check(drv.cuDeviceGetAttribute(x, dev), "cuDeviceGetAttribute")

    t = tg.Target.from_device()
    assert t.sm_count == attr(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    assert t.smem_per_block == attr(a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    assert t.registers_per_sm == attr(a.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
    assert t.l2_bytes == attr(a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
    assert t.arch == device_arch()
    name = torch.cuda.get_device_name()
    if "H100 80GB HBM3" in name or "H200" in name:  # a table entry: its measured bandwidth
        assert t.copy_bandwidth in (tg.H100.copy_bandwidth, tg.H200.copy_bandwidth)
