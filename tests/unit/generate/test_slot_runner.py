"""SlotRunner on a real model-builder folder: the KV cache is bound in place, never copied."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.model.model_dir import GeneratorSpec, load_generator_dir
from tensord.generate.model.slot_graph import SlotSession, open_slot_session, slot_layout
from tensord.generate.worker.kv_slots import SlotStorage
from tensord.generate.worker.slot_runner import SlotRunner
from tensord.modelconfig.model import ModelConfig
from tests.genai_models import build_families


@pytest.fixture(scope="module")
def opened() -> tuple[GeneratorSpec, SlotSession]:
    spec = load_generator_dir(build_families()["llama"].path).spec
    return spec, open_slot_session(spec, ModelConfig())


def _runner(opened: tuple[GeneratorSpec, SlotSession], slots: int, **options: Any) -> SlotRunner:
    spec, session = opened
    storage = SlotStorage(slot_layout(spec, 64), slots)
    return SlotRunner(
        session.backend,
        storage,
        logits_dtype=session.logits_dtype,
        vocab_size=spec.vocab_size,
        **options,
    )


def test_past_and_present_are_the_slots_own_buffers(opened) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(opened, 3)
    before = [runner.storage.host_view(0, 0)[s].copy() for s in range(3)]
    runner.execute([ScheduledRequest("a", [5, 6, 7], 0, [1])])
    runner.execute([ScheduledRequest("a", [8], 3, [1])])
    (binding,) = runner._decode_bindings.values()
    presents = binding.get_outputs()[:4]  # key/value per layer, in binding order, then logits
    expected = [runner.storage.address(layer, kind, 1) for layer in range(2) for kind in (0, 1)]
    assert [value.data_ptr() for value in presents] == expected
    keys = runner.storage.host_view(0, 0)
    assert np.count_nonzero(keys[1, :, :4]) > 0  # four positions written in slot 1
    assert not np.any(keys[1, :, 4:]) and np.array_equal(keys[0], before[0])
    assert np.array_equal(keys[2], before[2])  # the other slots untouched


def test_a_move_carries_the_cache_and_decoding_goes_on(opened) -> None:  # type: ignore[no-untyped-def]
    from tensord.generate.core.slot_manager import SlotMove

    runner = _runner(opened, 3)
    first = runner.execute([ScheduledRequest("a", [5, 6, 7, 9], 0, [2])]).rows[0]
    token = int(first.argmax())
    runner.storage.apply_moves([SlotMove(2, 0)])
    moved = runner.execute([ScheduledRequest("a", [token], 4, [0])]).rows[0]
    fresh = _runner(opened, 1)
    fresh.execute([ScheduledRequest("b", [5, 6, 7, 9], 0, [0])])
    alone = fresh.execute([ScheduledRequest("b", [token], 4, [0])]).rows[0]
    np.testing.assert_array_equal(moved, alone)


def test_first_prompts_share_one_pass_right_padded(opened) -> None:  # type: ignore[no-untyped-def]
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
    runner = _runner(opened, 3)
    items = [ScheduledRequest(str(s), p, 0, [s]) for s, p in enumerate(prompts)]
    together = runner.execute(items)
    assert (runner.stats.passes, runner.stats.max_sequences) == (1, 3)
    tokens = [int(row.argmax()) for row in together.rows]
    decoded = runner.execute(
        [ScheduledRequest(str(s), [tokens[s]], len(p), [s]) for s, p in enumerate(prompts)]
    )
    for s, prompt in enumerate(prompts):
        alone = _runner(opened, 1)
        first = alone.execute([ScheduledRequest("a", prompt, 0, [0])]).rows[0]
        np.testing.assert_allclose(together[str(s)], first, rtol=1e-5, atol=1e-5)
        then = alone.execute([ScheduledRequest("a", [tokens[s]], len(prompt), [0])]).rows[0]
        np.testing.assert_allclose(decoded[str(s)], then, rtol=1e-5, atol=1e-5)


def test_without_padding_only_equal_prompts_share_a_pass(opened) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(opened, 4, pad_prompts=False)
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12], [13, 14]]
    runner.execute([ScheduledRequest(str(s), p, 0, [s]) for s, p in enumerate(prompts)])
    assert (runner.stats.passes, runner.stats.max_sequences) == (2, 2)


def test_a_padded_pass_stays_within_the_token_budget(opened) -> None:  # type: ignore[no-untyped-def]
    """One long prompt among short ones: rows x width of a pass stays within budget."""
    runner = _runner(opened, 4, max_pass_tokens=40)
    prompts = [[5] * 30, [6, 7], [8, 9], [10, 11]]
    runner.execute([ScheduledRequest(str(s), p, 0, [s]) for s, p in enumerate(prompts)])
    assert (runner.stats.passes, runner.stats.max_sequences) == (2, 3)  # 1 x 30, 3 x 2
