"""Environment knobs, read in one place.

- ``CIRCBUF_DUMP=segments,fusion_ir,transforms,params,passes,kernel_ir,cuda,launch``:
  print those stages as they are produced (``all`` for every one); ``passes``
  prints the kernel IR after each lowering pass, headed ``after <pass>:``;
  ``segments`` the segments of a fusion no one scheduler takes whole.
- ``CIRCBUF_POISON_OUTPUTS=1``: fill outputs with NaN (all ones for integer
  types) before each launch, so elements a kernel fails to write show up.
- ``CIRCBUF_DEBUG_HANG=<tries>``: every mbarrier wait gives up after that many
  tries and traps; the runtime raises a CircbufError naming the barrier and
  stage instead of hanging.
- ``CIRCBUF_CACHE_DIR``: where compiled cubins are kept (default
  ``~/.cache/circbuf``); ``CIRCBUF_CACHE_DIR=`` (empty) turns the disk cache off.
- ``CIRCBUF_INTERPRET=1``: ``execute`` on CPU tensors runs the kernels in the
  kernel interpreter (``circbuf.interpret``) instead of refusing them.
- ``CIRCBUF_CHECK=<schedules>`` (1: 8 schedules): the pipeline protocol checker
  runs on each kernel first: in the interpreter before it runs the kernel, and
  before a GPU ``execute``'s first launch of an input signature on CPU copies
  of the inputs (``python -m circbuf.check script.py`` sets it).
- ``CIRCBUF_FAST_MATH=0``: keep CUDA's accurate exp, sigmoid, silu, gelu and
  tanh everywhere; by default fp32 values that reach the outputs only through
  a rounding to bf16/fp16 that hides the error use fast approximate variants
  (``circbuf/lowering/fast_math.py``).
- ``CIRCBUF_PDL=0``: launch kernels without programmatic dependent launch
  (by default each may be scheduled while the stream's previous kernel
  finishes; its first statement waits for it: ``cb::grid_dependency``).
- ``CIRCBUF_ROW_COPY=0``: realign a matmul operand with torch's ``copy_``
  instead of circbuf's 16-byte row copy (``circbuf/runtime/row_copy.py``).
- ``CIRCBUF_DYNAMO_COMPILE_ONLY=1``: the torch.compile backend
  (``circbuf.dynamo``) translates and compiles every fusion for sm_90a but
  runs the graph eagerly (works on CPU tensors).
"""

from __future__ import annotations

import os
import sys

DUMP_STAGES = ("segments", "fusion_ir", "transforms", "params", "passes", "kernel_ir", "cuda", "launch")


def dump_stages() -> set:
    raw = os.environ.get("CIRCBUF_DUMP", "")
    names = {s.strip() for s in raw.split(",") if s.strip()}
    if "all" in names:
        return set(DUMP_STAGES)
    unknown = names - set(DUMP_STAGES)
    if unknown:
        from .ir import CircbufError

        raise CircbufError(
            f"CIRCBUF_DUMP: unknown stage(s) {sorted(unknown)}; known: {', '.join(DUMP_STAGES)}, all"
        )
    return names


def dump(stage: str, text) -> None:
    """Print ``text`` under a header when ``stage`` is in CIRCBUF_DUMP."""
    if stage in dump_stages():
        print(f"===== CIRCBUF_DUMP {stage} =====\n{text}", file=sys.stdout, flush=True)


def cache_dir() -> str | None:
    d = os.environ.get("CIRCBUF_CACHE_DIR")
    if d is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "circbuf")
    return d or None


def poison_outputs() -> bool:
    return os.environ.get("CIRCBUF_POISON_OUTPUTS", "") not in ("", "0")


def debug_hang() -> int:
    raw = os.environ.get("CIRCBUF_DEBUG_HANG", "")
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        from .ir import CircbufError

        raise CircbufError(f"CIRCBUF_DEBUG_HANG={raw!r}: expected a number of tries") from None
    return max(n, 0)


def cp_async() -> bool:
    """``CIRCBUF_CP_ASYNC``: 1 lets the matmul heuristic fill the rings of operands
    TMA cannot describe with cp.async (the default, 0, copies them into aligned
    rows first and runs the TMA path: faster on an H100, NOTES issue 18)."""
    raw = os.environ.get("CIRCBUF_CP_ASYNC", "").strip()
    if raw not in ("", "0", "1"):
        from .ir import CircbufError

        raise CircbufError(f"CIRCBUF_CP_ASYNC={raw!r}: expected 0 (the default) or 1")
    return raw == "1"


def matmul_cluster() -> tuple:
    """``CIRCBUF_MATMUL_CLUSTER``: the thread-block cluster the matmul heuristic picks
    when ``schedule(cluster=...)`` does not ask, as ``CXxCY`` (``2x1``: two CTAs along M
    share B's tile by TMA multicast); default ``1x1`` until clusters are measured (NOTES,
    issue 21). A cluster the fusion's tile grid cannot take falls back to 1x1."""
    raw = os.environ.get("CIRCBUF_MATMUL_CLUSTER", "").strip().lower()
    if raw in ("", "1x1"):
        return (1, 1)
    parts = raw.split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        from .ir import CircbufError

        raise CircbufError(f"CIRCBUF_MATMUL_CLUSTER={raw!r}: expected CXxCY, e.g. 2x1 (the default is 1x1)")
    return (int(parts[0]), int(parts[1]))


def fast_math() -> bool:
    """``CIRCBUF_FAST_MATH``: 1 (the default, also when unset or empty) or 0."""
    raw = os.environ.get("CIRCBUF_FAST_MATH", "").strip()
    if raw not in ("", "0", "1"):
        from .ir import CircbufError

        raise CircbufError(f"CIRCBUF_FAST_MATH={raw!r}: expected 0 (accurate math only) or 1")
    return raw != "0"


def dynamo_compile_only() -> bool:
    """``CIRCBUF_DYNAMO_COMPILE_ONLY``: 0 (the default, also when unset or empty) or 1."""
    raw = os.environ.get("CIRCBUF_DYNAMO_COMPILE_ONLY", "").strip()
    if raw not in ("", "0", "1"):
        from .ir import CircbufError

        raise CircbufError(f"CIRCBUF_DYNAMO_COMPILE_ONLY={raw!r}: expected 0 or 1")
    return raw == "1"


def interpret() -> bool:
    """``CIRCBUF_INTERPRET``: run ``execute`` on CPU tensors in the interpreter."""
    return os.environ.get("CIRCBUF_INTERPRET", "") not in ("", "0")


def check_schedules() -> int:
    """``CIRCBUF_CHECK``: 0 (off, also when unset), 1 (8 schedules) or a number of schedules."""
    raw = os.environ.get("CIRCBUF_CHECK", "").strip()
    if raw in ("", "0"):
        return 0
    if not raw.isdigit():
        from .ir import CircbufError

        raise CircbufError(f"CIRCBUF_CHECK={raw!r}: expected 0, 1 or a number of schedules")
    return 8 if raw == "1" else int(raw)


def pdl() -> bool:
    """Launch with programmatic dependent launch (``CIRCBUF_PDL``, default on)."""
    return os.environ.get("CIRCBUF_PDL", "1") != "0"


def row_copy() -> bool:
    """Realign operands with circbuf's row copy (``CIRCBUF_ROW_COPY``, default on)."""
    return os.environ.get("CIRCBUF_ROW_COPY", "1") != "0"
