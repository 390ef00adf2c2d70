"""circbuf under ``torch.compile``: ``torch.compile(model, backend="circbuf")``.

- ``backend``: the backend function (``torch.compile(fn, backend=circbuf.dynamo.backend)``).
- ``explain(fn, *inputs)``: how each aten graph was split into fusions and eager ops.
- ``records()``: what the backend recorded for the graphs it compiled.

Modules: ``backend`` (AOTAutograd, the fused-call modules), ``aten`` (the
aten -> FusionDefinition table), ``partition`` (what circbuf takes),
``explain`` (the records).

>>> import circbuf.dynamo as cd
>>> callable(cd.backend)
True
"""

from .backend import backend, compile_aten_graph, decompositions
from .explain import Explanation, FusionRecord, GraphRecord, capture, explain, records
from .partition import node_support, partition

__all__ = [
    "backend",
    "compile_aten_graph",
    "decompositions",
    "explain",
    "Explanation",
    "FusionRecord",
    "GraphRecord",
    "capture",
    "records",
    "node_support",
    "partition",
]
