"""Picks a scheduler for a fusion and applies it.

>>> # params = schedule(fusion, info, overrides)   # mutates ``fusion``
"""

from __future__ import annotations

from ..ir import CircbufError, Fusion
from . import pointwise, reduction
from .info import InputInfo
from .utils import canonicalize_extents

SCHEDULERS = [
    (reduction.ReductionScheduler, reduction.OVERRIDES),
    (pointwise.PointwiseScheduler, pointwise.OVERRIDES),
]


def pick(fusion: Fusion):
    reasons = []
    for sched, overrides in SCHEDULERS:
        why = sched.can_schedule(fusion)
        if why is None:
            return sched, overrides
        reasons.append(f"{sched.name}: {why}")
    raise CircbufError("no scheduler can take this fusion (" + "; ".join(reasons) + ")")


def compute_params(fusion: Fusion, info: InputInfo, overrides: dict):
    """Heuristics for ``fusion`` on these inputs, with user overrides applied."""
    sched, allowed = pick(fusion)
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        later = {"persistent", "stages", "warp_specialized", "tma", "prefetch"}
        hint = " (TMA circular buffering is not built yet)" if set(unknown) & later else ""
        raise CircbufError(
            f"schedule(): the {sched.name} scheduler does not take {', '.join(unknown)}{hint}; "
            f"it takes {', '.join(allowed)}"
        )
    return sched, sched.compute_params(fusion, info, overrides)


def schedule(fusion: Fusion, info: InputInfo, overrides: dict | None = None):
    """Compute params and apply the schedule to ``fusion``; returns the params."""
    canonicalize_extents(fusion)
    sched, params = compute_params(fusion, info, overrides or {})
    sched.schedule(fusion, params)
    return params
