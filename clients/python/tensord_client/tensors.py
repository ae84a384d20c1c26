"""The client's side of the tensor encoding: NumPy arrays to `Tensor` messages and back.

The contract fixes the encoding (raw little-endian C-order bytes, a STRING element as a
4-byte little-endian length and its UTF-8 bytes; or typed values in TensorContents), and
tensord_client.dtypes the table of element types that the daemon shares. The daemon's own
codec also checks untrusted requests field by field; a client only needs to encode what it
sends and read what a server answers.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import cast

import numpy as np

from tensord_client.dtypes import CONTENTS_FIELD, DType, bfloat16_to_float32, float32_to_bfloat16
from tensord_client.dtypes import from_numpy as _from_numpy
from tensord_client.v1 import inference_pb2 as pb

_U32 = struct.Struct("<I")
_DTYPES = {int(d): d for d in DType}


def encode_tensor(name: str, array: np.ndarray, *, contents: bool = False) -> pb.Tensor:
    """A Tensor message for an array: raw bytes by default, typed contents on request.

    An array the contract cannot carry (uint16, complex, ...) raises ValueError.
    """
    array = np.asarray(array)
    try:
        dtype = _from_numpy(array.dtype)
    except ValueError as exc:
        raise ValueError(f"tensor {name!r}: {exc}") from None
    tensor = pb.Tensor(name=name, dtype=cast(pb.DataType, int(dtype)), shape=array.shape)
    if contents:
        _fill_contents(tensor.contents, array, dtype)
    elif dtype is DType.STRING:
        tensor.raw_data = encode_strings(array.reshape(-1))
    else:
        tensor.raw_data = np.ascontiguousarray(array, dtype=dtype.numpy).tobytes()
    return tensor


def _fill_contents(contents: pb.TensorContents, array: np.ndarray, dtype: DType) -> None:
    flat = array.reshape(-1)
    field = getattr(contents, CONTENTS_FIELD[dtype])
    if dtype is DType.STRING:
        field.extend(_as_bytes(v) for v in flat)
    elif dtype is DType.BFLOAT16:
        field.extend(bfloat16_to_float32(flat.astype(dtype.numpy, copy=False)).tolist())
    else:
        field.extend(flat.astype(np.float32 if dtype is DType.FLOAT16 else dtype.numpy).tolist())


def encode_strings(values: Iterable[object]) -> bytes:
    """STRING raw encoding: per element a 4-byte little-endian length, then the bytes."""
    parts: list[bytes] = []
    for value in values:
        data = _as_bytes(value)
        parts += (_U32.pack(len(data)), data)
    return b"".join(parts)


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else str(value)).encode("utf-8")


def decode_tensor(tensor: pb.Tensor) -> np.ndarray:
    """The array a Tensor message holds; STRING elements decode to str.

    Raw data is wrapped without copying (the array is read-only). A message that does not
    hold what its dtype and shape say raises ValueError naming the tensor.
    """
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"tensor {tensor.name!r}: DataType {tensor.dtype} is unknown here")
    shape = tuple(tensor.shape)
    count = math.prod(shape)
    kind = tensor.WhichOneof("data")
    if kind == "contents":
        return _decode_contents(tensor, dtype, count).reshape(shape)
    raw = tensor.raw_data
    if dtype is DType.STRING:
        return _decode_strings(tensor.name, raw, count).reshape(shape)
    if len(raw) != count * dtype.itemsize:
        raise ValueError(
            f"tensor {tensor.name!r}: raw_data has {len(raw)} bytes; shape {list(shape)} of "
            f"{dtype.name} needs {count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype.numpy, count=count).reshape(shape)


def _decode_strings(name: str, raw: bytes, count: int) -> np.ndarray:
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise ValueError(f"tensor {name!r}: raw_data ends inside string {i} of {count}")
        (length,) = _U32.unpack_from(raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ValueError(f"tensor {name!r}: string {i} runs past the end of raw_data")
        out[i] = raw[offset : offset + length].decode("utf-8")
        offset += length
    if offset != len(raw):
        raise ValueError(f"tensor {name!r}: raw_data holds bytes past its {count} strings")
    return out


def _decode_contents(tensor: pb.Tensor, dtype: DType, count: int) -> np.ndarray:
    values = getattr(tensor.contents, CONTENTS_FIELD[dtype])
    if len(values) != count:
        raise ValueError(
            f"tensor {tensor.name!r}: contents.{CONTENTS_FIELD[dtype]} has {len(values)} "
            f"values; shape {list(tensor.shape)} needs {count}"
        )
    if dtype is DType.STRING:
        out = np.empty(count, dtype=object)
        out[:] = [v.decode("utf-8") for v in values]
        return out
    if dtype is DType.BFLOAT16:
        return float32_to_bfloat16(np.array(values, dtype=np.float32))
    return np.array(values).astype(dtype.numpy)
