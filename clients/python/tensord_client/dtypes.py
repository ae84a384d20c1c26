"""Element types: for each of the contract's DataType numbers, the NumPy dtype that holds its
elements and the TensorContents field that carries its typed values.

The one table both sides use: the daemon's codec, signatures and backends import it from
here (tensord.dtypes), so a client and the daemon cannot disagree on an element's layout.
"""

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
    # NumPy has no bfloat16; ml_dtypes provides the standard one (the daemon has it through
    # onnx, a client with the `bfloat16` extra). Without it, bfloat16 elements are raw
    # 2-byte records, which no other dtype is taken for (uint16 would be sent as bfloat16).
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return np.dtype("V2")


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

CONTENTS_FIELD: dict[DType, str] = {
    DType.BOOL: "bool_values",
    DType.UINT8: "int_values",
    DType.INT8: "int_values",
    DType.INT16: "int_values",
    DType.INT32: "int_values",
    DType.INT64: "int64_values",
    DType.FLOAT16: "float_values",
    DType.BFLOAT16: "float_values",
    DType.FLOAT32: "float_values",
    DType.FLOAT64: "double_values",
    DType.STRING: "bytes_values",
}
"""Which TensorContents field carries each dtype (float16 and bfloat16 travel as float)."""

for _member, _dtype in _NUMPY.items():
    _member.numpy = _dtype
    _member.itemsize = 0 if _member is DType.STRING else _dtype.itemsize

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


def bfloat16_to_float32(array: np.ndarray) -> np.ndarray:
    """bfloat16 elements (ml_dtypes' or raw 2-byte records) as float32, exactly: a bfloat16
    is the upper half of a float32."""
    bits = np.ascontiguousarray(array).view("<u2").astype("<u4") << 16
    return bits.view("<f4")


def float32_to_bfloat16(array: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as DType.BFLOAT16's
    NumPy dtype; NaN stays NaN."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(np.asarray(array, dtype="<f4"))
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype("<u2")  # keep it a (quiet) NaN
    return rounded.view(DType.BFLOAT16.numpy)
