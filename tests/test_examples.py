"""The examples and the README's first snippet run as tests: on a CPU machine
they compile for sm_90a and print their kernels; with a GPU they also run and
check against torch."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["quickstart.py", "circular_buffer.py", "matmul.py"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "kernel circbuf_" in r.stdout
    assert ("did not run" in r.stdout) or ("ran on" in r.stdout)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_in_the_interpreter(name):
    """``CIRCBUF_INTERPRET=1`` with no GPU: each example runs its kernels on
    the CPU in the kernel interpreter (smaller sizes) and checks them against
    torch (its exit status)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU the examples run there (test_example_runs)")
    env = dict(
        os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CIRCBUF_INTERPRET="1"
    )
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "ran on the CPU (CIRCBUF_INTERPRET=1: the kernel interpreter)" in r.stdout, r.stdout[-500:]


def readme_snippet() -> str:
    """The first ```python block of README.md."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("```python\n") + len("```python\n")
    return text[start : text.index("```", start)]


def test_readme_first_snippet_runs():
    code = readme_snippet()
    assert "fd.execute(" in code and "fd.compile(" in code  # the snippet shows both
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "%kernel_math {" in r.stdout and 'extern "C" __global__' in r.stdout
    # the execute part runs where there is a GPU, and is skipped cleanly where there is none
    import torch

    # (the GPU machine's pipes have been seen to turn a space into a NUL)
    ran = re.search(r"matches torch:[\s\x00]True", r.stdout) is not None
    assert ran == torch.cuda.is_available(), r.stdout[-500:]


BENCHMARKS = ["pointwise.py", "normalization.py", "outer_reduction.py", "host_overhead.py"]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_without_a_gpu_says_so(name):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", name)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last == f"{name}: needs a CUDA GPU (torch.cuda.is_available() is False); nothing was timed"
