"""Sampling parameters: what a request asks for, resolved against the model's defaults.

`SamplingParams` mirrors the contract's SamplingParams with None for "not given";
`SamplingParams.resolve` fills the gaps from the model's `GenerationDefaults` (its
generation_config.json), checks every value and returns a `ResolvedSamplingParams` with
no gaps, which is what the scheduler and sampler read. Bad values raise
InvalidArgumentError naming the field, the value and what is allowed.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import TypeVar

from tensord.errors import InvalidArgumentError

# Temperatures below this are greedy: dividing logits by ~0 overflows float32.
SAMPLING_EPS = 1e-5
MAX_STOP_SEQUENCES = 16
"""Most stop strings in one request."""
MAX_STOP_LENGTH = 512
"""Most characters in one stop string."""
MAX_STOP_TOKEN_IDS = 1024
"""Most stop token ids in one request."""
# The most alternatives a request may ask for per token, unless the engine says otherwise.
DEFAULT_MAX_LOGPROBS = 20
_UINT64_LIMIT = 1 << 64

_T = TypeVar("_T")


@dataclass(slots=True, frozen=True)
class GenerationDefaults:
    """A model's decoding defaults for requests: its generation_config.json as
    hf_config.read_generation_defaults reads it, turned into these by
    engine.sampling_defaults (greedy unless the file sets do_sample).

    Keys the file leaves out take the values below (as vLLM does): temperature 1,
    no top-k or top-p limit, no repetition penalty, generation up to the context.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_new_tokens: int | None = None
    max_length: int | None = None
    """Prompt plus completion, when the file limits that instead of max_new_tokens."""
    eos_token_ids: tuple[int, ...] = ()


CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
"""What a request's output may be held to: a JSON schema (its text), any JSON object, a
regular expression, one of a list of strings (a JSON array of them), or a Lark grammar."""


@dataclass(slots=True, frozen=True)
class Constraint:
    """A structure the output must match (structured output); `text` is the schema, the
    regular expression, the JSON array of choices or the grammar ("" for json_object)."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidArgumentError(
                f"constraint kind {self.kind[:64]!r} is unknown; expected one of "
                f"{', '.join(CONSTRAINT_KINDS)}"
            )
        try:
            self.text.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON's \ud800 escapes: no UTF-8 text holds one
            raise InvalidArgumentError(
                f"the {self.kind} constraint is not valid Unicode text: it holds a lone "
                f"surrogate (U+{ord(self.text[exc.start]):04X}) at character {exc.start}"
            ) from None


@dataclass(slots=True, frozen=True)
class ResolvedSamplingParams:
    """Every decoding choice for one request, checked, with no gaps."""

    max_tokens: int
    temperature: float
    top_k: int
    """0 means no limit."""
    top_p: float
    repetition_penalty: float
    seed: int
    """The request's seed, or one drawn at random when it gave none (logged, replayable)."""
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logprobs: int = 0
    """Alternatives per token; 0 means no log probabilities."""
    eos_token_ids: frozenset[int] = frozenset()
    constraint: Constraint | None = None
    """The structure the output must match; None: unconstrained."""

    @property
    def greedy(self) -> bool:
        """Temperature (near) zero: the most likely token, no randomness."""
        return self.temperature < SAMPLING_EPS

    @property
    def argmax_only(self) -> bool:
        """Greedy with no repetition penalty and no log probabilities: the next token is
        the logits' argmax and nothing else is computed."""
        return self.greedy and self.repetition_penalty == 1.0 and not self.logprobs


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """What a request asked for; None means the model's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 0
    constraint: Constraint | None = None

    def resolve(
        self,
        defaults: GenerationDefaults,
        *,
        prompt_len: int,
        max_model_len: int,
        vocab_size: int | None = None,
        max_logprobs: int = DEFAULT_MAX_LOGPROBS,
    ) -> ResolvedSamplingParams:
        """Fill gaps from `defaults` and check everything against the model's limits.

        `max_model_len` is the most tokens (prompt plus completion) one sequence may hold:
        the model's context, or less when the KV pool is smaller.
        """
        check_prompt_length(prompt_len, max_model_len)
        temperature = _pick(self.temperature, defaults.temperature)
        top_k = _pick(self.top_k, defaults.top_k)
        top_p = _pick(self.top_p, defaults.top_p)
        penalty = _pick(self.repetition_penalty, defaults.repetition_penalty)
        temperature, top_p, penalty = _floats(temperature=temperature, top_p=top_p,
                                              repetition_penalty=penalty)  # fmt: skip
        if not 0 <= top_k < 2**31:  # tensord.v1's int32; the HTTP API's JSON has no bound
            raise _bad("top_k", top_k, "must be in [0, 2^31) (0 means no limit)")
        if not 0 <= self.logprobs <= max_logprobs:
            raise _bad("logprobs", self.logprobs, f"must be in [0, {max_logprobs}]")
        seed = secrets.randbits(64) if self.seed is None else self.seed
        if not 0 <= seed < _UINT64_LIMIT:
            raise _bad("seed", seed, "must be in [0, 2^64)")
        _check_stops(self.stop, self.stop_token_ids, vocab_size)
        if self.constraint is not None and self.ignore_eos:
            raise InvalidArgumentError(
                "sampling.ignore_eos cannot go with a constraint: a constrained output ends "
                "when its structure is complete"
            )
        return ResolvedSamplingParams(
            max_tokens=self._max_tokens(defaults, prompt_len, max_model_len),
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=penalty,
            seed=seed,
            stop=tuple(self.stop),
            stop_token_ids=frozenset(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            eos_token_ids=frozenset(defaults.eos_token_ids),
            constraint=self.constraint,
        )

    def _max_tokens(self, defaults: GenerationDefaults, prompt_len: int, max_model_len: int) -> int:
        room = max_model_len - prompt_len
        if self.max_tokens is None:
            # A default never fails a request: it is cut to the room the context leaves.
            if defaults.max_new_tokens is not None:
                return max(1, min(defaults.max_new_tokens, room))
            if defaults.max_length is not None:
                return max(1, min(defaults.max_length - prompt_len, room))
            return room
        if self.max_tokens < 1:
            raise _bad("max_tokens", self.max_tokens, "must be >= 1")
        if self.max_tokens > room:
            raise InvalidArgumentError(
                f"sampling.max_tokens is {self.max_tokens} and the prompt has {prompt_len} "
                f"tokens: {prompt_len + self.max_tokens} in all, beyond the model's context of "
                f"{max_model_len} tokens; ask for at most {room} tokens"
            )
        return self.max_tokens


def check_prompt_length(prompt_len: int, max_model_len: int) -> None:
    """A prompt needs at least one token and must leave room for one generated token."""
    if prompt_len < 1:
        raise InvalidArgumentError("the prompt is empty: give at least one token")
    if prompt_len >= max_model_len:
        raise InvalidArgumentError(
            f"the prompt has {prompt_len} tokens; the model's context is {max_model_len} tokens, "
            f"so a prompt may have at most {max_model_len - 1}"
        )


def _pick(given: _T | None, default: _T) -> _T:
    return default if given is None else given


def _bad(name: str, value: object, rule: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"sampling.{name} {rule}, got {value!r}")


def _floats(**values: float) -> tuple[float, float, float]:
    """temperature, top_p and repetition_penalty as floats (the HTTP API's JSON may give
    integers of any size), checked."""
    for name, value in values.items():
        try:
            values[name] = float(value)
        except OverflowError:
            raise _bad(name, value, "must be a finite number") from None
        if not math.isfinite(values[name]):
            raise _bad(name, value, "must be a finite number")
    _check_floats(values["temperature"], values["top_p"], values["repetition_penalty"])
    return values["temperature"], values["top_p"], values["repetition_penalty"]


def _check_floats(temperature: float, top_p: float, penalty: float) -> None:
    if temperature < 0:
        raise _bad("temperature", temperature, "must be >= 0 (0 means greedy)")
    if not 0 < top_p <= 1:
        raise _bad("top_p", top_p, "must be in (0, 1]")
    if penalty <= 0:
        raise _bad("repetition_penalty", penalty, "must be > 0 (1 means none)")


def _check_stops(stop: tuple[str, ...], stop_token_ids: tuple[int, ...], vocab: int | None) -> None:
    # Every stop string is matched against every token's text on the event loop: bounded.
    if len(stop) > MAX_STOP_SEQUENCES:
        raise InvalidArgumentError(
            f"sampling.stop has {len(stop)} sequences; at most {MAX_STOP_SEQUENCES} are allowed"
        )
    if len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgumentError(
            f"sampling.stop_token_ids has {len(stop_token_ids)} ids; at most "
            f"{MAX_STOP_TOKEN_IDS} are allowed"
        )
    for i, text in enumerate(stop):
        if not text:
            raise InvalidArgumentError(f"sampling.stop[{i}] is empty; a stop sequence needs text")
        if len(text) > MAX_STOP_LENGTH:
            raise InvalidArgumentError(
                f"sampling.stop[{i}] has {len(text)} characters; at most {MAX_STOP_LENGTH} "
                "are allowed"
            )
    for i, token in enumerate(stop_token_ids):
        if token < 0 or (vocab is not None and token >= vocab):
            limit = f"[0, {vocab})" if vocab is not None else ">= 0"
            raise InvalidArgumentError(
                f"sampling.stop_token_ids[{i}] is {token}, outside the vocabulary {limit}"
            )
