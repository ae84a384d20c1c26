"""OpenAI request bodies to the data plane's terms: checked field by field, each problem an
INVALID_ARGUMENT that names the field (`param`), and nothing the server cannot do ignored.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from tensord.dataplane import MAX_LOGPROBS, Constraint, SamplingParams
from tensord.errors import InvalidArgumentError

_IGNORED = frozenset({"user", "metadata", "store", "service_tier"})
"""Fields that ask nothing of the generation (a caller's label): accepted and unused."""
_COMMON = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "n",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        # Extensions, named as vLLM names them.
        "top_k",
        "repetition_penalty",
        "ignore_eos",
        # Structured output: OpenAI's response_format, and vLLM's guided_* extensions.
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    }
)
_COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT_FIELDS = _COMMON | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
}
_UNSUPPORTED = {
    "tools": "tool calls are not supported",
    "tool_choice": "tool calls are not supported",
    "functions": "function calls are not supported",
    "function_call": "function calls are not supported",
    "suffix": "suffix (insertion) is not supported",
    "logit_bias": "logit_bias is not supported",
}


class RequestError(InvalidArgumentError):
    """A bad request field; `param` names it, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class GenerationRequest:
    """What a completions or chat request asks of the data plane."""

    model: str
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    prompt: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    logprobs: int | None = None
    """Alternatives to show per token with its log probability; None: no log
    probabilities."""


def _typed(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise RequestError(f"{name} must be {what}, got {value!r:.80}", name)
    return value


def _refuse_unsupported(body: dict[str, Any], known: frozenset[str]) -> None:
    unknown = sorted(k for k in body if k not in known and k not in _IGNORED)
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r}: this server does not take it", unknown[0]
        )
    for name, why in _UNSUPPORTED.items():
        if body.get(name) not in (None, [], {}):
            raise RequestError(f"{name}: {why} by this server", name)
    n = _typed(body, "n", (int,), "an integer")
    if n not in (None, 1):
        raise RequestError(f"n is {n}: this server returns one choice per request (n = 1)", "n")
    best_of = _typed(body, "best_of", (int,), "an integer")
    if best_of not in (None, 1):
        raise RequestError(f"best_of is {best_of}: only 1 is supported", "best_of")
    if body.get("echo"):
        raise RequestError("echo is not supported by this server", "echo")
    for name in ("presence_penalty", "frequency_penalty"):
        if _typed(body, name, (int, float), "a number") not in (None, 0):
            raise RequestError(
                f"{name} is not supported (use repetition_penalty, as in vLLM)", name
            )


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings", "stop")
    for text in stop:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # JSON's \ud800 escapes: no UTF-8 text holds one
            raise RequestError(
                "stop holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its "
                "pair): it is not text",
                "stop",
            ) from None
    return tuple(stop)


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions' `logprobs`: how many alternatives each token shows (0: only its own)."""
    value = _typed(body, "logprobs", (int,), "an integer")
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise RequestError(f"logprobs is {value}: it must be in [0, {MAX_LOGPROBS}]", "logprobs")
    return value


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's `logprobs` (whether to show them) and `top_logprobs` (alternatives)."""
    wanted = _typed(body, "logprobs", (bool,), "a boolean")
    top = _typed(body, "top_logprobs", (int,), "an integer")
    if top is not None and not wanted:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise RequestError(
            f"top_logprobs is {top}: it must be in [0, {MAX_LOGPROBS}]", "top_logprobs"
        )
    return (top or 0) if wanted else None


def _sampling(body: dict[str, Any], max_tokens_field: str = "max_tokens") -> SamplingParams:
    max_tokens = _typed(body, max_tokens_field, (int,), "an integer")
    if max_tokens is None and max_tokens_field != "max_tokens":
        max_tokens = _typed(body, "max_tokens", (int,), "an integer")
    seed = _typed(body, "seed", (int,), "an integer")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_typed(body, "temperature", (int, float), "a number"),
        top_p=_typed(body, "top_p", (int, float), "a number"),
        top_k=_typed(body, "top_k", (int,), "an integer"),
        repetition_penalty=_typed(body, "repetition_penalty", (int, float), "a number"),
        seed=seed,
        stop=_stop(body),
        ignore_eos=bool(_typed(body, "ignore_eos", (bool,), "a boolean")),
        constraint=_constraint(body),
    )


_GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def _constraint(body: dict[str, Any]) -> Constraint | None:
    """The structure the output must match: response_format (json_object, or json_schema
    with its schema), or one of vLLM's guided_json / guided_regex / guided_choice /
    guided_grammar; at most one."""
    given = [name for name in ("response_format", *_GUIDED) if body.get(name) is not None]
    if len(given) > 1:
        raise RequestError(f"set one of {' and '.join(given)}, not both", given[1])
    if not given:
        return None
    name = given[0]
    if name == "response_format":
        return _response_format(body[name])
    value = body[name]
    kind = _GUIDED[name]
    if kind == "choice":
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise RequestError("guided_choice must be a list of strings", name)
        return Constraint(kind, _dumps(value))
    if kind == "json_schema" and isinstance(value, dict | bool):
        return Constraint(kind, _dumps(value))
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string", name)
    return Constraint(kind, value)


def _response_format(value: Any) -> Constraint | None:
    name = "response_format"
    if not isinstance(value, dict):
        raise RequestError("response_format must be an object with a type", name)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind != "json_schema":
        raise RequestError(
            f"response_format.type {str(kind)[:64]!r} is not supported: use text, json_object "
            "or json_schema",
            name,
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestError("response_format.json_schema must be an object", name)
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise RequestError("response_format.json_schema.schema must be a JSON schema object", name)
    return Constraint("json_schema", _dumps(schema))


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError) as exc:
        raise RequestError(f"the constraint is not valid JSON: {exc}") from None


def _common(
    body: Any, known: frozenset[str], max_tokens_field: str, chat: bool
) -> GenerationRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _refuse_unsupported(body, known)
    model = _typed(body, "model", (str,), "a string")
    if not model:
        raise RequestError("model is required: the name of a generator model", "model")
    stream = bool(_typed(body, "stream", (bool,), "a boolean"))
    options = _typed(body, "stream_options", (dict,), "an object") or {}
    if options and not stream:
        raise RequestError("stream_options is only allowed with stream: true", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise RequestError("stream_options.include_usage must be a boolean", "stream_options")
    logprobs = _chat_logprobs(body) if chat else _completion_logprobs(body)
    sampling = _sampling(body, max_tokens_field)
    if logprobs is not None:  # the engine reports a token's own log probability with its top 1
        sampling = dataclasses.replace(sampling, logprobs=max(1, logprobs))
    return GenerationRequest(model, sampling, stream, include_usage, logprobs=logprobs)


def completion_request(body: Any) -> GenerationRequest:
    """A /v1/completions body: one prompt, as text or token ids."""
    request = _common(body, _COMPLETION_FIELDS, "max_tokens", chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        request.prompt = prompt
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise RequestError(
            "prompt holds several prompts: this server takes one prompt per request", "prompt"
        )
    elif isinstance(prompt, list) and prompt:
        # Token ids, each checked by check_token_ids once their count is admitted.
        request.prompt_token_ids = prompt
    else:
        raise RequestError("prompt must be a non-empty string or list of token ids", "prompt")
    return request


def check_token_ids(ids: list[Any]) -> None:
    """A completions prompt of token ids holds integers only (after its count was checked
    against the model's context, so that a list of millions is refused before this walk)."""
    for index, token in enumerate(ids):
        if not isinstance(token, int) or isinstance(token, bool):
            raise RequestError(
                f"prompt[{index}] is {token!r:.40}: a prompt of token ids holds integers only",
                "prompt",
            )


def chat_request(body: Any) -> GenerationRequest:
    """A /v1/chat/completions body: the messages, their content as text."""
    request = _common(body, _CHAT_FIELDS, "max_completion_tokens", chat=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    request.messages = [_message(m, i) for i, m in enumerate(messages)]
    return request


def _message(message: Any, index: int) -> dict[str, Any]:
    param = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"{param} must be an object with a role", param)
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(f"{param}.content: only text parts are supported", param)
            texts.append(str(part.get("text", "")))
        content = "\n".join(texts)
    if content is not None and not isinstance(content, str):
        raise RequestError(f"{param}.content must be a string or a list of text parts", param)
    if message.get("tool_calls"):
        raise RequestError(f"{param}.tool_calls: tool calls are not supported", param)
    rendered: dict[str, Any] = {"role": message["role"], "content": content or ""}
    if isinstance(message.get("name"), str):
        rendered["name"] = message["name"]
    return rendered
