"""Structured output's parts on their own: constraints compiled by llguidance for the demo
tokenizer (cached, refusals with the compiler's message), masks against llguidance's own
NumPy reference, the sampler inside a mask, and the checks a constraint passes first."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tensord.errors import InvalidArgumentError
from tensord.generate.core.request import Request
from tensord.generate.core.sampling_params import (
    CONSTRAINT_KINDS,
    Constraint,
    GenerationDefaults,
    SamplingParams,
)
from tensord.generate.worker.grammar import ConstraintLimits, Grammars, Masks, apply_masks
from tensord.generate.worker.sampler import Sampler

llguidance_numpy = pytest.importorskip("llguidance.numpy")

EOS = 2


@pytest.fixture(scope="module")
def grammars(demo_repo: Path) -> Grammars:
    tokenizer = Tokenizer.from_file(str(demo_repo / "tinylm" / "tokenizer.json"))
    return Grammars(tokenizer, 2048, [EOS], ConstraintLimits(max_bytes=4096))


def test_every_kind_compiles_and_is_kept(grammars: Grammars) -> None:
    constraints = [
        Constraint("json_schema", json.dumps({"type": "integer", "minimum": 0, "maximum": 9})),
        Constraint("json_object"),
        Constraint("regex", "[ab]{2}"),
        Constraint("choice", '["yes", "no"]'),
        Constraint("grammar", 'start: "x" | "y"'),
    ]
    assert [c.kind for c in constraints] == list(CONSTRAINT_KINDS)
    for constraint in constraints:
        first = grammars.matcher(constraint)
        assert not first.is_error()
        again = grammars.cached(constraint)  # a copy of the kept matcher
        assert again is not None and again is not first and not again.is_stopped()


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (Constraint("json_schema", "[1, 2"), "the JSON schema is not valid JSON"),
        (Constraint("json_schema", "3"), "the JSON schema must be a JSON object"),
        (Constraint("regex", "(("), "the regex constraint is refused: "),
        (Constraint("grammar", "start: nothing"), 'unknown name: "nothing"'),
        (Constraint("choice", '["a", 1]'), "choices must be a non-empty list"),
        (Constraint("regex", "a" * 5000), "takes 5000 bytes, more than the 4096"),
    ],
)
def test_refusals_name_the_problem_and_are_kept(
    grammars: Grammars, constraint: Constraint, message: str
) -> None:
    for _ in range(2):
        with pytest.raises(InvalidArgumentError, match=message[:20].replace("(", r"\(")):
            grammars.matcher(constraint)


def test_constraints_are_checked_before_compiling() -> None:
    with pytest.raises(InvalidArgumentError, match="constraint kind 'xml' is unknown"):
        Constraint("xml", "<a/>")
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        Constraint("regex", "a\ud800")
    params = SamplingParams(constraint=Constraint("json_object"), ignore_eos=True)
    with pytest.raises(InvalidArgumentError, match="ignore_eos cannot go with a constraint"):
        params.resolve(GenerationDefaults(), prompt_len=3, max_model_len=64)


def test_masks_match_llguidance_and_keep_the_sample_inside(grammars: Grammars) -> None:
    matchers = [
        grammars.matcher(Constraint("regex", "[ab]{2}")),
        grammars.matcher(Constraint("choice", '["yes", "no"]')),
    ]
    bitmask = Masks(2048, parallel=False).fill(matchers)
    np.testing.assert_array_equal(Masks(2048, parallel=True).fill(matchers), bitmask)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 2048)).astype(np.float32)
    ours = logits.copy()
    apply_masks(ours, [0, 2], bitmask)
    reference = logits[[0, 2]].copy()
    llguidance_numpy.apply_token_bitmask_inplace(reference, bitmask)
    np.testing.assert_array_equal(ours[[0, 2]], reference)
    np.testing.assert_array_equal(ours[1], logits[1])  # a row without a constraint
    allowed = np.isfinite(ours[0])
    assert 0 < allowed.sum() < 2048
    params = SamplingParams(temperature=1.0).resolve(
        GenerationDefaults(), prompt_len=1, max_model_len=64
    )
    requests = [Request(str(i), [1], params, 0.0) for i in range(3)]
    for _ in range(20):
        draw = rng.normal(size=(3, 2048)).astype(np.float32)
        out = Sampler().sample(draw, requests, ([0, 2], bitmask))
        assert allowed[out.token_ids[0]]
        # log probabilities are the model's own, not the masked ones
        assert out.logprobs == [None, None, None]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": -1e19, "maximum": -1e19},
        {"type": "integer", "minimum": -9223372036854775807, "maximum": -9223372036854775806},
        {"type": "object", "properties": {"a": {"type": "number", "maximum": 2**60}}},
    ],
)
def test_bounds_llguidance_cannot_take_are_refused(grammars: Grammars, schema: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"beyond \+-2\^53"):
        grammars.matcher(Constraint("json_schema", json.dumps(schema)))
    grammar = "start: %json " + json.dumps(schema)
    with pytest.raises(InvalidArgumentError, match=r"beyond \+-2\^53"):
        grammars.matcher(Constraint("grammar", grammar))


def test_boolean_schemas_and_fresh_refusals(grammars: Grammars) -> None:
    assert not grammars.matcher(Constraint("json_schema", "true")).is_error()  # any JSON value
    with pytest.raises(InvalidArgumentError, match="no output satisfies it"):
        grammars.matcher(Constraint("json_schema", "false"))
    refused = Constraint("regex", "((")
    errors = []
    for _ in range(3):
        with pytest.raises(InvalidArgumentError) as error:
            grammars.matcher(refused)
        errors.append(error.value)
    assert len({id(e) for e in errors}) == 3  # a kept error's traceback would grow
