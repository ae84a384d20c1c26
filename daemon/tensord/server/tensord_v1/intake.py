"""The intake's look at tensord.v1 requests before they are parsed (kit/intake.py): the
model name read first and checked, Predict's tensors bounded as every protocol's are,
Generate's prompt and token ids counted, sampling parameters bounded. The field numbers
are inference.proto's.
"""

from __future__ import annotations

from collections.abc import Callable

from tensord.errors import InvalidArgumentError
from tensord.server.kit.look import (
    PARSED_INTEGER_BYTES,
    SMALL_MESSAGE_BYTES,
    InferFields,
    Look,
    Walk,
    look_empty,
    look_infer,
    model_and_version,
    small_message,
)
from tensord.wire import LENGTH

PREDICT_FIELDS = InferFields(
    inputs=3,
    outputs=4,
    output_name=0,
    typed_integers=frozenset({1, 2, 3}),  # TensorContents bool, int32 and int64 values
    raw_hint="as raw_data",
)
"""PredictRequest: model 1, version 2 (a number), inputs 3, output_names 4."""


def _look_predict(walk: Walk) -> Look:
    return look_infer(walk, PREDICT_FIELDS)


def _look_generate(walk: Walk) -> Look:
    look = Look()
    sampling = 0
    for field in walk.fields():
        if model_and_version(walk, field, look):
            continue
        if field.number == 3 and field.wire_type == LENGTH:
            look.prompt_bytes = field.end - field.value  # protobuf keeps the last one
        elif field.number == 4:
            count, exact = walk.repeated_numbers(field)
            look.token_ids += count
            look.token_ids_exact &= exact
        elif field.number == 5 and field.wire_type == LENGTH:
            sampling += field.end - field.value  # protobuf merges every occurrence
            if sampling > SMALL_MESSAGE_BYTES:
                raise InvalidArgumentError(
                    f"sampling takes more than {SMALL_MESSAGE_BYTES} bytes; sampling "
                    "parameters (stop strings and stop token ids included) fit in "
                    f"{SMALL_MESSAGE_BYTES}"
                )
            for _ in walk.fields(field.value, field.end):
                pass
    look.parsed_extra_bytes = look.token_ids * PARSED_INTEGER_BYTES
    return look


def _look_health(walk: Walk) -> Look:
    small_message(walk)
    look = Look()
    for field in walk.fields():
        if field.number == 1 and field.wire_type == LENGTH:
            look.model = walk.model(field)
    return look


LOOKERS: dict[str, Callable[[Walk], Look]] = {
    "Predict": _look_predict,
    "Generate": _look_generate,
    "Health": _look_health,
    "Info": look_empty,
}
"""How the intake looks at each InferenceService request, by RPC name."""
