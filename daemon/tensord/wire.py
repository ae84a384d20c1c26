"""Reading protobuf's wire format field by field, before any message is parsed.

The server looks at a request's bytes before protobuf parses them (server/kit/intake.py): the
model name, how many tensors or token ids it holds, how long its prompt is. Parsing
millions of tiny fields holds the interpreter lock for seconds in one call, so the look
must cost in proportion to the fields it reads and stop as soon as a limit is passed. A
field's bytes are never copied: length-delimited values come back as (start, end).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5


class WireError(ValueError):
    """The bytes are not a protobuf message (a truncated or malformed field)."""


@dataclass(slots=True)
class Field:
    """One field as it is on the wire."""

    number: int
    wire_type: int
    value: int
    """A varint's value; for a length-delimited field, the offset of its first byte."""
    end: int
    """The offset just past the field's value."""


def read_varint(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, offset past it) of the varint at `pos`; at most 10 bytes."""
    result = shift = 0
    for i in range(pos, min(end, pos + 10)):
        byte = data[i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i + 1
        shift += 7
    raise WireError(f"a varint at byte {pos} is truncated or longer than 10 bytes")


def fields(data: bytes | memoryview, start: int = 0, end: int | None = None) -> Iterator[Field]:
    """The fields of the message in data[start:end], in order. Groups (deprecated, and in
    none of tensord's messages) are refused."""
    end = len(data) if end is None else end
    pos = start
    while pos < end:
        key, pos = read_varint(data, pos, end)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire_type == VARINT:
            value, pos = read_varint(data, pos, end)
            yield Field(number, wire_type, value, pos)
        elif wire_type == LENGTH:
            length, pos = read_varint(data, pos, end)
            if pos + length > end:
                raise WireError(f"field {number} claims {length} bytes; {end - pos} are left")
            yield Field(number, wire_type, pos, pos + length)
            pos += length
        elif wire_type in (FIXED32, FIXED64):
            size = 4 if wire_type == FIXED32 else 8
            if pos + size > end:
                raise WireError(f"field {number} is truncated")
            yield Field(number, wire_type, pos, pos + size)
            pos += size
        else:
            raise WireError(f"field {number} has wire type {wire_type}, which tensord never uses")


def count_varints(data: bytes | memoryview, start: int, end: int) -> int:
    """How many varints a packed repeated field of data[start:end] holds (one per byte
    without the continuation bit), without decoding or copying them."""
    view = np.frombuffer(data, np.uint8, count=end - start, offset=start)
    return int(np.count_nonzero(view < 0x80))
