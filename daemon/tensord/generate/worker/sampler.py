"""The sampler: next tokens from a batch of logits, each row with its own settings.

Per row, in Hugging Face's order: repetition penalty over the prompt and output tokens,
then either the most likely token (temperature 0) or temperature, top-k, top-p and a
draw. Every request draws from its own `numpy.random.Generator`, seeded from its seed,
exactly one uniform number per sampled token, and no row's result depends on another
row: the same seed gives the same tokens whatever else is in the batch.

The work is vectorised over the batch and avoids sorting the vocabulary: top-k takes its
k candidates with a partial sort (argpartition) and samples among them alone; top-p
first tries the `TOP_P_CANDIDATES` most likely tokens and widens the search only for rows
whose nucleus reaches past them; a draw over the whole vocabulary walks block sums
before it walks one block.

Log probabilities (`TokenLogprob`) are those of the model's raw distribution: the
log-softmax of the logits before penalty, temperature, top-k and top-p.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tensord.generate.core.outputs import TokenLogprob
from tensord.generate.core.request import Request
from tensord.generate.core.sampling_params import ResolvedSamplingParams
from tensord.generate.worker.grammar import apply_masks

TOP_P_CANDIDATES = (64, 1024)
"""Candidate counts tried in turn for top-p before the whole vocabulary."""
_DRAW_BLOCK = 64


@dataclass(slots=True)
class SamplerOutput:
    """One sampled token per row, and its log probabilities where the request asked."""

    token_ids: np.ndarray
    """int64 [N]."""
    logprobs: list[TokenLogprob | None]


class Sampler:
    """Samples one token per request from logits [N, V]."""

    def sample(
        self,
        logits: np.ndarray,
        requests: Sequence[Request],
        masks: tuple[Sequence[int], np.ndarray] | None = None,
    ) -> SamplerOutput:
        """Row i of `logits` is the next-token distribution of `requests[i]`; `masks`
        (rows, int32 bitmask [len(rows), ceil(V / 32)]) leaves those rows only the tokens
        their constraints allow. Log probabilities stay the model's own."""
        if logits.ndim != 2 or logits.shape[0] != len(requests):
            raise ValueError(
                f"logits of shape {logits.shape} for {len(requests)} requests; expected [N, V]"
            )
        masked = masks is not None and len(masks[0]) > 0
        params = [request.sampling_params for request in requests]
        if all(p.argmax_only for p in params):  # the common greedy batch: argmax alone
            if masked:
                assert masks is not None
                logits = _writable(logits)  # no log probabilities: the rows may be masked
                apply_masks(logits, masks[0], masks[1])
            return SamplerOutput(logits.argmax(axis=1).astype(np.int64), [None] * len(params))
        scores = _penalised(logits, requests)
        if masked:  # after the penalty, which would lift a masked -inf to a finite score
            assert masks is not None
            if scores is logits:
                scores = np.array(logits, dtype=np.float32)  # the raw ones stay for logprobs
            apply_masks(scores, masks[0], masks[1])
        token_ids = np.empty(len(requests), np.int64)
        greedy = np.array([p.greedy for p in params], dtype=bool)
        if greedy.any():
            token_ids[greedy] = scores[greedy].argmax(axis=1)
        rows = np.flatnonzero(~greedy).tolist()
        if rows:
            uniforms = np.array([requests[i].generator.random() for i in rows])
            token_ids[rows] = sample_rows(scores[rows], [params[i] for i in rows], uniforms)
        return SamplerOutput(token_ids, token_logprobs(logits, token_ids, params))


def _writable(logits: np.ndarray) -> np.ndarray:
    """The logits themselves when they can be changed in place (float32, C-contiguous,
    writeable), else a copy that can."""
    if logits.dtype == np.float32 and logits.flags.c_contiguous and logits.flags.writeable:
        return logits
    return np.array(logits, dtype=np.float32)


def _penalised(logits: np.ndarray, requests: Sequence[Request]) -> np.ndarray:
    """float32 scores: the logits, copied and penalised where a request asks."""
    scores = np.asarray(logits, dtype=np.float32)
    penalties = np.array([request.sampling_params.repetition_penalty for request in requests])
    rows = np.flatnonzero(penalties != 1.0)
    if not rows.size:
        return scores
    scores = scores.copy()
    vocab = scores.shape[1]
    seen = np.stack([seen_tokens(requests[i], vocab) for i in rows.tolist()])
    scores[rows] = apply_repetition_penalty(scores[rows], seen, penalties[rows])
    return scores


def seen_tokens(request: Request, vocab: int) -> np.ndarray:
    """The request's prompt and output tokens as a bool mask [V], updated incrementally."""
    mask = request.seen_token_mask
    if mask is None or mask.shape[0] != vocab:
        mask = request.seen_token_mask = np.zeros(vocab, dtype=bool)
        request.seen_token_count = 0
    new = np.asarray(request.all_token_ids[request.seen_token_count :], dtype=np.int64)
    mask[new[(new >= 0) & (new < vocab)]] = True
    request.seen_token_count = request.num_tokens
    return mask


_PENALISED_LIMIT = 1e30
"""Bound of a penalised logit: divided by the smallest sampling temperature it stays finite
in float32."""


def apply_repetition_penalty(
    scores: np.ndarray, seen: np.ndarray, penalties: np.ndarray
) -> np.ndarray:
    """Hugging Face's rule: a seen token's logit is divided by the penalty when positive
    and multiplied by it when negative (a penalty above 1 discourages repeats).

    Only the seen entries are touched (a gather and a scatter), not the whole batch. The
    results are kept within +-1e30, so that an extreme penalty (any positive value is
    allowed) gives a very unlikely or very likely token, never an infinity that turns the
    softmax into NaN once divided by a small temperature."""
    out = np.array(scores, dtype=np.float32)
    flat = out.reshape(-1)
    index = np.flatnonzero(seen)
    values = flat[index].astype(np.float64)
    penalty = penalties.astype(np.float64)[index // scores.shape[1]]
    penalised = np.where(values > 0, values / penalty, values * penalty)
    flat[index] = np.clip(penalised, -_PENALISED_LIMIT, _PENALISED_LIMIT)
    return out


def sample_rows(
    scores: np.ndarray, params: Sequence[ResolvedSamplingParams], uniforms: np.ndarray
) -> np.ndarray:
    """Temperature, top-k, top-p, then one draw per row with the given uniforms in [0, 1)."""
    vocab = scores.shape[1]
    temperature = np.array([p.temperature for p in params], dtype=np.float32)
    top_k = np.array([p.top_k if p.top_k < vocab else 0 for p in params], dtype=np.int64)
    top_p = np.array([p.top_p for p in params])
    scaled = scores / temperature[:, None]
    out = np.empty(len(params), np.int64)
    by_k = top_k > 0
    by_p = ~by_k & (top_p < 1.0)
    full = ~by_k & ~by_p
    if by_k.any():
        ids, probs = top_k_candidates(scaled[by_k], top_k[by_k])
        out[by_k] = _draw_candidates(ids, probs, top_p[by_k], uniforms[by_k])
    if by_p.any():
        out[by_p] = _sample_top_p(scaled[by_p], top_p[by_p], uniforms[by_p])
    if full.any():
        out[full] = draw(softmax_weights(scaled[full]), uniforms[full])
    return out


def softmax_weights(scores: np.ndarray) -> np.ndarray:
    """exp(scores - row max): softmax without the division (draws need no normalising)."""
    return np.exp(scores - scores.max(axis=1, keepdims=True))


def top_k_candidates(scores: np.ndarray, top_k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k most likely tokens, most likely first, and their probabilities over
    those k (a row with a smaller k than the batch's widest has zeros past its k)."""
    vocab = scores.shape[1]
    k_max = int(top_k.max())
    ids = np.argpartition(scores, vocab - k_max, axis=1)[:, vocab - k_max :]
    values = np.take_along_axis(scores, ids, 1)
    order = np.argsort(-values, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, 1)
    values = np.take_along_axis(values, order, 1).astype(np.float64)
    values[np.arange(k_max)[None, :] >= top_k[:, None]] = -np.inf
    weights = np.exp(values - values[:, :1])
    return ids, weights / weights.sum(axis=1, keepdims=True)


def top_p_candidates(
    scores: np.ndarray, top_p: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Groups of (rows, ids, probs): each row's most likely tokens, most likely first, with
    their probabilities over the whole vocabulary, enough of them to hold its nucleus.

    The first group tries a few candidates; rows whose candidates hold less than p try
    more, and the last group sorts the whole vocabulary."""
    vocab = scores.shape[1]
    weights = softmax_weights(scores)
    totals = weights.sum(axis=1, dtype=np.float64)
    pending = np.arange(len(scores))
    for width in (*(m for m in TOP_P_CANDIDATES if m < vocab), vocab):
        chunk = weights[pending]
        if width < vocab:
            ids = np.argpartition(chunk, vocab - width, axis=1)[:, vocab - width :]
        else:
            ids = np.broadcast_to(np.arange(vocab), chunk.shape)
        values = np.take_along_axis(chunk, ids, 1)
        order = np.argsort(-values, axis=1, kind="stable")
        ids = np.take_along_axis(ids, order, 1)
        probs = np.take_along_axis(values, order, 1) / totals[pending, None]
        enough = probs.sum(axis=1) >= top_p[pending] if width < vocab else np.ones(len(ids), bool)
        yield pending[enough], ids[enough], probs[enough]
        pending = pending[~enough]
        if not pending.size:
            return


def apply_top_p_sorted(probs: np.ndarray, top_p: np.ndarray) -> None:
    """Zero each row's tail past its nucleus, in place. Rows are sorted most likely first;
    a token stays while the tokens before it sum to less than p, so the kept set is the
    smallest that reaches p (Hugging Face's rule; the most likely token always stays)."""
    before = np.cumsum(probs, axis=1) - probs
    probs[before >= top_p[:, None]] = 0.0


def _sample_top_p(scores: np.ndarray, top_p: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    out = np.empty(len(scores), np.int64)
    for rows, ids, probs in top_p_candidates(scores, top_p):
        out[rows] = _draw_candidates(ids, probs, top_p[rows], uniforms[rows])
    return out


def _draw_candidates(
    ids: np.ndarray, probs: np.ndarray, top_p: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    if (top_p < 1.0).any():
        apply_top_p_sorted(probs, top_p)
    return ids[np.arange(len(ids)), draw(probs, uniforms)]


def draw(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling, one index per row: the first index whose cumulative weight
    passes u × total. Weights need not be normalised; a weight of 0 is never drawn.

    Wide rows walk the sums of blocks of `_DRAW_BLOCK` weights, then one block, instead
    of a cumulative sum over the whole row."""
    n, width = weights.shape
    if width <= 4 * _DRAW_BLOCK:
        flat = weights.astype(np.float64)
        return _first_past(flat, uniforms * flat.sum(axis=1))
    num_blocks = -(-width // _DRAW_BLOCK)
    if width % _DRAW_BLOCK:
        padded = np.zeros((n, num_blocks * _DRAW_BLOCK), weights.dtype)
        padded[:, :width] = weights
        weights = padded
    blocks = weights.reshape(n, num_blocks, _DRAW_BLOCK)
    sums = blocks.sum(axis=2, dtype=np.float64)
    targets = uniforms * sums.sum(axis=1)
    block = _first_past(sums, targets)
    rows = np.arange(n)
    before = np.cumsum(sums, axis=1)[rows, block] - sums[rows, block]
    inner_weights = blocks[rows, block].astype(np.float64)
    inner = _first_past(inner_weights, np.maximum(targets - before, 0.0))
    return block * _DRAW_BLOCK + inner


def _first_past(weights: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row, the first index whose cumulative weight exceeds the target; when rounding
    puts the target at the total, the last index of positive weight."""
    chosen = (np.cumsum(weights, axis=1) <= targets[:, None]).sum(axis=1)
    width = weights.shape[1]
    last_positive = width - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
    return np.minimum(chosen, last_positive)


def token_logprobs(
    logits: np.ndarray, token_ids: np.ndarray, params: Sequence[ResolvedSamplingParams]
) -> list[TokenLogprob | None]:
    """Log probabilities of the raw logits for the rows that asked for them."""
    out: list[TokenLogprob | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs > 0]
    if not rows:
        return out
    raw = np.asarray(logits[rows], dtype=np.float32)
    peak = raw.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.exp(raw - peak).sum(axis=1, dtype=np.float64))
    vocab = raw.shape[1]
    widest = min(max(params[i].logprobs for i in rows), vocab)
    best = np.argpartition(raw, vocab - widest, axis=1)[:, vocab - widest :]
    best = np.take_along_axis(best, np.argsort(-np.take_along_axis(raw, best, 1), axis=1), 1)
    best_logprobs = np.take_along_axis(raw, best, 1) - log_z[:, None]
    chosen = raw[np.arange(len(rows)), token_ids[rows]] - log_z
    for j, i in enumerate(rows):
        n = params[i].logprobs
        top = tuple(zip(best[j, :n].tolist(), best_logprobs[j, :n].tolist(), strict=True))
        out[i] = TokenLogprob(int(token_ids[i]), float(chosen[j]), top)
    return out
