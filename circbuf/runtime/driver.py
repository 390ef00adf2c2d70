"""CUDA driver calls: module load, function lookup, launch on torch's stream.

Every driver error is raised with the call's name; kernels are launched on
``torch.cuda.current_stream()`` so they order with torch ops and graphs.
"""

from __future__ import annotations

_initialized = False


def _drv():
    from cuda.bindings import driver

    return driver


def check(res, what: str):
    drv = _drv()
    err = res[0] if isinstance(res, tuple) else res
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        raise RuntimeError(f"{what} failed: {err.name} ({msg.decode() if msg else ''})")
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


def init():
    global _initialized
    if not _initialized:
        import torch

        torch.cuda.init()  # torch's primary context becomes current
        check(_drv().cuInit(0), "cuInit")
        _initialized = True


def device_arch() -> str:
    """``sm_90a`` on compute capability 9.0 (wgmma/setmaxnreg need the a), else sm_XY."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


class LoadedKernel:
    """A cubin loaded into the current context, and its entry function."""

    def __init__(self, cubin: bytes, name: str, smem_bytes: int):
        init()
        drv = _drv()
        self.module = check(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.function = check(drv.cuModuleGetFunction(self.module, name.encode()), "cuModuleGetFunction")
        if smem_bytes > 48 * 1024:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(drv.cuFuncSetAttribute(self.function, attr, smem_bytes), "cuFuncSetAttribute")
        self._fn = int(self.function)
        self._launch = _raw_launch()

    def launch(self, grid, block, smem: int, stream: int, params_addr: int):
        # The per-call path: one C call through ctypes (the cuda-bindings
        # wrapper costs several microseconds of argument conversion).
        err = self._launch(
            self._fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, params_addr, None
        )
        if err:
            check(_drv().CUresult(err), "cuLaunchKernel")


_RAW = None


def _raw_launch():
    """``cuLaunchKernel`` from libcuda through ctypes, typed once."""
    global _RAW
    if _RAW is None:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernel
        u = ctypes.c_uint
        fn.argtypes = [
            ctypes.c_void_p,
            u,
            u,
            u,
            u,
            u,
            u,
            u,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        fn.restype = ctypes.c_int
        _RAW = fn
    return _RAW
