"""The intake's look at Open Inference Protocol (KServe v2) requests, before they are parsed.

The same bounds as tensord.v1's Predict (intake.py): the model name is read first and
checked (authorization), names and ranks are bounded, typed integers counted, and the
number of tensors and fields capped, so a refused request is never parsed. The field
numbers are grpc_service.proto's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensord.errors import InvalidArgumentError
from tensord.server.codec import MAX_RANK
from tensord.server.intake import Look, Walk
from tensord.wire import LENGTH

_SMALL_MESSAGE_BYTES = 64 * 1024
"""Every request but ModelInfer is a model name and a version at most."""
_PARSED_INTEGER_BYTES = 8
# InferTensorContents: bool, int, int64, uint and uint64 contents are varints.
_TYPED_INTEGER_FIELDS = frozenset({1, 2, 3, 4, 5})


def parse_version(text: str) -> int:
    """A model_version string as tensord's version number (0: the newest ready one)."""
    if not text:
        return 0
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise InvalidArgumentError(
            f"model version {text[:64]!r} is not a version number; tensord's versions are "
            "positive integers (leave it empty for the newest ready version)"
        )
    return int(text)


def _small(walk: Walk) -> None:
    if len(walk.data) > _SMALL_MESSAGE_BYTES:
        raise InvalidArgumentError(
            f"the request takes {len(walk.data)} bytes; this request is never larger than "
            f"{_SMALL_MESSAGE_BYTES}"
        )


def _name_and_version(walk: Walk, field: Any, look: Look) -> bool:
    """Fields 1 and 2 of every model request: name and version string (True when `field`
    was one of them). Every occurrence of the name is checked: protobuf keeps the last."""
    if field.number == 1 and field.wire_type == LENGTH:
        look.model = walk.model(field)
    elif field.number == 2 and field.wire_type == LENGTH:
        look.version = parse_version(walk.text(field, "the model version"))
    else:
        return False
    return True


def _look_model(walk: Walk) -> Look:
    """ModelReady, ModelMetadata, ModelConfig, ModelStatistics: a name and a version."""
    _small(walk)
    look = Look()
    for field in walk.fields():
        _name_and_version(walk, field, look)
    return look


def _look_server(walk: Walk) -> Look:
    """ServerLive, ServerReady, ServerMetadata: no fields (unknown ones only counted)."""
    _small(walk)
    for _ in walk.fields():
        pass
    return Look()


def _look_input(walk: Walk, field: Any, index: int) -> int:
    """One InferInputTensor: its name's length and its rank bounded; the typed integers its
    contents hold."""
    rank = integers = 0
    name = ""
    for inner in walk.fields(field.value, field.end):
        if inner.number == 1:
            name = walk.text(inner, f"inputs[{index}]'s name")
        elif inner.number == 2:
            walk.text(inner, f"inputs[{index}]'s datatype")
        elif inner.number == 3:  # shape: repeated int64, packed or not
            rank += walk.repeated_numbers(inner)[0]
        elif inner.number == 5 and inner.wire_type == LENGTH:
            for value in walk.fields(inner.value, inner.end):
                if value.number in _TYPED_INTEGER_FIELDS:
                    integers += walk.repeated_numbers(value, exact=True)[0]
    if rank > MAX_RANK:
        raise InvalidArgumentError(
            f"inputs[{index}] {name!r}: shape has rank {rank}; at most {MAX_RANK} dimensions "
            "are supported"
        )
    return integers


def _look_infer(walk: Walk) -> Look:
    """ModelInferRequest: model_name 1, model_version 2, inputs 5, outputs 6."""
    look = Look()
    tensors = names = integers = 0
    for field in walk.fields():
        if _name_and_version(walk, field, look):
            continue
        if field.number == 5 and field.wire_type == LENGTH:
            integers += _look_input(walk, field, tensors)
            tensors = walk.tensor_count(tensors, "input tensors")
            walk.typed_integers(integers, "in raw_input_contents")
        elif field.number == 6 and field.wire_type == LENGTH:
            for inner in walk.fields(field.value, field.end):
                if inner.number == 1:
                    walk.text(inner, f"outputs[{names}]'s name")
            names = walk.tensor_count(names, "requested outputs")
    look.parsed_extra_bytes = integers * _PARSED_INTEGER_BYTES
    return look


LOOKERS: dict[str, Callable[[Walk], Look]] = {
    "ServerLive": _look_server,
    "ServerReady": _look_server,
    "ServerMetadata": _look_server,
    "ModelReady": _look_model,
    "ModelMetadata": _look_model,
    "ModelConfig": _look_model,
    "ModelStatistics": _look_model,
    "ModelInfer": _look_infer,
}
"""How the intake looks at each GRPCInferenceService request, by RPC name."""
