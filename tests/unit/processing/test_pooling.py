"""Pooling on host arrays equals sentence-transformers' Pooling and Normalize modules, for
every mode and their concatenations, on right-padded batches."""

from __future__ import annotations

import numpy as np
import pytest

from tensord.modelconfig.embedding import POOLING_MODES
from tensord.processing.pooling import normalized, pool
from tests.tools import require_module


def batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(4, 7, 16)).astype(np.float32)
    lengths = [7, 3, 1, 5]
    mask = np.array([[1] * n + [0] * (7 - n) for n in lengths], np.int64)
    return hidden, mask


def reference(hidden: np.ndarray, mask: np.ndarray, modes: tuple[str, ...]) -> np.ndarray:
    torch = require_module("torch", "make setup (the export extra)")
    models = require_module("sentence_transformers.models", "make setup (the export extra)")
    names = {
        "cls": "pooling_mode_cls_token",
        "max": "pooling_mode_max_tokens",
        "mean": "pooling_mode_mean_tokens",
        "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
        "weightedmean": "pooling_mode_weightedmean_tokens",
        "lasttoken": "pooling_mode_lasttoken",
    }
    flags = {names[m]: True for m in modes}
    if "mean" not in modes:
        flags["pooling_mode_mean_tokens"] = False
    module = models.Pooling(hidden.shape[-1], **flags)
    features = {
        "token_embeddings": torch.from_numpy(hidden.copy()),
        "attention_mask": torch.from_numpy(mask),
    }
    return module(features)["sentence_embedding"].numpy()


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_each_mode_equals_sentence_transformers(mode: str) -> None:
    hidden, mask = batch()
    np.testing.assert_allclose(pool(hidden, mask, [mode], False), reference(hidden, mask, (mode,)),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_modes_concatenate_in_sentence_transformers_order() -> None:
    hidden, mask = batch()
    modes = ("cls", "mean", "lasttoken")
    got = pool(hidden, mask, modes, False)
    assert got.shape == (4, 48)
    np.testing.assert_allclose(got, reference(hidden, mask, modes), rtol=1e-5, atol=1e-5)


def test_padding_changes_nothing_and_normalising_gives_unit_length() -> None:
    hidden, mask = batch()
    alone = pool(hidden[1:2, :3], mask[1:2, :3], ["mean"], True)
    padded = pool(hidden, mask, ["mean"], True)[1:2]
    np.testing.assert_allclose(alone, padded, rtol=1e-6)
    assert np.allclose(np.linalg.norm(padded), 1.0)
    zero = normalized(np.zeros((1, 4), np.float32))
    assert not np.isnan(zero).any()
