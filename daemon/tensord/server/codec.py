"""Tensors between the contract's `Tensor` message and NumPy arrays.

Used by the server's converters and by the Python client, so both sides agree on one
encoding: raw little-endian C-order bytes (strings as 4-byte little-endian length plus
bytes), or typed repeated fields for people writing JSON.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any, NoReturn, cast

import numpy as np

from tensord.dtypes import CONTENTS_FIELD, DType, dtype_name, from_numpy
from tensord.errors import InvalidArgumentError
from tensord.v1 import inference_pb2 as pb

_CONTENTS_FIELDS = tuple(sorted(set(CONTENTS_FIELD.values())))
_DTYPE_NAMES = ", ".join(pb.DataType.Name(int(d)) for d in DType)
_U32 = struct.Struct("<I")
MAX_RANK = 64
"""NumPy's (and ONNX Runtime's) largest rank."""
MAX_BYTES_LOG2 = 62
MAX_BYTES = 1 << MAX_BYTES_LOG2
"""No tensor's elements may need more bytes than this, counted without its zero dimensions
(NumPy refuses such shapes even when they hold no element)."""
_SHOWN_DIMS = 8


def shape_text(shape: Sequence[int]) -> str:
    """A shape for a message, abridged past a few dimensions: shapes come from requests."""
    dims = list(shape)
    if len(dims) <= _SHOWN_DIMS:
        return str(dims)
    return f"[{', '.join(map(str, dims[:_SHOWN_DIMS]))}, ... ({len(dims)} dimensions)]"


# Fewest bytes an element takes in TensorContents (packed repeated fields: varints take at
# least one byte; float16 and bfloat16 travel widened to float).
_CONTENTS_MIN_BYTES = {
    DType.BOOL: 1,
    DType.UINT8: 1,
    DType.INT8: 1,
    DType.INT16: 1,
    DType.INT32: 1,
    DType.INT64: 1,
    DType.FLOAT16: 4,
    DType.BFLOAT16: 4,
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
    DType.STRING: 2,
}


def encoded_size_floor(array: np.ndarray, *, contents: bool) -> int:
    """The fewest bytes `array`'s values take in a Tensor message (string bytes aside)."""
    if array.dtype == object:
        return array.size * (_CONTENTS_MIN_BYTES[DType.STRING] if contents else 4)
    if not contents:
        return array.nbytes
    return array.size * _CONTENTS_MIN_BYTES[from_numpy(array.dtype)]


def encode_cost(array: np.ndarray, *, contents: bool) -> int:
    """Roughly how many Python-level element steps encoding `array` takes (see decode_cost)."""
    return array.size if contents or array.dtype == object else 0


_TENSOR_STEPS = 256
"""What decoding one tensor costs beside its elements (its checks and wrapper objects), in
element steps: many small tensors cost the event loop as much as a few large ones."""


def decode_cost(tensor: pb.Tensor) -> int:
    """Roughly how many Python-level element steps decoding `tensor` takes: a fixed cost per
    tensor, plus every element of strings and typed contents (raw numeric data wraps
    without a loop)."""
    if tensor.WhichOneof("data") == "raw_data":
        strings = len(tensor.raw_data) // 4 if tensor.dtype == pb.DATA_TYPE_STRING else 0
        return _TENSOR_STEPS + strings
    contents = tensor.contents
    return _TENSOR_STEPS + sum(len(getattr(contents, field)) for field in _CONTENTS_FIELDS)


def pb_dtype(dtype: DType) -> pb.DataType:
    """The contract's enum value for a dtype (the numbers are the same)."""
    return cast(pb.DataType, int(dtype))


def decode_tensor(tensor: pb.Tensor, where: str) -> tuple[str, np.ndarray]:
    """Return (name, array) for a Tensor message; `where` names it in error messages.

    Raw data is wrapped without copying (the array is read-only). STRING elements decode
    to Python str (UTF-8).
    """
    dtype = _DTYPES.get(tensor.dtype)
    shape = tuple(tensor.shape)
    if dtype is None or len(shape) > MAX_RANK or (shape and min(shape) < 0):
        _refuse_header(tensor, shape, _label(where, tensor))
    count = math.prod(shape)
    nonzero = count if count else math.prod(d for d in shape if d)
    if nonzero * max(dtype.itemsize, 8) > MAX_BYTES:
        raise InvalidArgumentError(
            f"{_label(where, tensor)}: shape {shape_text(shape)} is too large to hold in "
            f"memory (more than 2^{MAX_BYTES_LOG2} bytes, {MAX_BYTES >> 60} EiB, zero "
            "dimensions aside)"
        )
    kind = tensor.WhichOneof("data")
    if kind == "raw_data":
        return tensor.name, _decode_raw(tensor.raw_data, dtype, shape, count, where, tensor)
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
    return tensor.name, _decode_contents(tensor.contents, dtype, shape, count, label)


_DTYPES = {int(d): d for d in DType}


def _label(where: str, tensor: pb.Tensor) -> str:
    """How an error message names a tensor: `inputs[0] 'x'` (built only on error)."""
    return f"{where} {tensor.name!r}"


def _refuse_header(tensor: pb.Tensor, shape: tuple[int, ...], label: str) -> NoReturn:
    """InvalidArgumentError for a bad dtype, rank or dimension."""
    if tensor.dtype not in _DTYPES:
        state = "is not set" if tensor.dtype == 0 else f"{tensor.dtype} is unknown"
        raise InvalidArgumentError(f"{label}: dtype {state}; expected one of {_DTYPE_NAMES}")
    if len(shape) > MAX_RANK:
        raise InvalidArgumentError(
            f"{label}: shape has rank {len(shape)}; at most {MAX_RANK} dimensions are supported"
        )
    raise InvalidArgumentError(
        f"{label}: shape {shape_text(shape)} has a negative dimension; every dimension must be >= 0"
    )


def _decode_raw(
    raw: bytes, dtype: DType, shape: tuple[int, ...], count: int, where: str, tensor: pb.Tensor
) -> np.ndarray:
    if dtype is DType.STRING:
        return decode_raw_strings(raw, shape, count, _label(where, tensor))
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgumentError(
            f"{_label(where, tensor)}: raw_data has {len(raw)} bytes, but shape "
            f"{shape_text(shape)} of {dtype_name(dtype)} needs {expected} ({count} elements x "
            f"{dtype.itemsize} bytes)"
        )
    array = np.frombuffer(raw, dtype=dtype.numpy, count=count)
    if dtype is DType.BOOL and count:
        i = first_true(array.view(np.uint8) > 1)
        if i is not None:
            raise InvalidArgumentError(
                f"{_label(where, tensor)}: raw_data byte {i} is {raw[i]}; BOOL raw_data is one "
                "byte per element, 0 or 1"
            )
    return array.reshape(shape)


def decode_raw_strings(raw: bytes, shape: tuple[int, ...], count: int, label: str) -> np.ndarray:
    if count > len(raw) // 4:  # before allocating anything for `count` elements
        raise InvalidArgumentError(
            f"{label}: raw_data has {len(raw)} bytes, too few for {count} strings; STRING "
            "raw_data is a 4-byte little-endian length then the bytes, per element"
        )
    out = np.empty(count, dtype=object)
    view = memoryview(raw)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise InvalidArgumentError(
                f"{label}: raw_data ends inside element {i} of {count}; STRING raw_data is "
                "a 4-byte little-endian length then the bytes, per element"
            )
        (length,) = _U32.unpack_from(view, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidArgumentError(
                f"{label}: element {i} claims {length} bytes but only {len(raw) - offset} remain"
            )
        out[i] = utf8_text(bytes(view[offset : offset + length]), i, label)
        offset += length
    if offset != len(raw):
        raise InvalidArgumentError(
            f"{label}: raw_data has {len(raw) - offset} bytes left over after {count} strings"
        )
    return out.reshape(shape)


def utf8_text(data: bytes, index: int, label: str) -> str:
    # ONNX Runtime's string tensors are UTF-8 text; binary data cannot pass through them.
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(
            f"{label}: string element {index} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def _decode_contents(
    contents: pb.TensorContents, dtype: DType, shape: tuple[int, ...], count: int, label: str
) -> np.ndarray:
    field = CONTENTS_FIELD[dtype]
    type_name = dtype_name(dtype)
    values = contents_values(contents, field, _CONTENTS_FIELDS, shape, count, label, type_name)
    if dtype is DType.STRING:
        return string_array(values, shape, label)
    if field == "int_values":
        return narrow_integers(values, dtype, field, label, type_name).reshape(shape)
    if dtype is DType.FLOAT16:
        wide = number_array(values, np.dtype(np.float32))
        with np.errstate(over="ignore"):
            narrow = wide.astype(np.float16)
        i = first_true(np.isfinite(wide) & ~np.isfinite(narrow))
        if i is not None:
            raise InvalidArgumentError(
                f"{label}: contents.float_values[{i}] = {float(wide[i]):g} is out of range for "
                "DATA_TYPE_FLOAT16 (largest 65504)"
            )
        return narrow.reshape(shape)
    return number_array(values, dtype.numpy).reshape(shape)


def contents_values(
    contents: Any,
    field: str,
    fields: Sequence[str],
    shape: tuple[int, ...],
    count: int,
    label: str,
    type_name: str,
) -> Sequence[Any]:
    """The values a typed-contents message holds in `field`, the one of `fields` a
    `type_name` tensor takes: refused when another field is set, or when their number is
    not the shape's (the same check for tensord.v1 and the Open Inference Protocol)."""
    for other in fields:
        if other != field and len(getattr(contents, other)):
            raise InvalidArgumentError(
                f"{label}: contents.{other} is set, but a {type_name} tensor takes its "
                f"values in contents.{field}"
            )
    values: Sequence[Any] = getattr(contents, field)
    if len(values) != count:
        raise InvalidArgumentError(
            f"{label}: contents.{field} has {len(values)} values, but shape "
            f"{shape_text(shape)} needs {count}"
        )
    return values


def string_array(values: Sequence[bytes], shape: tuple[int, ...], label: str) -> np.ndarray:
    """STRING contents as an object array of UTF-8 text."""
    out = np.empty(len(values), dtype=object)
    out[:] = [utf8_text(v, i, label) for i, v in enumerate(values)]
    return out.reshape(shape)


def narrow_integers(
    values: Sequence[Any], dtype: DType, field: str, label: str, type_name: str
) -> np.ndarray:
    """Integers that travel widened to 32 bits, checked for `dtype`'s range (1-D)."""
    wide = number_array(values, np.dtype(np.int64))
    info = np.iinfo(dtype.numpy)
    i = first_true((wide < info.min) | (wide > info.max))
    if i is not None:
        raise InvalidArgumentError(
            f"{label}: contents.{field}[{i}] = {int(wide[i])} is out of range for "
            f"{type_name} [{info.min}, {info.max}]"
        )
    return wide.astype(dtype.numpy)


def first_true(mask: np.ndarray) -> int | None:
    """The index of the first true element, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


_CHUNK = 65_536
"""Elements converted per call between protobuf's repeated fields and NumPy. One call holds
the interpreter lock throughout; in chunks, a worker thread converting millions of values
lets the event loop run between them."""


def number_array(values: Sequence[Any], dtype: np.dtype) -> np.ndarray:
    """A repeated number field as an array, converted chunk by chunk."""
    if len(values) <= _CHUNK:
        return np.array(values, dtype=dtype)
    out = np.empty(len(values), dtype=dtype)
    for start in range(0, len(values), _CHUNK):
        out[start : start + _CHUNK] = values[start : start + _CHUNK]
    return out


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
        field.extend(_as_bytes(v) for v in flat)
    else:
        if dtype in (DType.FLOAT16, DType.BFLOAT16):
            flat = flat.astype(np.float32)
        for start in range(0, flat.size, _CHUNK):  # see _CHUNK
            field.extend(flat[start : start + _CHUNK].tolist())


def encode_raw_strings(values: Sequence[object] | np.ndarray) -> bytes:
    """STRING raw encoding: per element a 4-byte little-endian length, then the bytes."""
    parts: list[bytes] = []
    for value in values:
        data = _as_bytes(value)
        parts.append(_U32.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return str(value).encode("utf-8")
