"""Picks a scheduler for a fusion and applies it.

>>> # params = schedule(fusion, info, overrides)   # mutates ``fusion``

A scheduler is a class with ``name``, ``can_schedule``, ``compute_params``,
``variant`` (which kernel its params describe) and ``schedule``, listed in
:data:`SCHEDULERS` with the override names it takes (its table in
:mod:`.overrides`); an optional ``renamed`` dict maps deprecated override names
to current ones, and an optional ``if_spilled(params, overrides, target)`` names
the params to compile instead when ptxas spilled the kernel to local memory.
"""

from __future__ import annotations

import warnings

from ..ir import CircbufError, Fusion, ReductionOp
from . import matmul, normalization, outer_reduction, pointwise, pointwise_tma, reduction
from .empty_k import empty_k
from .info import InputInfo
from .overrides import TABLES, Declined
from .segmenter import operands_share_a_tensor, reads_one_tensor_twice
from .utils import check_aliases, check_distinct_axes, prepare, untangle_inlining

SCHEDULERS = [
    (matmul.MatmulScheduler, matmul.OVERRIDES),
    (normalization.NormalizationScheduler, normalization.OVERRIDES),
    (outer_reduction.OuterReductionScheduler, outer_reduction.OVERRIDES),
    (reduction.ReductionScheduler, reduction.OVERRIDES),
    (pointwise_tma.PointwiseTmaScheduler, pointwise_tma.OVERRIDES),
    (pointwise.PointwiseScheduler, pointwise.OVERRIDES),
]


class Unschedulable(CircbufError):
    """No one scheduler takes the whole fusion (the compile driver segments it)."""


def stray_zero_dim_output(fusion: Fusion) -> str | None:
    """Why no kernel with a grid takes ``fusion``: a 0-dim output that no
    reduction made (a copy or math of a 0-dim input) beside outputs with axes
    would be written by every CTA; it is a one-thread kernel of its own. A
    0-dim reduction result is written once (one thread writes ``out[0]``)."""
    if all(o.ndim == 0 for o in fusion.outputs):
        return None

    def reduced(t, seen) -> bool:
        e = t.definition
        if e is None or id(e) in seen:
            return False
        seen.add(id(e))
        return isinstance(e, ReductionOp) or any(reduced(p, seen) for p in e.tv_inputs())

    for o in fusion.outputs:
        if o.ndim == 0 and not reduced(o, set()):
            return f"0-dim output {o.name} is no reduction's result, beside outputs with axes (a kernel of its own)"
    return None


def can_schedule(sched, fusion: Fusion) -> str | None:
    """``sched.can_schedule`` after the rules every scheduler shares."""
    return stray_zero_dim_output(fusion) or sched.can_schedule(fusion)


def candidates(fusion: Fusion):
    """Schedulers that accept the fusion's structure, in order of preference;
    raises :class:`Unschedulable` when none does."""
    reasons, out = [], []
    for sched, overrides in SCHEDULERS:
        why = can_schedule(sched, fusion)
        if why is None:
            out.append((sched, overrides))
        else:
            reasons.append(f"{sched.name}: {why}")
    if not out:
        raise Unschedulable("no scheduler can take this fusion (" + "; ".join(reasons) + ")")
    return out


def _rename(scheds, overrides: dict):
    """Deprecated override names -> current ones, for the schedulers ``scheds``
    (a name one of them takes as it is is left alone). Returns the overrides
    and a message per renamed name."""
    takes = set().union(*(set(a) for _, a in scheds))
    out, notes = {}, []
    for k, v in overrides.items():
        owner = next((s for s, _ in scheds if k in getattr(s, "renamed", {})), None)
        if owner is not None and k not in takes:
            new = owner.renamed[k]
            if new in overrides:
                raise CircbufError(f"schedule(): {k} is the old name of {new}; give only {new}")
            notes.append(
                f"schedule({k}=...): the {owner.name} scheduler's override {k} is now {new}; "
                f"the old name will be removed in the next release"
            )
            k = new
        out[k] = v
    return out, notes


def deprecated_names() -> set:
    """Every deprecated override name some scheduler still renames (with a warning)."""
    return {k for entry in SCHEDULERS for k in getattr(entry[0], "renamed", {})}


def check_overrides(fusion: Fusion, overrides: dict):
    """Check overrides when ``fusion.schedule(**overrides)`` is called: a name no
    scheduler that can take ``fusion`` takes raises, listing what they take; a
    value no such scheduler allows (type, range) raises with the rule. Returns the
    overrides with deprecated names renamed, and a deprecation message per renamed
    name. (Rules that depend on the inputs are checked at compile.)

    >>> import circbuf as cb
    >>> with cb.FusionDefinition() as fd:
    ...     fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
    >>> check_overrides(fd.fusion, {"vectorize": 4})
    ({'vectorize': 4}, [])
    >>> check_overrides(fd.fusion, {"bogus": 1})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    circbuf.ir.errors.CircbufError: schedule(bogus=...): no scheduler of this fusion takes bogus; ...
    >>> check_overrides(fd.fusion, {"threads": 0})
    Traceback (most recent call last):
    ...
    circbuf.ir.errors.CircbufError: schedule(threads=0): must be a power of two in [32, 1024]
    """
    try:
        scheds, who = candidates(fusion), "no scheduler of this fusion"
    except CircbufError:  # not schedulable (yet): the compile says why; check names against all
        scheds, who = SCHEDULERS, "no scheduler"
    overrides, notes = _rename(scheds, overrides)
    _check_names(scheds, overrides, who)
    check_values(scheds, overrides)
    return overrides, notes


def _check_names(scheds, overrides: dict, who: str):
    takes = set().union(*(set(a) for _, a in scheds))
    unknown = [k for k in overrides if k not in takes]
    if unknown:
        named = []
        for k in unknown:
            others = [s.name for s, a in SCHEDULERS if k in a]
            named.append(f"{k} (an override of {' and '.join(others)})" if others else k)
        lists = "; ".join(f"the {s.name} scheduler takes {', '.join(a)}" for s, a in scheds)
        raise CircbufError(f"schedule({'=..., '.join(unknown)}=...): {who} takes {', '.join(named)}; {lists}")


def check_values(scheds, overrides: dict):
    """Each value allowed by the table of some scheduler in ``scheds`` that takes
    its name (the one chosen at compile checks its own rule again)."""
    for k, v in overrides.items():
        rules = [TABLES[s.name][k] for s, _ in scheds if k in TABLES[s.name]]
        whys = [o.why(v) for o in rules]
        if rules and all(whys):
            raise CircbufError(whys[0])


def compute_params(fusion: Fusion, info: InputInfo, overrides: dict):
    """Heuristics for ``fusion`` on these inputs, with user overrides applied.
    The candidates are asked in order of preference, each that takes every name
    given; one may decline these inputs (the next is asked). An override the
    chosen kernel does not use raises, naming the override and the kernel."""
    why = reads_one_tensor_twice(fusion) or empty_k(fusion, info.extents)
    if why is not None:
        raise Unschedulable(why)
    try:
        check_distinct_axes(fusion)
    except CircbufError as e:
        why = operands_share_a_tensor(fusion)
        if why is None:
            raise
        raise Unschedulable(f"{e}; {why}") from None
    cands = candidates(fusion)  # first: a fusion no one scheduler takes is segmented, each segment checked
    check_aliases(fusion)
    overrides, notes = _rename(cands, overrides)  # fusions not built by a FusionDefinition
    for note in notes:
        warnings.warn(note, DeprecationWarning, stacklevel=2)
    _check_names(cands, overrides, "no scheduler of this fusion")
    check_values(cands, overrides)
    declined = []
    for k, (sched, allowed) in enumerate(cands):
        last = k == len(cands) - 1
        if not last and not set(overrides) <= set(allowed):
            continue
        mine = {n: v for n, v in overrides.items() if n in allowed}
        for n, v in mine.items():
            TABLES[sched.name][n].check(v)
        params = sched.compute_params(fusion, info, mine)
        if params is None or isinstance(params, Declined):
            if last:
                raise CircbufError(f"the {sched.name} scheduler declined this fusion: {params.why}")
            declined.append((sched, getattr(params, "why", None)))
            continue
        _check_used(cands, sched, params, overrides, declined)
        return sched, params
    raise AssertionError("the last candidate always answers")  # pragma: no cover


def if_spilled(sched, params, overrides: dict, target):
    """The params ``sched`` compiles instead when the kernel of ``params`` keeps
    values in local memory (its optional ``if_spilled``), or None."""
    alt = getattr(sched, "if_spilled", None)
    return None if alt is None else alt(params, overrides, target)


def _check_used(cands, sched, params, overrides: dict, declined: list):
    """Every override is used by the kernel ``params`` describe."""
    variant = f"{sched.name}:{sched.variant(params)}"
    for k, v in overrides.items():
        rules = [TABLES[s.name][k] for s, _ in cands if k in TABLES[s.name]]
        if any(variant in o.variants(v) for o in rules):
            continue
        users = sorted({u for o in rules for u in o.variants(v) if not u.endswith(":declined")})
        why = "".join(f"; the {s.name} scheduler declined these inputs" + (f" ({w})" if w else "")
                      for s, w in declined)  # fmt: skip
        raise CircbufError(
            f"schedule({k}={v!r}): the kernel chosen, {_said(variant)}, does not use {k}; "
            f"{k}={v!r} is used by {' and '.join(_said(u) for u in users) or 'no kernel'}{why}"
        )


def _said(variant: str) -> str:
    sched, kind = variant.split(":")
    return f"{sched} ({kind})"


def apply(sched, fusion: Fusion, params) -> None:
    """Schedule ``fusion`` with ``sched`` and ``params``, then lower the
    inline positions no one loop nest can honor (:func:`.utils.untangle_inlining`):
    what a scheduler leaves always lowers."""
    sched.schedule(fusion, params)
    untangle_inlining(fusion)


def schedule(fusion: Fusion, info: InputInfo, overrides: dict | None = None):
    """Compute params and apply the schedule to ``fusion``; returns the params."""
    prepare(fusion, info.extents)
    sched, params = compute_params(fusion, info, overrides or {})
    apply(sched, fusion, params)
    return params
