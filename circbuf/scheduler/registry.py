"""Picks a scheduler for a fusion and applies it.

>>> # params = schedule(fusion, info, overrides)   # mutates ``fusion``
"""

from __future__ import annotations

from ..ir import CircbufError, Fusion
from . import normalization, outer_reduction, pointwise, pointwise_tma, reduction
from .info import InputInfo
from .utils import check_aliases, check_distinct_axes, prepare

SCHEDULERS = [
    (normalization.NormalizationScheduler, normalization.OVERRIDES),
    (outer_reduction.OuterReductionScheduler, outer_reduction.OVERRIDES),
    (reduction.ReductionScheduler, reduction.OVERRIDES),
    (pointwise_tma.PointwiseTmaScheduler, pointwise_tma.OVERRIDES),
    (pointwise.PointwiseScheduler, pointwise.OVERRIDES),
]


def candidates(fusion: Fusion):
    """Schedulers that accept the fusion's structure, in order of preference."""
    reasons, out = [], []
    for sched, overrides in SCHEDULERS:
        why = sched.can_schedule(fusion)
        if why is None:
            out.append((sched, overrides))
        else:
            reasons.append(f"{sched.name}: {why}")
    if not out:
        raise CircbufError("no scheduler can take this fusion (" + "; ".join(reasons) + ")")
    return out


def pick(fusion: Fusion):
    return candidates(fusion)[0]


def compute_params(fusion: Fusion, info: InputInfo, overrides: dict):
    """Heuristics for ``fusion`` on these inputs, with user overrides applied.
    A scheduler may decline these inputs (params None): the next one is asked,
    with the overrides it does not know dropped (e.g. ``stages`` when the rows
    cannot be staged by TMA)."""
    check_distinct_axes(fusion)
    check_aliases(fusion)
    cands = candidates(fusion)
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
