"""Schedulers: heuristics -> params -> transforms on TensorViews."""

from .info import InputInfo, TensorInfo
from .params import Params, PointwiseParams, ReductionParams
from .registry import compute_params, schedule
from .utils import propagate_transforms

__all__ = [
    "InputInfo",
    "TensorInfo",
    "Params",
    "PointwiseParams",
    "ReductionParams",
    "compute_params",
    "schedule",
    "propagate_transforms",
]
