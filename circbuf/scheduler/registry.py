"""Picks a scheduler for a fusion and applies it.

>>> # params = schedule(fusion, info, overrides)   # mutates ``fusion``

A scheduler is a class with ``name``, ``can_schedule``, ``compute_params`` and
``schedule``, listed in :data:`SCHEDULERS` with the override names it takes;
an optional ``renamed`` dict maps deprecated override names to current ones.
"""

from __future__ import annotations

import warnings

from ..ir import CircbufError, Fusion
from . import matmul, normalization, outer_reduction, pointwise, pointwise_tma, reduction
from .info import InputInfo
from .utils import check_aliases, check_distinct_axes, prepare

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


def candidates(fusion: Fusion):
    """Schedulers that accept the fusion's structure, in order of preference;
    raises :class:`Unschedulable` when none does."""
    reasons, out = [], []
    for sched, overrides in SCHEDULERS:
        why = sched.can_schedule(fusion)
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


def check_overrides(fusion: Fusion, overrides: dict):
    """Check override names when ``fusion.schedule(**overrides)`` is called:
    a name no scheduler that can take ``fusion`` takes raises, listing what
    they take. Returns the overrides with deprecated names renamed, and a
    deprecation message per renamed name. (Values are checked at compile,
    where the inputs are known.)

    >>> import circbuf as cb
    >>> with cb.FusionDefinition() as fd:
    ...     fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
    >>> check_overrides(fd.fusion, {"vectorize": 4})
    ({'vectorize': 4}, [])
    >>> check_overrides(fd.fusion, {"bogus": 1})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    circbuf.ir.errors.CircbufError: schedule(bogus=...): no scheduler of this fusion takes bogus; ...
    """
    try:
        scheds, who = candidates(fusion), "no scheduler of this fusion"
    except CircbufError:  # not schedulable (yet): the compile says why; check names against all
        scheds, who = SCHEDULERS, "no scheduler"
    overrides, notes = _rename(scheds, overrides)
    takes = set().union(*(set(a) for _, a in scheds))
    unknown = [k for k in overrides if k not in takes]
    if unknown:
        named = []
        for k in unknown:
            others = [s.name for s, a in SCHEDULERS if k in a]
            named.append(f"{k} (an override of {' and '.join(others)})" if others else k)
        lists = "; ".join(f"the {s.name} scheduler takes {', '.join(a)}" for s, a in scheds)
        raise CircbufError(f"schedule({'=..., '.join(unknown)}=...): {who} takes {', '.join(named)}; {lists}")
    return overrides, notes


def compute_params(fusion: Fusion, info: InputInfo, overrides: dict):
    """Heuristics for ``fusion`` on these inputs, with user overrides applied.
    A scheduler may decline these inputs (params None): the next one is asked,
    with the overrides it does not know dropped (e.g. ``stages`` when the rows
    cannot be staged by TMA)."""
    check_distinct_axes(fusion)
    cands = candidates(fusion)  # first: a fusion no one scheduler takes is segmented, each segment checked
    check_aliases(fusion)
    overrides, notes = _rename(cands, overrides)  # fusions not built by a FusionDefinition
    for note in notes:
        warnings.warn(note, DeprecationWarning, stacklevel=2)
    allowed_any = set().union(*(set(a) for _, a in cands))
    for sched, allowed in cands[:-1]:
        if set(overrides) <= set(allowed):
            params = sched.compute_params(fusion, info, overrides)
            if params is not None:
                return sched, params
    sched, allowed = cands[-1]
    if len(cands) > 1:
        overrides = {k: v for k, v in overrides.items() if k in allowed or k not in allowed_any}
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        later = {"persistent", "stages", "warp_specialized", "tma", "prefetch"}
        hint = " (no TMA variant takes these inputs)" if set(unknown) & later else ""
        raise CircbufError(
            f"schedule(): the {sched.name} scheduler does not take {', '.join(unknown)}{hint}; "
            f"it takes {', '.join(allowed)}"
        )
    return sched, sched.compute_params(fusion, info, overrides)


def schedule(fusion: Fusion, info: InputInfo, overrides: dict | None = None):
    """Compute params and apply the schedule to ``fusion``; returns the params."""
    prepare(fusion, info.extents)
    sched, params = compute_params(fusion, info, overrides or {})
    sched.schedule(fusion, params)
    return params
