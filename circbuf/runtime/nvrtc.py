"""NVRTC through cuda-bindings, with a disk cache of cubins.

>>> # cubin = compile_cuda(src, "sm_90a")   # works on a machine with no GPU
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
import time

from .. import knobs
from ..ir import CircbufError


class CompileError(RuntimeError):
    """NVRTC rejected generated code: a circbuf bug, reported with the log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


_ARCH = re.compile(r"sm_(\d+)([af]?)")
# ptxas refusing an instruction the target lacks (the kernel, not circbuf, is at fault)
_TARGET_LACKS = re.compile(r"requires \.target|not supported on \.target")


def supported_archs() -> list[int]:
    """Compute capabilities this NVRTC builds cubins for (``[75, 80, ..., 90, 100, ...]``)."""
    err, archs = _nvrtc().nvrtcGetSupportedArchs()
    _check(err, "get supported archs")
    return list(archs)


def parse_arch(arch) -> tuple[int, str]:
    """``"sm_90a"`` -> ``(90, "a")``. A string NVRTC cannot build a cubin for
    raises a CircbufError naming it.

    >>> parse_arch("sm_90a"), parse_arch("sm_80")
    ((90, 'a'), (80, ''))
    >>> parse_arch("compute_90a")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    circbuf.ir.errors.CircbufError: arch='compute_90a': expected sm_XY or sm_XYa (a cubin target such as sm_90a); ...
    """
    m = _ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if m is None or not _accepts(arch):
        major, minor = nvrtc_version()
        archs = ", ".join(f"sm_{a}" for a in supported_archs())
        why = "expected sm_XY or sm_XYa (a cubin target such as sm_90a)" if m is None else "unknown to NVRTC"
        raise CircbufError(
            f"arch={arch!r}: {why}; NVRTC {major}.{minor} builds cubins for {archs}, "
            "with the suffix a for arch-specific features from sm_90 on (sm_90a)"
        )
    return int(m[1]), m[2]


@functools.cache
def _accepts(arch: str) -> bool:
    """NVRTC takes ``--gpu-architecture=arch`` (an empty kernel, once per arch
    and NVRTC release: a yes is remembered in the disk cache, so a warm start
    does not load NVRTC to ask again)."""
    cdir = knobs.cache_dir()
    mark = os.path.join(cdir, "archs", f"{nvrtc_identity()}-{arch}.ok") if cdir else None
    if mark and os.path.exists(mark):
        return True
    ok = _probe(arch)
    if ok and mark:
        os.makedirs(os.path.dirname(mark), exist_ok=True)
        with open(mark, "w"):
            pass
    return ok


def _probe(arch: str) -> bool:
    nv = _nvrtc()
    err, prog = nv.nvrtcCreateProgram(b'extern "C" __global__ void k() {}', b"probe.cu", 0, [], [])
    _check(err, "create")
    try:
        opt = [f"--gpu-architecture={arch}".encode()]
        return nv.nvrtcCompileProgram(prog, 1, opt)[0] == nv.nvrtcResult.NVRTC_SUCCESS
    finally:
        nv.nvrtcDestroyProgram(prog)


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - dependency is declared
        raise RuntimeError("circbuf needs cuda-bindings and nvidia-cuda-nvrtc (pip install)") from e
    return nvrtc


def nvrtc_version() -> tuple:
    err, major, minor = _nvrtc().nvrtcVersion()
    return (major, minor)


@functools.cache
def nvrtc_identity() -> str:
    """Which NVRTC compiles: its wheel's version (read from the package
    metadata, without loading the library), else the library's own version."""
    from importlib import metadata

    try:
        return "wheel-" + metadata.version("nvidia-cuda-nvrtc")
    except metadata.PackageNotFoundError:
        major, minor = nvrtc_version()
        return f"lib-{major}.{minor}"


def _check(err, what):
    nv = _nvrtc()
    if err != nv.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC {what} failed: {err}")


def compile_options(arch: str) -> list[str]:
    return [f"--gpu-architecture={arch}", "-std=c++17", "-default-device"]


def compile_cuda(source: str, arch: str, name: str = "kernel.cu") -> bytes:
    """CUDA source -> cubin for ``arch`` (e.g. ``sm_90a``); cached on disk by a
    hash of source, options and NVRTC version. An instruction ``arch`` lacks
    raises a CircbufError naming the arch and quoting ptxas."""
    opts = compile_options(arch)
    path = cubin_path(source, arch)
    cdir = knobs.cache_dir()
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    try:
        cubin = _compile(source, opts, name)
    except CompileError as e:
        lacks = [ln.strip() for ln in e.log.splitlines() if _TARGET_LACKS.search(ln)]
        if not lacks:
            raise
        what = name.removesuffix(".cu")
        raise CircbufError(f"arch={arch!r}: {what} uses what {arch} lacks: " + "; ".join(lacks[:4])) from e
    if path:
        os.makedirs(cdir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cdir)
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)  # atomic: concurrent compiles never see half a file
    return cubin


def cubin_path(source: str, arch: str) -> str | None:
    """Where the disk cache keeps ``source``'s cubin for ``arch`` (None: no disk cache)."""
    cdir = knobs.cache_dir()
    if not cdir:
        return None
    opts = compile_options(arch)
    key = hashlib.sha256("\0".join([source, *opts, repr(nvrtc_version())]).encode()).hexdigest()[:32]
    return os.path.join(cdir, f"{key}.cubin")


def compile_log(source: str, arch: str, name: str = "kernel.cu") -> str:
    """NVRTC's log (ptxas warnings and its ``-v`` resource lines) for ``source``,
    compiled afresh: e.g. ptxas's C7511/C7515 "wgmma ... serialized" warnings.

    >>> # assert "C7511" not in compile_log(ck.cuda, "sm_90a")
    """
    # NVRTC 13.0 as installed on the lent H100s remembers what ptxas made of a
    # PTX text and hands back an empty log when it sees that text again (a -D
    # define does not help: the PTX is the same). An empty kernel with a name
    # used once makes the PTX new, so ptxas really runs and reports.
    nonce = f"circbuf_compile_log_{os.getpid()}_{time.monotonic_ns()}"
    source = f'{source}\nextern "C" __global__ void {nonce}() {{}}\n'
    return _compile(source, compile_options(arch) + ["--ptxas-options=-v"], name, want_log=True)[1]


def _compile(source: str, opts: list[str], name: str, want_log: bool = False):
    nv = _nvrtc()
    err, prog = nv.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "create")
    try:
        bopts = [o.encode() for o in opts]
        (err,) = nv.nvrtcCompileProgram(prog, len(bopts), bopts)
        _, n = nv.nvrtcGetProgramLogSize(prog)
        log = b" " * n
        nv.nvrtcGetProgramLog(prog, log)
        if err != nv.nvrtcResult.NVRTC_SUCCESS:
            numbered = "\n".join(f"{k + 1:5d} {line}" for k, line in enumerate(source.splitlines()))
            text = log.decode(errors="replace")
            raise CompileError(f"NVRTC failed:\n{text}\n{numbered}", text)
        _, n = nv.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        _check(nv.nvrtcGetCUBIN(prog, cubin)[0], "get cubin")
        return (cubin, log.decode(errors="replace")) if want_log else cubin
    finally:
        nv.nvrtcDestroyProgram(prog)
