"""circbuf.runtime.cubin: a cubin's stack frames, read from the ELF file, against
cuobjdump's resource usage (CPU: NVRTC compiles real sm_90a cubins)."""

import pytest
import torch

from circbuf.runtime.cubin import frame_bytes
from circbuf.runtime.tools import find_tool
from tests.util import D, norm_fusion, norm_inputs


def _kernel(kind, shape, **overrides):
    fd = norm_fusion(kind, D.BFloat16)
    if overrides:
        fd.fusion.schedule(**overrides)
    return fd.compile(norm_inputs(kind, *shape, torch.bfloat16, "cpu"), arch="sm_90a")


@pytest.mark.parametrize(
    "kind, shape, overrides, spills",
    [
        ("softmax", (64, 4096), {}, False),
        ("layer_norm", (10000, 5000), {"blocks_per_sm": 5}, True),  # 48 registers: spilled
        ("layer_norm", (4096, 32768), {}, True),  # 1024 threads at 64 registers: 8-16 bytes
    ],
)
def test_frame_bytes_matches_cuobjdump(kind, shape, overrides, spills):
    ck = _kernel(kind, shape, **overrides)
    got = frame_bytes(ck.cubin)
    assert (got > 0) == spills, got
    if find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not installed: the reader's own answer was checked only")
    assert got == ck.resource_usage()["STACK"]


def test_frame_bytes_refuses_what_is_no_cubin():
    with pytest.raises(ValueError, match="not an ELF64 cubin"):
        frame_bytes(b"PTX text")
