"""NVRTC through cuda-bindings, with a disk cache of cubins.

>>> # cubin = compile_cuda(src, "sm_90a")   # works on a machine with no GPU
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from .. import knobs


class CompileError(RuntimeError):
    """NVRTC rejected generated code: a circbuf bug, reported with the log."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - dependency is declared
        raise RuntimeError("circbuf needs cuda-bindings and nvidia-cuda-nvrtc (pip install)") from e
    return nvrtc


def nvrtc_version() -> tuple:
    err, major, minor = _nvrtc().nvrtcVersion()
    return (major, minor)


def _check(err, what):
    nv = _nvrtc()
    if err != nv.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC {what} failed: {err}")


def compile_options(arch: str) -> list[str]:
    return [f"--gpu-architecture={arch}", "-std=c++17", "-default-device"]


def compile_cuda(source: str, arch: str, name: str = "kernel.cu") -> bytes:
    """CUDA source -> cubin for ``arch`` (e.g. ``sm_90a``); cached on disk by a
    hash of source, options and NVRTC version."""
    opts = compile_options(arch)
    key = hashlib.sha256("\0".join([source, *opts, repr(nvrtc_version())]).encode()).hexdigest()[:32]
    cdir = knobs.cache_dir()
    path = os.path.join(cdir, f"{key}.cubin") if cdir else None
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    cubin = _compile(source, opts, name)
    if path:
        os.makedirs(cdir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cdir)
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)  # atomic: concurrent compiles never see half a file
    return cubin


def _compile(source: str, opts: list[str], name: str) -> bytes:
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
            raise CompileError(f"NVRTC failed:\n{log.decode(errors='replace')}\n{numbered}")
        _, n = nv.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        _check(nv.nvrtcGetCUBIN(prog, cubin)[0], "get cubin")
        return cubin
    finally:
        nv.nvrtcDestroyProgram(prog)
