"""Which aten nodes circbuf takes, and the partitions it fuses.

``node_support`` says whether circbuf can take one node and, if not, why.
``partition`` runs torch's ``CapabilityBasedPartitioner`` with it, leaves the
views at a partition's boundary to torch (``remove_bookend_non_compute_ops``:
a view of an input or of an output costs torch nothing, while a fusion would
copy it), keeps vertical fusion only (a partition is cut into its connected
parts: circbuf runs independent parts as separate kernels anyway), and
translates each partition; a node whose translation fails is left to eager
aten with the reason, and the graph is partitioned again without it.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: torch.relu(x) * 2, tracing_mode="fake")(torch.randn(4))
>>> [sorted(n.name for n in p.nodes) for p in partition(gm, compile_only=True).fusions]
[['mul', 'relu']]
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass, field

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .aten import TABLE, TORCH_TO_CB, VIEW_OPS, Translator, Unsupported

aten = torch.ops.aten


def _is_sdpa(target) -> bool:
    """scaled_dot_product_attention and the kernels it dispatches to (flash,
    efficient, cuDNN, math, CPU), forward or backward."""
    return isinstance(target, torch._ops.OpOverload) and "scaled_dot_product" in target._schema.name


def _metas(v):
    if isinstance(v, (tuple, list)):
        for x in v:
            yield from _metas(x)
    elif v is not None:
        yield v


def _tensor_reason(t, compile_only) -> str | None:
    if t.is_complex():
        return f"complex dtype {t.dtype}"
    if t.dtype not in TORCH_TO_CB:
        return f"dtype {t.dtype} (circbuf has float32/64, float16, bfloat16, int32/64, bool)"
    if t.layout != torch.strided:
        return f"layout {t.layout}"
    if t.device.type != "cuda" and not compile_only:
        return f"a {t.device.type.upper()} tensor (circbuf runs on CUDA tensors)"
    return None


def node_support(node, compile_only: bool) -> str | None:
    """None when circbuf can take ``node``, else why not (explain prints it)."""
    if node.op != "call_function":
        return f"{node.op} node"
    target = node.target
    if _is_sdpa(target):
        return "scaled_dot_product_attention stays eager (circbuf has no attention kernel)"
    if isinstance(target, torch._ops.OpOverload):
        if torch.Tag.nondeterministic_seeded in target.tags:
            return "random op"
        if target._schema.is_mutable:
            return "mutates its input in place"
    if target not in TABLE:
        return "no circbuf translation"
    if target is operator.getitem:
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or node_support(src, compile_only) is not None:
            return "an element of a value circbuf does not compute"
    if "val" not in node.meta:
        return "no tensor metadata on the node (trace it with make_fx or AOTAutograd)"
    devices = set()
    for v in [node.meta["val"], *(a.meta.get("val") for a in node.all_input_nodes)]:
        for t in _metas(v):
            if isinstance(t, torch.Tensor):
                why = _tensor_reason(t, compile_only)
                if why:
                    return why
                devices.add(t.device)
            elif not isinstance(t, (int, float, bool, torch.SymInt)):
                return f"a value of type {type(t).__name__}"
    if len(devices) > 1:
        return f"tensors on several devices ({', '.join(sorted(map(str, devices)))})"
    return None


class _Support(OperatorSupportBase):
    def __init__(self, compile_only, excluded):
        self.compile_only, self.excluded, self.reasons = compile_only, excluded, {}

    def is_node_supported(self, submodules, node) -> bool:
        if node in self.excluded:
            return False
        why = self.reasons.get(node, 0)
        if why == 0:
            why = self.reasons[node] = node_support(node, self.compile_only)
        return why is None


def _qualified(op) -> str:
    from torch.fx.node import _get_qualified_name

    return _get_qualified_name(op)


_VIEW_NAMES = [_qualified(op) for op in VIEW_OPS]
_VIEW_SET = set(VIEW_OPS) | {operator.getitem}
_HAS_SKIP_HORIZONTAL = "skip_horizontal_fusion" in inspect.signature(CapabilityBasedPartitioner).parameters


@dataclass
class Fusion:
    """One partition: its nodes (topological order), the values it reads from
    outside (``inputs``, the fused call's arguments) and those used outside
    (``outputs``); ``translator`` holds the FusionDefinition."""

    nodes: list
    inputs: list
    outputs: list
    translator: Translator | None = None


@dataclass
class Partitioning:
    fusions: list = field(default_factory=list)
    excluded: dict = field(default_factory=dict)  # node -> why its translation failed
    support: dict = field(default_factory=dict)  # node -> node_support's answer


def _components(nodes):
    """``nodes`` cut into the parts connected by edges among them."""
    member = set(nodes)
    parent = {n: n for n in nodes}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in nodes:
        for a in n.all_input_nodes:
            if a in member:
                ra, rn = find(a), find(n)
                if ra is not rn:
                    parent[ra] = rn
    groups: dict = {}
    for n in nodes:
        groups.setdefault(find(n), []).append(n)
    return list(groups.values())


def _boundary(nodes):
    member = set(nodes)
    inputs, seen = [], set()
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in member and a not in seen:
                seen.add(a)
                inputs.append(a)
    outputs = [n for n in nodes if any(u not in member for u in n.users)]
    return inputs, outputs


def partition(gm: torch.fx.GraphModule, compile_only: bool) -> Partitioning:
    """The fusions of ``gm`` (not modified) circbuf takes, each translated."""
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    excluded: dict = {}
    while True:
        support = _Support(compile_only, excluded)
        kw = {"skip_horizontal_fusion": True} if _HAS_SKIP_HORIZONTAL else {}
        partitioner = CapabilityBasedPartitioner(
            gm, support, allows_single_node_partition=True, non_compute_ops=_VIEW_NAMES, **kw
        )
        parts = partitioner.propose_partitions()
        partitioner.remove_bookend_non_compute_ops(parts)
        groups = []
        for p in parts:
            for g in _components(sorted(p.nodes, key=order.__getitem__)):
                if any(n.target not in _VIEW_SET for n in g):  # something to compute
                    groups.append(g)
        groups.sort(key=lambda g: order[g[0]])
        result = Partitioning(excluded=excluded)
        failed = False
        for g in groups:
            inputs, outputs = _boundary(g)
            tr = Translator(g, inputs, outputs)
            try:
                tr.run()
            except Unsupported as e:
                failed = True
                if e.node in g:
                    excluded[e.node] = e.reason
                else:  # an input the fusion cannot read: none of it runs on circbuf
                    for n in g:
                        excluded.setdefault(n, f"reads {e.node.name if e.node else '?'}: {e.reason}")
                continue
            result.fusions.append(Fusion(g, inputs, outputs, tr))
        if not failed:
            result.support = {n: (excluded.get(n) or support.reasons.get(n)) for n in gm.graph.nodes}
            return result
