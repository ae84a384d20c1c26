"""The demo generator's graph: exact with a KV cache, ragged batches, and not degenerate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tensord.demo.generator import build_demo_generator
from tensord.generate.model.model_dir import GeneratorDirectory, load_generator_dir

Past = list[np.ndarray]
TOL = 2e-5  # float32 sums in another order (batched MatMul) differ in the last bits


@pytest.fixture(scope="module")
def tinylm(tmp_path_factory: pytest.TempPathFactory) -> GeneratorDirectory:
    return load_generator_dir(build_demo_generator(tmp_path_factory.mktemp("gen") / "tinylm"))


@pytest.fixture(scope="module")
def session(tinylm: GeneratorDirectory) -> ort.InferenceSession:
    return ort.InferenceSession(str(tinylm.spec.model_path), providers=["CPUExecutionProvider"])


def run(
    session: ort.InferenceSession,
    ids: np.ndarray,
    past: Past | None = None,
    mask: np.ndarray | None = None,
    positions: np.ndarray | None = None,
) -> tuple[np.ndarray, Past]:
    """One forward pass; a full mask and consecutive positions unless given."""
    ids = np.asarray(ids, np.int64)
    batch, new = ids.shape
    past = past or [np.zeros((batch, 2, 0, 64), np.float32)] * 8
    start = past[0].shape[2]
    if mask is None:
        mask = np.ones((batch, start + new), np.int64)
    if positions is None:
        positions = np.broadcast_to(np.arange(start, start + new), (batch, new))
    feeds = {
        "input_ids": ids,
        "attention_mask": np.asarray(mask, np.int64),
        "position_ids": np.asarray(positions, np.int64),
    }
    for i in range(4):
        feeds[f"past_key_values.{i}.key"] = past[2 * i]
        feeds[f"past_key_values.{i}.value"] = past[2 * i + 1]
    logits, *present = session.run(None, feeds)
    return logits, present


def _pad_past(past: Past, length: int) -> Past:
    return [np.pad(p, ((0, 0), (0, 0), (0, length - p.shape[2]), (0, 0))) for p in past]


def test_prefill_in_chunks_equals_one_pass(
    session: ort.InferenceSession, tinylm: GeneratorDirectory
) -> None:
    ids = tinylm.encode_prompt("The quick brown fox jumps over the lazy dog")
    whole, whole_kv = run(session, [ids])
    first, past = run(session, [ids[:4]])
    second, past = run(session, [ids[4:5]], past)
    rest, past = run(session, [ids[5:]], past)
    np.testing.assert_allclose(np.concatenate([first, second, rest], 1), whole, atol=TOL)
    for a, b in zip(past, whole_kv, strict=True):
        np.testing.assert_allclose(a, b, atol=TOL)


def test_ragged_batch_equals_each_sequence_alone(
    session: ort.InferenceSession, tinylm: GeneratorDirectory
) -> None:
    # Three sequences with pasts of different lengths (the last empty), right-padded to the
    # longest (mask zeros on the padding); sequence 0 decodes one token, 1 prefills three
    # more, 2 prefills two.
    prompts = [tinylm.encode_prompt("Once upon a time there"), tinylm.encode_prompt("Hi"), []]
    news = [[50], [60, 61, 62], [1, 70]]
    width, longest = len(prompts[0]), 3
    assert len(prompts[1]) < width
    pasts = [run(session, [p])[1] if p else None for p in prompts]
    batch_past = [
        np.concatenate(
            [
                _pad_past(p, width)[k] if p else np.zeros((1, 2, width, 64), np.float32)
                for p in pasts
            ]
        )
        for k in range(8)
    ]
    ids = np.zeros((3, longest), np.int64)
    mask = np.zeros((3, width + longest), np.int64)
    positions = np.zeros((3, longest), np.int64)
    for b, (prompt, new) in enumerate(zip(prompts, news, strict=True)):
        ids[b, : len(new)] = new
        mask[b, : len(prompt)] = 1
        mask[b, width : width + len(new)] = 1
        positions[b, : len(new)] = np.arange(len(prompt), len(prompt) + len(new))
    logits, present = run(session, ids, batch_past, mask, positions)
    for b, (past, new) in enumerate(zip(pasts, news, strict=True)):
        alone, alone_present = run(session, [new], past)
        np.testing.assert_allclose(logits[b, : len(new)], alone[0], atol=TOL)
        start = alone_present[0].shape[2] - len(new)
        for k in range(8):  # the new keys and values, as the engine scatters them
            np.testing.assert_allclose(
                present[k][b, :, width : width + len(new)],
                alone_present[k][0, :, start:],
                atol=TOL,
            )


def _greedy(session: ort.InferenceSession, ids: list[int], steps: int) -> list[int]:
    logits, past = run(session, [ids])
    out = [int(logits[0, -1].argmax())]
    for _ in range(steps - 1):
        logits, past = run(session, [[out[-1]]], past)
        out.append(int(logits[0, -1].argmax()))
    return out


def test_outputs_differ_across_prompts(
    session: ort.InferenceSession, tinylm: GeneratorDirectory
) -> None:
    prompts = ["The quick brown fox", "Hello world", "Once upon a time", "1 2 3 4", "What is"]
    outputs = [_greedy(session, tinylm.encode_prompt(p), 24) for p in prompts]
    assert len({tuple(o) for o in outputs}) == len(prompts)
    # No prompt falls into one repeated token or a short loop.
    assert all(len(set(o)) >= 12 for o in outputs), [len(set(o)) for o in outputs]
    # The first tokens already differ, so short generations are distinct too.
    assert len({tuple(o[:2]) for o in outputs}) == len(prompts)


def test_builds_the_same_bytes_from_the_same_seed(tmp_path: Path) -> None:
    a = build_demo_generator(tmp_path / "a")
    b = build_demo_generator(tmp_path / "b")
    for name in ("model.onnx", "tokenizer.json", "config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
