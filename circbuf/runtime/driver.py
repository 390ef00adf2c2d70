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


def device_index(device) -> int:
    """A CUDA torch.device's index (``cuda`` alone: the current device's)."""
    import torch

    return device.index if device.index is not None else torch.cuda.current_device()


def device_arch() -> str:
    """``sm_90a`` on compute capability 9.0 (wgmma/setmaxnreg need the a), else sm_XY."""
    import torch

    from ..target import arch_of

    return arch_of(*torch.cuda.get_device_capability())


class LoadedKernel:
    """A cubin loaded into the current context, and its entry function."""

    def __init__(self, cubin: bytes, name: str):
        init()
        drv = _drv()
        self.module = check(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.function = check(drv.cuModuleGetFunction(self.module, name.encode()), "cuModuleGetFunction")
        self._fn = int(self.function)
        self._smem_limit = 0  # static + dynamic above 48 KB needs the attribute: always set it

    def ensure_smem(self, nbytes: int):
        """Raise the kernel's dynamic shared memory limit to ``nbytes`` if needed."""
        if nbytes > self._smem_limit:
            drv = _drv()
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(drv.cuFuncSetAttribute(self.function, attr, nbytes), "cuFuncSetAttribute")
            self._smem_limit = nbytes

    def launcher(self, grid, block, smem: int):
        """A launch function for fixed geometry: ``launch(stream, params_addr)``.

        The per-call path is one ``cuLaunchKernelEx`` through ctypes with four
        pointer arguments; the CUlaunchConfig is built once here (the
        cuda-bindings wrapper and an 11-argument ``cuLaunchKernel`` both cost
        several microseconds of argument conversion per call).
        """
        import ctypes

        from .. import knobs

        cfg = _LaunchConfig(*grid, *block, smem, None, None, 0)
        if knobs.pdl():
            # programmatic dependent launch: scheduled while the previous kernel of the
            # stream finishes (the kernel's first statement waits for it, cb::grid_dependency)
            attr = _launch_attribute(_PROGRAMMATIC_STREAM_SERIALIZATION, 1)
            cfg.attrs, cfg.numAttrs = ctypes.addressof(attr), 1
            cfg._attr = attr  # (kept alive with the config)
        cfg_addr = ctypes.addressof(cfg)
        fn, launch_ex = self._fn, _raw_launch_ex()

        def launch(stream: int, params_addr: int):
            if cfg.hStream != stream:
                cfg.hStream = stream
            err = launch_ex(cfg_addr, fn, params_addr, None)
            if err:
                check(_drv().CUresult(err), "cuLaunchKernelEx")

        launch.config = cfg  # keeps the struct alive with the closure
        return launch


def blocks_per_sm(kernel: LoadedKernel, threads: int, smem: int = 0) -> int:
    """How many CTAs of ``threads`` threads (``smem`` dynamic bytes) of
    ``kernel`` one SM holds at once (the driver's occupancy calculator)."""
    drv = _drv()
    n = check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel.function, threads, smem), "cuOccupancy")
    return max(1, int(n))


def _ctypes_config():
    import ctypes

    class LaunchConfig(ctypes.Structure):
        _fields_ = [
            ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
            ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
            ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
            ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint),
        ]  # fmt: skip

    return LaunchConfig


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


def _launch_attribute(attr_id: int, value: int):
    """One ``CUlaunchAttribute`` (an id, 4 bytes of padding, a 64-byte value
    union) holding an int value."""
    import ctypes

    class LaunchAttribute(ctypes.Structure):
        _fields_ = [
            ("id", ctypes.c_int),
            ("pad", ctypes.c_char * 4),
            ("value", ctypes.c_int),
            ("rest", ctypes.c_char * 60),
        ]

    return LaunchAttribute(id=attr_id, value=value)


class _LazyConfig:
    cls = None

    def __call__(self, *args):
        if self.cls is None:
            self.cls = _ctypes_config()
        return self.cls(*args)


_LaunchConfig = _LazyConfig()
_RAW = None


def _raw_launch_ex():
    """``cuLaunchKernelEx`` from libcuda through ctypes, typed once."""
    global _RAW
    if _RAW is None:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernelEx
        fn.argtypes = [ctypes.c_void_p] * 4
        fn.restype = ctypes.c_int
        _RAW = fn
    return _RAW
