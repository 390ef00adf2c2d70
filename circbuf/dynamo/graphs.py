"""``mode="reduce-overhead"``: each compiled aten graph replayed as one CUDA graph.

A model step under the backend is many small launches (circbuf's fusions and
the eager aten ops between them); replaying them as one CUDA graph leaves one
launch of host work per graph. The wrapper, per aten graph::

    call 1   run the graph as compiled: kernels compile, plans are made
             (host work a capture cannot hold)
    call 2   copy the inputs into static buffers, capture the graph on them
             (torch.cuda.graph: its own memory pool), replay it
    call 3+  copy each input whose storage or version moved since it was last
             copied (a parameter updated in place is copied again; one that
             did not move is not), replay, return clones of the outputs

Outputs are cloned because the next replay writes the same pool. A graph that
cannot be captured (CPU tensors in it, a host sync, an op a capture refuses)
runs uncaptured from then on, the reason on its record (``explain``).

circbuf's launches are capture-safe: they go to torch's current stream, take
their outputs and workspaces from torch's caching allocator, copy their
arguments at the launch, and skip the CIRCBUF_DEBUG_HANG synchronize while the
stream captures.

>>> # model = torch.compile(model, backend="circbuf", mode="reduce-overhead")
"""

from __future__ import annotations

import torch


class GraphedCallable:
    """A boxed callable (a list of arguments in, a list of outputs out) replayed
    as a CUDA graph from its second call (see the module doc)."""

    _boxed_call = True

    def __init__(self, fn, rec):
        self.fn, self.rec = fn, rec  # rec: the GraphRecord (its cuda_graph says what happened)
        self.calls = 0
        self.graph = None
        self.static_in = None  # our copies of the inputs, captured on
        self.seen = None  # per input: (data_ptr, version) last copied
        self.static_out = None
        self.signature = None
        rec.cuda_graph = "not yet captured (captured on the second call)"

    @staticmethod
    def _sig(args):
        return tuple(
            (tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("value", a)
            for a in args
        )

    def _why_not(self, args) -> str | None:
        if not torch.cuda.is_available():
            return "no CUDA device"
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(t.device.type != "cuda" for t in tensors):
            return "an input is not a CUDA tensor"
        if len({t.device for t in tensors}) > 1:
            return "inputs on several devices"
        return None

    def _run(self, args):
        return self.fn(list(args))

    def __call__(self, args):
        args = list(args)
        self.calls += 1
        if self.graph is False or self.calls == 1:
            return self._run(args)
        if self.graph is None:
            why = self._why_not(args)
            if why is None:
                why = self._capture(args)
            if why is not None:
                self.graph = False
                self.rec.cuda_graph = f"not captured: {why}"
                return self._run(args)
        elif self._sig(args) != self.signature:  # another shape or layout: not what was captured
            self.graph = False
            self.rec.cuda_graph = "not captured: the inputs' shapes or strides changed after the capture"
            return self._run(args)
        self._copy_in(args)
        self.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.static_out]

    def _copy_in(self, args):
        for k, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            key = (a.data_ptr(), a._version)
            if self.seen[k] != key:
                self.static_in[k].copy_(a)
                self.seen[k] = key

    def _capture(self, args) -> str | None:
        self.signature = self._sig(args)
        self.static_in = [
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device) if isinstance(a, torch.Tensor) else a
            for a in args
        ]  # fmt: skip
        self.seen = [None] * len(args)
        self._copy_in(args)
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):  # warm-up on the capture's stream (torch's advice)
                self._run(self.static_in)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(g):
                self.static_out = list(self._run(self.static_in))
        except Exception as e:  # noqa: BLE001 - the graph runs uncaptured; the reason is recorded
            torch.cuda.synchronize()
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.graph = g
        self.rec.cuda_graph = "captured (replayed from the second call)"
        return None


__all__ = ["GraphedCallable"]
