"""The intake's look at Open Inference Protocol (KServe v2) requests, before they are parsed.

The same bounds as tensord.v1's Predict (intake.py): the model name is read first and
checked (authorization), names and ranks are bounded, typed integers counted, and the
number of tensors and fields capped, so a refused request is never parsed. The field
numbers are grpc_service.proto's.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tensord.errors import InvalidArgumentError
from tensord.server.kit.look import (
    InferFields,
    Look,
    Walk,
    look_empty,
    look_infer,
    look_model,
)
from tensord.wire import LENGTH


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


INFER_FIELDS = InferFields(
    inputs=5,
    outputs=6,
    output_name=1,
    # InferTensorContents: bool, int, int64, uint and uint64 contents are varints.
    typed_integers=frozenset({1, 2, 3, 4, 5}),
    raw_hint="in raw_input_contents",
    version_text=parse_version,
    texts=((2, "datatype"),),
)
"""ModelInferRequest: model_name 1, model_version 2 (a string), inputs 5, outputs 6."""


_look_model = partial(look_model, version_text=parse_version)
"""ModelReady, ModelMetadata, ModelConfig, ModelStatistics: a name and a version string."""


def _look_repository_model(walk: Walk) -> Look:
    """RepositoryModelLoad and RepositoryModelUnload: repository_name 1, model_name 2 (read
    and checked as soon as it is read), parameters 3 (their size bounded by the intake's
    message limit)."""
    look = Look()
    for field in walk.fields():
        if field.number == 2 and field.wire_type == LENGTH:
            look.model = walk.model(field)
    return look


LOOKERS: dict[str, Callable[[Walk], Look]] = {
    "ServerLive": look_empty,
    "ServerReady": look_empty,
    "ServerMetadata": look_empty,
    "ModelReady": _look_model,
    "ModelMetadata": _look_model,
    "ModelConfig": _look_model,
    "ModelStatistics": _look_model,
    "ModelInfer": partial(look_infer, spec=INFER_FIELDS),
    "RepositoryIndex": look_empty,
    "RepositoryModelLoad": _look_repository_model,
    "RepositoryModelUnload": _look_repository_model,
}
"""How the intake looks at each GRPCInferenceService request, by RPC name."""
