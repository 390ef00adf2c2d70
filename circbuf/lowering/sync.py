"""Pass 7: block syncs for shared-memory hazards.

Read-after-write: a statement reading a shared buffer that an earlier sibling
wrote gets a sync before it. Write-after-read across iterations: a loop whose
body reads and writes one shared buffer ends its body with a sync.

Before::

    FOR j0 ..:  T2_s[threadIdx.x] = set(T0[...])
    FOR j1 ..:  T3[j1] = T2_s[(threadIdx.x + 1) % 128]

After::

    FOR j0 ..:  T2_s[...] = ...
    BLOCK_SYNC  // RAW on T2
    FOR j1 ..:  T3[j1] = T2_s[...]
"""

from __future__ import annotations

from ..ir import MemoryType
from .kir import Assign, BlockSync, ForLoop, IfThenElse, Kernel, TensorRef


def _synced_by_barriers(tv) -> bool:
    d = tv.definition
    return getattr(d, "kind", None) == "tma"  # mbarriers order these (circular-buffer pass)


def _access(node, reads, writes):
    if isinstance(node, Assign):
        if node.lhs.tv.memory_type == MemoryType.Shared and not _synced_by_barriers(node.lhs.tv):
            writes.add(node.lhs.tv.name)
        for o in node.operands:
            if (
                isinstance(o, TensorRef)
                and o.tv.memory_type == MemoryType.Shared
                and not _synced_by_barriers(o.tv)
            ):
                reads.add(o.tv.name)
    elif isinstance(node, ForLoop):
        for n in node.body:
            _access(n, reads, writes)
    elif isinstance(node, IfThenElse):
        for n in node.then + node.else_:
            _access(n, reads, writes)


def _sync_list(nodes: list) -> list:
    out, dirty = [], set()
    for n in nodes:
        if isinstance(n, ForLoop):
            n.body = _sync_list(n.body)
            r, w = set(), set()
            _access(n, r, w)
            if r & w and not (n.body and isinstance(n.body[-1], BlockSync)):
                n.body.append(BlockSync("WAR across iterations on " + ", ".join(sorted(r & w))))
        r, w = set(), set()
        _access(n, r, w)
        if r & dirty:
            out.append(BlockSync("RAW on " + ", ".join(sorted(r & dirty))))
            dirty = set()
        out.append(n)
        dirty |= w
    return out


def insert_syncs(kernel: Kernel) -> Kernel:
    """Entry: add BlockSync nodes for shared-memory RAW/WAR hazards."""
    kernel.body = _sync_list(kernel.body)
    return kernel
