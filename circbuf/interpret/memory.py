"""Global memory of an interpreted launch: the kernel's tensors as Python
lists (one per storage, so an output written in place into an input is one
list), written back into the torch tensors at the end; per-output store
counts (each element written exactly once).
"""

from __future__ import annotations

import torch

from ..ir import CircbufError

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class GlobalMemory:
    """``params``: name -> torch tensor (CPU). ``count``: names of outputs
    whose stores are counted."""

    def __init__(self, params: dict, count=()):
        self.params = params
        self._store: dict = {}  # storage key -> (list, base tensor)
        self.view: dict = {}  # name -> (list, offset, span)
        self.counts: dict = {}
        self.dirty: set = set()
        for name, t in params.items():
            if t.device.type != "cpu":
                raise CircbufError(f"{name}: the interpreter runs on CPU tensors, this one is on {t.device}")
            span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
            key = (t.untyped_storage().data_ptr(), t.dtype)
            n = t.untyped_storage().nbytes() // t.element_size()
            if key not in self._store:
                flat = torch.as_strided(t, (n,), (1,), 0)
                vals = flat.tolist() if t.dtype != torch.bool else [bool(v) for v in flat.tolist()]
                self._store[key] = (vals, flat)
            self.view[name] = (self._store[key][0], t.storage_offset(), span, key)
            if name in count:
                self.counts[name] = [0] * span

    def data(self, name):
        vals, off, span, key = self.view[name]
        return vals, off, span

    def mark(self, name):
        self.dirty.add(self.view[name][3])

    def write_back(self):
        for key in self.dirty:
            vals, flat = self._store[key]
            dt = flat.dtype
            src = torch.tensor(vals, dtype=torch.float64 if dt in _FLOAT else None)
            flat.copy_(src.to(dt))
