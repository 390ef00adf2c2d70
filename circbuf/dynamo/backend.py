"""circbuf as a ``torch.compile`` backend.

``torch.compile(model, backend="circbuf")`` (registered through the
``torch_dynamo_backends`` entry point) or ``backend=circbuf.dynamo.backend``:
AOTAutograd lowers each graph dynamo captures to aten (forward and backward
for training, one graph for inference), ``partition`` picks the subgraphs
circbuf takes, and each runs through its ``FusionDefinition`` (``fd.execute``)
while everything else runs as eager aten. A fusion that fails to compile or
run falls back to its aten subgraph, and the reason is recorded
(``circbuf.dynamo.explain``, ``circbuf.dynamo.records()``).

Options (``torch.compile(..., options={...})``):

- ``compile_only`` (or ``CIRCBUF_DYNAMO_COMPILE_ONLY=1``): translate every
  fusion and compile it for sm_90a (``fd.compile``) on its first call, but run
  the graph eagerly; works on CPU tensors, for checking what a model would run.
- ``strict``: raise instead of falling back when a fusion fails (for tests).
- ``record_inputs``: keep each fusion's first arguments on its record.

>>> # model = torch.compile(model, backend="circbuf")
"""

from __future__ import annotations

import operator

import torch

from .. import knobs
from ..ir import CircbufError
from .aten import TABLE
from .explain import FusionRecord, GraphRecord, op_name, record
from .partition import _VIEW_SET, partition

aten = torch.ops.aten

# aten ops AOTAutograd decomposes for circbuf: backward formulas and composites
# whose decompositions are made of ops the table translates
_DECOMPOSE = [
    "gelu_backward",
    "silu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "threshold_backward",
    "hardtanh_backward",
    "leaky_relu_backward",
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "native_layer_norm_backward",
    "_fused_rms_norm_backward",
    "native_dropout_backward",
    "native_group_norm",
    "native_group_norm_backward",
    "t",
    "transpose.int",
    "baddbmm",
    "addmv",
    "mse_loss",
    "mse_loss_backward",
    "elu",
    "elu_backward",
    "hardswish",
    "hardswish_backward",
    "hardsigmoid",
    "hardsigmoid_backward",
    "softplus",
    "softplus_backward",
    "glu",
    "glu_backward",
    "lerp.Scalar",
    "lerp.Tensor",
    "var.dim",
    "var.default",
    "var_mean.dim",
    "var_mean.default",
    "std.correction",
    "std_mean.correction",
]


def decompositions() -> dict:
    """The decomposition table the backend gives AOTAutograd."""
    from torch._decomp import decomposition_table

    ops = []
    for name in _DECOMPOSE:
        packet, _, overload = name.partition(".")
        p = getattr(aten, packet, None)
        if p is None:
            continue
        names = [overload] if overload else p.overloads()
        ops += [getattr(p, o) for o in names if hasattr(p, o)]
    return {op: decomposition_table[op] for op in ops if op in decomposition_table}


def _options(options) -> dict:
    options = dict(options or {})
    unknown = set(options) - {"compile_only", "strict", "record_inputs"}
    if unknown:
        raise CircbufError(
            f"circbuf backend: unknown option(s) {sorted(unknown)}; known: compile_only, strict, record_inputs"
        )
    if "compile_only" not in options:
        options["compile_only"] = knobs.dynamo_compile_only()
    return options


def backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None):
    """The torch.compile backend: ``torch.compile(fn, backend=circbuf.dynamo.backend)``.
    ``mode="reduce-overhead"`` replays each aten graph as a CUDA graph from its
    second call (:mod:`circbuf.dynamo.graphs`); other modes change nothing."""
    from torch._dynamo.backends.common import aot_autograd

    opts = _options(options)
    graphed = mode == "reduce-overhead" and not opts["compile_only"]

    def compiler(kind):
        def circbuf_aten_compiler(gm, example_inputs):
            return compile_aten_graph(gm, example_inputs, kind, opts, cuda_graph=graphed)

        return circbuf_aten_compiler

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions(),
    )(gm, example_inputs)


def compile_aten_graph(
    gm: torch.fx.GraphModule, example_inputs, kind="inference", options=None, cuda_graph=False
):
    """Partition one aten graph, put each fusion behind a ``CircbufFusion``
    module, and return the boxed callable AOTAutograd runs (with
    ``cuda_graph``, one that replays it as a CUDA graph: ``graphs.py``)."""
    from torch._functorch.aot_autograd import make_boxed_func

    opts = _options(options)
    part = partition(gm, opts["compile_only"])
    rec = GraphRecord(kind, bool(opts["compile_only"]))
    fused = {n for f in part.fusions for n in f.nodes}
    views = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in fused:
            continue
        if n.target is operator.getitem or not isinstance(n.meta.get("val"), (torch.Tensor, tuple, list)):
            continue  # an element of an eager op's result, or size arithmetic on the host
        why = part.support.get(n)
        if why is None and n.target in _VIEW_SET:
            views.append((n.name, op_name(n)))
        else:
            rec.fallbacks.append((n.name, op_name(n), why or "left out of every fusion"))
    rec.views = views
    eager = [_eager_module(gm, f) for f in part.fusions]  # before any fusion replaces its nodes
    replaced: dict = {}  # a fusion's output node -> the getitem of the fused call standing for it
    for k, f in enumerate(part.fusions):
        name = f"circbuf_fusion_{k}"
        ops = [op_name(n) for n in f.nodes if n.target is not operator.getitem]
        fr = FusionRecord(
            name,
            ops,
            fd=f.translator.fd,
            in_pos=f.translator.in_pos,
            out_map=f.translator.out_map,
        )
        fr.eager = eager[k]
        rec.fusions.append(fr)
        runner = CircbufFusion(fr, f.translator.out_layouts, opts)
        _replace(gm, f, name, runner, replaced)
    if part.fusions:
        _toposort(gm.graph)
        gm.graph.lint()
        gm.recompile()
    record(rec)
    if cuda_graph:
        from .graphs import GraphedCallable

        return GraphedCallable(make_boxed_func(gm.forward), rec)
    return make_boxed_func(gm.forward)


class CircbufFusion(torch.nn.Module):
    """A fusion in the graph: ``fd.execute`` on its inputs, or its aten
    subgraph (compile-only mode, or after a failure, whose reason goes on the
    record). Returns a tuple, one value per fusion output."""

    def __init__(self, rec: FusionRecord, layouts, opts):
        super().__init__()
        self.rec, self.eager = rec, rec.eager
        self.fd, self.in_pos, self.out_map = rec.fd, rec.in_pos, rec.out_map
        # outputs whose strides to check against the graph's: (index, strides, (axis, stride) pairs)
        self.layouts = [(k, lay[0], lay[1]) for k, lay in enumerate(layouts) if lay is not None and lay[1]]
        self.compile_only, self.strict = bool(opts["compile_only"]), bool(opts.get("strict"))
        self.record_inputs = bool(opts.get("record_inputs"))
        self.failed = False

    def _fail(self, what, e):
        if self.strict:
            raise e
        self.failed = True
        self.rec.status = "eager"
        kind = "" if isinstance(e, CircbufError) else f"{type(e).__name__}: "
        self.rec.reason = f"{what}: {kind}{e}"

    def forward(self, *args):
        if self.failed:
            return self.eager(*args)
        ins = [args[i] for i in self.in_pos]
        if self.record_inputs and self.rec.args is None:
            self.rec.args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
        if self.compile_only:
            return self._compile_only(args, ins)
        try:
            outs = self.fd.execute(ins)
        except Exception as e:  # noqa: BLE001 - the fusion falls back, the reason is recorded
            self._fail("execute", e)
            return self.eager(*args)
        if self.rec.kernels is None:
            self.rec.status = "ran"
            self.rec.kernels = _kernel_count(self.fd)
        for k, strides, pairs in self.layouts:
            o = outs[k]
            if any(o.stride(d) != s for d, s in pairs):  # not the layout the graph was traced with
                outs[k] = torch.empty_strided(o.shape, strides, dtype=o.dtype, device=o.device).copy_(o)
        return tuple(outs[k] if kind == "out" else args[k] for kind, k in self.out_map)

    def _compile_only(self, args, ins):
        if self.rec.status == "translated":
            try:
                ck = self.fd.compile(ins, arch="sm_90a")
                self.rec.kernels = len(ck.kernels)
                self.rec.status = "compiled"
            except Exception as e:  # noqa: BLE001 - recorded; the graph runs eagerly anyway
                self._fail("compile", e)
        return self.eager(*args)


def _kernel_count(fd) -> int:
    p = fd.last_params()
    if p is None:
        return 0
    return len(p) if isinstance(p, list) else 1


def _eager_module(gm, f) -> torch.fx.GraphModule:
    """The fusion's nodes as an aten GraphModule: its fallback."""
    g = torch.fx.Graph()
    env = {}
    for a in f.inputs:
        env[a] = g.placeholder(a.name)
        env[a].meta = dict(a.meta)
    for n in f.nodes:
        env[n] = g.node_copy(n, lambda x: env[x])
    g.output(tuple(env[o] for o in f.outputs))
    return torch.fx.GraphModule(gm, g)


def _replace(gm, f, name, runner, replaced):
    """Put ``runner`` in place of the fusion's nodes."""
    gm.add_submodule(name, runner)
    graph = gm.graph
    with graph.inserting_after(f.nodes[-1]):
        call = graph.call_module(name, tuple(replaced.get(a, a) for a in f.inputs))
    last = call
    for k, o in enumerate(f.outputs):
        with graph.inserting_after(last):
            get = graph.call_function(operator.getitem, (call, k))
        get.meta = dict(o.meta)
        o.replace_all_uses_with(get)
        replaced[o] = get
        last = get
    for n in reversed(f.nodes):
        graph.erase_node(n)


def _toposort(graph):
    """Reorder ``graph`` so each node follows its inputs, keeping the order
    otherwise (a fused call sits after its last node, where a user of one of
    its outputs may already have been)."""
    order, done = [], set()
    for root in graph.nodes:
        if root in done:
            continue
        stack = [(root, iter(root.all_input_nodes))]
        while stack:
            n, it = stack[-1]
            nxt = next((a for a in it if a not in done), None)
            if nxt is not None:
                stack.append((nxt, iter(nxt.all_input_nodes)))
                continue
            stack.pop()
            if n not in done:
                done.add(n)
                order.append(n)
    for prev, n in zip(order, order[1:]):
        if prev.next is not n:
            prev.append(n)


__all__ = ["backend", "compile_aten_graph", "decompositions", "CircbufFusion", "TABLE"]
