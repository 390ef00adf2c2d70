"""The disk cache of finished kernels: a warm start skips scheduling,
lowering, codegen and NVRTC.

The compile driver keys an entry by everything a kernel depends on
(``FusionExecutor._warm_key``: the fusion's structural fingerprint, the
inputs' signature, overrides, target, arch, knobs, circbuf's source and
NVRTC's release). An entry, ``<cache>/kernels/<key>.pkl``, holds the
kernel's name, scheduler params, CUDA source, :class:`LaunchInfo` and the
name of its cubin in the cubin cache (``<cache>/<hash>.cubin``, by source:
:mod:`circbuf.runtime.nvrtc`), so a cubin is stored once however many
entries share it. An entry whose cubin is gone, or that cannot be read,
is a miss. A fusion split into segments keeps, under its own key,
``<key>.seg``: the segmenter's verdicts on the groups of exprs it tried
(which schedulers take each), so a warm start splits it again without
asking the schedulers; each segment is then a fusion with entries of its
own. Entries are written atomically (a temporary file renamed).

The cache directory is trusted as the cubin cache is: entries are pickles.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile

from .. import knobs
from .executor import CompiledKernel

_VERSION = 1


@functools.cache
def source_hash() -> str:
    """A hash of circbuf's Python source (every module under the package):
    any change to the compiler makes every entry a miss."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for d, subdirs, files in os.walk(root):
        subdirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                h.update(os.path.relpath(p, root).encode())
                with open(p, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def _path(key: str, suffix: str = "pkl") -> str | None:
    cdir = knobs.cache_dir()
    return os.path.join(cdir, "kernels", f"{key}.{suffix}") if cdir else None


def has_verdicts(key: str) -> bool:
    """A segmentation was stored under ``key`` (the fusion is split for these inputs)."""
    path = _path(key, "seg")
    return path is not None and os.path.exists(path)


def load_verdicts(key: str) -> dict | None:
    """The segmenter's verdicts stored under ``key`` (group of expr positions,
    outputs) -> schedulers taking it; None when absent or unreadable."""
    path = _path(key, "seg")
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            e = pickle.load(f)
        return e["verdicts"] if e.get("version") == _VERSION else None
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, KeyError, TypeError):
        return None


def store_verdicts(key: str, verdicts: dict) -> None:
    _write(_path(key, "seg"), {"version": _VERSION, "verdicts": verdicts})


def _write(path: str | None, entry: dict) -> None:
    """Pickle ``entry`` to ``path`` atomically (nothing when it does not pickle)."""
    if path is None:
        return
    try:
        data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return  # params or launch data that do not pickle: not cached
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def load(key: str, arch: str, rebuild, fusion_ir) -> CompiledKernel | None:
    """The kernel stored under ``key``, or None. ``rebuild()`` compiles it
    afresh, for its kernel IR and transforms when they are asked for;
    ``fusion_ir()`` prints the fusion."""
    path = _path(key)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            e = pickle.load(f)
        if e.get("version") != _VERSION:
            return None
        with open(os.path.join(os.path.dirname(os.path.dirname(path)), e["cubin"]), "rb") as f:
            cubin = f.read()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, KeyError, TypeError):
        return None  # absent, half-written by a crashed writer, or its cubin gone: a miss
    ck = CompiledKernel(
        e["name"],
        arch,
        e["params"],
        fusion_ir(),
        None,
        None,
        e["cuda"],
        cubin,
        launch=e["launch"],
        rebuild=rebuild,
    )
    ck.memo_key = e.get("memo_key")
    return ck


def store(key: str, ck: CompiledKernel) -> None:
    """Keep ``ck`` under ``key`` when its cubin is in the cubin cache (it is
    not when NVRTC's result did not come from ``compile_cuda``)."""
    from .nvrtc import cubin_path

    path = _path(key)
    cubin = cubin_path(ck.cuda, ck.arch)
    if path is None or cubin is None or not os.path.exists(cubin):
        return
    with open(cubin, "rb") as f:
        if f.read() != ck.cubin:  # not this kernel's cubin: keep nothing
            return
    e = {
        "version": _VERSION,
        "name": ck.name,
        "params": ck.params,
        "cuda": ck.cuda,
        "launch": ck.launch,
        "cubin": os.path.basename(cubin),
        "memo_key": ck.memo_key,
    }
    _write(path, e)


__all__ = ["has_verdicts", "load", "load_verdicts", "source_hash", "store", "store_verdicts"]
