"""The `[embedding]` table of model.toml: how a text-embedding model is served."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from tensord.config_tables import INT32_MAX, Settings

PoolingMode = Literal["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
POOLING_MODES: tuple[PoolingMode, ...] = (
    "cls",
    "max",
    "mean",
    "mean_sqrt_len_tokens",
    "weightedmean",
    "lasttoken",
)
"""sentence-transformers' pooling modes, in the order its Pooling module concatenates them."""

DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_QUEUE_SIZE = 8192
"""Four calls of 2,048 texts: forming a run looks at the queue, which stays short enough."""


class EmbeddingConfig(Settings):
    """Overrides for what the model's folder says (modules.json, sentence_bert_config.json,
    1_Pooling/config.json) and the batching of its texts. Every key is optional."""

    model_config = ConfigDict(extra="forbid")

    max_seq_length: int | None = Field(default=None, ge=1, le=INT32_MAX)
    """Tokens a text may have, special tokens included; longer texts are truncated or
    refused as the request asks. Unset: sentence_bert_config.json's, else the least of
    tokenizer_config.json's model_max_length and the model's max_position_embeddings."""
    pooling: PoolingMode | None = None
    """How token vectors become one vector; unset: 1_Pooling/config.json's modes."""
    normalize: bool | None = None
    """Scale each vector to unit length; unset: whether modules.json has a Normalize module."""
    max_batch_tokens: int = Field(default=DEFAULT_MAX_BATCH_TOKENS, ge=1, le=INT32_MAX)
    """Tokens one run may hold, padding included (texts x the longest of them): texts are
    packed by length into runs up to this size. Unset, it grows to max_seq_length when
    that is more."""
    max_batch_size: int = Field(default=DEFAULT_MAX_BATCH_SIZE, ge=1, le=INT32_MAX)
    """Texts one run may hold."""
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    """How long a forming run may wait for more texts after its oldest arrived; 0: a run
    starts as soon as the model is free, with every text queued meanwhile."""
    max_queue_size: int = Field(default=DEFAULT_MAX_QUEUE_SIZE, ge=0)
    """Texts that may wait; a call whose texts do not all fit is RESOURCE_EXHAUSTED (more
    texts than this in one call: INVALID_ARGUMENT). 0 means unbounded."""

    @model_validator(mode="after")
    def _check_budget(self) -> EmbeddingConfig:
        if self.max_seq_length is not None and self.max_seq_length > self.max_batch_tokens:
            raise ValueError(
                f"max_seq_length {self.max_seq_length} exceeds max_batch_tokens "
                f"{self.max_batch_tokens}: a text of that length could never run"
            )
        return self
