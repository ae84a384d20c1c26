"""The reference loops agree: a KV-cache greedy loop equals recomputing without a cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensord.demo.generator import build_demo_generator
from tensord.generate.model.model_dir import load_generator_dir
from tests.generate_reference import ReferenceModel, ReferenceRun, benchmark_module

generate_limit = benchmark_module("generate_limit")

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Hello",
    "Once upon a time, in a land far away, there lived",
    "1 2 3",
]


@pytest.fixture(scope="module")
def tinylm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_generator(tmp_path_factory.mktemp("gen") / "tinylm")


@pytest.fixture(scope="module")
def references(tinylm: Path) -> list[ReferenceRun]:
    model = ReferenceModel(tinylm)
    loaded = load_generator_dir(tinylm)
    return [model.greedy(loaded.encode_prompt(p), 24) for p in PROMPTS]


def test_kv_cache_loop_equals_no_cache_reference(
    tinylm: Path, references: list[ReferenceRun]
) -> None:
    spec = load_generator_dir(tinylm).spec
    session = generate_limit.make_session(spec, intra_op_threads=1)
    prompts = [list(r.prompt) for r in references]
    # Alone, and all together (left-padded: the prompts' lengths differ).
    for prompt, reference in zip(prompts, references, strict=True):
        run = generate_limit.greedy_with_past(session, spec, [prompt], 24)
        assert reference.check(run.tokens[0]) == 24
    batched = generate_limit.greedy_with_past(session, spec, prompts, 24)
    for tokens, reference in zip(batched.tokens, references, strict=True):
        assert reference.check(tokens) == 24
    assert len(batched.decode_step_s) == 23


def test_check_reports_the_first_difference(references: list[ReferenceRun]) -> None:
    reference = references[0]
    wrong = list(reference.tokens)
    wrong[5] = (wrong[5] + 1) % 2048
    with pytest.raises(AssertionError, match=r"step 5: got token \d+, the reference picks"):
        reference.check(wrong)
    assert reference.check(wrong[:5]) == 5  # a shorter output is compared as far as it goes


def test_near_tie_stops_the_comparison() -> None:
    run = ReferenceRun(
        prompt=(1,),
        tokens=(5, 6, 7, 8),
        top2_gaps=(1.0, 0.5, 2e-5, 3.0),
        max_logits=(10.0, 10.0, 10.0, 10.0),
    )
    assert [run.near_tie(i) for i in range(4)] == [False, False, True, False]
    assert run.comparable == 2
    assert run.check([5, 6, 9, 9]) == 2
    with pytest.raises(AssertionError, match="step 1"):
        run.check([5, 7])
    # An absolute gap instead, as transformers' references use: 0.5 is below 0.6.
    absolute = ReferenceRun((1,), (5, 6, 7, 8), (1.0, 0.5, 2e-5, 3.0), (1.0,) * 4, 0.6)
    assert absolute.comparable == 1


def test_measure_limit_reports_throughput(tinylm: Path) -> None:
    result = generate_limit.measure_limit(tinylm, 4, prompt_len=8, new_tokens=6, repeats=1)
    assert (result.batch_size, result.prompt_len, result.new_tokens) == (4, 8, 6)
    assert result.tokens_per_s == pytest.approx(4 * 6 / result.total_s)
    assert result.tokens_per_s > 0 and result.decode_tokens_per_s > 0
    assert result.decode_step_ms_p50 <= result.decode_step_ms_p99
