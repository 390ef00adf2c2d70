"""Lowering: scheduled Fusion -> kernel IR -> CUDA source.

The passes run in the order of :data:`PASSES`; each is ``Kernel -> Kernel``
and lives in its own file. ``CIRCBUF_DUMP=kernel_ir`` prints the result,
``CIRCBUF_DUMP=passes`` the kernel IR after each pass (``lower``'s ``after_pass``).

Each pass declares the facts it requires and provides (:mod:`.passes`): Kernel
fields it reads from an earlier pass or writes, and properties of the kernel
IR. ``lower()`` refuses a list whose order breaks them, naming the pass and
the fact. A pass may read the loop nest's fields without declaring them only
while no earlier pass has changed them (``predicate`` reads ``launch`` before
``roles`` adds the producer row; ``tma_store`` and ``mbarriers`` read it
after, so they require it)::

    loop_nest       requires: -
                    provides: loop_nest, name, tensor_params, scalar_params, launch, extent_bindings,
                              max_threads, min_blocks, circular_loops, strides, memory_orders,
                              index_type, target, mbarriers, fast_math
    allocation      requires: loop_nest
                    provides: allocated, smem_bytes
    indexing        requires: loop_nest
                    provides: indexed, tensor_maps, descriptors
                    consumes: loop_nest
    fast_math       requires: indexed
                    provides: approximated
    vectorize       requires: indexed
                    provides: vectorized
    predicate       requires: indexed, vectorized
                    provides: predicated
    wgmma           requires: indexed
                    provides: wgmma_synced
    roles           requires: allocated
                    provides: roles, role_switch, launch, max_threads, min_blocks
    split_k         requires: indexed, allocated, wgmma_synced, roles, launch
                    provides: split_k, split_k_summed, named_barriers
    turns           requires: allocated, wgmma_synced, roles
                    provides: turns, turn_orders
    tma_store       requires: indexed, role_switch, launch, named_barriers
                    provides: tma_stores_synced, named_barriers
    circular_buffer requires: allocated, indexed, predicated, wgmma_synced, roles, turns,
                              tma_stores_synced, launch, max_threads
                    provides: pipelined, rings
    mbarriers       requires: rings, turns, turn_orders, launch
                    provides: mbarriers_allocated
    one_trip        requires: pipelined, mbarriers_allocated
                    provides: one_trip_dropped
    simplify        requires: indexed, predicated, turns, tma_stores_synced, pipelined,
                              mbarriers_allocated, one_trip_dropped
                    provides: simplified
    hoist           requires: simplified
                    provides: hoisted
    sync            requires: predicated, tma_stores_synced, pipelined, named_barriers,
                              mbarriers_allocated
                    provides: synced, named_barriers
    names           requires: hoisted, synced, pipelined, mbarriers_allocated, named_barriers,
                              descriptors, rings, turn_orders, roles
                    provides: named, former_names
                    renames: rings, turn_orders, roles, mbarriers, named_barriers, descriptors
    peer_stores     requires: tma_stores_synced, role_switch, tensor_maps, synced
                    provides: peer_stores, peer, tensor_params, scalar_params, tensor_maps
    peer_order      requires: peer_stores, peer, scalar_params, hoisted, synced
                    provides: peer_order

``approximated`` (fast_math): the fp32 transcendentals whose error no output
shows marked for their fast variants (``Assign.fast``).

IR facts: ``loop_nest`` the fusion's exprs placed in their loops, not yet
indexed; ``allocated`` an Allocate per local/shared buffer; ``indexed`` every
access an explicit index, its bounds recorded; ``vectorized`` vector loops
collapsed into wide accesses; ``predicated`` guarded statements wrapped in
their conditions; ``wgmma_synced`` wgmma fences, commits and waits;
``role_switch`` the warp roles of a warp-specialized kernel split the body
(``Kernel.roles`` names them, ``launch`` has the producer row); ``split_k_summed`` an accumulator whose K is split across
``blockIdx.y`` published and summed by the last CTA of its tile, the
epilogue run on that CTA only (``Kernel.split_k``: the workspace); ``turns`` ping-pong
turn barriers; ``tma_stores_synced`` fences and barriers around TMA stores,
on each role's own named barriers; ``pipelined`` circular buffers lowered to
their rings (barrier waits, arrivals, stage and phase), ``Kernel.rings``
describing them;
``mbarriers_allocated`` every registered mbarrier allocated, initialized and
invalidated; ``one_trip_dropped`` no loop of one trip left but the rings' own;
``simplified`` indices and conditions simplified; ``hoisted`` each
run-time loop's index arithmetic named once per iteration; ``synced``
block syncs for shared-memory hazards; ``named`` buffers, rings, barriers,
tile loop indices and tile coordinates named after their roles (``acc``,
``a_stage``, ``ab_full``, ``tile``, ``tile_m``), ``Kernel.former_names``
keeping their T-numbers; ``peer_stores`` an output's TMA stores
sent to every peer GPU with per-tile flags (issue 22); ``peer_order`` a
reduce-scatter's tile loops rotated by rank. ``codegen`` prints the result and
sets ``hang_record``.
"""

from __future__ import annotations

from ..ir import Const, DataType, Fusion, TensorView, Var
from ..target import DEFAULT, Target
from .allocation import insert_allocations
from .circular_buffer import circular_buffer
from .codegen import codegen
from .fast_math import use_fast_math
from .hoist import hoist_indices
from .indexing import lower_indexing
from .kir import Kernel
from .loop_nest import generate_loop_nest
from .mbarriers import setup_mbarriers
from .names import readable_names
from .one_trip import drop_one_trip_loops
from .passes import Pass, check_order
from .peer_order import peer_order
from .peer_stores import peer_stores
from .predicate import insert_predicates
from .roles import assign_roles
from .simplify_indices import simplify_indices
from .split_k import split_k_sums
from .sync import insert_syncs
from .tma_store import tma_stores
from .turns import take_turns
from .vectorize import vectorize_loops
from .wgmma import wgmma_sync

PASSES = [
    Pass("allocation", insert_allocations, requires=("loop_nest",), provides=("allocated", "smem_bytes")),
    Pass(
        "indexing",
        lower_indexing,
        requires=("loop_nest",),
        provides=("indexed", "tensor_maps", "descriptors"),
        consumes=("loop_nest",),
    ),
    Pass("fast_math", use_fast_math, requires=("indexed",), provides=("approximated",)),
    Pass("vectorize", vectorize_loops, requires=("indexed",), provides=("vectorized",)),
    Pass("predicate", insert_predicates, requires=("indexed", "vectorized"), provides=("predicated",)),
    Pass("wgmma", wgmma_sync, requires=("indexed",), provides=("wgmma_synced",)),
    Pass(
        "roles",
        assign_roles,
        requires=("allocated",),
        provides=("roles", "role_switch", "launch", "max_threads", "min_blocks"),
    ),
    Pass(
        "split_k",
        split_k_sums,
        requires=("indexed", "allocated", "wgmma_synced", "roles", "launch"),
        provides=("split_k", "split_k_summed", "named_barriers"),
    ),
    Pass(
        "turns",
        take_turns,
        requires=("allocated", "wgmma_synced", "roles"),
        provides=("turns", "turn_orders"),
    ),
    Pass(
        "tma_store",
        tma_stores,
        requires=("indexed", "role_switch", "launch", "named_barriers"),
        provides=("tma_stores_synced", "named_barriers"),
    ),
    Pass(
        "circular_buffer",
        circular_buffer,
        requires=(
            "allocated",
            "indexed",
            "predicated",
            "wgmma_synced",
            "roles",
            "turns",
            "tma_stores_synced",
            "launch",
            "max_threads",
        ),
        provides=("pipelined", "rings"),
    ),
    Pass(
        "mbarriers",
        setup_mbarriers,
        requires=("rings", "turns", "turn_orders", "launch"),
        provides=("mbarriers_allocated",),
    ),
    Pass(
        "one_trip",
        drop_one_trip_loops,
        requires=("pipelined", "mbarriers_allocated"),
        provides=("one_trip_dropped",),
    ),
    Pass(
        "simplify",
        simplify_indices,
        requires=(
            "indexed",
            "predicated",
            "turns",
            "tma_stores_synced",
            "pipelined",
            "mbarriers_allocated",
            "one_trip_dropped",
        ),
        provides=("simplified",),
    ),
    Pass("hoist", hoist_indices, requires=("simplified",), provides=("hoisted",)),
    Pass(
        "sync",
        insert_syncs,
        requires=("predicated", "tma_stores_synced", "pipelined", "named_barriers", "mbarriers_allocated"),
        provides=("synced", "named_barriers"),
    ),
    Pass(
        "names",
        readable_names,
        requires=(
            "hoisted",
            "synced",
            "pipelined",
            "mbarriers_allocated",
            "named_barriers",
            "descriptors",
            "rings",
            "turn_orders",
            "roles",
        ),
        provides=("named", "former_names"),
        renames=("rings", "turn_orders", "roles", "mbarriers", "named_barriers", "descriptors"),
    ),
    Pass(
        "peer_stores",
        peer_stores,
        requires=("tma_stores_synced", "role_switch", "tensor_maps", "synced"),
        provides=("peer_stores", "peer", "tensor_params", "scalar_params", "tensor_maps"),
    ),
    Pass(
        "peer_order",
        peer_order,
        requires=("peer_stores", "peer", "scalar_params", "hoisted", "synced"),
        provides=("peer_order",),
    ),
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
    fast_math: bool = True,
) -> Kernel:
    """Scheduled fusion -> Kernel. ``contiguity[k]`` gives, per axis of the k-th
    tensor parameter (inputs then outputs), whether its stride is the product
    of the inner extents; ``orders[k]`` its axes in memory order (default
    row-major; tensor maps follow it too). ``after_pass(name, kernel)``, if
    given, sees the kernel after the loop nest is built (``"loop_nest"``) and
    after each pass. ``target``: the GPU whose limits the passes check (``kernel.target``).
    ``fast_math``: whether the fast_math pass may use approximate transcendentals
    (``kernel.fast_math``; the driver passes ``CIRCBUF_FAST_MATH``).

    >>> import circbuf as cb
    >>> with cb.FusionDefinition() as fd:
    ...     fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
    >>> seen = []
    >>> k = lower(fd.fusion, after_pass=lambda name, kernel: seen.append(name))
    >>> seen == ["loop_nest"] + [p.name for p in PASSES]
    True
    """
    check_order(PASSES)
    kernel = generate_loop_nest(fusion, name, target)
    kernel.index_type = index_type
    kernel.target = target
    kernel.fast_math = fast_math
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
    for p in PASSES:
        kernel = p.fn(kernel)
        if after_pass is not None:
            after_pass(p.name, kernel)
    return kernel


__all__ = ["lower", "codegen", "Kernel", "Pass", "PASSES", "stride_exprs"]
