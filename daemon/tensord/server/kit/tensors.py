"""The tensor codec core every protocol's codec stands on: shapes checked, raw bytes and
typed contents decoded into NumPy arrays (and strings encoded), with one wording of every
refusal. The protocols' codecs (tensord_v1/codec.py, kserve/codec.py) map their messages'
fields onto these; the Python client shares the raw encoding.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensord.dtypes import DType, from_numpy
from tensord.errors import InvalidArgumentError, ResourceExhaustedError

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


def check_shape(shape: tuple[int, ...], label: str, itemsize: int = 8) -> int:
    """The element count of a request's shape; INVALID_ARGUMENT for too many dimensions, a
    negative one, or more bytes than any memory holds (zero dimensions aside)."""
    if len(shape) > MAX_RANK:
        raise InvalidArgumentError(
            f"{label}: shape has rank {len(shape)}; at most {MAX_RANK} dimensions are supported"
        )
    if shape and min(shape) < 0:
        raise InvalidArgumentError(
            f"{label}: shape {shape_text(shape)} has a negative dimension; every dimension "
            "must be >= 0"
        )
    count = math.prod(shape)
    nonzero = count if count else math.prod(d for d in shape if d)
    if nonzero * max(itemsize, 8) > MAX_BYTES:
        raise InvalidArgumentError(
            f"{label}: shape {shape_text(shape)} is too large to hold in memory (more than "
            f"2^{MAX_BYTES_LOG2} bytes, {MAX_BYTES >> 60} EiB, zero dimensions aside)"
        )
    return count


def decode_raw(
    raw: bytes,
    dtype: DType,
    shape: tuple[int, ...],
    count: int,
    label: str,
    field: str,
    type_name: str,
) -> np.ndarray:
    """A tensor's raw little-endian bytes as an array, wrapped without copying (read-only);
    `field` names where they came from ("raw_data"), `type_name` the protocol's type."""
    if dtype is DType.STRING:
        return decode_raw_strings(raw, shape, count, label)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgumentError(
            f"{label}: {field} has {len(raw)} bytes, but shape {shape_text(shape)} of "
            f"{type_name} needs {expected} ({count} elements x {dtype.itemsize} bytes)"
        )
    array = np.frombuffer(raw, dtype=dtype.numpy, count=count)
    if dtype is DType.BOOL and count:
        i = first_true(array.view(np.uint8) > 1)
        if i is not None:
            raise InvalidArgumentError(
                f"{label}: {field} byte {i} is {raw[i]}; BOOL {field} is one byte per "
                "element, 0 or 1"
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


NARROW_INTEGERS = frozenset({DType.UINT8, DType.INT8, DType.INT16})
"""Integers that travel widened to 32 bits in typed contents (both protocols)."""


def decode_contents(
    contents: Any,
    dtype: DType,
    shape: tuple[int, ...],
    count: int,
    label: str,
    field: str,
    fields: Sequence[str],
    type_name: str,
) -> np.ndarray:
    """A tensor's typed contents (`field`, one of the message's `fields`) as an array."""
    values = contents_values(contents, field, fields, shape, count, label, type_name)
    if dtype is DType.STRING:
        return string_array(values, shape, label)
    if dtype in NARROW_INTEGERS:
        return narrow_integers(values, dtype, field, label, type_name).reshape(shape)
    if dtype is DType.FLOAT16:  # travels widened to float
        wide = number_array(values, np.dtype(np.float32))
        with np.errstate(over="ignore"):
            narrow = wide.astype(np.float16)
        i = first_true(np.isfinite(wide) & ~np.isfinite(narrow))
        if i is not None:
            raise InvalidArgumentError(
                f"{label}: contents.{field}[{i}] = {float(wide[i]):g} is out of range for "
                f"{type_name} (largest 65504)"
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


CHUNK = 65_536
"""Elements converted per call between protobuf's repeated fields and NumPy. One call holds
the interpreter lock throughout; in chunks, a worker thread converting millions of values
lets the event loop run between them."""


def number_array(values: Sequence[Any], dtype: np.dtype) -> np.ndarray:
    """A repeated number field as an array, converted chunk by chunk."""
    if len(values) <= CHUNK:
        return np.array(values, dtype=dtype)
    out = np.empty(len(values), dtype=dtype)
    for start in range(0, len(values), CHUNK):
        out[start : start + CHUNK] = values[start : start + CHUNK]
    return out


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


TENSOR_STEPS = 256
"""What decoding one tensor costs beside its elements (its checks and wrapper objects), in
element steps: many small tensors cost the event loop as much as a few large ones."""


def encode_raw_strings(values: Sequence[object] | np.ndarray) -> bytes:
    """STRING raw encoding: per element a 4-byte little-endian length, then the bytes."""
    parts: list[bytes] = []
    for value in values:
        data = to_bytes(value)
        parts.append(_U32.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def to_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return str(value).encode("utf-8")


INLINE_STEPS = 32_768
"""Tensor conversions that walk more elements than this in Python (strings, typed contents)
run on a worker thread, so that the event loop keeps serving..."""
INLINE_BYTES = 4 * 1024 * 1024
"""...and so do those that copy more bytes than this."""


def plan_reply(
    outputs: Sequence[tuple[str, np.ndarray]], *, contents: bool, limit: int, form: str, hint: str
) -> bool:
    """One walk over a reply's outputs: RESOURCE_EXHAUSTED before encoding outputs that
    cannot fit in the `limit` bytes a reply may have (0: unchecked), worded with the
    encoding's `form` (" as raw bytes") and what to ask for instead (`hint`); else whether
    encoding them is big enough for a worker thread."""
    floor = steps = nbytes = 0
    for _, array in outputs:
        floor += encoded_size_floor(array, contents=contents)
        steps += encode_cost(array, contents=contents)
        nbytes += array.nbytes
    if limit and floor > limit:
        raise ResourceExhaustedError(
            f"the outputs take at least {floor} bytes{form}, more than the {limit} a reply may "
            f"have (server.max_send_message_bytes); {hint}"
        )
    return steps > INLINE_STEPS or nbytes > INLINE_BYTES
