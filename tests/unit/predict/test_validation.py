"""Signature checks: every message names the tensor and what was expected."""

from __future__ import annotations

import numpy as np
import pytest

from tensord.backends.base import TensorSpec
from tensord.dtypes import DType
from tensord.errors import InvalidArgumentError
from tensord.predict.validation import check_inputs, check_output_names

SIG = [TensorSpec("input", DType.FLOAT32, (-1, 512)), TensorSpec("mask", DType.BOOL, (-1,))]
GOOD = [("input", np.zeros((2, 512), np.float32)), ("mask", np.zeros(2, bool))]


def fails(inputs: list[tuple[str, np.ndarray]], max_batch: int = 8) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        check_inputs("m", SIG, inputs, max_batch)
    return info.value.message


def test_good_inputs_pass() -> None:
    assert list(check_inputs("m", SIG, GOOD, 8)) == ["input", "mask"]


def test_unknown_input() -> None:
    assert fails([*GOOD, ("other", np.zeros(1))]) == (
        "model 'm' has no input 'other'; it takes 'input' (DATA_TYPE_FLOAT32 [-1, 512]), "
        "'mask' (DATA_TYPE_BOOL [-1])"
    )


def test_missing_input() -> None:
    assert fails(GOOD[:1]) == "model 'm' is missing input(s) 'mask' (DATA_TYPE_BOOL [-1])"


def test_duplicate_input() -> None:
    assert fails([*GOOD, GOOD[0]]) == "input 'input' is given more than once"


def test_wrong_dtype() -> None:
    assert fails([("input", np.zeros((2, 512), np.float64)), GOOD[1]]) == (
        "input 'input': dtype DATA_TYPE_FLOAT64 does not match the model's DATA_TYPE_FLOAT32"
    )


def test_string_to_float_input() -> None:
    strings = np.array([["a"] * 512] * 2, dtype=object)
    assert "dtype DATA_TYPE_STRING does not match the model's DATA_TYPE_FLOAT32" in fails(
        [("input", strings), GOOD[1]]
    )


def test_wrong_rank() -> None:
    assert fails([("input", np.zeros((2, 1, 512), np.float32)), GOOD[1]]) == (
        "input 'input': shape [2, 1, 512] has rank 3, but the model expects rank 2 [-1, 512]"
    )


def test_wrong_dimension() -> None:
    assert fails([("input", np.zeros((2, 256), np.float32)), GOOD[1]]) == (
        "input 'input': dimension 1 is 256, but the model expects 512 "
        "(shape [-1, 512], -1 is dynamic)"
    )


def test_batch_disagreement_and_limit() -> None:
    assert "disagree on the batch" in fails([GOOD[0], ("mask", np.zeros(3, bool))])
    big = [("input", np.zeros((9, 512), np.float32)), ("mask", np.zeros(9, bool))]
    assert fails(big) == "batch size 9 exceeds the model's max_batch_size 8; split the request"


def test_output_names() -> None:
    outs = [TensorSpec("a", DType.FLOAT32, (1,)), TensorSpec("b", DType.FLOAT32, (1,))]
    assert check_output_names("m", outs, []) == ["a", "b"]
    assert check_output_names("m", outs, ["b"]) == ["b"]
    with pytest.raises(InvalidArgumentError, match="model 'm' has no output 'c'; its outputs are"):
        check_output_names("m", outs, ["c"])
    with pytest.raises(InvalidArgumentError, match="asked for more than once"):
        check_output_names("m", outs, ["a", "a"])
