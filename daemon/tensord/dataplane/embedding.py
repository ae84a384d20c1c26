"""An Embed request's checks and tokenising, in whichever process takes the call: texts
(with the folder's prompt before each) to token ids as sentence-transformers' encode makes
them, token ids checked against the vocabulary, lengths against max_seq_length, and the
Matryoshka cut of the vectors the engine returns."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from tokenizers import Encoding, Tokenizer

from tensord.dataplane.admission import text_bytes
from tensord.dataplane.kinds import EMBEDDING, check_kind
from tensord.dataplane.types import EmbedCall, EmbeddingEntry, EmbedTokens, TableEntry
from tensord.errors import InvalidArgumentError, UnavailableError
from tensord.generate.model.model_dir import INLINE_TOKENIZE_CHARS
from tensord.processing.pooling import normalized
from tensord.registry.version import EmbeddingVersion

MAX_EMBED_INPUTS = 2048
"""Texts one request may carry (as OpenAI's embeddings API allows)."""


def check_count(texts: int, token_lists: int) -> int:
    """How many inputs the request has: INVALID_ARGUMENT for none, both kinds, or too many."""
    if texts and token_lists:
        raise InvalidArgumentError("give texts or token ids, not both")
    n = texts or token_lists
    if n == 0:
        raise InvalidArgumentError("the request has no input: give one or more texts")
    if n > MAX_EMBED_INPUTS:
        raise InvalidArgumentError(
            f"the request has {n} inputs; at most {MAX_EMBED_INPUTS} may go in one request"
        )
    return n


def check_dimensions(dimensions: int, row: EmbeddingEntry, model: str) -> None:
    if not 0 <= dimensions <= row.dimensions:
        raise InvalidArgumentError(
            f"dimensions {dimensions} is outside 1..{row.dimensions}: model {model!r} makes "
            f"vectors of {row.dimensions} values (a smaller number keeps the first ones)"
        )


_MARGIN_TOKENS = 16
"""A text cut before tokenising keeps this many tokens more than the model takes, so that
where the cut falls changes none of the tokens kept."""


async def tokenise_texts(
    tokenizer: Tokenizer, texts: Sequence[str], row: EmbeddingEntry, truncate: bool
) -> list[list[int]]:
    """Each text's ids as sentence-transformers' encode makes them (the prompt before it,
    stripped, lowercased when the folder says so, special tokens added), cut at
    max_seq_length, or INVALID_ARGUMENT when not `truncate`. A text of more characters than
    the model's tokens could hold is cut before it is tokenised (with a margin: the tokens
    kept are those of the whole text); many or long texts are tokenised on a worker thread
    (encode_batch lets the GIL go while it works)."""
    total = 0
    for i, text in enumerate(texts):
        if not text:
            raise InvalidArgumentError(f"input {i} is an empty text")
        total += text_bytes(text, f"input {i}")
    most = (row.max_seq_length + _MARGIN_TOKENS) * row.max_token_chars
    if total > INLINE_TOKENIZE_CHARS:
        return await asyncio.to_thread(_encode, tokenizer, texts, row, truncate, most)
    return _encode(tokenizer, texts, row, truncate, most)


def _encode(
    tokenizer: Tokenizer, texts: Sequence[str], row: EmbeddingEntry, truncate: bool, most: int
) -> list[list[int]]:
    whole = []
    for text in texts:
        text = (row.prompt + text).strip()
        whole.append(text.lower() if row.lowercase else text)
    encodings: list[Encoding] = tokenizer.encode_batch([text[:most] for text in whole])
    ids = []
    for i, encoding in enumerate(encodings):
        if len(whole[i]) > most and not encoding.overflowing:
            # Characters the tokenizer drops (runs of spaces, say) made the cut text short
            # of the model's length: the whole text gives the tokens encode() would.
            (encoding,) = tokenizer.encode_batch([whole[i]])
        if not truncate and encoding.overflowing:
            raise _too_long(i, row)
        ids.append(encoding.ids)
    return ids


def _too_long(index: int, row: EmbeddingEntry) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"input {index} has more than {row.max_seq_length} tokens, the most the model takes; "
        "shorten it, or ask for truncation"
    )


def check_token_ids(
    token_lists: Sequence[Sequence[int]], row: EmbeddingEntry, truncate: bool
) -> list[Sequence[int]]:
    """Token-id inputs as given, each non-empty, every id in the vocabulary, cut at
    max_seq_length (or INVALID_ARGUMENT when not `truncate`)."""
    kept = []
    for i, ids in enumerate(token_lists):
        if not ids:
            raise InvalidArgumentError(f"input {i} has no token ids")
        if len(ids) > row.max_seq_length:
            if not truncate:
                raise InvalidArgumentError(
                    f"input {i} has {len(ids)} tokens, more than the {row.max_seq_length} the "
                    "model takes; shorten it, or ask for truncation"
                )
            ids = ids[: row.max_seq_length]
        low, high = min(ids), max(ids)
        if low < 0 or high >= row.vocab_size:
            bad = low if low < 0 else high
            raise InvalidArgumentError(
                f"input {i}: token id {bad} is outside the vocabulary [0, {row.vocab_size})"
            )
        kept.append(ids)
    return kept


def flatten(token_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Every input's ids one after another (int64), and each input's length."""
    lengths = np.fromiter((len(ids) for ids in token_lists), np.int64, len(token_lists))
    # int32: every vocabulary is smaller, and the ids cross to the engine in half the bytes.
    flat = np.fromiter((t for ids in token_lists for t in ids), np.int32, int(lengths.sum()))
    return flat, lengths


def cut_dimensions(vectors: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """The first `dimensions` values of each vector (all of them when 0 or the full
    length), scaled to unit length again when the model's vectors have it."""
    if not dimensions or dimensions >= vectors.shape[1]:
        return vectors
    cut = np.ascontiguousarray(vectors[:, :dimensions])
    return normalized(cut) if normalize else cut


def embedding_row(entry: TableEntry, mv: EmbeddingVersion) -> TableEntry:
    """A READY embedding version's row: its Predict signature and what tokenising needs."""
    spec = mv.spec
    assert spec is not None
    row = EmbeddingEntry(
        spec.max_seq_length, spec.dimensions, spec.normalize, spec.vocab_size, spec.prompt,
        spec.lowercase, spec.max_token_chars,
    )  # fmt: skip
    return dataclasses.replace(
        entry,
        inputs=tuple(mv.inputs),
        outputs=tuple(mv.outputs),
        tokenizer_path=str(spec.tokenizer_path),
        embedding=row,
    )


def embedding_of(entry: TableEntry) -> EmbeddingEntry:
    """A READY embedding version's row."""
    if entry.embedding is None:
        check_kind(entry, EMBEDDING)
        raise UnavailableError(f"model {entry.name!r} version {entry.version} is not ready")
    return entry.embedding


def texts_of(array: np.ndarray) -> list[str]:
    """A BYTES tensor's elements as texts: INVALID_ARGUMENT for one that is not UTF-8."""
    texts = []
    for i, item in enumerate(array.reshape(-1).tolist()):
        if isinstance(item, bytes | bytearray):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidArgumentError(
                    f"input {i} is not UTF-8 text (byte {exc.start}: {exc.reason})"
                ) from None
        texts.append(str(item))
    return texts


async def tokens_for(
    call: EmbedCall, entry: TableEntry, tokenizer_of: Callable[[TableEntry], Tokenizer]
) -> EmbedTokens:
    """The call's inputs checked and tokenised for `entry`'s version, as the engine takes
    them."""
    row = embedding_of(entry)
    check_count(len(call.texts), len(call.token_ids))
    check_dimensions(call.dimensions, row, entry.name)
    token_lists: Sequence[Sequence[int]]
    if call.texts:
        token_lists = await tokenise_texts(tokenizer_of(entry), call.texts, row, call.truncate)
    else:
        token_lists = check_token_ids(call.token_ids, row, call.truncate)
    ids, lengths = flatten(token_lists)
    return EmbedTokens(entry.name, entry.version, ids, lengths, call.deadline)
