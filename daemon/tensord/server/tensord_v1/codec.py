"""Tensors between the contract's `Tensor` message and NumPy arrays.

Used by the server's converters and by the Python client, so both sides agree on one
encoding: raw little-endian C-order bytes (strings as 4-byte little-endian length plus
bytes), or typed repeated fields for people writing JSON.
"""

from __future__ import annotations

from typing import NoReturn, cast

import numpy as np

from tensord.dtypes import CONTENTS_FIELD, DType, dtype_name, from_numpy
from tensord.errors import InvalidArgumentError
from tensord.server.kit.tensors import (
    CHUNK,
    TENSOR_STEPS,
    check_shape,
    decode_contents,
    decode_raw,
    encode_raw_strings,
    shape_text,
    to_bytes,
)
from tensord.v1 import inference_pb2 as pb

_CONTENTS_FIELDS = tuple(sorted(set(CONTENTS_FIELD.values())))
_DTYPE_NAMES = ", ".join(pb.DataType.Name(int(d)) for d in DType)


def decode_cost(tensor: pb.Tensor) -> int:
    """Roughly how many Python-level element steps decoding `tensor` takes: a fixed cost per
    tensor, plus every element of strings and typed contents (raw numeric data wraps
    without a loop)."""
    if tensor.WhichOneof("data") == "raw_data":
        strings = len(tensor.raw_data) // 4 if tensor.dtype == pb.DATA_TYPE_STRING else 0
        return TENSOR_STEPS + strings
    contents = tensor.contents
    return TENSOR_STEPS + sum(len(getattr(contents, field)) for field in _CONTENTS_FIELDS)


def pb_dtype(dtype: DType) -> pb.DataType:
    """The contract's enum value for a dtype (the numbers are the same)."""
    return cast(pb.DataType, int(dtype))


def decode_tensor(tensor: pb.Tensor, where: str) -> tuple[str, np.ndarray]:
    """Return (name, array) for a Tensor message; `where` names it in error messages.

    Raw data is wrapped without copying (the array is read-only). STRING elements decode
    to Python str (UTF-8).
    """
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        _refuse_dtype(tensor, _label(where, tensor))
    shape = tuple(tensor.shape)
    count = check_shape(shape, _label(where, tensor), dtype.itemsize)
    kind = tensor.WhichOneof("data")
    if kind == "raw_data":
        label = _label(where, tensor)
        array = decode_raw(
            tensor.raw_data, dtype, shape, count, label, "raw_data", dtype_name(dtype)
        )
        return tensor.name, array
    if kind is None:
        if count != 0:
            expected = (
                f"{count * dtype.itemsize} bytes of raw_data" if dtype.itemsize else "raw_data"
            )
            raise InvalidArgumentError(
                f"{_label(where, tensor)}: no data for shape {shape_text(shape)} ({count} "
                f"elements); set {expected} or contents.{CONTENTS_FIELD[dtype]}"
            )
        return tensor.name, np.empty(shape, dtype=dtype.numpy)
    label = _label(where, tensor)
    field = CONTENTS_FIELD[dtype]
    array = decode_contents(
        tensor.contents, dtype, shape, count, label, field, _CONTENTS_FIELDS, dtype_name(dtype)
    )
    return tensor.name, array


_DTYPES = {int(d): d for d in DType}


def _label(where: str, tensor: pb.Tensor) -> str:
    """How an error message names a tensor: `inputs[0] 'x'` (built only on error)."""
    return f"{where} {tensor.name!r}"


def _refuse_dtype(tensor: pb.Tensor, label: str) -> NoReturn:
    state = "is not set" if tensor.dtype == 0 else f"{tensor.dtype} is unknown"
    raise InvalidArgumentError(f"{label}: dtype {state}; expected one of {_DTYPE_NAMES}")


def encode_tensor(name: str, array: np.ndarray, *, contents: bool = False) -> pb.Tensor:
    """A Tensor message for an array: raw bytes by default, typed contents on request."""
    tensor = pb.Tensor()
    fill_tensor(tensor, name, array, contents=contents)
    return tensor


def fill_tensor(tensor: pb.Tensor, name: str, array: np.ndarray, *, contents: bool) -> None:
    """Fill an empty Tensor message (one of a reply's outputs) with an array."""
    dtype = _array_dtype(array, name)
    tensor.name = name
    tensor.dtype = pb_dtype(dtype)
    tensor.shape.extend(array.shape)
    if contents:
        _fill_contents(tensor.contents, array, dtype)
    elif dtype is DType.STRING:
        tensor.raw_data = encode_raw_strings(array.reshape(-1))
    else:
        tensor.raw_data = np.ascontiguousarray(array, dtype=dtype.numpy).tobytes()


def _array_dtype(array: np.ndarray, name: str) -> DType:
    try:
        return from_numpy(array.dtype)
    except ValueError as exc:
        raise InvalidArgumentError(f"tensor {name!r}: {exc}") from None


def _fill_contents(contents: pb.TensorContents, array: np.ndarray, dtype: DType) -> None:
    flat = array.reshape(-1)
    field = getattr(contents, CONTENTS_FIELD[dtype])
    if dtype is DType.STRING:
        field.extend(to_bytes(v) for v in flat)
    else:
        if dtype in (DType.FLOAT16, DType.BFLOAT16):
            flat = flat.astype(np.float32)
        for start in range(0, flat.size, CHUNK):  # see CHUNK
            field.extend(flat[start : start + CHUNK].tolist())
