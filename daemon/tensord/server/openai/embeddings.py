"""/v1/embeddings: OpenAI's request body to an Embed call, and its answer to OpenAI's shape
(float lists, or base64 of little-endian float32, which the openai client asks for by
default)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from tensord.dataplane import MAX_EMBED_INPUTS, EmbedCall, EmbedResult
from tensord.errors import ResourceExhaustedError
from tensord.server.openai.requests import RequestError

_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user", "truncate"})
"""OpenAI's fields, and `truncate` (an extension, as text-embeddings-inference names it)."""
_FORMATS = ("float", "base64")


def embed_request(body: Any) -> tuple[EmbedCall, str]:
    """The body as an Embed call (every input, checked for its type), and the encoding
    asked for."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    unknown = sorted(k for k in body if k not in _FIELDS)
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r}: this server does not take it", unknown[0]
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model must be the name of an embedding model", "model")
    texts, token_ids = _inputs(body.get("input"))
    encoding = body.get("encoding_format") or "float"
    if encoding not in _FORMATS:
        raise RequestError(
            f"encoding_format {encoding!r:.40} is not one of {list(_FORMATS)}", "encoding_format"
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise RequestError(
            f"dimensions must be an integer >= 1, got {dimensions!r:.40}", "dimensions"
        )
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RequestError(f"truncate must be true or false, got {truncate!r:.40}", "truncate")
    call = EmbedCall(model, 0, texts, token_ids, truncate, dimensions or 0)
    return call, encoding


def _inputs(value: Any) -> tuple[list[str], list[list[int]]]:
    """input: a string, a list of strings, a list of token ids, or a list of such lists."""
    if isinstance(value, str):
        return [value], []
    if not isinstance(value, list) or not value:
        raise RequestError(
            "input must be a string, a list of strings, or token ids (a list of integers, or "
            "a list of such lists), and not empty",
            "input",
        )
    if len(value) > MAX_EMBED_INPUTS and not _is_token(value[0]):
        raise RequestError(
            f"input has {len(value)} items; at most {MAX_EMBED_INPUTS} may go in one request",
            "input",
        )
    first = value[0]
    if isinstance(first, str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise RequestError(
                    f"input[{i}] is {item!r:.40}: a list of texts holds strings", "input"
                )
        return list(value), []
    if _is_token(first):
        return [], [_token_list(value, "input")]
    if isinstance(first, list):
        return [], [_token_list(item, f"input[{i}]") for i, item in enumerate(value)]
    raise RequestError(
        f"input[0] is {first!r:.40}: not a string, a token id or a list of ids", "input"
    )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_token(t) for t in value):
        raise RequestError(f"{where} must be a list of token ids (integers)", "input")
    return value


MAX_REPLY_BYTES = 256 * 1024 * 1024
"""The largest answer rendered (about: a float takes up to 16 characters of JSON)."""


def embed_response(result: EmbedResult, encoding: str, model: str) -> bytes:
    """The answer's JSON body: one entry a vector, in order, and the tokens they took.
    Rendered a row at a time (json.dumps holds the GIL for all it is given: on a worker
    thread, the event loop gets its turns between rows)."""
    vectors = result.vectors
    size = response_bytes(vectors, encoding)
    if size > MAX_REPLY_BYTES:
        raise ResourceExhaustedError(
            f"the answer would take about {size >> 20} MiB, more than {MAX_REPLY_BYTES >> 20} "
            "MiB: send fewer inputs a request, ask for fewer dimensions, or for base64"
        )
    parts = []
    if encoding == "base64":
        for i, row in enumerate(vectors.astype("<f4", copy=False)):
            text = base64.b64encode(row.tobytes()).decode("ascii")
            parts.append(f'{{"object":"embedding","index":{i},"embedding":"{text}"}}')
    else:
        for i, row in enumerate(vectors):
            values = json.dumps(row.tolist(), separators=(",", ":"))
            parts.append(f'{{"object":"embedding","index":{i},"embedding":{values}}}')
    tokens = result.prompt_tokens
    tail = json.dumps(
        {"model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
        separators=(",", ":"),
    )
    return f'{{"object":"list","data":[{",".join(parts)}],{tail[1:]}'.encode()


def response_bytes(vectors: np.ndarray, encoding: str = "float") -> int:
    """About the bytes of an answer (a worker thread renders a large one)."""
    return int(vectors.size) * (6 if encoding == "base64" else 16)
