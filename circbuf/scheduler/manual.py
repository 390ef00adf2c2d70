"""Public entry points for scheduling a matmul by hand.

The matmul scheduler rewrites a fusion's ``matmul`` / ``linear`` into MMA form
before it transforms anything: the operands staged in shared memory by TMA
(``As``, ``Bs``, each with a broadcast axis for the other operand's tile loop),
``acc = mma(As, Bs)`` in fp32 registers, and the output ``cast(acc)``. A hand
schedule needs that same form to split and parallelize, so :func:`mma_form`
gives it; everything after it (tiles, the wgmma fragment layout, rings, roles)
is done with the ordinary primitives (``split``, ``reorder``, ``merge``,
``parallelize``, ``cache_before(op="tma")``, ``circular_buffer``,
``take_turns``). ``examples/gemm_ladder/`` builds a Hopper GEMM that way, step
by step, up to the kernel the heuristic produces.
"""

from __future__ import annotations

from ..ir import CircbufError, DataType, Fusion, LoadStoreOp, TensorView
from .matmul import translate
from .matmul_path import _mma_structure, fixed_ones
from .params import MatmulParams
from .utils import LogicalMap, concretize_broadcasts, contractions


def mma_form(fusion: Fusion) -> tuple[TensorView, TensorView, TensorView]:
    """Rewrite the fusion's one matmul / linear in MMA form for a hand schedule;
    returns ``(acc, As, Bs)``: the fp32 accumulator (its last axis the K
    reduction) and the two shared-memory operand tiles, filled by TMA (each
    ``[.., M, N, K]``-shaped in its own memory order, with a broadcast axis,
    given the output's extent, where the operand has none: ``As`` is
    ``[M, bN, K]``, a linear's ``Bs`` ``[bM, N, K]``, a matmul's ``Bs``
    ``[bM, K, N]``). The output is ``cast(acc)`` (``acc + bias`` first for a
    linear with a bias); the epilogue's fp32 math reads ``acc``.

    Raises a ``CircbufError`` for a fusion whose matmul the tensor cores
    cannot take (fp32 or mixed operands, 1-D operands, prologue math), and for
    a fusion already scheduled or rewritten.

    >>> import circbuf as cb
    >>> from circbuf.scheduler import mma_form
    >>> with cb.FusionDefinition() as fd:
    ...     a = fd.define_tensor([256, 128], dtype=cb.DataType.BFloat16)
    ...     b = fd.define_tensor([512, 128], dtype=cb.DataType.BFloat16)
    ...     fd.add_output(fd.ops.linear(a, b))
    >>> acc, As, Bs = mma_form(fd.fusion)
    >>> acc.dtype.name, As.memory_type.name, Bs.memory_type.name
    ('Float', 'Shared', 'Shared')
    >>> [i.is_reduction for i in acc.logical], [i.is_broadcast for i in As.logical]
    ([False, False, True], [False, True, False])
    """
    cs = contractions(fusion)
    if len(cs) != 1:
        raise CircbufError(
            f"mma_form: the fusion must hold exactly one matmul or linear (it holds {len(cs)})"
        )
    e = cs[0]
    why = _mma_structure(fusion, e)
    if why is None and fixed_ones(fusion, e):
        # (the scheduler turns those broadcast axes into iteration axes on its clone; a hand
        # schedule would tile a broadcast axis, which has no rows in the operand's buffer)
        why = "an M or N extent of 1 fixed in the definition (define it -1 to schedule it by hand)"
    if why is None and e.inputs[0].dtype == DataType.Float:
        # (TF32 follows torch's switch, read per call by the scheduler; a hand schedule
        # has no call to read it from, and its k slices are 16-bit ones)
        why = "Float operands (TF32 runs only where the scheduler reads torch's switch)"
    if why is not None:
        raise CircbufError(f"mma_form: the tensor cores cannot take matmul {e.out.name}: {why}")
    if any(isinstance(x, TensorView) and not x.is_input for x in e.inputs):
        raise CircbufError(
            f"mma_form: matmul {e.out.name}'s operands must be fusion inputs (no prologue math)"
        )
    for tv in fusion.used_tvs():
        if tv.loop != tv.logical or tv.compute_at_pos or tv.circular:
            raise CircbufError(f"mma_form: {tv.name} is already scheduled; call mma_form on a fresh fusion")
        d = tv.definition
        if isinstance(d, LoadStoreOp) and d.kind != "set":
            raise CircbufError(
                f"mma_form: {tv.name} is already a {d.kind} copy; call mma_form on a fresh fusion"
            )
    acc, As, Bs = translate(fusion, MatmulParams(fill=("tma", "tma"), copy_vector=(0, 0)))
    fusion._caches_added = True  # a fusion touched by hand: lowered as written, without heuristics
    concretize_broadcasts(fusion, LogicalMap(fusion))
    return acc, As, Bs
