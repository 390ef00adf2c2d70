"""Pass: split a warp-specialized kernel's threads into warp roles.

Requires: allocated; provides: roles, role_switch, launch, max_threads, min_blocks.

A kernel whose shared buffers are marked ``WarpSpecialized`` gets one more
row of threads (``threadIdx.y == Y``), the ``producer`` role, which will
issue the buffers' copies; the rows below it are the ``consumers`` role,
which computes. Each role carries its ``setmaxnreg`` count. When the rows
split the work between them (the readers' tile loop starts at a
``threadIdx.y``-dependent tile, as ping-pong warpgroups do) the consumers
have one sync group per row. The pass only partitions the threads: the
producer's branch holds its register setting and nothing else yet (the
circular-buffer pass moves the copies there); every later pass sees the
roles (``kernel.roles``) and places its barriers per role.

Before::

    ALLOC T7_s (shared, WarpSpecialized)      // launch: block(128, 2)
    FOR t ..: FOR k ..: TMA_LOAD T7_s ...     // the copies' own nest
    FOR t ..: ... reads T7_s ...              // the readers

After::

    ALLOC T7_s (shared, WarpSpecialized)      // launch: block(128, 3)
    ROLES
      ROLE producer: threadIdx.y == 2 (128 threads), setmaxnreg.dec 40
        SETMAXNREG.DEC 40
      ROLE consumers: threadIdx.y in 0..2 (256 threads), setmaxnreg.inc 232
        SETMAXNREG.INC 232
        FOR t ..: FOR k ..: TMA_LOAD T7_s ...
        FOR t ..: ... reads T7_s ...
"""

from __future__ import annotations

from ..ir import CircbufError, Const, ParallelType, Var, WarpSpecialized
from ..ir.scalar import free_vars, substitute
from .kir import (
    Allocate,
    Assign,
    Comment,
    ForLoop,
    IfThenElse,
    Kernel,
    Role,
    RoleSwitch,
    SetMaxNReg,
    TensorRef,
    Wgmma,
    walk,
)


def _ws_allocations(kernel) -> list:
    allocs = []
    walk(
        kernel.body,
        lambda n, _s: (
            allocs.append(n)
            if isinstance(n, Allocate)
            and n.tv.name in kernel.circular_loops
            and isinstance(n.tv.circular[2], WarpSpecialized)
            else None
        ),
    )
    return allocs


def _rows_split_the_work(nodes, tvs) -> bool:
    """Whether a serial loop around a read of ``tvs`` starts at a position
    that depends on ``threadIdx.y`` (each row reads its own positions)."""
    found = []

    def reads(n) -> bool:
        if isinstance(n, Wgmma):
            return n.a.tv in tvs or n.b.tv in tvs
        return isinstance(n, Assign) and any(isinstance(o, TensorRef) and o.tv in tvs for o in n.operands)

    def visit(n, stack):
        if not found and reads(n):
            loops = [lp for lp in stack if isinstance(lp, ForLoop) and lp.ptype == ParallelType.Serial]
            found.append(any(ParallelType.TIDy.value in free_vars(lp.start) for lp in loops))

    walk(nodes, visit)
    return bool(found and found[0])


def _relative_to_role(nodes, axis, lo):
    """A role's own loop nests see thread indices relative to its first row:
    ``threadIdx.y`` becomes ``threadIdx.y - lo`` in every index, condition and
    loop bound (the predicate pass made "row 0 of the block writes" out of
    an output no row splits; in the role it is the role's first row)."""
    v = axis.value
    sub = {v: Var(v) - lo}

    def ref(r):
        if isinstance(r, TensorRef) and v in free_vars(r.index):
            r.index = substitute(r.index, sub)

    def fix(n, _s):
        if isinstance(n, Assign):
            ref(n.lhs)
            for o in n.operands:
                ref(o)
        elif isinstance(n, IfThenElse):
            n.cond = substitute(n.cond, sub)
        elif isinstance(n, ForLoop):
            n.extent, n.start, n.step = (substitute(x, sub) for x in (n.extent, n.start, n.step))

    walk(nodes, fix)


def _reads_any(node, tvs) -> bool:
    hit = []

    def visit(n, _s):
        if isinstance(n, Assign) and any(isinstance(o, TensorRef) and o.tv in tvs for o in n.operands):
            hit.append(n)

    walk([node], visit)
    return bool(hit)


def assign_roles(kernel: Kernel) -> Kernel:
    """Entry: the producer and consumer roles of a warp-specialized kernel (see module doc)."""
    every = _ws_allocations(kernel)
    if not every:
        return kernel
    # buffers the computing threads fill for a role of readers of their own
    handed = [a for a in every if a.tv.circular[2].fill == "threads"]
    allocs = [a for a in every if a.tv.circular[2].fill != "threads"]
    if not allocs:
        raise CircbufError(
            f"{handed[0].tv.name}: a threads-filled ring hands over the work of a warp-specialized "
            "kernel's consumers; this kernel has no TMA-filled warp-specialized ring"
        )
    names = [a.tv.name for a in allocs]
    if len(every) != len(kernel.circular_loops):
        raise CircbufError("a kernel's circular buffers must all be warp-specialized, or none")
    # one producer row serves every ring: their kinds (its register count) agree;
    # stage counts are each ring's own (the circular-buffer pass groups buffers into rings)
    kinds = {a.tv.circular[2] for a in allocs}
    if len(kinds) != 1:
        raise CircbufError(
            f"warp-specialized buffers {', '.join(names)} are filled by one producer row: "
            "they must share one WarpSpecialized type (its thread axis and register counts)"
        )
    kind = kinds.pop()
    label = "_".join(names) if len(names) > 1 else names[0]
    if kind.on != ParallelType.TIDy:
        raise CircbufError(f"{names[0]}: WarpSpecialized(on={kind.on.name}) is not supported yet (use TIDy)")
    y, tx = kernel.launch.get(ParallelType.TIDy, Const(1)), kernel.launch.get(ParallelType.TIDx, Const(1))
    if kernel.launch.get(ParallelType.TIDz, Const(1)) != Const(1):
        raise CircbufError(
            f"{label}: a warp-specialized kernel's threads are rows of threadIdx.y (no threadIdx.z)"
        )
    if not isinstance(y, Const) or not isinstance(tx, Const):
        raise CircbufError(f"{label}: warp specialization needs constant thread extents")
    consumers = y.value * tx.value
    if kind.registers and tx.value % 128:
        raise CircbufError(
            f"{label}: WarpSpecialized(registers=...) uses setmaxnreg, which acts on whole warpgroups: "
            f"each threadIdx.y row must be a multiple of 128 threads, not {tx.value}"
        )
    readers = sorted({a.tv.circular[2].readers for a in handed})
    extra = len(readers)  # one row of threads per role of readers
    kernel.launch[ParallelType.TIDy] = Const(y.value + 1 + extra)  # the producer row (and readers')
    kernel.max_threads = consumers + tx.value * (1 + extra)
    limit = kernel.target.max_threads_per_block
    if kernel.max_threads > limit:
        raise CircbufError(f"{label}: {kernel.max_threads} threads with the producer row exceed {limit}")
    regs = kind.registers or (None, None)
    producer = Role("producer", y.value, y.value + 1, tx.value, regs[0], increase=False)
    compute = Role("consumers", 0, y.value, consumers, regs[1], increase=True)
    tvs = [a.tv for a in allocs]
    if y.value > 1 and _rows_split_the_work(kernel.body, tvs):
        compute.groups = y.value  # ping-pong warpgroups: each syncs on its own
    kernel.roles += [producer, compute]
    if kind.registers:
        kernel.min_blocks = 1  # setmaxnreg needs a register cap at entry
    # shared buffers are seen by every role: declared before the split
    smem = [n for n in kernel.body if isinstance(n, Allocate) and n.memory.name == "Shared"]
    rest = [n for n in kernel.body if not any(n is m for m in smem)]
    bodies = [[], rest]
    if kind.registers:
        bodies[0].insert(0, SetMaxNReg(regs[0], increase=False))
        bodies[1].insert(0, SetMaxNReg(regs[1], increase=True))
    roles = [producer, compute]
    for k, name in enumerate(readers):
        # the loop nests that read the role's buffers (and write none of them) are its own
        mine = [a.tv for a in handed if a.tv.circular[2].readers == name]
        nests = [n for n in rest if isinstance(n, ForLoop) and _reads_any(n, mine)]
        if not nests:
            raise CircbufError(f"{mine[0].name}: no loop nest of its own reads it (the {name} role's work)")
        for n in nests:
            rest.remove(n)
        row = y.value + 1 + k
        _relative_to_role(nests, ParallelType.TIDy, row)
        r = {a.tv.circular[2].registers for a in handed if a.tv.circular[2].readers == name}
        if len(r) != 1:
            raise CircbufError(f"the buffers the {name} role reads ask for different register counts")
        r = r.pop()
        entry = kernel.target.registers_at(kernel.max_threads)  # what each thread starts with
        role = Role(name, row, row + 1, tx.value, r, increase=r is not None and r > entry)
        kernel.roles.append(role)
        roles.append(role)
        bodies.append(([SetMaxNReg(r, increase=role.increase)] if r else []) + nests)
    what = f"threadIdx.y == {y.value} loads {', '.join(names)}, " + "".join(
        f"threadIdx.y == {y.value + 1 + k} runs the {n} role, " for k, n in enumerate(readers)
    )
    kernel.body = [
        *smem,
        Comment(f"warp roles: {what}the other rows compute"),
        RoleSwitch(roles, bodies),
    ]
    return kernel
