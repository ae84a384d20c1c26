"""Hugging Face's JSON files beside a model: typed reads with errors naming file and field.

Token ids follow the Hugging Face conventions:
  eos  generation_config.json's eos_token_id (an int or a list), else config.json's, else
       tokenizer_config.json's eos_token looked up in the tokenizer;
  bos  tokenizer_config.json's bos_token (text, looked up) when present, else config.json's
       bos_token_id, else generation_config.json's; a text prompt starts with it when
       tokenizer_config.json says add_bos_token, or, without that key, when
       tokenizer.json's post-processor puts it first;
  pad  generation_config.json, else config.json, else tokenizer_config.json's pad_token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tensord.errors import ModelLoadError
from tensord.files import read_regular_file
from tensord.generate.core.sampling_params import GenerationDefaults

MAX_JSON_BYTES = 16 * 1024 * 1024
"""The largest config.json, generation_config.json or tokenizer_config.json read (the
largest published ones, with chat templates and added tokens, take a few megabytes)."""


@dataclass(slots=True, frozen=True)
class JsonFile:
    """One JSON object from disk (empty when the optional file is absent)."""

    path: Path | None
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path | None, *, required: bool = False) -> JsonFile:
        """The file's object; an optional file that does not exist reads as empty. Only a
        regular file of at most MAX_JSON_BYTES is read (a FIFO is refused, not waited on)."""
        if path is None:
            return cls(None)
        if not path.exists():
            if not required:
                return cls(None)
            raise ModelLoadError(f"{path} does not exist")
        size = f"a JSON file of at most {MAX_JSON_BYTES >> 20} MiB"
        raw = read_regular_file(path, MAX_JSON_BYTES, ModelLoadError, size)
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ModelLoadError(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return cls(path, data)

    def _first(self, names: Sequence[str]) -> tuple[str, Any]:
        for name in names:
            if self.data.get(name) is not None:
                return name, self.data[name]
        return names[0], None

    def int_or_none(self, names: Sequence[str], *, minimum: int = 1) -> int | None:
        """The first of `names` that is set, as an int >= minimum; None when none is set."""
        name, value = self._first(names)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ModelLoadError(
                f"{self.path}: {name} must be an integer >= {minimum}, got {value!r}"
            )
        return value

    def require_int(self, names: Sequence[str]) -> int:
        """Like int_or_none, but one of `names` must be set."""
        value = self.int_or_none(names)
        if value is None:
            others = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
            raise ModelLoadError(f"{self.path}: {names[0]}{others} is missing")
        return value

    def float_or_none(self, name: str, low: float, high: float | None = None) -> float | None:
        """A number in [low, high] (high None: unbounded); None when unset."""
        value = self.data.get(name)
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or value < low
            or (high is not None and value > high)
        ):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ModelLoadError(f"{self.path}: {name} must be a number {bound}, got {value!r}")
        return float(value)

    def bool_or_none(self, name: str) -> bool | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, bool):
            raise ModelLoadError(f"{self.path}: {name} must be true or false, got {value!r}")
        return value

    def str_or_empty(self, name: str) -> str:
        value = self.data.get(name)
        return value if isinstance(value, str) else ""

    def token_ids(self, name: str, vocab_size: int) -> tuple[int, ...] | None:
        """An id or a list of ids, each below vocab_size; None when unset."""
        value = self.data.get(name)
        if value is None:
            return None
        values = value if isinstance(value, list) else [value]
        if any(
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab_size for v in values
        ):
            raise ModelLoadError(
                f"{self.path}: {name} must be a token id or a list of ids in [0, {vocab_size}), "
                f"got {value!r}"
            )
        return tuple(values)

    def token_text(self, name: str) -> str | None:
        """A special token's text: a string, or an AddedToken object's "content"."""
        value = self.data.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            return None
        if not isinstance(value, str):
            raise ModelLoadError(f"{self.path}: {name} must be a string, got {value!r}")
        return value


@dataclass(slots=True, frozen=True)
class FileDefaults(GenerationDefaults):
    """generation_config.json's sampling values, and whether it samples (`do_sample`). A key
    that is absent has no effect here (top_k 0 and top_p 1.0 disable their filters), unlike
    transformers' implicit top_k 50."""

    do_sample: bool = False


def read_generation_defaults(generation: JsonFile) -> FileDefaults:
    """Sampling defaults from generation_config.json (all defaults when it is absent)."""
    base = FileDefaults()
    top_k = generation.int_or_none(("top_k",), minimum=0)
    temperature = generation.float_or_none("temperature", 0.0)
    top_p = generation.float_or_none("top_p", 0.0, 1.0)
    penalty = generation.float_or_none("repetition_penalty", 0.0)
    if top_p == 0.0 or penalty == 0.0:
        name = "top_p" if top_p == 0.0 else "repetition_penalty"
        raise ModelLoadError(f"{generation.path}: {name} must be > 0")
    do_sample = generation.bool_or_none("do_sample")
    return FileDefaults(
        do_sample=base.do_sample if do_sample is None else do_sample,
        temperature=base.temperature if temperature is None else temperature,
        top_k=base.top_k if top_k is None else top_k,
        top_p=base.top_p if top_p is None else top_p,
        repetition_penalty=base.repetition_penalty if penalty is None else penalty,
        max_new_tokens=generation.int_or_none(("max_new_tokens",)),
        max_length=generation.int_or_none(("max_length",)),
    )


@dataclass(slots=True, frozen=True)
class TokenIds:
    """The special token ids a generator needs."""

    eos: tuple[int, ...]
    bos: int | None
    add_bos: bool
    pad: int | None


def _lookup(source: JsonFile, name: str, tokenizer: Tokenizer) -> int | None:
    text = source.token_text(name)
    if text is None:
        return None
    token_id = tokenizer.token_to_id(text)
    if token_id is None:
        raise ModelLoadError(f"{source.path}: {name} {text!r} is not a token of tokenizer.json")
    return int(token_id)


def _single(source: JsonFile, name: str, vocab_size: int) -> int | None:
    ids = source.token_ids(name, vocab_size)
    if ids is None or not ids:
        return None
    if len(ids) > 1:
        raise ModelLoadError(f"{source.path}: {name} must be one token id, got {list(ids)}")
    return ids[0]


def token_ids(
    config: JsonFile,
    generation: JsonFile,
    tokenizer_config: JsonFile,
    tokenizer: Tokenizer,
    vocab_size: int,
) -> TokenIds:
    """eos, bos (and whether prompts start with it) and pad; see the module doc."""
    eos = generation.token_ids("eos_token_id", vocab_size)
    if eos is None:
        eos = config.token_ids("eos_token_id", vocab_size)
    if eos is None:
        found = _lookup(tokenizer_config, "eos_token", tokenizer)
        eos = () if found is None else (found,)
    bos = _lookup(tokenizer_config, "bos_token", tokenizer)
    if bos is None:
        bos = _single(config, "bos_token_id", vocab_size)
    if bos is None:
        bos = _single(generation, "bos_token_id", vocab_size)
    add_bos = tokenizer_config.bool_or_none("add_bos_token")
    if add_bos is None:
        prefix = tokenizer.encode("", add_special_tokens=True).ids
        add_bos = bos is not None and prefix[:1] == [bos]
    if add_bos and bos is None:
        raise ModelLoadError(
            f"{tokenizer_config.path}: add_bos_token is true but no bos_token is set "
            "(nor bos_token_id in config.json)"
        )
    pad = _single(generation, "pad_token_id", vocab_size)
    if pad is None:
        pad = _single(config, "pad_token_id", vocab_size)
    if pad is None:
        pad = _lookup(tokenizer_config, "pad_token", tokenizer)
    return TokenIds(eos=tuple(eos), bos=bos, add_bos=add_bos, pad=pad)


_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The special tokens transformers passes to a chat template by name (its
special_tokens_map), when tokenizer_config.json sets them."""


@dataclass(slots=True, frozen=True)
class ChatTemplate:
    """tokenizer_config.json's chat template and the special tokens rendered with it."""

    source: str
    """The Jinja template's text."""
    special_tokens: tuple[tuple[str, str | tuple[str, ...]], ...] = ()
    """(name, text) pairs: bos_token, eos_token, ... and additional_special_tokens."""


CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""The template file newer exports write beside tokenizer_config.json; when present it
wins over the config's chat_template, as in transformers."""
MAX_CHAT_TEMPLATE_BYTES = 1 << 20


def read_chat_template(
    tokenizer_config: JsonFile, template_file: Path | None = None
) -> ChatTemplate | None:
    """The model's chat template as transformers picks it: `template_file`
    (chat_template.jinja) when given, else tokenizer_config.json's chat_template (a string,
    or the template named "default" of a list of named ones); None when neither has one it
    can use (the model then serves no chat; its other calls are unaffected)."""
    value: Any
    if template_file is not None:
        raw = read_regular_file(
            template_file, MAX_CHAT_TEMPLATE_BYTES, ModelLoadError, "a Jinja chat template"
        )
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelLoadError(f"{template_file}: not UTF-8 text: {exc}") from None
    else:
        value = tokenizer_config.data.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if not isinstance(value, str) or not value.strip():
        return None
    tokens: list[tuple[str, str | tuple[str, ...]]] = []
    for name in _SPECIAL_TOKENS:
        text = tokenizer_config.data.get(name)
        if isinstance(text, dict):
            text = text.get("content")
        if isinstance(text, str):
            tokens.append((name, text))
    extra = tokenizer_config.data.get("additional_special_tokens")
    if isinstance(extra, list):
        texts = [t.get("content") if isinstance(t, dict) else t for t in extra]
        tokens.append(("additional_special_tokens", tuple(str(t) for t in texts)))
    return ChatTemplate(value, tuple(tokens))
