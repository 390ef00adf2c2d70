"""Runtime: NVRTC compile, caches, module load and launch on torch tensors.
It launches what the compile driver (:mod:`circbuf.compiler`) gives it."""

from .executor import CompiledKernel, Plan
from .nvrtc import compile_cuda

__all__ = ["CompiledKernel", "Plan", "compile_cuda"]
