"""Data types and torch-like type promotion.

>>> DataType.BFloat16.size, promote(DataType.Half, DataType.BFloat16)
(2, DataType.Float)
"""

from __future__ import annotations

from enum import Enum


class DataType(Enum):
    """Element types. ``value`` is the CUDA type name used by codegen."""

    Float = "float"
    Double = "double"
    Half = "cb_half"
    BFloat16 = "cb_bfloat16"
    Int32 = "int"
    Int64 = "long long"
    Bool = "bool"

    @property
    def size(self) -> int:
        return _SIZE[self]

    @property
    def short(self) -> str:
        """nvFuser-style short name used when printing TensorViews (``bf16``)."""
        return _SHORT[self]

    @property
    def is_float(self) -> bool:
        return self in (DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16)

    @property
    def is_int(self) -> bool:
        return self in (DataType.Int32, DataType.Int64)

    @property
    def is_reduced_float(self) -> bool:
        """Half and BFloat16: stored narrow, computed in fp32."""
        return self in (DataType.Half, DataType.BFloat16)

    def __repr__(self) -> str:
        return f"DataType.{self.name}"


_SIZE = {
    DataType.Float: 4,
    DataType.Double: 8,
    DataType.Half: 2,
    DataType.BFloat16: 2,
    DataType.Int32: 4,
    DataType.Int64: 8,
    DataType.Bool: 1,
}
_SHORT = {
    DataType.Float: "f32",
    DataType.Double: "f64",
    DataType.Half: "f16",
    DataType.BFloat16: "bf16",
    DataType.Int32: "i32",
    DataType.Int64: "i64",
    DataType.Bool: "b",
}


def _kind(dt: DataType) -> int:
    return 2 if dt.is_float else 1 if dt.is_int else 0


def promote(a: DataType, b: DataType) -> DataType:
    """Result type of a binary op on two tensors, as torch computes it.

    >>> promote(DataType.Int32, DataType.Half)
    DataType.Half
    """
    if a == b:
        return a
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return a if ka > kb else b
    if ka == 2:
        if DataType.Double in (a, b):
            return DataType.Double
        return DataType.Float  # Float with anything, or Half with BFloat16
    if ka == 1:
        return DataType.Int64
    return DataType.Bool


def promote_with_scalar(t: DataType, scalar: DataType) -> DataType:
    """A Python number does not widen a tensor of its own kind (torch semantics).

    >>> promote_with_scalar(DataType.BFloat16, DataType.Double)
    DataType.BFloat16
    """
    if _kind(scalar) > _kind(t):
        return DataType.Float if scalar.is_float else DataType.Int64
    return t


def compute_type(dt: DataType) -> DataType:
    """Arithmetic on Half/BFloat16 runs (and returns) fp32, as in nvFuser."""
    return DataType.Float if dt.is_reduced_float else dt
