"""OpenAI response bodies: completions, chat completions, their stream chunks, usage, and
errors in OpenAI's shape with the HTTP status of tensord's gRPC status."""

from __future__ import annotations

import json
import time
from typing import Any

import grpc

from tensord.dataplane import RequestOutput

HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
"""The HTTP status of each gRPC status, as Google's APIs map them (gRPC's own code table);
a client stops or retries on the HTTP status as a gRPC client would on the gRPC one."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def error_body(
    code: grpc.StatusCode, message: str, param: str | None = None, status: int | None = None
) -> dict[str, Any]:
    """`{"error": {message, type, param, code}}`; `code` is the gRPC status, lower case."""
    status = status or HTTP_STATUS.get(code, 500)
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error"),
            "param": param,
            "code": code.name.lower(),
        }
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Shapes:
    """The objects of one request: a completion or a chat completion, whole or in chunks."""

    def __init__(self, chat: bool, model: str, request_id: str) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.created = int(time.time())

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def whole(self, text: str, finish_reason: str | None, counts: dict[str, int]) -> dict[str, Any]:
        """The non-streamed answer."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._object(kind, [choice]), "usage": counts}

    def chunk(
        self, chunk: RequestOutput | None, include_usage: bool, first: bool = False
    ) -> dict[str, Any]:
        """One streamed chunk: a text delta, the finish reason on the last (None: the chat
        stream's opening chunk, which names the role)."""
        text = chunk.text if chunk is not None else ""
        reason = chunk.finish_reason if chunk is not None else None
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = self._object(kind, [choice])
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, counts: dict[str, int]) -> dict[str, Any]:
        """The last chunk when the request asked for usage: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._object(kind, []), "usage": counts}


def event(body: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return f"data: {data}\n\n".encode()
