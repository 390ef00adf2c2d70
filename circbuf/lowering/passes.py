"""The pass registry: what each lowering pass requires and provides.

A *fact* is a name for something true of a :class:`~circbuf.lowering.kir.Kernel`
at a point of the pipeline: a Kernel field holding a meaningful value
(``"tensor_maps"``, ``"consumer_barrier"``), or a property of the kernel IR
(``"indexed"``: no placed expr is left, every access has its index;
``"mbarriers_allocated"``). The loop nest (``generate_loop_nest`` and the
strides ``lower()`` sets next to it) provides :data:`LOOP_NEST_PROVIDES`;
each pass provides its own. ``lower()`` calls :func:`check_order` before
running anything, so a list of passes in the wrong order fails loudly instead
of lowering to a subtly wrong kernel.

A Kernel field in ``provides`` means the pass writes it (assigns it or
changes its contents); in ``requires``, that the pass reads the value an
earlier pass left there. A pass reads the loop nest's fields freely as long
as no earlier pass changed them (``tests/test_passes.py`` records the reads
and writes of every pass over kernels of every scheduler and holds the
declarations to them). A field in ``renames`` is one the pass rewrites under
new identifiers without changing what it says (the ``names`` pass: ring
``T7_T8`` becomes ``ab``): an earlier pass may require it, and a later pass
that reads it requires it, as after a change.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, fields

from .kir import Kernel


class PassOrderError(RuntimeError):
    """A list of passes whose order breaks their declared contract (an
    internal error: no user input can cause it)."""


@dataclass(frozen=True)
class Pass:
    """One lowering pass: ``fn(kernel) -> kernel``, with the facts it reads
    (``requires``) and establishes or changes (``provides``)."""

    name: str
    fn: Callable[[Kernel], Kernel]
    requires: tuple = ()
    provides: tuple = ()
    consumes: tuple = ()  # IR facts no longer true after it (indexing: the placed exprs are gone)
    # facts whose identifiers it renames without changing what they say (the names pass):
    # an earlier pass may have required them, a later one reads them under the new names
    renames: tuple = ()


# The Kernel fields whose values the passes hand on; ``body`` is the kernel IR
# itself, which every pass reads and rewrites: its state is told by IR facts.
KERNEL_FIELDS = tuple(f.name for f in fields(Kernel) if f.name != "body")

# What the loop nest hands the first pass: "loop_nest" (every fusion expr
# placed in its loops as an ExprStmt/ReductionInit/BlockReduce) and the
# fields generate_loop_nest and lower() set.
LOOP_NEST_PROVIDES = (
    "loop_nest",
    "name",
    "tensor_params",
    "scalar_params",
    "launch",
    "extent_bindings",
    "max_threads",
    "min_blocks",
    "circular_loops",
    "strides",
    "memory_orders",
    "index_type",
    "target",
    "mbarriers",
    "fast_math",
)


def check_order(passes) -> None:
    """Raise :class:`PassOrderError` naming the first pass that requires a
    fact neither the loop nest nor an earlier pass provides, one an earlier
    pass consumed, or one a later pass still changes (unless it changes it
    too: a shared table such as ``mbarriers``, which several passes add to).

    >>> def f(k):
    ...     return k
    >>> check_order([Pass("a", f, provides=("x",)), Pass("b", f, requires=("x",))])
    >>> try:
    ...     check_order([Pass("b", f, requires=("x",)), Pass("a", f, provides=("x",))])
    ... except PassOrderError as e:
    ...     print(str(e).split(" (")[0])
    lowering pass 'b' requires 'x', which neither the loop nest nor an earlier pass provides
    """
    have = set(LOOP_NEST_PROVIDES)
    gone: dict = {}
    for k, p in enumerate(passes):
        for fact in p.requires:
            if fact in gone:
                raise PassOrderError(
                    f"lowering pass {p.name!r} requires {fact!r}, which the earlier pass {gone[fact]!r} "
                    "consumed: it must run before it"
                )
            if fact not in have:
                raise PassOrderError(
                    f"lowering pass {p.name!r} requires {fact!r}, which neither the loop nest nor an "
                    f"earlier pass provides (passes in order: {', '.join(q.name for q in passes)})"
                )
            later = next((q for q in passes[k + 1 :] if fact in q.provides), None)
            if later is not None and fact not in p.provides:
                raise PassOrderError(
                    f"lowering pass {p.name!r} requires {fact!r}, which the later pass {later.name!r} "
                    "still changes: it must run after it"
                )
        have |= set(p.provides)
        for fact in p.consumes:
            have.discard(fact)
            gone[fact] = p.name


def contract_table(passes, width: int = 100) -> str:
    """The loop nest's and each pass's facts, a few lines each (the lowering
    package's docstring shows it; tests keep the two the same)."""
    out = []
    for name, req, prov, cons, ren in [("loop_nest", (), LOOP_NEST_PROVIDES, (), ())] + [
        (p.name, p.requires, p.provides, p.consumes, p.renames) for p in passes
    ]:
        head = f"{name:<16}"
        for what, facts in (("requires", req), ("provides", prov), ("consumes", cons), ("renames", ren)):
            if facts or what not in ("consumes", "renames"):
                text = f"{what}: {', '.join(facts) or '-'}"
                out += textwrap.wrap(text, width, initial_indent=head, subsequent_indent=" " * 26)
                head = " " * 16
    return "\n".join(out)
