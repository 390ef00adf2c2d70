"""Pass: guard statements that could touch memory out of range.

Requires: indexed, vectorized; provides: predicated.

Statements that read or write global memory, and reduction updates, run
under the bounds conditions recorded by indexing. Global writes of a value
every thread of an axis holds (after a block reduction, or with no axis bound
to that thread index) are made by thread 0 of that axis only.

Before::

    T3[j0 * 8] = vec8 T2[j0 * 8]

After::

    IF ((blockIdx.x * 512 + threadIdx.x * 4 + j0) * 8 < i0)
      T3[...] = vec8 T2[j0 * 8]
"""

from __future__ import annotations

from ..ir import Bin, Const, MemoryType, ParallelType, Var, simplify
from .kir import Assign, IfThenElse, Kernel, rewrite


def _thread_predicate(kernel: Kernel, a: Assign) -> list:
    tv = a.lhs.tv
    if tv.memory_type != MemoryType.Global:
        return []
    bound = {ax.parallel_type for ax in tv.loop if not ax.is_broadcast and not ax.is_reduction}
    terms = []
    for pt in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz):
        ext = kernel.launch.get(pt)
        if ext is not None and not (isinstance(ext, Const) and ext.value == 1) and pt not in bound:
            terms.append(Var(pt.value).eq(0))
    return terms


def insert_predicates(kernel: Kernel) -> Kernel:
    """Entry: wrap guarded Assigns in IfThenElse."""

    def fn(node):
        if not isinstance(node, Assign):
            return None
        terms = list(node.pred) if (node.touches_global or node.accumulate) else []
        terms += _thread_predicate(kernel, node)
        terms = [simplify(t) for t in terms]
        terms = [t for t in terms if not (isinstance(t, Const) and t.value is True)]
        node.pred = []
        if not terms:
            return None
        cond = terms[0]
        for t in terms[1:]:
            cond = Bin("&&", cond, t)
        return IfThenElse(cond, [node])

    kernel.body = rewrite(kernel.body, fn)
    return kernel
