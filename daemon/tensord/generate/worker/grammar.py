"""Structured output: a request's constraint as an llguidance matcher, and the token masks
that keep each step's sample inside it.

llguidance reads the model's tokenizer itself (`LLTokenizer` from tokenizer.json, with the
logits' width and the end-of-sequence ids), compiles a JSON schema, a regular expression,
a list of choices or a Lark grammar into a matcher, and computes, for a whole pass at
once, a bitmask of the tokens that may come next (threads of its own, the interpreter lock
released). A constraint is compiled once per model and text: the matcher built from it is
kept, and each request gets a copy of it (`deep_copy`). Compiling is bounded by the
constraint's size (`[generator] max_constraint_bytes`), llguidance's own fuel limits
(`LLParserLimits`) and a wall-clock bound the caller applies; what the compiler refuses is
INVALID_ARGUMENT with its message.

JSON comes out compact (no whitespace between tokens of the JSON text, `,` and `:` as
separators), which also bounds the output of a model that would otherwise ramble in
whitespace.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensord.errors import InvalidArgumentError
from tensord.generate.core.sampling_params import Constraint

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions
    from tokenizers import Tokenizer

_CACHE_SIZE = 256
"""Compiled constraints kept per model (least recently used dropped first)..."""
_CACHE_TEXT_BYTES = 1024 * 1024
"""...and at most this much constraint text: a compiled matcher takes about a hundred
times its text's size (a 92 kB schema about 11 MB)."""
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
}
_PARALLEL_CORES = 8
"""Cores from which a pass's masks are filled by llguidance's threads at once."""
_ERROR_CHARS = 2000
"""The longest compiler message a refusal quotes."""


@dataclass(frozen=True, slots=True)
class ConstraintLimits:
    """How much a constraint may cost to compile."""

    max_bytes: int = 64 * 1024
    """The longest constraint text (schema, expression, choices or grammar)."""
    compile_seconds: float = 10.0
    """Wall-clock bound on one compile (the caller waits no longer)."""
    max_grammar_size: int = 500_000
    """llguidance: symbols in the grammar's productions."""
    initial_lexer_fuel: int = 1_000_000
    """llguidance: work building the lexer's regular expressions (about 50 per us)."""
    step_lexer_fuel: int = 200_000
    """llguidance: lexer work per token mask."""


def available() -> bool:
    """Whether llguidance is installed (structured output needs it)."""
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


def grammar_text(constraint: Constraint) -> str:
    """llguidance's grammar for a constraint; INVALID_ARGUMENT for text that is not what
    its kind says (a schema that is not JSON, choices that are not a list of strings)."""
    from llguidance import LLMatcher

    kind, text = constraint.kind, constraint.text
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    if kind == "json_schema":
        schema = _json(text, "the JSON schema")
        if schema is False:
            raise InvalidArgumentError("the JSON schema is false: no output satisfies it")
        if schema is True:
            schema = {}  # any JSON value
        if not isinstance(schema, dict):
            raise InvalidArgumentError("the JSON schema must be a JSON object (or true)")
        check_bounds(schema)
        try:
            return LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
        except ValueError as exc:
            raise InvalidArgumentError(f"the JSON schema is refused: {said(exc)}") from None
    if kind == "choice":
        choices = _json(text, "the choices")
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise InvalidArgumentError("choices must be a non-empty list of non-empty strings")
        return LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        )
    if kind == "regex":
        return LLMatcher.grammar_from_regex(text)
    _check_inline_json(text)
    return LLMatcher.grammar_from_lark(text)  # "grammar"


_BOUND_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_LARGEST_BOUND = 2**53
"""Numeric bounds of a JSON schema are refused beyond +-2^53 (the integers a JSON number
holds exactly): llguidance 1.9 crashes the process on some bounds near the int64 limits."""
_MAX_SCHEMA_DEPTH = 64


def check_bounds(schema: Any, depth: int = 0) -> None:
    """INVALID_ARGUMENT for a numeric bound beyond +-2^53 anywhere in the schema, or a
    schema nested deeper than 64 levels."""
    if depth > _MAX_SCHEMA_DEPTH:
        raise InvalidArgumentError(
            f"the JSON schema is nested deeper than {_MAX_SCHEMA_DEPTH} levels"
        )
    if isinstance(schema, dict):
        for key, value in schema.items():
            if (
                key in _BOUND_KEYS
                and isinstance(value, int | float)
                and not isinstance(value, bool)
                and not -_LARGEST_BOUND <= value <= _LARGEST_BOUND
            ):
                raise InvalidArgumentError(
                    f"the JSON schema's {key} {value!r} is beyond +-2^53 "
                    f"({_LARGEST_BOUND}); bounds that large are not supported"
                )
            check_bounds(value, depth + 1)
    elif isinstance(schema, list):
        for item in schema:
            check_bounds(item, depth + 1)


def _check_inline_json(grammar: str) -> None:
    """The JSON schemas a Lark grammar holds inline (`%json {...}`), checked as above."""
    decoder = json.JSONDecoder()
    start = grammar.find("%json")
    while start != -1:
        brace = grammar.find("{", start)
        if brace != -1:
            try:
                schema, _ = decoder.raw_decode(grammar, brace)
            except (ValueError, RecursionError):
                pass  # llguidance words the error
            else:
                check_bounds(schema)
        start = grammar.find("%json", start + 5)


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgumentError(f"{what} is not valid JSON: {said(exc)}") from None


def said(exc: BaseException | str) -> str:
    """An error's text on one line, short; a compiler panic without its backtrace."""
    text = str(exc)
    cut = text.find("backtrace")
    if cut != -1:
        text = text[:cut] + "(compiler backtrace left out)"
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + "..."


class Grammars:
    """One model's constraints: llguidance's view of its tokenizer (built on first use),
    and the matchers compiled from constraint texts, kept by text."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        limits: ConstraintLimits | None = None,
    ) -> None:
        self.limits = limits or ConstraintLimits()
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        """Constraint -> pristine matcher, or the message it was refused with (a str)."""
        self._cached_bytes = 0

    def check_size(self, constraint: Constraint) -> None:
        """INVALID_ARGUMENT for a constraint text longer than the limit (before any work)."""
        size = len(constraint.text.encode("utf-8", "surrogatepass"))
        if size > self.limits.max_bytes:
            raise InvalidArgumentError(
                f"the {constraint.kind} constraint takes {size} bytes, more than the "
                f"{self.limits.max_bytes} this server compiles ([generator] "
                "max_constraint_bytes)"
            )

    def cached(self, constraint: Constraint) -> Any | None:
        """A fresh matcher when the constraint is compiled already, else None; raises the
        refusal of a constraint compiled before and refused."""
        with self._lock:
            pristine = self._compiled.get(constraint)
            if pristine is None:
                return None
            self._compiled.move_to_end(constraint)
        if isinstance(pristine, str):
            raise InvalidArgumentError(pristine)  # a new error: a kept one would grow tracebacks
        return pristine.deep_copy()

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher for the constraint (a copy of the kept one, see `compile`)."""
        return self.compile(constraint).deep_copy()

    def compile(self, constraint: Constraint) -> Any:
        """The kept matcher for the constraint, compiled now unless it was before (this can
        take long: call it on a worker thread); INVALID_ARGUMENT with the compiler's
        message for a constraint it refuses. Hand out copies of it, never it."""
        self.check_size(constraint)
        with self._lock:
            pristine: Any = self._compiled.get(constraint)
        if pristine is None:
            try:
                pristine = self._compile(constraint)
            except InvalidArgumentError as exc:
                pristine = exc.message
            with self._lock:
                if constraint not in self._compiled:
                    self._compiled[constraint] = pristine
                    self._cached_bytes += len(constraint.text)
                while len(self._compiled) > 1 and (
                    len(self._compiled) > _CACHE_SIZE or self._cached_bytes > _CACHE_TEXT_BYTES
                ):
                    dropped, _ = self._compiled.popitem(last=False)
                    self._cached_bytes -= len(dropped.text)
        if isinstance(pristine, str):
            raise InvalidArgumentError(pristine)  # a new error: a kept one would grow tracebacks
        return pristine

    def _compile(self, constraint: Constraint) -> Any:
        from llguidance import LLMatcher, LLParserLimits

        grammar = grammar_text(constraint)
        limits = LLParserLimits(
            max_grammar_size=self.limits.max_grammar_size,
            initial_lexer_fuel=self.limits.initial_lexer_fuel,
            step_lexer_fuel=self.limits.step_lexer_fuel,
            verbose_errors=False,
        )
        matcher = LLMatcher(self.tokenizer(), grammar, limits=limits, log_level=0)
        if matcher.is_error():
            raise InvalidArgumentError(
                f"the {constraint.kind} constraint is refused: {said(matcher.get_error())}"
            )
        return matcher

    def tokenizer(self) -> Any:
        """llguidance's tokenizer for the model (built once: it walks the vocabulary)."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from llguidance import LLTokenizer

                self._tokenizer = LLTokenizer(
                    self._hf_tokenizer.to_str(), n_vocab=self._vocab_size, eos_token=self._eos
                )
            return self._tokenizer


class Masks:
    """The token masks of one pass: a bitmask row per constrained sequence. On a host with
    many cores llguidance's own threads fill the rows at once; on a few, one after another
    on the calling thread (the parallel fill spends more CPU than it saves there)."""

    def __init__(self, vocab_size: int, parallel: bool | None = None) -> None:
        self.vocab_size = vocab_size
        self._words = (vocab_size + 31) // 32
        self._parallel = (os.cpu_count() or 1) >= _PARALLEL_CORES if parallel is None else parallel
        self._executor: Any = None

    def fill(self, matchers: Sequence[Any]) -> np.ndarray:
        """int32 [len(matchers), words]: bit t of row i says whether token t may follow
        matcher i's tokens so far."""
        bitmask = np.empty((len(matchers), self._words), dtype=np.int32)
        if self._parallel and len(matchers) > 1:
            from llguidance import LLExecutor
            from llguidance.numpy import fill_next_token_bitmask_par

            if self._executor is None:
                self._executor = LLExecutor()
            pairs = [(m, i) for i, m in enumerate(matchers)]
            fill_next_token_bitmask_par(self._executor, pairs, bitmask)
        else:
            row_bytes = self._words * 4
            for i, matcher in enumerate(matchers):
                matcher.unsafe_compute_mask_ptr(bitmask[i].ctypes.data, row_bytes)
        return bitmask


def apply_masks(scores: np.ndarray, rows: Sequence[int], bitmask: np.ndarray) -> None:
    """Set to -inf, in `scores` [N, V] (float32, in place), each token row `rows[i]` may
    not take according to bitmask row i. A constraint's mask allows few tokens (JSON
    punctuation, digits) or nearly all (free text): the rarer side is written, after one
    pass over the bits."""
    vocab = scores.shape[1]
    every = len(rows) == scores.shape[0] and list(rows) == list(range(len(rows)))
    block = scores if every and scores.flags.c_contiguous else np.ascontiguousarray(scores[rows])
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, count=vocab, bitorder="little")
    allowed = bits.view(bool).reshape(-1)
    flat = block.reshape(-1)
    if np.count_nonzero(allowed) * 2 < allowed.size:
        keep = np.flatnonzero(allowed)
        values = flat[keep]
        flat.fill(-np.inf)
        flat[keep] = values
    else:
        flat[np.flatnonzero(~allowed)] = -np.inf
    if block is not scores:
        scores[rows] = block
