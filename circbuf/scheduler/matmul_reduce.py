"""Row reductions of a matmul's output in its epilogue (issue 17): nvFuser's
rfactor of the reduced N axis, planned by the segmenter as two kernels.

A fusion ``y = linear(x, w); r = max(abs(y), -1)`` (or ``sum``, ``min``, any
elementwise epilogue between the matmul and the reduction) reads the whole
output again when the reduction runs in a kernel of its own. Instead, the
reduction is split (:func:`split_row_reductions`, before segmentation)::

    r = max(abs(y), dims=[1])
 ->
    p = partial max(abs(y), dims=[1] as [iM, iceilDiv(N, 64), r8, i4, r2])   # the GEMM's epilogue
    r = max(p, dims=[1, 2])                                                   # a small reduction kernel

``p``'s root axes are ``y``'s ``[M, N]`` (the reduction's input maps to them);
its logical axes are made from the reduced ``N`` by a split into 64-column
groups (one epilogue sub-tile's width; not exact: the last group may be
ragged, and indexing predicates its columns on ``N``) and exact splits of a
group as the wgmma accumulator fragment holds it: column ``j * 8 + q * 2 + e``
is in register pair ``j`` (8 of them), element ``e`` of the pair, of the quad
lane ``q = threadIdx.x % 4``. ``j`` and ``e`` are reduced in the thread's
registers; ``q`` is kept, so every thread writes its own partials and no
shuffle or atomic is needed: ``p`` is ``[M, ceil(N / 64), 4]`` fp32,
deterministic (the same order every run).

The partials depend on neither the tile nor the inputs' sizes, so the
segmenter plans them structurally: the matmul scheduler takes ``p`` beside the
epilogue (:func:`schedule_partials` puts its loop nest in the epilogue's
sub-tile loop, :func:`check_params` refuses the schedules that cannot hold
it), and the reduction scheduler takes ``r``. Traffic at M = N = 8192: the
partials are M N / 16 fp32 (16 MB written, read once) instead of the 128 MB
bf16 output read again.

The reduction reads the value the fusion defines: a reduction of the bf16
output (``max(abs(cast(y, Float)))``) reads ``y`` rounded, not the fp32
accumulator the matmul scheduler's epilogue otherwise takes for a cast of
``y`` back to fp32 (:func:`split_row_reductions` reads ``y`` through a
``set``).
"""

from __future__ import annotations

import dataclasses

from ..ir import (
    BroadcastOp,
    CastOp,
    Const,
    DataType,
    Fusion,
    IterDomain,
    IterType,
    LoadStoreOp,
    ParallelType,
    ReductionOp,
    TensorView,
    evaluate,
)
from ..ir.iterdomain import exact_split, split
from ..ir.nodes import ELEMENTWISE, TensorDomain
from .utils import LogicalMap, contractions

GROUP = 64  # columns of one partial: one epilogue sub-tile's width
FRAGMENT = (8, 4, 2)  # a group's columns in the accumulator fragment: j (pairs), q (quad lane), e
OPS = ("sum", "max", "min")


# ------------------------------------------------------------- the rewrite
def partial_source(tv: TensorView):
    """The partial reduction ``tv`` is (or is a copy of), else None."""
    d = tv.definition
    if isinstance(d, LoadStoreOp) and d.kind == "set" and isinstance(d.inputs[0], TensorView):
        if d.inputs[0].domain.has_root and isinstance(d.inputs[0].definition, ReductionOp):
            return d.inputs[0]
    if isinstance(d, ReductionOp) and tv.domain.has_root:
        return tv
    return None


def is_partial(e) -> bool:
    """Whether expr ``e`` makes a row reduction's partials (or copies them)."""
    return partial_source(e.out) is not None


def tile_outputs(fusion: Fusion) -> list:
    """The fusion's outputs that are tiles of the matmul's output (not partials)."""
    return [o for o in fusion.outputs if partial_source(o) is None]


def _epilogue_chain(x: TensorView, c: TensorView) -> bool:
    """``x`` is made from ``c`` by elementwise ops and broadcasts of inputs alone."""
    seen, todo, reaches = set(), [x], False
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t is c:
            reaches = True
            continue
        d = t.definition
        if d is None:
            continue
        if not isinstance(d, (*ELEMENTWISE, BroadcastOp)):
            return False
        todo += d.tv_inputs()
    return reaches


def _candidates(fusion: Fusion) -> list:
    cs = contractions(fusion)
    if len(cs) != 1:
        return []
    c = cs[0].out
    if c.ndim != 2 or c.dtype not in (DataType.BFloat16, DataType.Half):
        return []
    a = cs[0].inputs[0]
    if a.dtype not in (DataType.BFloat16, DataType.Half) or not all(x.is_input for x in cs[0].tv_inputs()):
        return []
    lmap = LogicalMap(fusion)
    m_cls, n_cls = lmap.find(c.logical[0]), lmap.find(c.logical[1])
    out = []
    for r in fusion.exprs():
        if not isinstance(r, ReductionOp) or r.op_name not in OPS or r.out.domain.has_root:
            continue
        x = r.inputs[0]
        xs = x.domain.no_reductions()
        red = [i.is_reduction for i in r.out.logical]
        if (
            x.dtype != DataType.Float
            or len(xs) != 2
            or red != [False, True]
            or lmap.find(xs[0]) != m_cls
            or lmap.find(xs[1]) != n_cls
            or any(i.is_broadcast for i in xs)
            or not _epilogue_chain(x, c)
            or _meets_rows(fusion, r.out, lmap, n_cls)
        ):
            continue
        out.append(r)
    return out


def _meets_rows(fusion: Fusion, t: TensorView, lmap, n_cls) -> bool:
    """Whether what is computed from ``t`` meets tensors along N again (a
    layer norm's mean, a softmax's max): a kernel then reads the output's rows
    anyway (the normalization's), and partials would only add one."""
    live = {id(e) for e in fusion.exprs()}
    todo, seen = [t], set()
    while todo:
        u = todo.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if any(not i.is_broadcast and lmap.find(i) == n_cls for i in u.domain.no_reductions()):
            return True
        for e in u.uses:
            if id(e) in live:
                todo += e.outputs
    return False


def split_row_reductions(fusion: Fusion, env, target=None) -> Fusion | None:
    """A copy of ``fusion`` whose row reductions of the matmul's output
    (over N, of fp32 values made from it by elementwise ops) are split into
    the partials the matmul's epilogue computes and their reduction; None
    when there are none. Only where the tensor-core path runs the matmul: a
    bf16/fp16 2-D matmul of inputs, M, N, K > 0 in ``env`` (the segmenter's
    split is kept for every size with the same zeros); and not where split-K
    would run the matmul (asked, or the heuristic's for these sizes on
    ``target``): few output tiles, so little output to read again, and a K
    split cannot hold whole rows' partials."""
    if env is None or fusion.manual_schedule or not _candidates(fusion):
        return None
    e = contractions(fusion)[0]
    sizes = [e.out.logical[0].extent, e.out.logical[1].extent, e.inputs[0].logical[-1].extent]
    try:
        m, n, k = (evaluate(s, env) for s in sizes)
    except Exception:  # noqa: BLE001 - a size the inputs do not give: no split
        return None
    if min(m, n, k) <= 0 or fusion.schedule_overrides.get("split_k", 1) != 1:
        return None
    if _overrides_refuse(fusion.schedule_overrides):
        return None
    if target is not None:
        from .split_k import heuristic_splits

        if heuristic_splits(m, n, k, e.inputs[0].dtype.size, target) > 1:
            return None
    f = fusion.clone()
    c = contractions(f)[0].out
    # the reductions read c rounded, as the fusion defines it (through a copy the
    # matmul's epilogue does not rewire to its fp32 accumulator)
    readers = [u for u in c.uses if u in f.exprs() and isinstance(u, CastOp)]
    todo = [r for r in _candidates(f) if _private_chain(f, r, c, readers)]
    if not todo:
        return None
    for r in todo:
        x = r.inputs[0]
        _reread(f, x, c, readers)
        _split(f, r)
    return f


def _overrides_refuse(ov: dict) -> bool:
    """Overrides under which the matmul cannot hold the partials (:func:`check_params`),
    or skips the realign copy (``realign=False``: the cp.async fill, not measured with
    the partials): the fusion keeps its reduction whole."""
    tile, epi = ov.get("tile"), ov.get("epilogue_tile")
    return (
        ov.get("epilogue", "inline") != "inline"
        or ov.get("realign") is False
        or (
            isinstance(tile, (tuple, list))
            and len(tile) == 3
            and isinstance(tile[1], int)
            and tile[1] % GROUP != 0
        )
        or (isinstance(epi, (tuple, list)) and len(epi) == 2 and epi[1] != GROUP)
    )


def _computed_from(x: TensorView) -> set:
    """ids of ``x`` and every computed tensor it is made from."""
    chain, todo = set(), [x]
    while todo:
        t = todo.pop()
        if id(t) in chain or t.definition is None:
            continue
        chain.add(id(t))
        todo += t.definition.tv_inputs()
    return chain


def _private_chain(f: Fusion, r: ReductionOp, c: TensorView, readers: list) -> bool:
    """Whether the values from ``c``'s casts to ``r`` feed nothing but ``r``: no
    fusion output on the way and no other reader. The split makes the reduction
    read ``c`` rounded (:func:`_reread`); a value another output shares would be
    rounded for it too (an ``amax`` added beside a ``gelu`` output would change
    the gelu's values), so such a reduction stays whole."""
    chain = _computed_from(r.inputs[0])
    live = {id(e) for e in f.exprs()}
    outputs = {id(o) for o in f.outputs}
    todo = [u.out for u in readers if id(u.out) in chain]
    seen = set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) in outputs:
            return False
        for e in t.uses:
            if id(e) not in live or e is r:
                continue
            if not all(id(o) in chain for o in e.outputs):
                return False
            todo += e.outputs
    return True


def _reread(f: Fusion, x: TensorView, c: TensorView, readers: list) -> None:
    """Casts of ``c`` on ``x``'s chain read ``set(c)`` instead of ``c``."""
    chain = _computed_from(x)
    for u in readers:
        if id(u.out) in chain and c in u.inputs:
            copy = f.register(TensorView([i.fresh() for i in c.domain.no_reductions()], c.dtype))
            LoadStoreOp(copy, c)
            u.replace_input(c, copy)


def _split(f: Fusion, r: ReductionOp) -> TensorView:
    """``r.out = op(x, [1])`` -> ``p = partial op(x)``; ``r.out = op(p, [1, 2])``."""
    x, out = r.inputs[0], r.out
    m_ax, n_ax = x.domain.no_reductions()
    root = [IterDomain(m_ax.extent), IterDomain(n_ax.extent, IterType.Reduction)]
    g, n64 = split(root[1], GROUP)
    g.iter_type = IterType.Iteration
    j, n8 = exact_split(n64, Const(FRAGMENT[0]), Const(GROUP // FRAGMENT[0]))
    q, e = exact_split(n8, Const(FRAGMENT[1]), Const(FRAGMENT[2]))
    q.iter_type = IterType.Iteration
    p = f.register(TensorView([root[0], g, j, q, e], out.dtype))
    p.domain.root = root
    x.uses.remove(r)
    ReductionOp(r.op_name, p, x, r.init)
    out.domain = TensorDomain(
        [
            out.logical[0],
            IterDomain(g.extent, IterType.Reduction),
            IterDomain(Const(FRAGMENT[1]), IterType.Reduction),
        ],
        stride_order=out.domain.stride_order,
    )
    ReductionOp(r.op_name, out, p, r.init)
    return p


# ------------------------------------------------------------ scheduling
def check_params(fusion: Fusion, params) -> None:
    """The matmul schedules that can hold the partials: an inline epilogue of
    sub-tiles one group wide (64 columns), tiles a whole number of groups."""
    from ..ir import CircbufError

    if not any(partial_source(o) is not None for o in fusion.outputs):
        return
    bm, bn, bk = params.tile
    why = None
    if params.epilogue != "inline":
        why = f"schedule(epilogue={params.epilogue!r})", "an inline epilogue"
    elif bn % GROUP:
        why = f"schedule(tile={params.tile})", f"bn a multiple of {GROUP}"
    elif params.epilogue_tile[1] != GROUP:
        why = f"schedule(epilogue_tile={params.epilogue_tile})", f"sub-tiles {GROUP} columns wide"
    if why is not None:
        raise CircbufError(
            f"{why[0]}: a row reduction of the matmul's output computed in its epilogue needs {why[1]}"
        )


def schedule_partials(fusion: Fusion, params, tile_fn) -> set:
    """Loop nests for the partials, in the epilogue's sub-tile loop. For a
    cooperative tile (W warpgroups, Mb row blocks, Nc sub-tiles)::

        p_acc [T/G, G, W, Mb, Nc, TIDx{(w4 r8) q}, rj{8}, h{2}, re{2}]  ca_pos(TIDx)
        p     [T/G, G, W, Mb, Nc, TIDx{(w4 r8) q}, h{2}]

    ``p_acc`` (registers, one per fragment row h) accumulates the epilogue's
    values of a thread's 16 columns of a sub-tile row inside the epilogue's own
    ``j, h, e`` loops; ``p`` stores them, every thread its own (row, group,
    quad lane). ``tile_fn(tv, roles, params)`` is the matmul's tile loop split.
    Returns the ids of the tensors scheduled here."""
    done = set()
    for o in fusion.outputs:
        src = partial_source(o)
        if src is None:
            continue
        acc = o.cache_before() if src is o else src
        for tv, kind in ((acc, "acc"), (o, "store")):
            _partial_loops(tv, params, tile_fn, kind)
            done.add(id(tv))
        acc.inline_at(next(k for k, a in enumerate(acc.loop) if a.parallel_type == ParallelType.TIDx) + 1)
    return done


def _partial_loops(tv: TensorView, params, tile_fn, kind: str) -> None:
    """[M, G, (j), q, (e)] -> the epilogue's loops (see :func:`schedule_partials`)."""
    bm, bn, bk = params.tile
    roles = ["M", "N"] + ["-"] * (len(tv.loop) - 2)
    pos = tile_fn(tv, roles, dataclasses.replace(params, tile=(bm, bn // GROUP, bk)))
    # [.., Mi, Nc, (j), q, (e)]
    p = pos
    if not params.pingpong:
        tv.split(p, bm // 2)  # [W, Mw]
        tv.axis(p).parallelize(ParallelType.TIDy)
        p += 1
    tv.split(p, 64)  # [Mb, M64, Nc, ..]
    rest = list(range(p + 3, len(tv.loop)))
    tv.reorder(list(range(p)) + [p, p + 2, p + 1] + rest)  # [Mb, Nc, M64, ..]
    lead = 2
    if params.store_buffers > 1:  # as the epilogue's sub-tiles: [Mb, Nc/B, B, M64, ..]
        tv.split(p + 1, params.store_buffers)
        lead = 3
    m64 = p + lead
    tv.split(m64, 16)  # [w4, 16, ..]
    tv.split(m64 + 1, 8)  # [w4, h2, r8, ..]
    w4, h2, r8 = m64, m64 + 1, m64 + 2
    if kind == "acc":  # [.., w4, h2, r8, j, q, e]
        j, q, e = m64 + 3, m64 + 4, m64 + 5
        order = [w4, r8, q, j, h2, e]
    else:  # [.., w4, h2, r8, q]
        q = m64 + 3
        order = [w4, r8, q, h2]
    tv.reorder(list(range(m64)) + order)
    tv.merge(m64)  # w4 r8
    tv.merge(m64)  # (w4 r8) q: the warpgroup's 128 threads, as the accumulator's
    tv.axis(m64).parallelize(ParallelType.TIDx)
