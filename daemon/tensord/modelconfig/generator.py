"""The `[generator]` table of model.toml: the generation engine's limits for one model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from tensord.config_tables import INT32_MAX, MAX_THREADS, Settings
from tensord.errors import ModelLoadError

DEFAULT_KV_CACHE_BYTES = 256 * 1024 * 1024
"""The KV pool's size when model.toml sets neither kv_cache_bytes nor num_blocks."""
SLOT_MAX_MODEL_LEN = 8192
"""The slot path's default max_model_len bound: each slot reserves its whole length, so a
128k-context model does not reserve 128k positions a sequence unless asked to."""
DEFAULT_CONTEXT_LENGTH = 2048
"""max_model_len for a model whose config.json declares no context length (BLOOM and MPT
with ALiBi have no table of positions)."""


PREFIX_BLOCK_TOKENS = 16
"""Tokens per block of the prefix store on KV slots: the unit of prefix sharing."""
DEFAULT_PREFIX_CACHE_LIMIT = 2**30
"""The prefix store's default size is the slots' bytes, at most this."""


def prefix_cache_bytes(configured: int | None, slot_bytes: int) -> int:
    """The prefix store's bytes: as configured, else the slots' bytes, at most 1 GiB."""
    if configured is not None:
        return configured
    return min(slot_bytes, DEFAULT_PREFIX_CACHE_LIMIT)


MIN_EXPORT_SLOTS = 4
"""An Optimum export whose KV budget holds fewer whole slots than this (and than
max_num_seqs) serves on the paged pool, which shares the budget among sequences by their
lengths."""


def slot_max_model_len(context_length: int | None) -> int:
    """max_model_len on KV slots when [generator] sets none: min(context, 8192)."""
    return min(context_length or DEFAULT_CONTEXT_LENGTH, SLOT_MAX_MODEL_LEN)


class BatchLayout(StrEnum):
    """How a step's sequences are grouped into model passes (safest last)."""

    RAGGED = "ragged"
    """KV slots: each row attends over its own slot, of any length (not configurable)."""
    PADDED = "padded"
    EQUAL_LENGTH = "equal_length"
    SINGLE = "single"


class GeneratorConfig(Settings):
    """Limits of the generation engine. Every key has a default; set at most one of
    kv_cache_bytes and num_blocks."""

    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(default=16, ge=1, le=4096)
    """Tokens per KV cache block of the paged pool: the unit of allocation and of prefix
    sharing. Set, it keeps an Optimum export on the paged pool (not on KV slots)."""
    kv_cache_bytes: int | None = Field(default=None, ge=1, le=2**62)
    """The KV cache's size in bytes (keys and values of every layer); default 256 MiB
    when num_blocks is not set either (on KV slots on a GPU: half the device memory free
    after loading). The paged pool, or the slots (min(max_num_seqs, this / one slot's
    bytes) of them), are allocated and written once at load, so this memory is reserved up
    front and the process does not grow as sequences fill it."""
    num_blocks: int | None = Field(default=None, ge=1, le=INT32_MAX)
    """The paged KV pool's size in blocks, instead of kv_cache_bytes. Set, it keeps an
    Optimum export on the paged pool; a model-builder folder (always on KV slots) refuses
    it."""
    max_num_seqs: int = Field(default=64, ge=1, le=65_536)
    """Sequences that may run (hold KV blocks and decode) at once."""
    max_num_batched_tokens: int = Field(default=2048, ge=1, le=INT32_MAX)
    """Tokens one engine step may process: prompt tokens of joining sequences plus one per
    decoding sequence."""
    max_queue_size: int = Field(default=1024, ge=0)
    """Requests that may wait to start; beyond it Generate answers RESOURCE_EXHAUSTED.
    0 means unbounded."""
    max_model_len: int | None = Field(default=None, ge=1, le=INT32_MAX)
    """Longest sequence (prompt + generated tokens); default and upper bound: the model's
    context length (config.json's max_position_embeddings, n_positions, max_seq_len,
    seq_length or n_ctx; genai_config.json's context_length). A model that declares none
    (ALiBi: BLOOM, MPT) takes any value here, and 2048 by default. On KV slots (a
    model-builder folder) each slot reserves this many positions, and the default is
    min(context length, 8192)."""
    intra_op_threads: int = Field(default=1, ge=0, le=MAX_THREADS)
    """Threads one model step may use inside an operator; 0 lets ONNX Runtime use one per
    core. The default leaves the other cores to the event loop, which detokenizes and
    streams every token while the next step runs (measured on 2 cores: as many tokens/s
    at 16 streams with 1 thread as with 2, and a steadier inter-token latency)."""
    stream_interval: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = "auto"
    """Steps a stream's tokens are held and merged into one chunk; a stream's first token
    and its last chunk go out at once. 1 sends every token as it is made. "auto" holds
    them for ceil(running streams / 4) steps, at most 8: one chunk per token up to 4
    streams, and about 4 chunks per step above that, which bounds the per-message gRPC
    work that shares the host's cores with the model (measured on 2 cores at 16 streams:
    about 13 % less server CPU per token and about 6 % more tokens/s than 1)."""

    prefix_cache_bytes: int | None = Field(default=None, ge=0, le=2**62)
    """Host memory that keeps prompt prefixes for reuse on KV slots: a request whose prompt
    starts with blocks of 16 tokens a request before it computed gets their keys and values
    copied into its slot instead of computing them again (the least recently used blocks
    make room). Default: as many bytes as the slots hold, at most 1 GiB; 0 turns prefix
    reuse off. On the paged pool the pool itself keeps prefixes, and this key is unused."""
    max_constraint_bytes: int = Field(default=64 * 1024, ge=1, le=1024 * 1024)
    """The longest constraint a request may bring for structured output (a JSON schema, a
    regular expression, a list of choices or a grammar, in bytes): a longer one gets
    INVALID_ARGUMENT before anything is compiled. A larger constraint can also take
    longer per token to mask (every step of every sequence it holds to it)."""
    constraint_compile_seconds: float = Field(default=10.0, gt=0, le=600, allow_inf_nan=False)
    """How long compiling one constraint may take; a request whose constraint takes longer
    gets INVALID_ARGUMENT (the compiler also stops at its own work limits). A compiled
    constraint is kept for the next request with the same text."""
    batch_layout: Literal["auto", "padded", "equal_length", "single"] = "auto"
    """How sequences of different lengths share a model pass. "auto" takes the widest the
    graph allows, checked on the model at load: "padded" (any lengths in one pass, pasts
    right-aligned; graphs with position_ids, and ALiBi models) or "equal_length" (only
    sequences with pasts of the same length; graphs that count positions from the past's
    length, such as Gemma's). "single" runs one sequence per pass. A layout wider than the
    graph allows is refused at load, never served wrong. These are the paged pool's: on KV
    slots every sequence attends over its own slot, any lengths in one pass ("ragged"), so
    "equal_length" or "single" keeps an Optimum export on the paged pool."""

    @model_validator(mode="after")
    def _check(self) -> GeneratorConfig:
        if self.kv_cache_bytes is not None and self.num_blocks is not None:
            raise ValueError("set kv_cache_bytes or num_blocks, not both")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}): every running sequence decodes one "
                "token per step"
            )
        return self

    def resolve(self, *, context_length: int | None, kv_bytes_per_token: int) -> GeneratorLimits:
        """The limits for one model: max_model_len checked against its context (None: the
        model declares none, and max_model_len defaults to DEFAULT_CONTEXT_LENGTH), the
        pool's block count from its KV bytes per token. Raises ModelLoadError when they
        cannot work."""
        max_model_len = self._max_model_len(context_length, context_length)
        block_bytes = kv_bytes_per_token * self.block_size
        if self.num_blocks is not None:
            num_blocks = self.num_blocks
        else:
            budget = self.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES
            num_blocks = budget // block_bytes
        if num_blocks * self.block_size < max_model_len:
            raise ModelLoadError(
                f"[generator] the KV pool ({num_blocks} blocks of {self.block_size} tokens, "
                f"{block_bytes} bytes each) cannot hold one sequence of max_model_len "
                f"{max_model_len} tokens; raise kv_cache_bytes or num_blocks, or lower "
                "max_model_len"
            )
        return self._limits(
            max_model_len,
            block_size=self.block_size,
            num_blocks=num_blocks,
            block_bytes=block_bytes,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            layout=None if self.batch_layout == "auto" else BatchLayout(self.batch_layout),
        )

    def resolve_slots(
        self,
        *,
        context_length: int | None,
        slot_bytes: Callable[[int], int],
        budget_bytes: int | None = None,
    ) -> GeneratorLimits:
        """The limits of a model served on KV slots (one per sequence, each holding
        max_model_len positions): max_model_len defaults to min(context length, 8192);
        the slots are min(max_num_seqs, the KV budget / one slot's bytes), the budget
        being kv_cache_bytes, else `budget_bytes` (what the device offers), else the
        default. `slot_bytes(max_model_len)` is one slot's size. ModelLoadError, with the
        numbers, when not even one slot fits."""
        if self.num_blocks is not None:
            raise ModelLoadError(
                "[generator] num_blocks sizes the paged KV pool; this model is served on KV "
                "slots (one per sequence): set kv_cache_bytes and max_num_seqs instead"
            )
        max_model_len = self._max_model_len(context_length, slot_max_model_len(context_length))
        one = slot_bytes(max_model_len)
        budget = self.kv_cache_bytes or budget_bytes or DEFAULT_KV_CACHE_BYTES
        slots = min(self.max_num_seqs, budget // one)
        if slots < 1:
            raise ModelLoadError(
                f"[generator] one KV slot of max_model_len {max_model_len} takes {one} bytes "
                f"({one / 2**20:.1f} MiB), more than the KV budget of {budget} bytes; raise "
                "kv_cache_bytes or lower max_model_len"
            )
        if self.batch_layout not in ("auto", "padded"):
            raise ModelLoadError(
                f"[generator] batch_layout {self.batch_layout!r} applies to the paged path; "
                "on KV slots every sequence attends over its own slot, whatever its length"
            )
        return self._limits(
            max_model_len,
            block_size=max_model_len,
            num_blocks=slots,
            block_bytes=one,
            max_num_seqs=slots,
            max_num_batched_tokens=max(self.max_num_batched_tokens, slots),
        )

    def _max_model_len(self, context_length: int | None, default: int | None) -> int:
        """max_model_len as set, else `default` (else DEFAULT_CONTEXT_LENGTH), checked
        against the model's context length."""
        max_model_len = self.max_model_len or default or DEFAULT_CONTEXT_LENGTH
        if context_length is not None and max_model_len > context_length:
            raise ModelLoadError(
                f"[generator] max_model_len {max_model_len} exceeds the model's context "
                f"length {context_length}"
            )
        return max_model_len

    def _limits(
        self,
        max_model_len: int,
        *,
        block_size: int,
        num_blocks: int,
        block_bytes: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        layout: BatchLayout | None = None,
    ) -> GeneratorLimits:
        """GeneratorLimits of these KV sizes, with the settings both paths take as set."""
        return GeneratorLimits(
            block_size=block_size,
            num_blocks=num_blocks,
            block_bytes=block_bytes,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_queue_size=self.max_queue_size,
            max_model_len=max_model_len,
            intra_op_threads=self.intra_op_threads,
            stream_interval=0 if self.stream_interval == "auto" else self.stream_interval,
            layout=layout,
            max_constraint_bytes=self.max_constraint_bytes,
            constraint_compile_seconds=self.constraint_compile_seconds,
        )


@dataclass(slots=True, frozen=True)
class GeneratorLimits:
    """GeneratorConfig resolved for one model: every number final."""

    block_size: int
    num_blocks: int
    block_bytes: int
    """KV bytes of one block across all layers, keys and values."""
    max_num_seqs: int
    max_num_batched_tokens: int
    max_queue_size: int
    max_model_len: int
    intra_op_threads: int
    stream_interval: int = 0
    """Steps a stream's tokens are merged over; 0: chosen from the running streams."""
    layout: BatchLayout | None = None
    """The configured batch layout; None: chosen from the graph ("auto")."""
    max_constraint_bytes: int = 64 * 1024
    constraint_compile_seconds: float = 10.0
