"""``mode="reduce-overhead"``: each compiled aten graph replayed as one CUDA graph.

A model step under the backend is many small launches (circbuf's fusions and
the eager aten ops between them); replaying them as one CUDA graph leaves one
launch of host work per graph. The wrapper, per aten graph::

    call 1   run the graph as compiled: kernels compile, plans are made
             (host work a capture cannot hold)
    call 2   copy the inputs into static buffers, capture the graph on them
             (torch.cuda.graph: its own memory pool), replay it
    call 3+  copy each input into its static buffer (a parameter is captured
             in place instead: its updates are the graph's), replay, return
             clones of the outputs

Outputs are cloned because the next replay writes the same pool (an input
returned as is, or a view of one, is the caller's tensor or that view of it;
the same tensor returned twice is one clone). A graph that
cannot be captured (CPU tensors in it, a host sync, an op a capture refuses,
an expanded input, an output that is a view of another output, a parameter
that moved) runs uncaptured from then on, the reason on its
record (``explain``).

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

    def __init__(self, fn, rec):
        # on the instance: a wrapper torch puts around the callable (functools.wraps copies
        # __dict__) must still say it takes a boxed list, or AOTAutograd calls it with *args
        self._boxed_call = True
        self.fn, self.rec = fn, rec  # rec: the GraphRecord (its cuda_graph says what happened)
        self.calls = 0
        self.graph = None  # None: not tried yet; False: runs uncaptured
        self.static_in = None  # per input: the tensor captured on (a copy, or the parameter itself)
        self.copied = None  # per input: whether it is copied in on every call
        self.static_out = None
        self.recipes = None  # per output: how a replay hands it back (_plan_outputs)
        self.signature = None
        self.device = None
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
        if any(n > 1 and st == 0 for t in tensors for n, st in zip(t.shape, t.stride())):
            return "an expanded input (stride 0): its static copy would not be one"
        return None

    def _run(self, args):
        return self.fn(list(args))

    def _give_up(self, why, args):
        self.graph = False
        self.rec.cuda_graph = f"not captured: {why}"
        return self._run(args)

    def __call__(self, *args):
        # boxed (one list), as AOTAutograd calls a callable with _boxed_call; or the
        # arguments one by one, as a wrapper that lost the attribute would
        args = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        self.calls += 1
        if self.graph is False or self.calls == 1:
            return self._run(args)
        if self.graph is None:
            why = self._why_not(args)
            if why is None:
                why = self._capture(args)
            if why is not None:
                return self._give_up(why, args)
        elif self._sig(args) != self.signature:  # another shape or layout: not what was captured
            return self._give_up("the inputs' shapes or strides changed after the capture", args)
        elif any(not c and a is not s for a, s, c in zip(args, self.static_in, self.copied)):
            return self._give_up("a parameter captured in place was replaced by another tensor", args)
        with torch.cuda.device(self.device):
            self._copy_in(args)
            self.graph.replay()
            return self._outputs(args)

    def _plan_outputs(self) -> str | None:
        """How each output is handed back after a replay (``self.recipes``):
        an input returned as is, the caller's input itself; a view of an input,
        the same view of the caller's input; the same tensor twice, one clone;
        anything else from the graph's pool, a clone. A view of another output
        is not captured (its clone would not be a view)."""
        recipes, first = [], {}
        for o in self.static_out:
            if not isinstance(o, torch.Tensor):
                recipes.append(("value", o))
                continue
            k = next((k for k, s in enumerate(self.static_in) if s is o), None)
            if k is not None:
                recipes.append(("arg", k))
                continue
            ptr = o.untyped_storage().data_ptr()
            k = next(
                (k for k, s in enumerate(self.static_in)
                 if isinstance(s, torch.Tensor) and s.numel() and s.untyped_storage().data_ptr() == ptr),
                None,
            )  # fmt: skip
            if k is not None:  # a view of input k: the same view of the caller's tensor
                rel = o.storage_offset() - self.static_in[k].storage_offset()
                recipes.append(("view", k, tuple(o.shape), o.stride(), rel))
                continue
            j = next((j for j, p in enumerate(self.static_out[: len(recipes)]) if p is o), None)
            if j is not None:
                recipes.append(("same", j))
                continue
            if o.numel() and ptr in first:
                return "an output is a view of another output"
            first[ptr] = len(recipes)
            recipes.append(("clone", o))
        self.recipes = recipes
        return None

    def _outputs(self, args) -> list:
        out = []
        for r in self.recipes:
            kind = r[0]
            if kind == "value":
                out.append(r[1])
            elif kind == "arg":
                out.append(args[r[1]])
            elif kind == "view":
                a = args[r[1]]
                out.append(a.as_strided(r[2], r[3], a.storage_offset() + r[4]))
            elif kind == "same":
                out.append(out[r[1]])
            else:
                out.append(r[1].clone())
        return out

    def _copy_in(self, args):
        # every input but the parameters, on every call: a new tensor may sit at a freed
        # one's address with the same version counter, so neither tells that it changed
        for a, s, c in zip(args, self.static_in, self.copied):
            if c:
                s.copy_(a)

    def _capture(self, args) -> str | None:
        self.device = next(a.device for a in args if isinstance(a, torch.Tensor))
        try:
            with torch.cuda.device(self.device):
                return self._capture_on_device(args)
        except Exception as e:  # noqa: BLE001 - the graph runs uncaptured; the reason is recorded
            torch.cuda.synchronize()
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    def _capture_on_device(self, args) -> str | None:
        self.signature = self._sig(args)
        # a parameter is captured in place (its in-place updates are what the graph reads);
        # every other tensor input gets a static buffer of its own layout
        self.copied = [isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter) for a in args]
        self.static_in = [
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device) if c else a
            for a, c in zip(args, self.copied)
        ]  # fmt: skip
        self._copy_in(args)
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on the capture's stream (torch's advice)
            self._run(self.static_in)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            self.static_out = list(self._run(self.static_in))
        why = self._plan_outputs()
        if why is not None:
            return why
        self.graph = g
        self.rec.cuda_graph = "captured (replayed from the second call)"
        return None


__all__ = ["GraphedCallable"]
