"""Element types: one enum shared by the codec, the signatures and the backends.

The table itself (DType, its NumPy dtypes and contents fields, from_numpy) lives in the
client distribution, tensord_client.dtypes, so that clients and the daemon share one copy;
this module adds what only the daemon needs.
"""

from __future__ import annotations

from tensord_client.dtypes import CONTENTS_FIELD, DType, from_numpy

__all__ = ["CONTENTS_FIELD", "DType", "dtype_name", "from_numpy", "from_ort_type", "parse"]

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


def dtype_name(dtype: DType) -> str:
    """The contract's spelling of a dtype, as people see it in grpcurl (DATA_TYPE_FLOAT32):
    the enum's values are the contract's, and so are its names after the prefix."""
    return f"DATA_TYPE_{dtype.name}"


def from_ort_type(type_name: str) -> DType | None:
    """The DType for an ONNX Runtime type string, or None when tensord cannot carry it."""
    return _ORT_NAMES.get(type_name)


_ORT_TYPES = {dtype: name for name, dtype in _ORT_NAMES.items()}


def ort_type(dtype: DType) -> str:
    """ONNX Runtime's type string for a DType ("tensor(float)"), as OrtValues report it."""
    return _ORT_TYPES[dtype]


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


# ONNX TensorProto element types, for binding device buffers.
ONNX_TYPES = {
    DType.BOOL: 9, DType.UINT8: 2, DType.INT8: 3, DType.INT16: 5,
    DType.INT32: 6, DType.INT64: 7, DType.FLOAT16: 10,
    DType.BFLOAT16: 16, DType.FLOAT32: 1, DType.FLOAT64: 11,
}  # fmt: skip
