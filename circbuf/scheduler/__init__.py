"""Schedulers: heuristics -> params -> transforms on TensorViews."""

from .info import InputInfo, TensorInfo
from .manual import mma_form
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
    "mma_form",
]
