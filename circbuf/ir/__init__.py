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
    Expr,
    FullOp,
    LinearOp,
    LoadStoreOp,
    MatmulOp,
    MemoryType,
    MmaOp,
    ReductionOp,
    TensorDomain,
    TensorView,
    TernaryOp,
    UnaryOp,
    reduction_init,
)
from .scalar import Bin, Const, Scalar, Un, Var, as_scalar, ceil_div, evaluate, simplify

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
    "Expr",
    "FullOp",
    "LoadStoreOp",
    "LinearOp",
    "MatmulOp",
    "MmaOp",
    "MemoryType",
    "ReductionOp",
    "TensorDomain",
    "TensorView",
    "TernaryOp",
    "UnaryOp",
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
]
