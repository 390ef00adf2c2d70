"""The fusion IR: math only, no scheduling policy and no CUDA."""

from .circular import Pipelined, WarpSpecialized
from .dtype import DataType, compute_type, promote, promote_with_scalar
from .errors import CircbufError
from .fusion import Fusion, transform_history
from .iterdomain import IterDomain, IterType, Merge, ParallelType, Split
from .nodes import (
    BinaryOp,
    BroadcastOp,
    CastOp,
    ExpandOp,
    Expr,
    LoadStoreOp,
    MemoryType,
    PermuteOp,
    ReductionOp,
    ReshapeOp,
    SqueezeOp,
    TensorDomain,
    TensorView,
    TernaryOp,
    UnaryOp,
    ViewExpr,
    reduction_init,
)
from .scalar import Bin, Const, Scalar, Un, Var, as_scalar, ceil_div, evaluate, simplify
from .view import concretize_reshapes, reshape_groups

__all__ = [
    "Pipelined",
    "WarpSpecialized",
    "DataType",
    "compute_type",
    "promote",
    "promote_with_scalar",
    "CircbufError",
    "Fusion",
    "transform_history",
    "IterDomain",
    "IterType",
    "Merge",
    "ParallelType",
    "Split",
    "BinaryOp",
    "BroadcastOp",
    "CastOp",
    "ExpandOp",
    "Expr",
    "LoadStoreOp",
    "MemoryType",
    "PermuteOp",
    "ReductionOp",
    "ReshapeOp",
    "SqueezeOp",
    "TensorDomain",
    "TensorView",
    "TernaryOp",
    "UnaryOp",
    "ViewExpr",
    "reduction_init",
    "Bin",
    "Const",
    "Scalar",
    "Un",
    "Var",
    "as_scalar",
    "ceil_div",
    "evaluate",
    "simplify",
    "concretize_reshapes",
    "reshape_groups",
]
