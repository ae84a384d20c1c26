"""Chat prompts: a conversation rendered with the model's chat template, as transformers'
`apply_chat_template` renders it (a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`, the special tokens by name,
`add_generation_prompt`), then tokenised without special tokens: the template writes them.

jinja2 comes with the `openai-api` extra; only a chat request imports it.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from tensord.errors import InvalidArgumentError
from tensord.generate.model.hf_config import ChatTemplate


@functools.lru_cache(maxsize=32)
def _compiled(source: str) -> Any:
    """The template compiled once per text (a reload with a new text compiles anew)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render_chat(
    template: ChatTemplate, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> str:
    """The conversation as the model's prompt text; INVALID_ARGUMENT when the template
    refuses it (roles out of order, a role it does not know) or cannot render it."""
    import jinja2

    try:
        compiled = _compiled(template.source)
    except jinja2.exceptions.TemplateError as exc:
        raise InvalidArgumentError(f"the model's chat template does not compile: {exc}") from None
    try:
        return str(
            compiled.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **dict(template.special_tokens),
            )
        )
    except jinja2.exceptions.TemplateError as exc:
        raise InvalidArgumentError(
            f"the model's chat template refused the messages: {exc}"
        ) from None
