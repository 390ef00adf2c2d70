"""circbuf: a fusion compiler for NVIDIA Hopper GPUs.

>>> import circbuf as cb
>>> with cb.FusionDefinition() as fd:
...     x = fd.define_tensor([-1], dtype=cb.DataType.Float)
...     fd.add_output(fd.ops.relu(x))
"""

from .frontend import FusionDefinition, Ops
from .ir import (
    CircbufError,
    DataType,
    Fusion,
    IterDomain,
    IterType,
    MemoryType,
    ParallelType,
    Pipelined,
    TensorView,
    WarpSpecialized,
)
from .target import Target

__version__ = "0.1.0"

__all__ = [
    "FusionDefinition",
    "Ops",
    "CircbufError",
    "DataType",
    "Fusion",
    "IterDomain",
    "IterType",
    "MemoryType",
    "ParallelType",
    "TensorView",
    "Pipelined",
    "WarpSpecialized",
    "Target",
]
