"""The randomized differential test (tests/fuzz.py, issue 16) as pytest entry points.

A fixed slice of cases runs in CI (cpu-compile: NVRTC, no GPU; and a few
through the kernel-IR interpreter). Bugs the fuzzer found and that are not
fixed yet are listed in KNOWN, each with its reproducer: the run fails on any
bug outside that list, and each known one has its own xfail test that starts
passing (XPASS) when it is fixed, so the list is pruned as fixes land.
"""

import re

import pytest

from tests import fuzz

# (outcome, signature pattern, reproducer "seed:index", profile, mode): open bugs
K = ("full", "cpu-compile")
KNOWN = [
    (
        "bug:refusal",
        r"segmenter\.py:segment: no scheduler can take this fusion \(nor .* as a kernel of its own",
        "0:12",
        *K,
    ),
    ("bug:nvrtc", r"cb::(Min|Max)Op::operator\(\)", "0:24", *K),
    ("bug:nvrtc", r"cb::block_reduce_x", "0:29", "interp", "cpu-compile"),
    ("bug:internal", r"matmul\.py:_tile: 'N' is not in list", "0:6", *K),
    (
        "bug:lowering-check",
        r"allocation\.py:allocation_strides: .* would need a buffer over axis",
        "0:110",
        *K,
    ),
    (
        "bug:lowering-check",
        r"loop_nest\.py:generate_loop_nest: .* is bound to blockIdx\.x with extent",
        "0:222",
        *K,
    ),
    ("bug:lowering-check", r"circular_buffer\.py:_place_consumer_ring: .*readers' loop", "0:147", *K),
]


def _known(res):
    return any(res.outcome == o and re.search(p, res.signature) for o, p, *_ in KNOWN)


def _new_bugs(results):
    return [
        r for r in results if (r.outcome.startswith("bug") or r.outcome == "fuzz-error") and not _known(r)
    ]


def _report(new):
    return "\n\n".join(f"{r.outcome}: {r.signature}\n{r.detail}\n{r.case.source()}" for r in new[:3])


def test_cases_are_reproducible():
    a, b = fuzz.make_case(3, 7), fuzz.make_case(3, 7)
    assert a.source() == b.source()
    assert all(x.equal(y) for x, y in zip(a.input_tensors(), b.input_tensors()))
    assert fuzz.make_case(3, 8).source() != a.source()


def test_reference_catches_a_wrong_result():
    """The judge is not vacuous: a perturbed output is a mismatch, an unwritten one NaN."""
    case = next(c for c in (fuzz.make_case(0, i) for i in range(50)) if _float_output(c))
    n = case.outputs[0][0]
    v = case.vals[n]
    out = v.ref.to(fuzz.TORCH[v.dtype])
    assert fuzz.compare(out, v, fuzz._tolerance(case)) is None
    # one element off by its own size plus one: beyond any tolerance the judge uses
    bad = out.clone().flatten()
    bad[0] += 1 + bad[0].abs()
    assert "beyond tol" in fuzz.compare(bad.view(out.shape), v, fuzz._tolerance(case))
    assert "NaN" in fuzz.compare(out * float("nan"), v, fuzz._tolerance(case))


def _float_output(c):
    n = c.outputs[0][0]
    v = c.vals[n]
    return c.outputs[0][1] is None and v.dtype in fuzz.FLOATS and v.ref.numel() > 0


def test_cpu_compile_no_new_bugs():
    """120 cases (about 15 s here, bounded at 50 s): no internal error, no
    lowering check, no NVRTC error, no undocumented refusal beyond KNOWN."""
    results = fuzz.run(120, seed=0, mode="cpu-compile", budget=50)
    assert len(results) >= 30
    assert sum(r.outcome == "ok" for r in results) >= len(results) // 2, fuzz.summary(results, 0)
    new = _new_bugs(results)
    assert not new, _report(new)


def test_interp_no_new_bugs():
    """Numerics through the kernel-IR interpreter on small cases."""
    results = fuzz.run(25, seed=1, mode="interp", budget=25)
    assert sum(r.outcome == "ok" for r in results) >= len(results) // 3, fuzz.summary(results, 0)
    new = _new_bugs(results)
    assert not new, _report(new)


@pytest.mark.parametrize("outcome,pattern,repro,profile,mode", KNOWN, ids=[k[2] + "-" + k[0] for k in KNOWN])
def test_known_bug(outcome, pattern, repro, profile, mode):
    seed, index = (int(x) for x in repro.split(":"))
    (res,) = fuzz.run(seed=seed, indices=[index], mode=mode, profile=profile)
    if res.outcome == outcome and re.search(pattern, res.signature):
        pytest.xfail(f"open: {res.signature}")
    assert res.outcome in ("ok", "refused"), f"{res.outcome}: {res.signature}\n{res.detail}"


@pytest.mark.gpu
def test_cuda_no_new_bugs():
    """200 cases executed on the GPU against float64 torch, outputs NaN-poisoned."""
    results = fuzz.run(200, seed=0, mode="cuda")
    print(fuzz.summary(results, 3))
    new = _new_bugs(results)
    assert not new, _report(new)
