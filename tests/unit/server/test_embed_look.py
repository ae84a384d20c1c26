"""The intake's look at an EmbedRequest before it is parsed: the model read first, the
inputs counted (too many refused), the token ids counted for the request's budget."""

from __future__ import annotations

import pytest

from tensord.config_tables import LimitsSettings
from tensord.errors import InvalidArgumentError
from tensord.server.kit.look import Walk
from tensord.server.tensord_v1.intake import LOOKERS
from tensord.v1 import inference_pb2 as pb


def look(request: bytes, seen: list[str] | None = None) -> object:
    walk = Walk(request, LimitsSettings(), (seen if seen is not None else []).append)
    return LOOKERS["Embed"](walk)


def test_the_model_and_token_ids_are_read() -> None:
    seen: list[str] = []
    request = pb.EmbedRequest(model="minilm", version=3)
    for ids in ([1, 2, 3], [4] * 100):
        request.token_ids.add().ids.extend(ids)
    result = look(request.SerializeToString(), seen)
    assert seen == ["minilm"]
    assert (result.model, result.version, result.token_ids) == ("minilm", 3, 103)  # type: ignore[attr-defined]


def test_too_many_inputs_are_refused_unparsed() -> None:
    request = pb.EmbedRequest(model="m", texts=["a"] * 2049)
    with pytest.raises(InvalidArgumentError, match="more than 2048 inputs"):
        look(request.SerializeToString())
    assert look(pb.EmbedRequest(model="m", texts=["a"] * 2048).SerializeToString())


def test_fields_of_unknown_numbers_and_kinds_pass() -> None:
    data = pb.EmbedRequest(model="m", texts=["x"]).SerializeToString()
    data += bytes([9 << 3 | 0, 5, 10 << 3 | 5, 0, 0, 0, 0])  # unknown varint and fixed32
    assert look(data)
