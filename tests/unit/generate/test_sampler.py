"""The sampler on hand-made logits: greedy, masks, penalty, seeds, draws and logprobs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensord.generate.core.request import Request
from tensord.generate.worker.sampler import (
    Sampler,
    apply_repetition_penalty,
    apply_top_p_sorted,
    draw,
    seen_tokens,
    top_k_candidates,
    top_p_candidates,
)
from tests.unit.generate.helpers import make_request

NEG = -np.inf


def req(rid: str = "r", prompt: list[int] | None = None, **sampling: object) -> Request:
    return make_request(rid, prompt or [1], **sampling)


def hf_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Hugging Face's TopPLogitsWarper on one row of probabilities, for comparison."""
    order = np.argsort(probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    removed = cumulative <= 1 - top_p
    removed[-1] = False
    out = probs.copy()
    out[order[removed]] = 0.0
    return out


def test_greedy_takes_the_highest_logit_after_the_penalty() -> None:
    logits = np.array([[0.1, 3.0, 2.9, -1.0], [5.0, 1.0, 0.0, 0.0]], dtype=np.float32)
    requests = [req("a", [1], repetition_penalty=1.2), req("b", [3])]
    out = Sampler().sample(logits, requests)
    # a: 3.0 / 1.2 = 2.5 < 2.9
    assert out.token_ids.tolist() == [2, 0]
    assert out.logprobs == [None, None]
    assert out.token_ids.dtype == np.int64


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    scores = np.array([[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]], dtype=np.float32)
    seen = np.array([[True, True, False, False], [True, True, False, False]])
    out = apply_repetition_penalty(scores, seen, np.array([2.0, 0.5]))
    # below 1 the penalty encourages repeats
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0], [4.0, -0.5, 0.5, 3.0]]


def test_extreme_penalties_give_finite_scores_and_real_draws() -> None:
    logits = np.array([[2.0, -1.0, 0.5, 3.0]] * 2, dtype=np.float32)
    seen = np.array([[True, True, False, False]] * 2)
    out = apply_repetition_penalty(logits, seen, np.array([1e-45, 3e38]))
    assert np.isfinite(out).all()
    assert out[0, 0] == np.float32(1e30) and -1e-30 < out[0, 1] <= 0  # tiny: repeats win
    assert out[1, 1] == np.float32(-1e30)  # huge: the seen negative logit is out of the running
    requests = [
        req("tiny", [0, 1], repetition_penalty=1e-45, temperature=1.0, seed=1),
        req("huge", [3, 1], repetition_penalty=3e38, temperature=0.01, seed=1),
    ]
    with np.errstate(over="raise", invalid="raise"):  # no overflow or NaN on the way
        tokens = Sampler().sample(logits, requests).token_ids.tolist()
    assert tokens == [0, 0]  # the boosted repeat; then the best token not penalised


def test_seen_tokens_follow_prompt_and_output_incrementally() -> None:
    request = req("r", [1, 1, 3, 99], repetition_penalty=1.5)
    assert np.flatnonzero(seen_tokens(request, 5)).tolist() == [1, 3]  # 99 is past the vocab
    request.append_output_token(4)
    assert np.flatnonzero(seen_tokens(request, 5)).tolist() == [1, 3, 4]
    assert request.seen_token_count == 5
    logits = np.array([[1.0, 3.0, 2.9, 0.0, -1.0]], dtype=np.float32)
    request.append_output_token(0)
    # penalised: 3.0 / 1.5 = 2.0 < 2.9, and token 0's 1.0 -> 0.67
    assert Sampler().sample(logits, [request]).token_ids.tolist() == [2]


def test_top_k_keeps_the_k_highest_per_row_renormalised() -> None:
    scores = np.array(
        [
            [1.0, 5.0, 3.0, 4.0, 2.0],
            [0.0, 0.0, 9.0, 0.0, 0.0],
            [1.0, 2.0, 3.0, 4.0, 5.0],
        ]
    )
    ids, probs = top_k_candidates(scores, np.array([2, 1, 3]))
    assert ids[:, 0].tolist() == [1, 2, 4]
    e = math.e
    expected = [
        [e / (e + 1), 1 / (e + 1), 0.0],
        [1.0, 0.0, 0.0],
        [e**2 / (e**2 + e + 1), e / (e**2 + e + 1), 1 / (e**2 + e + 1)],
    ]
    np.testing.assert_allclose(probs, expected, rtol=1e-12)
    assert ids[0, :2].tolist() == [1, 3]
    assert ids[2].tolist() == [4, 3, 2]


def test_top_p_keeps_the_smallest_set_that_reaches_p() -> None:
    probs = np.array([[0.5, 0.3, 0.15, 0.05]] * 4)
    apply_top_p_sorted(probs, np.array([0.8, 0.81, 1.0, 0.01]))
    assert probs.tolist() == [
        [0.5, 0.3, 0.0, 0.0],
        [0.5, 0.3, 0.15, 0.0],
        [0.5, 0.3, 0.15, 0.05],
        [0.5, 0.0, 0.0, 0.0],  # the top token always stays
    ]


def test_top_p_matches_hugging_face_on_narrow_and_wide_rows() -> None:
    rng = np.random.default_rng(3)
    # sharp rows hold their nucleus in the first 64 candidates, broad ones in the first
    # 1024, flat ones need the whole sorted vocabulary
    logits = np.concatenate(
        [rng.normal(0, 6, (6, 3000)), rng.normal(0, 1.5, (6, 3000)), rng.normal(0, 0.05, (6, 3000))]
    ).astype(np.float32)
    top_p = np.concatenate([rng.uniform(0.3, 0.95, 12), np.full(6, 0.9)])
    weights = np.exp(logits - logits.max(axis=1, keepdims=True)).astype(np.float64)
    full = weights / weights.sum(axis=1, keepdims=True)
    widths = {}
    for rows, ids, probs in top_p_candidates(logits, top_p):
        apply_top_p_sorted(probs, top_p[rows])
        for j, row in enumerate(rows):
            kept = set(ids[j][probs[j] > 0].tolist())
            expected = set(np.flatnonzero(hf_top_p(full[row], top_p[row]) > 0).tolist())
            assert kept == expected
            widths[int(row)] = ids.shape[1]
    assert [widths[r] for r in range(6)] == [64] * 6
    assert [widths[r] for r in range(12, 18)] == [3000] * 6
    assert 1024 in {widths[r] for r in range(6, 12)}


@pytest.mark.parametrize("width", [5, 1000])
def test_draw_follows_the_weights_and_never_picks_a_zero(width: int) -> None:
    """Narrow rows take one cumulative sum; wide ones go through block sums."""
    weights = np.zeros((1, width))
    weights[0, 1], weights[0, 3] = 0.2, 0.8
    weights[0, -1] = 1.0 if width > 5 else weights[0, -1]
    total = weights.sum()
    assert draw(weights, np.array([0.0])).tolist() == [1]
    assert draw(weights, np.array([0.1999 / total])).tolist() == [1]
    assert draw(weights, np.array([0.2001 / total])).tolist() == [3]
    assert draw(weights, np.array([0.999999])).tolist() == [width - 1 if width > 5 else 3]
    uniforms = np.random.default_rng(0).random(20000)
    picks = draw(np.repeat(weights, uniforms.size, axis=0), uniforms)
    assert set(picks.tolist()) == ({1, 3, width - 1} if width > 5 else {1, 3})
    assert abs((picks == 3).mean() - 0.8 / total) < 0.01


def test_draw_matches_a_plain_inverse_cdf_on_wide_rows() -> None:
    rng = np.random.default_rng(5)
    weights = rng.random((50, 777)) * (rng.random((50, 777)) < 0.3)
    uniforms = rng.random(50)
    cdf = np.cumsum(weights, axis=1)
    expected = (cdf <= (uniforms * cdf[:, -1])[:, None]).sum(axis=1)
    assert draw(weights, uniforms).tolist() == expected.tolist()


def test_sampled_frequencies_follow_temperature() -> None:
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]], dtype=np.float32))
    sampler = Sampler()
    hot = req("hot", temperature=1.0, seed=5)
    cold = req("cold", temperature=0.5, seed=5)
    counts = {name: np.zeros(4) for name in ("hot", "cold")}
    for _ in range(4000):
        out = sampler.sample(np.repeat(logits, 2, axis=0), [hot, cold])
        counts["hot"][out.token_ids[0]] += 1
        counts["cold"][out.token_ids[1]] += 1
    expected_cold = np.array([0.01, 0.04, 0.09, 0.16]) / 0.30  # p^2, renormalised
    np.testing.assert_allclose(counts["hot"] / 4000, [0.1, 0.2, 0.3, 0.4], atol=0.025)
    np.testing.assert_allclose(counts["cold"] / 4000, expected_cold, atol=0.025)


def test_top_k_and_top_p_bound_what_can_be_sampled() -> None:
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1]], dtype=np.float32))
    sampler = Sampler()
    top_k = req("k", top_k=2, temperature=1.0, seed=1)
    top_p = req("p", top_p=0.6, temperature=1.0, seed=2)
    both = req("kp", top_k=3, top_p=0.5, temperature=1.0, seed=3)
    plain = req("t", temperature=1.0, seed=4)
    batch = [top_k, top_p, both, plain]
    counts = np.zeros((4, 4))
    for _ in range(2000):
        out = sampler.sample(np.repeat(logits, 4, axis=0), batch)
        counts[np.arange(4), out.token_ids] += 1
    freq = counts / 2000
    # top-2 renormalised: 4/7, 3/7; top-p 0.6: tokens 0, 1 (0.4 + 0.3 reaches 0.6);
    # top-3 then p = 0.5 over (4, 3, 2)/9: 4/9 < 0.5 so tokens 0 and 1
    np.testing.assert_allclose(freq[0], [4 / 7, 3 / 7, 0, 0], atol=0.03)
    np.testing.assert_allclose(freq[1], [4 / 7, 3 / 7, 0, 0], atol=0.03)
    np.testing.assert_allclose(freq[2], [4 / 7, 3 / 7, 0, 0], atol=0.03)
    np.testing.assert_allclose(freq[3], [0.4, 0.3, 0.2, 0.1], atol=0.03)


def test_the_same_seed_gives_the_same_tokens_whatever_the_batch() -> None:
    rng = np.random.default_rng(11)
    steps = [rng.normal(0, 2, (1, 300)).astype(np.float32) for _ in range(30)]
    settings = {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.1}

    def run(batch_of: int, position: int, seed: int) -> list[int]:
        sampler = Sampler()
        me = req("me", [5, 6], seed=seed, **settings)
        others = [
            req(f"o{i}", [i], seed=100 + i, temperature=0.5 + 0.3 * i, top_p=0.7)
            for i in range(batch_of - 1)
        ]
        tokens = []
        for logits in steps:
            batch = [*others[:position], me, *others[position:]]
            noise = rng.normal(0, 2, (batch_of, 300)).astype(np.float32)
            noise[position] = logits[0]
            token = int(sampler.sample(noise, batch).token_ids[position])
            me.append_output_token(token)
            tokens.append(token)
        return tokens

    alone = run(1, 0, seed=42)
    assert run(5, 3, seed=42) == alone
    assert run(8, 0, seed=42) == alone
    assert run(1, 0, seed=43) != alone
    assert len(set(alone)) > 10


def test_logprobs_are_the_raw_log_softmax_with_top_alternatives() -> None:
    logits = np.array([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]], dtype=np.float32)
    requests = [
        req("a", logprobs=2, repetition_penalty=3.0, prompt=[1]),
        req("b", logprobs=0),
    ]
    out = Sampler().sample(logits, requests)
    # the penalty moves a's choice to token 2, but logprobs describe the raw logits
    assert out.token_ids.tolist() == [2, 2]
    log_z = math.log(sum(math.exp(v) for v in (1.0, 3.0, 2.0, 0.0)))
    first = out.logprobs[0]
    assert first is not None
    assert first.token_id == 2
    assert first.logprob == pytest.approx(2.0 - log_z)
    assert [t for t, _ in first.top] == [1, 2]
    assert [lp for _, lp in first.top] == pytest.approx([3.0 - log_z, 2.0 - log_z])
    assert out.logprobs[1] is None


def test_a_tiny_temperature_is_greedy_and_draws_nothing() -> None:
    request = req("r", temperature=1e-7)
    state = request.generator.bit_generator.state
    out = Sampler().sample(np.array([[0.0, 1.0, 0.5]], dtype=np.float32), [request])
    assert out.token_ids.tolist() == [1]
    assert request.generator.bit_generator.state == state


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match=r"logits of shape \(2, 3\) for 1 requests"):
        Sampler().sample(np.zeros((2, 3), np.float32), [req()])
