"""OpenAI response bodies: completions, chat completions, their stream chunks, usage, and
errors in OpenAI's shape with the HTTP status of tensord's gRPC status."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tensord.dataplane import RequestOutput, TokenLogprob

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


_LOWEST_LOGPROB = -9999.0
"""What a log probability of minus infinity is written as (JSON has no infinities)."""


class Logprobs:
    """The `logprobs` of a request's choices: per token its text, log probability and the
    `top` most likely alternatives; completions in the legacy shape (tokens,
    token_logprobs, top_logprobs, text_offset), chat as a list of token objects."""

    def __init__(self, chat: bool, top: int, texts: Callable[[Sequence[int]], list[str]]) -> None:
        self.chat = chat
        self.top = top
        self.texts = texts
        self.offset = 0
        """Completions: where the next token's text starts in the completion."""

    def of(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The `logprobs` object of these tokens (a chunk's, or a whole answer's)."""
        ids = {lp.token_id for lp in logprobs}
        ids.update(t for lp in logprobs for t, _ in lp.top[: self.top])
        order = sorted(ids)
        text = dict(zip(order, self.texts(order), strict=True))
        if self.chat:
            return {"content": [self._chat_token(lp, text) for lp in logprobs]}
        tokens = [text[lp.token_id] for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(self.offset)
            self.offset += len(token)
        tops = []
        for lp in logprobs:
            top = {text[t]: _finite(p) for t, p in lp.top[: self.top]}
            top.setdefault(text[lp.token_id], _finite(lp.logprob))  # as vLLM: the chosen too
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(lp.logprob) for lp in logprobs],
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _chat_token(self, lp: TokenLogprob, text: dict[int, str]) -> dict[str, Any]:
        entry = _chat_entry(text[lp.token_id], lp.logprob)
        entry["top_logprobs"] = [_chat_entry(text[t], p) for t, p in lp.top[: self.top]]
        return entry


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": _finite(logprob),
        "bytes": list(token.encode("utf-8", errors="replace")),
    }


def _finite(logprob: float) -> float:
    return max(float(logprob), _LOWEST_LOGPROB)


class Shapes:
    """The objects of one request: a completion or a chat completion, whole or in chunks."""

    def __init__(
        self, chat: bool, model: str, request_id: str, logprobs: Logprobs | None = None
    ) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.created = int(time.time())
        self.logprobs = logprobs

    def _logprobs(self, chunk: RequestOutput | None) -> dict[str, Any] | None:
        if self.logprobs is None or chunk is None:
            return None
        return self.logprobs.of(chunk.logprobs or ())

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def whole(self, output: RequestOutput, counts: dict[str, int]) -> dict[str, Any]:
        """The non-streamed answer: `output` holds every chunk merged."""
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self._logprobs(output),
            "finish_reason": output.finish_reason,
        }
        if self.chat:
            choice["message"] = {"role": "assistant", "content": output.text}
        else:
            choice["text"] = output.text
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._object(kind, [choice]), "usage": counts}

    def chunk(
        self, chunk: RequestOutput | None, include_usage: bool, first: bool = False
    ) -> dict[str, Any]:
        """One streamed chunk: a text delta, the finish reason on the last (None: the chat
        stream's opening chunk, which names the role)."""
        text = chunk.text if chunk is not None else ""
        reason = chunk.finish_reason if chunk is not None else None
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self._logprobs(chunk),
            "finish_reason": reason,
        }
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
    # "surrogatepass": an error event may quote a request's lone surrogate back.
    return f"data: {data}\n\n".encode("utf-8", "surrogatepass")
