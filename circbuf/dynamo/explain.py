"""What the backend did: one record per aten graph it compiled (forward,
backward or inference), each listing its fusions (the aten ops in each, how
many kernels circbuf runs it as, or why it runs eagerly) and every aten op
left to eager torch with the reason. ``explain(fn, *inputs)`` compiles and
runs ``fn`` once and returns them.

>>> import torch, circbuf.dynamo as cd
>>> e = cd.explain(lambda x: torch.nn.functional.gelu(x) * 2, torch.randn(8, 16))  # doctest: +SKIP
>>> print(e)  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field

import torch


def op_name(node) -> str:
    t = node.target
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(t)
    return getattr(t, "__name__", str(t))


@dataclass
class FusionRecord:
    """One fusion: ``ops`` (its aten ops in order), ``status`` ("translated";
    then "compiled" in compile-only mode, "ran" once circbuf ran it, or
    "eager" with ``reason``), ``kernels`` (how many circbuf kernels run it, once
    known). ``fd`` is its FusionDefinition; ``eager`` the aten subgraph the
    backend falls back to; ``args`` (with ``options={"record_inputs": True}``)
    the first arguments it was called with."""

    name: str
    ops: list
    fd: object = field(repr=False, default=None)
    eager: object = field(repr=False, default=None)
    in_pos: list = field(repr=False, default_factory=list)
    out_map: list = field(repr=False, default_factory=list)
    status: str = "translated"
    reason: str | None = None
    kernels: int | None = None
    args: list | None = field(repr=False, default=None)

    def fd_inputs(self, args) -> list:
        """The FusionDefinition's inputs among the fused call's ``args``."""
        return [args[i] for i in self.in_pos]

    def fd_outputs(self, outs) -> list:
        """The FusionDefinition's outputs among the fused call's results ``outs``
        (as the eager subgraph returns them)."""
        got: dict = {}
        for (kind, k), o in zip(self.out_map, outs):
            if kind == "out":
                got.setdefault(k, o)
        return [got[k] for k in sorted(got)]

    def describe(self) -> str:
        if self.status == "eager":
            how = f"runs eagerly: {self.reason}"
        elif self.kernels is not None:
            how = f"{self.kernels} kernel{'s' if self.kernels != 1 else ''}"
            if self.status == "compiled":
                how += " (compiled for sm_90a, not run)"
        else:
            how = "translated, not compiled yet"
        counts = collections.Counter(o for o in self.ops)
        ops = ", ".join(f"{o} x{c}" if c > 1 else o for o, c in counts.items())
        return f"{self.name}: {len(self.ops)} aten ops -> {how}\n      {ops}"


@dataclass
class GraphRecord:
    """One aten graph the backend compiled: its ``fusions`` and the ops left to
    torch: ``fallbacks`` ((node, op, reason) for ops circbuf does not take) and
    ``views`` ((node, op) views at a fusion's boundary, which torch makes
    without a copy)."""

    kind: str
    compile_only: bool
    fusions: list = field(default_factory=list)
    fallbacks: list = field(default_factory=list)
    views: list = field(default_factory=list)
    cuda_graph: str | None = None  # mode="reduce-overhead": whether it was captured, or why not

    def __str__(self) -> str:
        mode = (
            " (compile-only: kernels compiled for sm_90a, the graph runs eagerly)"
            if self.compile_only
            else ""
        )
        lines = [f"{self.kind} graph{mode}: {len(self.fusions)} fusions, {len(self.fallbacks)} ops eager"]
        for f in self.fusions:
            lines.append("  " + f.describe())
        by_reason = collections.defaultdict(list)
        for name, op, why in self.fallbacks:
            by_reason[(op, why)].append(name)
        for (op, why), names in by_reason.items():
            lines.append(f"  eager {op}{f' x{len(names)}' if len(names) > 1 else ''}: {why}")
        if self.views:
            lines.append(f"  {len(self.views)} views left to torch at fusion boundaries (no copy)")
        if self.cuda_graph is not None:
            lines.append(f"  CUDA graph: {self.cuda_graph}")
        return "\n".join(lines)


_RECORDS: collections.deque = collections.deque(maxlen=256)
_CAPTURES: list = []


def record(g: GraphRecord) -> GraphRecord:
    _RECORDS.append(g)
    for c in _CAPTURES:
        c.append(g)
    return g


def records() -> list:
    """The GraphRecords of the graphs compiled most recently (up to 256)."""
    return list(_RECORDS)


@contextlib.contextmanager
def capture():
    """Collect the GraphRecords made inside the ``with`` block.

    >>> with capture() as graphs:
    ...     pass
    >>> graphs
    []
    """
    got: list = []
    _CAPTURES.append(got)
    try:
        yield got
    finally:
        _CAPTURES.remove(got)


@dataclass
class Explanation:
    """``graphs``: a GraphRecord per aten graph; ``print`` it for the summary."""

    graphs: list

    @property
    def fusions(self) -> list:
        return [f for g in self.graphs for f in g.fusions]

    @property
    def fallbacks(self) -> list:
        return [x for g in self.graphs for x in g.fallbacks]

    def __str__(self) -> str:
        n_k = sum(f.kernels or 0 for f in self.fusions)
        head = (
            f"circbuf: {len(self.graphs)} aten graphs, {len(self.fusions)} fusions ({n_k} kernels), "
            f"{len(self.fallbacks)} aten ops eager"
        )
        return "\n".join([head, *(str(g) for g in self.graphs)])

    __repr__ = __str__


def explain(fn, *inputs, backward=None, compile_only=None, dynamic=None, **kwargs) -> Explanation:
    """Compile ``fn`` with the circbuf backend, run it once on ``inputs`` (and
    ``kwargs``), and return how each aten graph was split. ``backward``: also
    run a backward pass of the outputs' sum (default: when an output requires
    grad), so the backward graph is compiled and shown. ``compile_only``
    (default: when an input is a CPU tensor): translate and compile each
    fusion for sm_90a but run the graph eagerly, as with
    ``CIRCBUF_DYNAMO_COMPILE_ONLY=1``.

    >>> # print(circbuf.dynamo.explain(model, x))
    """
    from .backend import backend

    if compile_only is None:
        compile_only = any(isinstance(x, torch.Tensor) and x.device.type != "cuda" for x in inputs)
    options = {"compile_only": bool(compile_only)}

    def circbuf_explain(gm, example_inputs):
        return backend(gm, example_inputs, options=options)

    compiled = torch.compile(fn, backend=circbuf_explain, dynamic=dynamic)
    with capture() as graphs:
        out = compiled(*inputs, **kwargs)
        outs = [o for o in _leaves(out) if isinstance(o, torch.Tensor)]
        if backward is None:
            backward = any(o.requires_grad for o in outs)
        if backward:
            loss = sum(o.float().sum() for o in outs if o.requires_grad)
            loss.backward()
    return Explanation(list(graphs))


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _leaves(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _leaves(y)
    else:
        yield x
