"""Runtime: NVRTC compile, caches, module load and launch on torch tensors."""

from .executor import CompiledKernel, FusionExecutor
from .nvrtc import compile_cuda

__all__ = ["CompiledKernel", "FusionExecutor", "compile_cuda"]
