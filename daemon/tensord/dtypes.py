"""Element types: one enum shared by the codec, the signatures and the backends."""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.IntEnum):
    """Element types; the values equal the contract's DataType numbers."""

    BOOL = 1
    UINT8 = 2
    INT8 = 3
    INT16 = 4
    INT32 = 5
    INT64 = 6
    FLOAT16 = 7
    BFLOAT16 = 8
    FLOAT32 = 9
    FLOAT64 = 10
    STRING = 11

    # Set on every member below, from _NUMPY: plain attributes, since the codec reads them
    # for every tensor of every request (a property would hash the member on each read).
    numpy: np.dtype
    """The little-endian NumPy dtype that holds this type's elements."""
    itemsize: int
    """Bytes per element in raw encoding (0 for STRING, which is variable)."""


def _bfloat16_dtype() -> np.dtype:
    # NumPy has no bfloat16; ml_dtypes (a dependency of onnx) provides the standard one.
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover - onnx depends on ml_dtypes
        return np.dtype("<u2")


_NUMPY: dict[DType, np.dtype] = {
    DType.BOOL: np.dtype(np.bool_),
    DType.UINT8: np.dtype("u1"),
    DType.INT8: np.dtype("i1"),
    DType.INT16: np.dtype("<i2"),
    DType.INT32: np.dtype("<i4"),
    DType.INT64: np.dtype("<i8"),
    DType.FLOAT16: np.dtype("<f2"),
    DType.BFLOAT16: _bfloat16_dtype(),
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT64: np.dtype("<f8"),
    DType.STRING: np.dtype(object),
}

for _member, _dtype in _NUMPY.items():
    _member.numpy = _dtype
    _member.itemsize = 0 if _member is DType.STRING else _dtype.itemsize

# ONNX Runtime describes types as "tensor(float)" and so on.
_ORT_NAMES: dict[str, DType] = {
    "tensor(bool)": DType.BOOL,
    "tensor(uint8)": DType.UINT8,
    "tensor(int8)": DType.INT8,
    "tensor(int16)": DType.INT16,
    "tensor(int32)": DType.INT32,
    "tensor(int64)": DType.INT64,
    "tensor(float16)": DType.FLOAT16,
    "tensor(bfloat16)": DType.BFLOAT16,
    "tensor(float)": DType.FLOAT32,
    "tensor(double)": DType.FLOAT64,
    "tensor(string)": DType.STRING,
}


def from_ort_type(type_name: str) -> DType | None:
    """The DType for an ONNX Runtime type string, or None when tensord cannot carry it."""
    return _ORT_NAMES.get(type_name)


_FROM_NUMPY: dict[np.dtype, DType] = {}


def from_numpy(dtype: np.dtype) -> DType:
    """The DType for a NumPy dtype; raises ValueError for types the contract lacks."""
    found = _FROM_NUMPY.get(dtype)  # the hot path: one dict lookup per tensor
    if found is not None:
        return found
    if dtype.kind in ("U", "S", "O"):
        found = DType.STRING
    else:
        little = dtype.newbyteorder("<")
        found = next((m for m, d in _NUMPY.items() if m is not DType.STRING and d == little), None)
        if found is None:
            raise ValueError(f"NumPy dtype {dtype} has no tensord DataType")
    _FROM_NUMPY[dtype] = found
    return found


def parse(name: str) -> DType:
    """A DType from a config spelling: 'float32', 'FLOAT32' or 'DATA_TYPE_FLOAT32'."""
    key = name.upper().removeprefix("DATA_TYPE_")
    aliases = {"FLOAT": "FLOAT32", "DOUBLE": "FLOAT64", "HALF": "FLOAT16", "BF16": "BFLOAT16"}
    key = aliases.get(key, key)
    try:
        return DType[key]
    except KeyError:
        names = ", ".join(m.name.lower() for m in DType)
        raise ValueError(f"unknown dtype {name!r}; expected one of {names}") from None
