"""The kinds of model a call may go to, and the refusal of a call for the wrong kind."""

from __future__ import annotations

from typing import Literal

from tensord.dataplane.types import TableEntry
from tensord.errors import FailedPreconditionError

Kind = Literal["predict", "generator", "embedding"]
PREDICT: Kind = "predict"
GENERATOR: Kind = "generator"
EMBEDDING: Kind = "embedding"


class WrongKindError(FailedPreconditionError):
    """The call's RPC is not for the model's kind (Generate on a predict model)."""

    def __init__(self, message: str, model: str, kind: str) -> None:
        super().__init__(message)
        self.model = model
        self.kind = kind
        """The kind the model is."""


_WRONG_KIND = {
    PREDICT: (
        "model {!r} is a generator: call Generate, which streams its tokens (Predict runs "
        "predict models: tensors in, tensors out)"
    ),
    GENERATOR: (
        "model {!r} is a predict model (tensors in, tensors out), not a generator: call "
        "Predict, or Generate on a generator model (Info lists each model's kind)"
    ),
    EMBEDDING: (
        "model {!r} is not an embedding model (texts in, vectors out): Info lists each model's kind"
    ),
}
_WRONG_FOR_EMBEDDING = (
    "model {!r} is an embedding model: call Embed (or Predict with a BYTES input of texts), "
    "not Generate"
)


def check_kind(entry: TableEntry, kind: Kind) -> None:
    """FAILED_PRECONDITION unless a `kind` call may go to `entry`'s model (Predict may go
    to an embedding model too: texts in a BYTES input)."""
    if entry.kind == kind or (kind == PREDICT and entry.kind == EMBEDDING):
        return
    message = _WRONG_KIND[kind]
    if kind == GENERATOR and entry.kind == EMBEDDING:
        message = _WRONG_FOR_EMBEDDING
    raise WrongKindError(message.format(entry.name), entry.name, entry.kind)
