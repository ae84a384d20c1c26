"""The intake's look at tensord.v1 requests before they are parsed (kit/intake.py): the
model name read first and checked, Predict's tensors bounded as every protocol's are,
Generate's prompt and token ids counted, sampling parameters bounded. The field numbers
are inference.proto's.
"""

from __future__ import annotations

from collections.abc import Callable

from tensord.dataplane import MAX_EMBED_INPUTS
from tensord.errors import InvalidArgumentError
from tensord.server.kit import look as kit
from tensord.server.kit.look import Look, Walk
from tensord.wire import LENGTH

_SAMPLING_BYTES = 1024 * 1024
"""A Generate's sampling parameters are never larger: stop strings and ids are bounded by
count, and a constraint (a JSON schema, a grammar) by [generator] max_constraint_bytes."""

PREDICT_FIELDS = kit.InferFields(
    inputs=3,
    outputs=4,
    output_name=0,
    typed_integers=frozenset({1, 2, 3}),  # TensorContents bool, int32 and int64 values
    raw_hint="as raw_data",
)
"""PredictRequest: model 1, version 2 (a number), inputs 3, output_names 4."""


def _look_predict(walk: Walk) -> Look:
    return kit.look_infer(walk, PREDICT_FIELDS)


def _look_generate(walk: Walk) -> Look:
    look = Look()
    sampling = 0
    for field in walk.fields():
        if kit.model_and_version(walk, field, look):
            continue
        if field.number == 3 and field.wire_type == LENGTH:
            look.prompt_bytes = field.end - field.value  # protobuf keeps the last one
        elif field.number == 4:
            count, exact = walk.repeated_numbers(field)
            look.token_ids += count
            look.token_ids_exact &= exact
        elif field.number == 5 and field.wire_type == LENGTH:
            sampling += field.end - field.value  # protobuf merges every occurrence
            if sampling > _SAMPLING_BYTES:
                raise InvalidArgumentError(
                    f"sampling takes more than {_SAMPLING_BYTES} bytes; sampling parameters "
                    f"(stop strings, stop token ids and a constraint included) fit in "
                    f"{_SAMPLING_BYTES}"
                )
            for _ in walk.fields(field.value, field.end):
                pass
    look.parsed_extra_bytes = look.token_ids * kit.PARSED_INTEGER_BYTES
    return look


def _look_embed(walk: Walk) -> Look:
    """EmbedRequest: model 1, version 2, texts 3, token_ids 4 (each a TokenIds, whose
    ids are counted); too many inputs are refused before the message is parsed."""
    look = Look()
    inputs = 0
    for field in walk.fields():
        if kit.model_and_version(walk, field, look):
            continue
        if field.number in (3, 4) and field.wire_type == LENGTH:
            inputs += 1
            if inputs > MAX_EMBED_INPUTS:
                raise InvalidArgumentError(
                    f"the request has more than {MAX_EMBED_INPUTS} inputs; at most "
                    f"{MAX_EMBED_INPUTS} may go in one request"
                )
            if field.number == 4:
                for ids in walk.fields(field.value, field.end):
                    count, _ = walk.repeated_numbers(ids)
                    look.token_ids += count
    look.parsed_extra_bytes = look.token_ids * kit.PARSED_INTEGER_BYTES
    return look


LOOKERS: dict[str, Callable[[Walk], Look]] = {
    "Predict": _look_predict,
    "Generate": _look_generate,
    "Embed": _look_embed,
    "Health": kit.look_model,
    "Info": kit.look_empty,
    "RepositoryIndex": kit.look_empty,
    "LoadModel": kit.look_model,
    "UnloadModel": kit.look_model,
}
"""How the intake looks at each InferenceService request, by RPC name."""
