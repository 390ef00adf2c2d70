"""Pointwise fusions with operands broadcast against the output (a bias
``[1, N]``, a row scale ``[M, 1]``, an outer product) run as rows and
columns (``scheduler/pointwise.py``: ``inner_threads``), not flattened with a
division and remainder per element. Each case runs on the interpreter (every
output element stored once, NaN-poisoned) and on the GPU against float64
torch; hypothesis varies the extents (1, primes), offsets and strides.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circbuf as cb
from circbuf.interpret import interpret
from tests.util import D, check_outputs, seeded, to_double

DEV = "cuda"


def _fusion(defs, body, dtype=D.BFloat16):
    with cb.FusionDefinition() as fd:
        xs = [fd.define_tensor(list(d), dtype=dtype) for d in defs]
        fd.add_output(fd.ops.cast(body(fd.ops, *xs), dtype))
    return fd


# (name, definitions (-1: any extent, 1: a broadcast), body, torch's)
CASES = {
    "x + bias[1, N]": ([(-1, -1), (1, -1)], lambda o, x, b: o.add(x, b), lambda x, b: x + b),
    "x * s[M, 1]": ([(-1, -1), (-1, 1)], lambda o, x, s: o.mul(x, s), lambda x, s: x * s),
    "a[M, 1] * b[1, N]": ([(-1, 1), (1, -1)], lambda o, a, b: o.mul(a, b), lambda a, b: a * b),
    "x * s[M, 1] + bias[1, N]": (
        [(-1, -1), (-1, 1), (1, -1)],
        lambda o, x, s, b: o.add(o.mul(x, s), b),
        lambda x, s, b: x * s + b,
    ),
    "[B, M, N] + [1, 1, N]": ([(-1, -1, -1), (1, 1, -1)], lambda o, x, b: o.add(x, b), lambda x, b: x + b),
    "[B, M, N] * [B, 1, N]": ([(-1, -1, -1), (-1, 1, -1)], lambda o, x, b: o.mul(x, b), lambda x, b: x * b),
    "[B, M, N] * [1, M, 1]": ([(-1, -1, -1), (1, -1, 1)], lambda o, x, b: o.mul(x, b), lambda x, b: x * b),
    "gelu(x + bias[1, N])": (
        [(-1, -1), (1, -1)],
        lambda o, x, b: o.gelu(o.add(x, b)),
        lambda x, b: torch.nn.functional.gelu(x + b),
    ),
}


def _inputs(defs, shape, g, device="cpu", offset=0, transposed=False):
    out = []
    for k, d in enumerate(defs):
        size = [1 if a == 1 else s for a, s in zip(d, shape)]
        n = 1
        for s in size:
            n *= s
        flat = torch.randn(n + offset, generator=g).bfloat16()
        t = flat[offset:].view(size) if offset else flat.view(size)
        if transposed and k == 0 and len(size) >= 2:  # x as the transpose of its transpose: strided
            t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        out.append(t.to(device))
    return out


def _run(name, shape, device="cpu", offset=0, transposed=False):
    defs, body, ref = CASES[name]
    fd = _fusion(defs, body)
    xs = _inputs(defs, shape, seeded(sum(shape) + len(name)), device, offset, transposed)
    outs = interpret(fd, xs) if device == "cpu" else fd.execute(xs)
    check_outputs(outs, [ref(*[to_double(x).cpu() for x in xs])], written=True)
    p = fd.last_params()
    # rows and columns wherever a row holds 8 vectors (every case has a broadcast operand)
    assert (p.inner_threads > 0) == (-(-shape[-1] // p.vectorize) >= 8), p
    return fd


@pytest.mark.parametrize("name", sorted(CASES))
def test_rows_and_columns(name):
    shape = (3, 37, 264) if "B" in name else (37, 264)
    fd = _run(name, shape)
    assert fd.last_params().inner_threads > 0, fd.last_params()


def test_same_shape_operands_stay_flattened():
    """No operand broadcast: the flattened schedule (at the copy bandwidth)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.add(x, y), D.BFloat16))
    xs = [torch.randn(37, 264).bfloat16()] * 2
    interpret(fd, xs)
    assert fd.last_params().inner_threads == 0


def test_narrow_rows_stay_flattened():
    """Fewer than 8 vectors a row: most threads along it would idle."""
    fd = _run("x + bias[1, N]", (1000, 24))
    assert fd.last_params().inner_threads == 0


def test_bias_is_loaded_in_vectors():
    """The bias [1, N] is cached and read 16 bytes at a time, like x; the
    row scale [M, 1] is read once per row."""
    fd = _fusion(*CASES["x * s[M, 1] + bias[1, N]"][:2])
    fd.compile(_inputs(CASES["x * s[M, 1] + bias[1, N]"][0], (64, 1024), seeded(1)), arch="sm_90a")
    p = fd.last_params()
    assert p.vectorize_inputs == (True, False, True), p


def test_params_print_the_inner_threads():
    fd = _run("x + bias[1, N]", (37, 264))
    assert "inner_threads: 64" in str(fd.last_params())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(CASES)),
    m=st.sampled_from([1, 2, 7, 61, 128]),
    n=st.sampled_from([1, 8, 63, 64, 127, 264, 1031]),
    b=st.sampled_from([1, 3]),
    offset=st.sampled_from([0, 1]),
    transposed=st.booleans(),
    unroll=st.sampled_from([None, 2, 4]),
)
def test_shapes(name, m, n, b, offset, transposed, unroll):
    defs, body, ref = CASES[name]
    fd = _fusion(defs, body)
    if unroll:
        fd.fusion.schedule(unroll=unroll)
    shape = (b, m, n) if "B" in name else (m, n)
    xs = _inputs(defs, shape, seeded(m * n + b), offset=offset, transposed=transposed)
    check_outputs(interpret(fd, xs), [ref(*[to_double(x) for x in xs])], written=True)
    p = fd.last_params()
    assert (p.inner_threads > 0) == (-(-n // p.vectorize) >= 8), p


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("shape", [(4099, 1031), (8192, 4096), (5, 100003)])
def test_gpu_rows_and_columns(monkeypatch, name, shape):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    if "B" in name:
        shape = (3, shape[0] // 4 + 1, shape[1])
    _run(name, shape, DEV)


@pytest.mark.gpu
@pytest.mark.parametrize("offset,transposed", [(1, False), (0, True)])
def test_gpu_strided_and_offset(monkeypatch, offset, transposed):
    monkeypatch.setenv("CIRCBUF_POISON_OUTPUTS", "1")
    _run("x * s[M, 1] + bias[1, N]", (2049, 3001), DEV, offset, transposed)
