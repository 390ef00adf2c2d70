"""Lowering: scheduled Fusion -> kernel IR -> CUDA source.

The passes run in the order of :data:`PASSES`; each is ``Kernel -> Kernel``
and lives in its own file. ``CIRCBUF_DUMP=kernel_ir`` prints the result,
``CIRCBUF_DUMP=passes`` the kernel IR after each pass (``lower``'s ``after_pass``).
"""

from __future__ import annotations

from ..ir import Const, DataType, Fusion, TensorView, Var
from ..target import DEFAULT, Target
from .allocation import insert_allocations
from .circular_buffer import circular_buffer
from .codegen import codegen
from .indexing import lower_indexing
from .kir import Kernel
from .loop_nest import generate_loop_nest
from .mbarriers import setup_mbarriers
from .predicate import insert_predicates
from .simplify_indices import simplify_indices
from .sync import insert_syncs
from .tma_store import tma_stores
from .turns import take_turns
from .vectorize import vectorize_loops
from .wgmma import wgmma_sync

PASSES = [
    ("allocation", insert_allocations),
    ("indexing", lower_indexing),
    ("vectorize", vectorize_loops),
    ("predicate", insert_predicates),
    ("wgmma", wgmma_sync),
    ("turns", take_turns),
    ("tma_store", tma_stores),
    ("circular_buffer", circular_buffer),
    ("mbarriers", setup_mbarriers),
    ("simplify", simplify_indices),
    ("sync", insert_syncs),
]


def stride_exprs(tv: TensorView, contiguity, order=None) -> list:
    """Stride of each axis: symbolic products of extents where the tensor is
    contiguous (so indexing can fold them), the run-time stride elsewhere.
    ``order`` lists the axes in memory order, outermost first (default
    row-major); ``contiguity[d]``: axis d's stride is the next inner axis'
    stride times that axis' extent (1 for the innermost).

    >>> # channels-last NCHW, contiguous: order [0, 2, 3, 1] -> strides [H*W*C, 1, W*C, C]
    """
    ids = tv.domain.no_reductions()
    out = [None] * len(ids)
    prev = None
    for d in reversed(list(order) if order is not None else range(len(ids))):
        if contiguity[d]:
            out[d] = Const(1) if prev is None else prev[0] * prev[1]
        else:
            out[d] = Var(f"{tv.name}.stride[{d}]")
        prev = (out[d], ids[d].extent)
    return out


def lower(
    fusion: Fusion,
    contiguity=None,
    index_type=DataType.Int32,
    name="kernel",
    orders=None,
    after_pass=None,
    target: Target = DEFAULT,
) -> Kernel:
    """Scheduled fusion -> Kernel. ``contiguity[k]`` gives, per axis of the k-th
    tensor parameter (inputs then outputs), whether its stride is the product
    of the inner extents; ``orders[k]`` its axes in memory order (default
    row-major; tensor maps follow it too). ``after_pass(name, kernel)``, if
    given, sees the kernel after the loop nest is built (``"loop_nest"``) and
    after each pass. ``target``: the GPU whose limits the passes check (``kernel.target``).

    >>> import circbuf as cb
    >>> with cb.FusionDefinition() as fd:
    ...     fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
    >>> seen = []
    >>> k = lower(fd.fusion, after_pass=lambda name, kernel: seen.append(name))
    >>> seen == ["loop_nest"] + [name for name, _ in PASSES]
    True
    """
    kernel = generate_loop_nest(fusion, name)
    kernel.index_type = index_type
    kernel.target = target
    for k, p in enumerate(kernel.tensor_params):
        nd = p.tv.ndim
        contig = contiguity[k] if contiguity is not None else [True] * nd
        order = orders[k] if orders is not None else None
        for d, s in enumerate(stride_exprs(p.tv, contig, order)):
            kernel.strides[(p.tv.name, d)] = s
        if order is not None:
            kernel.memory_orders[p.tv.name] = list(order)
    if after_pass is not None:
        after_pass("loop_nest", kernel)
    for pass_name, fn in PASSES:
        kernel = fn(kernel)
        if after_pass is not None:
            after_pass(pass_name, kernel)
    return kernel


__all__ = ["lower", "codegen", "Kernel", "PASSES", "stride_exprs"]
