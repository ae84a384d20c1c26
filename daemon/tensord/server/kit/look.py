"""The look at a request's bytes before they are parsed (wire.py): the model name, and
the counts that make parsing or decoding costly (tensors, names, ranks, typed integers,
token ids, protobuf fields), each refused as soon as it passes its limit. Each protocol
describes its messages with these (tensord_v1/intake.py, kserve/intake.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tensord.config_tables import LimitsSettings
from tensord.errors import InvalidArgumentError, ResourceExhaustedError
from tensord.server.kit.tensors import MAX_RANK
from tensord.wire import LENGTH, VARINT, WireError, count_varints, fields

SMALL_MESSAGE_BYTES = 64 * 1024
"""Requests that name a model at most (Health, Info, ModelReady), and a Generate's
sampling parameters, are never larger."""
_COUNT_BYTES = 16 * 1024 * 1024
"""Packed token ids are counted exactly up to this many bytes (milliseconds of work);
typed integers always are (a count of 64 MiB takes tens of milliseconds)."""
MAX_NAME_BYTES = 4096
"""The longest model, tensor or output name a request may carry."""
PARSED_INTEGER_BYTES = 8
"""What one typed integer of a request costs once parsed (protobuf keeps int64s)."""


@dataclass(slots=True)
class Look:
    """What a request's bytes say before they are parsed."""

    model: str = ""
    version: int = 0
    prompt_bytes: int = 0
    """Generate: the text prompt's length in bytes."""
    token_ids: int = 0
    """Generate: how many prompt_token_ids (the fewest there can be when not exact)."""
    token_ids_exact: bool = True
    parsed_extra_bytes: int = 0
    """How much more memory the parsed message takes than its wire bytes (typed integers
    packed as one-byte varints become 8 bytes each)."""


class Walk:
    """Counts the fields read; RESOURCE_EXHAUSTED past the budget. `on_model` sees the model
    name as soon as it is read (serializers write it first), so a caller who may not use
    the model learns nothing more about its request."""

    def __init__(
        self, data: bytes, limits: LimitsSettings, on_model: Callable[[str], None]
    ) -> None:
        self.data = data
        self.limits = limits
        self.left = limits.max_request_fields
        self.on_model = on_model

    def fields(self, start: int = 0, end: int | None = None) -> Iterator[Any]:
        for field in fields(self.data, start, end):
            self.left -= 1
            if self.left < 0:
                raise ResourceExhaustedError(
                    f"the request holds more than {self.limits.max_request_fields} protobuf "
                    "fields ([limits] max_request_fields); send tensors as raw_data, and "
                    "repeated numbers packed, as every proto3 library does"
                )
            yield field

    def model(self, field: Any) -> str:
        name = self.text(field, "the model name")
        self.on_model(name)
        return name

    def text(self, field: Any, what: str) -> str:
        if field.wire_type != LENGTH:
            raise WireError(f"field {field.number} should be length-delimited")
        if field.end - field.value > MAX_NAME_BYTES:
            raise InvalidArgumentError(
                f"{what} takes {field.end - field.value} bytes; names are at most "
                f"{MAX_NAME_BYTES} bytes"
            )
        try:
            return bytes(self.data[field.value : field.end]).decode()
        except UnicodeDecodeError:
            raise WireError(f"field {field.number} is not valid UTF-8") from None

    def tensor_count(self, count: int, what: str) -> int:
        """count + 1, refused past [limits] max_tensors_per_request."""
        limit = self.limits.max_tensors_per_request
        if count + 1 > limit:
            raise InvalidArgumentError(
                f"the request has more than {limit} {what}; a request takes at most {limit} "
                "([limits] max_tensors_per_request)"
            )
        return count + 1

    def typed_integers(self, count: int, instead: str) -> int:
        """`count` typed bool and integer values so far, refused past [limits]
        max_typed_integers; `instead` says how to send such tensors ("as raw_data")."""
        cap = self.limits.max_typed_integers
        if cap and count > cap:
            raise InvalidArgumentError(
                f"the request carries more than {cap} bool and integer values as typed "
                f"contents ([limits] max_typed_integers); send tensors this large {instead}"
            )
        return count

    def repeated_numbers(self, field: Any, exact: bool = False) -> tuple[int, bool]:
        """Entries of one repeated number field occurrence: 1 unpacked; packed, the count
        (or, past _COUNT_BYTES and unless `exact`, the fewest a field that long holds: a
        varint takes at most 10 bytes, and so many ids pass any model's context)."""
        if field.wire_type != LENGTH:
            return 1, True
        length = field.end - field.value
        if length > _COUNT_BYTES and not exact:
            return length // 10, False
        return count_varints(self.data, field.value, field.end), True


def small_message(walk: Walk) -> None:
    """INVALID_ARGUMENT for a request that should be small (a name and a version at most)."""
    if len(walk.data) > SMALL_MESSAGE_BYTES:
        raise InvalidArgumentError(
            f"the request takes {len(walk.data)} bytes; this request is never larger than "
            f"{SMALL_MESSAGE_BYTES}"
        )


def model_and_version(
    walk: Walk, field: Any, look: Look, version_text: Callable[[str], int] | None = None
) -> bool:
    """Fields 1 and 2 of every model request: the model name and its version, a varint
    (tensord.v1) or a string `version_text` reads (the Open Inference Protocol); True when
    `field` was one of them. Every occurrence of the name is checked: protobuf keeps the
    last."""
    if field.number == 1 and field.wire_type == LENGTH:
        look.model = walk.model(field)
    elif field.number != 2:
        return False
    elif version_text is None and field.wire_type == VARINT:
        look.version = field.value
    elif version_text is not None and field.wire_type == LENGTH:
        look.version = version_text(walk.text(field, "the model version"))
    else:
        return False
    return True


@dataclass(frozen=True, slots=True)
class InferFields:
    """Where a protocol's inference request keeps what the intake bounds (field numbers)."""

    inputs: int
    """The repeated input tensor messages."""
    outputs: int
    """The requested outputs: names (`output_name` 0) or messages holding a name."""
    output_name: int
    typed_integers: frozenset[int]
    """The tensor contents' fields that carry varints."""
    raw_hint: str
    """How to send large integer tensors instead ("as raw_data")."""
    version_text: Callable[[str], int] | None = None
    texts: tuple[tuple[int, str], ...] = ()
    """Other string fields of an input tensor, bounded as names: (number, what)."""
    tensor_name: int = 1
    tensor_shape: int = 3
    tensor_contents: int = 5


def look_tensor(walk: Walk, field: Any, index: int, spec: InferFields) -> int:
    """One input tensor: its name's length and its rank, refused past their limits before
    protobuf builds them (as the decoder would word it); the typed integers its contents
    hold."""
    rank = integers = 0
    exact = True
    name = ""
    texts = dict(spec.texts)
    for inner in walk.fields(field.value, field.end):
        if inner.number == spec.tensor_name:
            name = walk.text(inner, f"inputs[{index}]'s name")
        elif inner.number == spec.tensor_shape:  # repeated int64, packed or not
            count, counted = walk.repeated_numbers(inner)
            rank += count
            exact &= counted
        elif inner.number == spec.tensor_contents and inner.wire_type == LENGTH:
            for value in walk.fields(inner.value, inner.end):
                if value.number in spec.typed_integers:
                    integers += walk.repeated_numbers(value, exact=True)[0]
        elif inner.number in texts:
            walk.text(inner, f"inputs[{index}]'s {texts[inner.number]}")
    if rank > MAX_RANK:
        raise InvalidArgumentError(
            f"inputs[{index}] {name!r}: shape has rank {'' if exact else 'at least '}{rank}; "
            f"at most {MAX_RANK} dimensions are supported"
        )
    return integers


def look_infer(walk: Walk, spec: InferFields) -> Look:
    """An inference request (Predict, ModelInfer): the model, its inputs' names, ranks and
    typed integers, and the requested outputs' names, each counted against the limits."""
    look = Look()
    tensors = names = integers = 0
    for field in walk.fields():
        if model_and_version(walk, field, look, spec.version_text):
            continue
        if field.number == spec.inputs and field.wire_type == LENGTH:
            integers += look_tensor(walk, field, tensors, spec)
            tensors = walk.tensor_count(tensors, "input tensors")
            walk.typed_integers(integers, spec.raw_hint)
        elif field.number == spec.outputs and not spec.output_name:
            walk.text(field, f"output_names[{names}]")
            names = walk.tensor_count(names, "output names")
        elif field.number == spec.outputs and field.wire_type == LENGTH:
            for inner in walk.fields(field.value, field.end):
                if inner.number == spec.output_name:
                    walk.text(inner, f"outputs[{names}]'s name")
            names = walk.tensor_count(names, "requested outputs")
    look.parsed_extra_bytes = integers * PARSED_INTEGER_BYTES
    return look


def look_model(walk: Walk, version_text: Callable[[str], int] | None = None) -> Look:
    """A small request naming a model and perhaps a version (Health, ModelReady,
    ModelMetadata): both read, the name checked as soon as it is read."""
    small_message(walk)
    look = Look()
    for field in walk.fields():
        model_and_version(walk, field, look, version_text)
    return look


def look_empty(walk: Walk) -> Look:
    """A small message with no fields the intake reads (InfoRequest, ServerLive): unknown
    fields are only counted."""
    small_message(walk)
    for _ in walk.fields():
        pass
    return Look()
