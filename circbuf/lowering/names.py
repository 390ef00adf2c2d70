"""Pass: give buffers, rings, barriers and tile coordinates names that say what they are.

Requires: hoisted, synced, pipelined, mbarriers_allocated, named_barriers, descriptors, rings,
turn_orders, roles; provides: named, former_names; renames: rings, turn_orders, roles,
mbarriers, named_barriers, descriptors.

Until this pass every buffer carries its fusion tensor's number (``T9``), a
ring the numbers of its buffers (``T7_T8_full``), a loop index its loop's
(``j6``) and a hoisted value its loop's index and a counter (``j6_0``). This
pass renames them after their role in the kernel IR, never after the text:

* the accumulator a ``Wgmma`` adds into: ``acc``;
* a shared buffer that feeds operand A or B of a matmul (followed through the
  fusion's copies to the ``MmaOp``): ``a_stage`` / ``b_stage`` (``a_tile`` /
  ``b_tile`` when it has one stage); the source of a TMA store of an output:
  ``out_stage``; a copy of a matmul's result (the accumulator handed to an
  epilogue role): ``acc_stage``; a shared buffer filled from a fusion input: in a
  matmul kernel ``residual_stage`` (the input has the output's rank) or
  ``bias_stage`` (fewer axes), elsewhere ``x_stage`` (``y_stage``, ... for
  more inputs, in parameter order);
* a ring after the roles of its buffers (``ab``: ``ab_full``, ``ab_empty``,
  ``ab_load_stage``, ``ab_use_phase``), a turn order after its accumulator
  (``acc_mma_turn``), a named barrier after its purpose with the new names
  (``bar_consumers_store_out_stage``);
* the index of a persistent tile loop (a strided loop: start ``blockIdx.x``,
  step the grid): ``tile``;
* a hoisted value that is exactly the origin of the tile along the output's
  rows or columns (the coordinates of the output's TMA store with every inner
  loop index and thread index at 0, compared by evaluating both at sample
  points): ``tile_m`` / ``tile_n`` in a matmul, ``tile_row`` / ``tile_col``
  elsewhere; the origin plus an offset that depends on the thread only:
  ``row0`` / ``col0`` (where this thread's or warpgroup's part starts).

Names are unique (a second ``acc`` is ``acc_1``; a name the kernel already
uses is not taken) and valid C identifiers; the producer's and the consumers'
copies of one tile loop, in separate branches of the role switch, share
``tile`` and their coordinates' names. Whatever has no clear role keeps its
name (a register of the epilogue, a hoisted value that is no tile origin). ``kernel.former_names`` maps each
new buffer and barrier name to the old one, which codegen prints in a trailing
comment at the declaration (``float acc[128];  // T9``) so that a reader of
the CUDA can find the tensor in ``print_math()``. Comments and sync reasons
follow the new names. Everything else (interpreter and hang messages, the
launch info's barrier names) reads the renamed IR.

The renaming changes identifiers only: the earlier passes' facts (rings,
turn orders, barriers, descriptors) hold as they were, under new names
(``renames`` in the pass table, which :func:`~.passes.check_order` lets
earlier passes have required).

Before::

    FOR j6 in blockIdx.x..T step 132
      LET j6_0 = (((j6 / 8) % ceilDiv(i2, 256)) * 256)
      ALLOC T9_l_float[128]
      MBARRIER_WAIT T7_T8_full[T7_T8_use_stage] parity=T7_T8_use_phase
      WGMMA.m64n256k16 T9[0] += desc(T7+..) x desc(T8+..)
      TMA_STORE tmap2{j6_0 + j11 * 128, ...} <- T14[...]

After::

    FOR tile in blockIdx.x..T step 132
      LET tile_n = (((tile / 8) % ceilDiv(i2, 256)) * 256)
      ALLOC acc_l_float[128]
      MBARRIER_WAIT ab_full[ab_use_stage] parity=ab_use_phase
      WGMMA.m64n256k16 acc[0] += desc(a_stage+..) x desc(b_stage+..)
      TMA_STORE tmap2{tile_n + j11 * 128, ...} <- out_stage[...]
"""

from __future__ import annotations

import copy
import dataclasses
import random
import re

from ..ir import LoadStoreOp, MemoryType, TensorView, Var
from ..ir.nodes import MmaOp
from ..ir.scalar import Bin, Scalar, Un, evaluate, free_vars
from .kir import (
    Allocate,
    ForLoop,
    Kernel,
    Let,
    MBarrierRef,
    Node,
    Ring,
    RingSide,
    Role,
    TmaStore,
    TurnOrder,
    Wgmma,
    barrier_name,
    children,
    walk,
)

_RING_WORDS = ("full", "empty", "load", "use", "load_stage", "load_phase", "use_stage", "use_phase")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def readable_names(kernel: Kernel) -> Kernel:
    """Entry: rename the kernel's buffers, rings, barriers, tile loop indices
    and tile coordinates after their roles (the module docstring says which)."""
    taken = _identifiers(kernel)
    has_mma = _has_mma(kernel)
    tvs = _buffer_names(kernel, taken, has_mma)
    rings = _ring_names(kernel, tvs, taken)
    turns = {t.name: tvs[t.name] for t in kernel.turn_orders if t.name in tvs}
    words = {**rings, **tvs}
    purposes = {p: _retext(p, words) for p in kernel.named_barriers}
    purposes = {p: q for p, q in purposes.items() if q != p}
    scoped = _tile_names(kernel, taken, has_mma)
    variables: dict = {}
    bars: dict = {}  # old mbarrier array name -> new
    for r in kernel.rings:
        if r.name in rings:
            new = dataclasses.replace(r, name=rings[r.name], buffers=[tvs.get(b, b) for b in r.buffers])
            for old_arr, new_arr in zip(r.barriers(), new.barriers()):
                bars[old_arr[0]] = new_arr[0]
            for side, nside in ((r.load, new.load), (r.use, new.use)):
                variables[side.stage.name] = nside.stage.name
                variables[side.phase.name] = nside.phase.name
    for t in kernel.turn_orders:
        if t.name in turns:
            new = dataclasses.replace(t, name=turns[t.name])
            for old_arr, new_arr in zip(t.barriers(), new.barriers()):
                bars[old_arr[0]] = new_arr[0]
            variables[t.side.stage.name] = new.side.stage.name
            variables[t.side.phase.name] = new.side.phase.name
    for p, q in purposes.items():
        variables[barrier_name(p)] = barrier_name(q)
    for n in [*tvs.values(), *bars.values(), *variables.values()] + [
        v for _, m in scoped for v in m.values()
    ]:
        assert _IDENT.match(n), n
    # a tile loop's index and LETs are its own (each role's copy of the loop has the same
    # names): renamed within the loop only
    for loop, names in scoped:
        _Renamer({}, {}, {}, {}, names, {}).node(loop)
    r = _Renamer(tvs, rings, turns, bars, variables, {**words, **bars})
    # the rings and turn orders first: the body's RingInit/RingAdvance nodes hold their sides
    kernel.rings = [r.obj(x) for x in kernel.rings]
    kernel.turn_orders = [r.obj(x) for x in kernel.turn_orders]
    kernel.roles = [r.obj(x) for x in kernel.roles]
    kernel.body = r.nodes(kernel.body)
    kernel.mbarriers = [(bars.get(n, n), c, r.obj(a)) for n, c, a in kernel.mbarriers]
    kernel.named_barriers = {purposes.get(p, p): v for p, v in kernel.named_barriers.items()}
    kernel.descriptors = {tvs.get(n, n): d for n, d in kernel.descriptors.items()}
    former = {new: old for old, new in {**tvs, **bars}.items()}
    kernel.former_names = former
    return kernel


# ----------------------------------------------------------------- roles
def _identifiers(kernel: Kernel) -> set:
    """The identifiers in use (parameters, barriers, every variable and buffer
    of the kernel IR): new names avoid them."""
    out = {p.tv.name for p in kernel.tensor_params} | {v.name for v in kernel.scalar_params}
    out |= {n for n, _, _ in kernel.all_mbarriers()} | {barrier_name(p) for p in kernel.named_barriers}
    seen: set = set()

    def visit(v):
        if isinstance(v, Scalar):
            out.update(free_vars(v))
        elif isinstance(v, TensorView):
            out.add(v.name)
        elif isinstance(v, RingSide):
            out.update({v.name, v.stage.name, v.phase.name})
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type) and id(v) not in seen:
            seen.add(id(v))
            for f in dataclasses.fields(v):
                visit(getattr(v, f.name))

    visit(kernel.body)
    return out


def _has_mma(kernel: Kernel) -> bool:
    """Whether the kernel computes a matmul (its buffers feed or hold an MmaOp)."""
    found = []

    def visit(n, _stack):
        if isinstance(n, Wgmma) or (
            isinstance(n, Allocate)
            and (isinstance(n.tv.definition, MmaOp) or any(isinstance(u, MmaOp) for u in n.tv.uses))
        ):
            found.append(n)

    walk(kernel.body, visit)
    return bool(found)


def _unique(base: str, taken: set) -> str:
    name, k = base, 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    taken.add(name)
    return name


def _operand_of_mma(tv: TensorView, depth: int = 4):
    """ "a" or "b": the operand of a matmul this buffer feeds, through copies; or None."""
    for use in tv.uses:
        if isinstance(use, MmaOp):
            k = next((k for k, x in enumerate(use.inputs) if x is tv), None)
            return "ab"[k] if k in (0, 1) else None
        if isinstance(use, LoadStoreOp) and depth > 0:
            got = _operand_of_mma(use.out, depth - 1)
            if got:
                return got
    return None


def _copies_accumulator(tv: TensorView, depth: int = 4) -> bool:
    """Whether a buffer is a copy (through copies) of a matmul's result: the
    accumulator's values handed on (to an epilogue role)."""
    d = tv.definition
    while depth > 0 and d is not None:
        if isinstance(d, MmaOp):
            return True
        if not isinstance(d, LoadStoreOp) or not isinstance(d.inputs[0], TensorView):
            return False
        d = d.inputs[0].definition
        depth -= 1
    return False


def _source_input(tv: TensorView, depth: int = 4):
    """The fusion input a buffer copies (through copies), or None."""
    d = tv.definition
    while isinstance(d, LoadStoreOp) and depth > 0:
        src = d.inputs[0]
        if isinstance(src, TensorView) and src.memory_type == MemoryType.Global:
            return src if src.is_input else None
        d = src.definition if isinstance(src, TensorView) else None
        depth -= 1
    return None


def _buffer_names(kernel: Kernel, taken: set, has_mma: bool) -> dict:
    """Old tensor name -> new, for the buffers whose role is clear."""
    allocs = {}
    walk(kernel.body, lambda n, _s: allocs.setdefault(n.tv.name, n) if isinstance(n, Allocate) else None)
    accs, stored = [], []

    def visit(n, _stack):
        if isinstance(n, Wgmma) and n.acc.tv.name not in accs:
            accs.append(n.acc.tv.name)
        if isinstance(n, TmaStore) and n.src.tv.name not in stored:
            stored.append(n.src.tv.name)

    walk(kernel.body, visit)
    out_params = [p.tv for p in kernel.tensor_params if p.is_output]
    out_rank = max((t.ndim for t in out_params), default=0)
    names: dict = {}
    for name in accs:
        names[name] = "acc"
    for name in stored:
        if name in allocs and name not in names:
            names[name] = "out_stage"
    inputs = []
    for name, a in allocs.items():
        if a.memory != MemoryType.Shared or name in names:
            continue
        op = _operand_of_mma(a.tv)
        if op is not None:
            names[name] = f"{op}_stage" if a.stages > 1 else f"{op}_tile"
            continue
        if _copies_accumulator(a.tv):
            names[name] = "acc_stage" if a.stages > 1 else "acc_tile"
            continue
        src = _source_input(a.tv)
        if src is not None:
            inputs.append((name, src, a))
    params = [p.tv for p in kernel.tensor_params]
    inputs.sort(key=lambda x: params.index(x[1]) if x[1] in params else len(params))
    letters = "xyzuvw"
    seen_inputs: list = []
    for name, src, a in inputs:
        if has_mma:
            role = "residual" if src.ndim >= out_rank else "bias"
        else:
            if src not in seen_inputs:
                seen_inputs.append(src)
            k = seen_inputs.index(src)
            role = letters[k] if k < len(letters) else f"in{k}"
        names[name] = f"{role}_stage" if a.stages > 1 else f"{role}_tile"
    return {old: _unique(new, taken) for old, new in names.items()}


def _ring_names(kernel: Kernel, tvs: dict, taken: set) -> dict:
    """A ring after its buffers' roles: a_stage + b_stage -> ``ab``, x_stage -> ``x``."""
    out = {}
    for r in kernel.rings:
        roles = [tvs.get(b, "").rsplit("_", 1)[0] for b in r.buffers]
        if not roles or not all(roles):
            continue
        base = "".join(roles) if all(len(x) == 1 for x in roles) else "_".join(roles)
        name, k = base, 1
        while any(f"{name}_{s}" in taken for s in _RING_WORDS):  # its names, not the base, must be new
            name, k = f"{base}_{k}", k + 1
        taken.update(f"{name}_{s}" for s in _RING_WORDS)
        out[r.name] = name
    return out


# ------------------------------------------------------ tile coordinates
def _tile_loops(nodes, found=None) -> list:
    """The persistent tile loops: strided loops, the outermost of each nest."""
    found = [] if found is None else found
    for n in nodes:
        if isinstance(n, ForLoop) and n.strided:
            found.append(n)
            continue
        for sub in children(n):
            _tile_loops(sub, found)
    return found


def _origin_coords(kernel: Kernel, loops: list) -> dict:
    """``"row"``/``"col"`` -> (tile loop, TmaStore coordinate, enclosing nodes):
    where the output's TMA stores put their boxes along its last two axes (a
    box's coordinates are innermost first: on a row-major output, one per axis
    from the last)."""
    out = {}
    for loop in loops:

        def visit(n, stack, loop=loop):
            if not isinstance(n, TmaStore) or not isinstance(n.out, TensorView):
                return
            nd = n.out.ndim
            order = kernel.memory_orders.get(n.out.name)
            if len(n.coords) != nd or nd < 2 or (order is not None and list(order) != list(range(nd))):
                return
            out.setdefault("col", (loop, n.coords[0], stack))
            out.setdefault("row", (loop, n.coords[1], stack))

        walk(loop.body, visit, [loop])
    return out


def _lets(loop: ForLoop) -> list:
    return [n for n in loop.body if isinstance(n, Let)]


def _env_for(loop: ForLoop, stack: list, sample: dict, zero_threads: bool) -> dict:
    """Variable values at one sample point: the tile index from the sample,
    every loop inside the tile loop at 0, threads from the sample (or 0), the
    tile loop's LETs computed in order."""
    env = dict(sample)
    env[loop.index.name] = sample["cb_tile"]
    if zero_threads:
        for k in list(env):
            if k.startswith("threadIdx."):
                env[k] = 0
    for n in stack:
        if isinstance(n, ForLoop) and n is not loop:
            env[n.index.name] = 0
    for let in _lets(loop):
        env[let.var.name] = evaluate(let.value, env)
    return env


def _samples(exprs: list, count: int = 24) -> list:
    rng = random.Random(17)
    names = set()
    for e in exprs:
        names |= set(free_vars(e))
    out = []
    for _ in range(count):
        s = {"cb_tile": rng.randrange(0, 1 << 16)}
        for v in names:
            if v.startswith("threadIdx."):
                s[v] = rng.randrange(0, 128)
            elif v.startswith(("blockIdx.", "gridDim.", "blockDim.")):
                s[v] = rng.randrange(0, 1 << 10)  # (sample points: any grid, no GPU's size)
            else:
                s[v] = rng.randrange(1, 1 << 14)
        s.setdefault("threadIdx.x", rng.randrange(0, 128))
        s.setdefault("threadIdx.y", rng.randrange(0, 3))
        out.append(s)
    return out


def _tile_names(kernel: Kernel, taken: set, has_mma: bool) -> list:
    """Per tile loop, (loop, old variable name -> new): its index (``tile``)
    and the hoisted values that are the tile's origin (``tile_m``) or a
    thread's start in it (``row0``)."""
    loops = _tile_loops(kernel.body)
    if not loops:
        return []
    tile = _unique("tile", taken)
    out = [(loop, {loop.index.name: tile}) for loop in loops]
    origins = _origin_coords(kernel, loops)
    if not origins:
        return out
    exact = {"row": "tile_m" if has_mma else "tile_row", "col": "tile_n" if has_mma else "tile_col"}
    offset = {"row": "row0", "col": "col0"}
    exprs = [e for _, e, _ in origins.values()] + [x.value for lp in loops for x in _lets(lp)]
    exprs += [x.var for lp in loops for x in _lets(lp)]
    samples = _samples(exprs)
    # names are per tile loop (each role's loop has its own LETs); one name per role in a loop
    base_taken = set(taken)
    for loop, names in out:
        used = set(base_taken)
        for let in _lets(loop):
            for axis, (oloop, coord, ostack) in origins.items():
                got = _compare(loop, let, oloop, coord, ostack, samples)
                if got is None:
                    continue
                names[let.var.name] = _unique(exact[axis] if got == "exact" else offset[axis], used)
                break
        taken |= used
    return out


def _compare(loop, let, oloop, coord, ostack, samples):
    """ "exact" if ``let`` is the origin ``coord`` at every sample, "offset" if
    it is with the thread indices at 0 but not always, else None."""
    lets = _lets(loop)
    upto = lets[: lets.index(let) + 1]
    try:
        same, same0 = True, True
        for s in samples:
            o = evaluate(coord, _env_for(oloop, ostack, s, zero_threads=True))
            v = _eval_let(loop, upto, s, zero_threads=False)
            v0 = _eval_let(loop, upto, s, zero_threads=True)
            same &= v == o
            same0 &= v0 == o
            if not same0:
                return None
    except (KeyError, ZeroDivisionError, TypeError):
        return None
    return "exact" if same else "offset"


def _eval_let(loop, lets, sample, zero_threads):
    env = dict(sample)
    env[loop.index.name] = sample["cb_tile"]
    if zero_threads:
        for k in list(env):
            if k.startswith("threadIdx."):
                env[k] = 0
    for let in lets:
        env[let.var.name] = evaluate(let.value, env)
    return env[lets[-1].var.name]


# ------------------------------------------------------------- rewriting
def _retext(text: str, words: dict) -> str:
    """``text`` with each whole word in ``words`` replaced (comments, purposes)."""
    if not words:
        return text
    pat = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r")\b")
    return pat.sub(lambda m: words[m.group(1)], text)


class _Renamer:
    """Rebuilds the IR's names: nodes are changed in place, the objects the
    Kernel's fields hold (rings, turn orders, roles) are replaced by renamed
    copies, and each TensorView renamed is a copy (the fusion's own keeps its
    name)."""

    def __init__(self, tvs, rings, turns, bars, variables, words):
        self.tvs, self.rings, self.turns, self.bars = tvs, rings, turns, bars
        self.vars = variables
        self.words = words
        self.memo: dict = {}

    def nodes(self, nodes: list) -> list:
        for n in nodes:
            self.node(n)
        return nodes

    def node(self, n):
        if id(n) in self.memo:
            return
        self.memo[id(n)] = n
        for f in dataclasses.fields(n):
            v = getattr(n, f.name)
            if f.name in ("text", "reason", "why") and isinstance(v, str):
                nv = _retext(v, self.words)
            elif f.name == "name" and isinstance(v, str):
                nv = self.bars.get(v, v)
            else:
                nv = self.obj(v)
            if nv is not v:
                setattr(n, f.name, nv)

    def scalar(self, e):
        if isinstance(e, Var):
            new = self.vars.get(e.name)
            return dataclasses.replace(e, name=new) if new is not None else e
        if isinstance(e, Bin):
            a, b = self.scalar(e.a), self.scalar(e.b)
            return e if a is e.a and b is e.b else dataclasses.replace(e, a=a, b=b)
        if isinstance(e, Un):
            a = self.scalar(e.a)
            return e if a is e.a else dataclasses.replace(e, a=a)
        return e

    def obj(self, v):
        """``v`` with its names replaced (the same object when none changes)."""
        if isinstance(v, Scalar):
            return self.scalar(v)
        if isinstance(v, (list, tuple)):
            items = [self.obj(x) for x in v]
            if all(a is b for a, b in zip(items, v)):
                return v
            return type(v)(items) if isinstance(v, list) else tuple(items)
        if isinstance(v, TensorView):
            if v.name not in self.tvs:
                return v
            got = self.memo.get(id(v))
            if got is None:
                got = copy.copy(v)
                got.name = self.tvs[v.name]
                self.memo[id(v)] = got
            return got
        if isinstance(v, Node):
            self.node(v)
            return v
        if isinstance(v, Ring):
            return self._memo(v, lambda: self._ring(v))
        if isinstance(v, TurnOrder):
            return self._memo(v, lambda: self._turns(v))
        if isinstance(v, RingSide):
            return self.memo.get(id(v), v)
        if isinstance(v, Role):
            return self._memo(v, lambda: dataclasses.replace(v, barrier=self.obj(v.barrier)))
        if isinstance(v, MBarrierRef):
            return self._memo(
                v, lambda: dataclasses.replace(v, name=self.bars.get(v.name, v.name), stage=self.obj(v.stage))
            )
        if (
            dataclasses.is_dataclass(v)
            and not isinstance(v, type)
            and type(v).__module__.startswith(__package__)
        ):
            # TensorRef, MmaOperand and the like: kernel IR data
            def rebuilt():
                changes = {}
                for f in dataclasses.fields(v):
                    x = getattr(v, f.name)
                    nx = self.obj(x)
                    if nx is not x:
                        changes[f.name] = nx
                if not changes:
                    return v
                out = copy.copy(v)
                for k, x in changes.items():
                    setattr(out, k, x)
                return out

            return self._memo(v, rebuilt)
        return v

    def _memo(self, v, make):
        got = self.memo.get(id(v))
        if got is None:
            got = make()
            self.memo[id(v)] = got
        return got

    def _ring(self, r: Ring) -> Ring:
        if r.name not in self.rings:
            return r
        new = copy.copy(r)
        new.name = self.rings[r.name]
        new.buffers = [self.tvs.get(b, b) for b in r.buffers]
        new.load = RingSide(f"{new.name}_load", r.stages)
        new.use = RingSide(f"{new.name}_use", r.stages)
        self.memo[id(r.load)], self.memo[id(r.use)] = new.load, new.use
        return new

    def _turns(self, t: TurnOrder) -> TurnOrder:
        if t.name not in self.turns:
            return t
        new = copy.copy(t)
        new.name = self.turns[t.name]
        new.side = RingSide(f"{new.name}_turn", t.side.stages)
        self.memo[id(t.side)] = new.side
        return new
