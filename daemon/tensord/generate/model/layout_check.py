"""The batch layout checked on the model itself before it serves.

`choose_layout` judges from the graph's inputs; this runs a few tiny steps on the real
session and KV pool (free blocks, as the warm-up does) and compares a sequence's logits
when it shares a pass with others against the same sequence alone:

  alone         prefill 5 tokens then decode 1, against one pass over all 6: the export's
                KV-cache path must agree with itself, or nothing can be served;
  padded        the sequence beside a longer one (its past right-aligned behind padding),
                in a prefill chunk and a decode step;
  equal_length  the sequence beside one of the same past length, with a ragged prefill.

A layout whose check disagrees is replaced by the next safer one, and the log and Info say
why; a model that disagrees with itself alone is refused. Correct layouts agree to float
rounding (1e-6 on float32 CPU exports); a wrong one moves the logits by tenths or more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensord.errors import ModelLoadError
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.model.batch_layout import BatchLayout, LayoutChoice
from tensord.generate.worker.model_runner import ModelRunner

_LENGTH = 6
"""Tokens of the probe sequence: a 5-token prefill, then one decode step."""
_GAP = 7
"""How much longer the padded check's other sequence is (not a multiple of a block)."""
_FLOAT32_TOLERANCE = 1e-2
_HALF_TOLERANCE = 5e-2
"""Largest logit difference allowed, relative to max(1, largest |logit|): float rounding
across batch shapes (and TF32 on GPUs) stays far below it, a shifted position far above."""


@dataclass(slots=True, frozen=True)
class _Probe:
    runner: ModelRunner
    tolerance: float
    tables: tuple[list[int], list[int], list[int]]
    """Block tables of the probe sequence (a), the longer one (b) and the equal one (c)."""
    tokens: tuple[list[int], list[int], list[int]]


def _difference(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference relative to max(1, largest |logit|)."""
    want64 = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want64).max()))
    return float(np.abs(np.asarray(got, np.float64) - want64).max()) / scale


def _run(runner: ModelRunner, items: Sequence[ScheduledRequest]) -> dict[str, np.ndarray]:
    logits = runner.execute(items)
    return {rid: np.array(logits[rid]) for rid in logits.request_ids}


def _alone(probe: _Probe) -> tuple[np.ndarray, np.ndarray]:
    """The probe sequence alone: its prefill and decode logits (checked against one pass
    over the whole sequence)."""
    a, ta = probe.tokens[0], probe.tables[0]
    runner = probe.runner
    runner.reset()
    prefill = _run(runner, [ScheduledRequest("a", a[:-1], 0, ta)])["a"]
    decode = _run(runner, [ScheduledRequest("a", a[-1:], _LENGTH - 1, ta)])["a"]
    runner.reset()
    whole = _run(runner, [ScheduledRequest("a", a, 0, ta)])["a"]
    runner.reset()
    off = _difference(decode, whole)
    if off > probe.tolerance:
        raise ModelLoadError(
            f"the graph's KV-cache decoding disagrees with a full pass over the same tokens "
            f"(logits differ by {off:.3g} of their scale): the export's past_key_values "
            "path is not consistent, so Generate cannot serve it"
        )
    return prefill, decode


def _padded_off(probe: _Probe, prefill: np.ndarray, decode: np.ndarray) -> float:
    """The probe sequence beside one _GAP tokens longer, in a prefill chunk after a padded
    past and in a decode step."""
    (a, b, _), (ta, tb, _) = probe.tokens, probe.tables
    runner = probe.runner
    runner.reset()
    _run(
        runner,
        [
            ScheduledRequest("a", a[:3], 0, ta, False),
            ScheduledRequest("b", b[: 3 + _GAP], 0, tb, False),
        ],
    )
    chunk = _run(
        runner,
        [
            ScheduledRequest("a", a[3:5], 3, ta),
            ScheduledRequest("b", b[3 + _GAP : 5 + _GAP], 3 + _GAP, tb),
        ],
    )["a"]
    step = _run(
        runner,
        [ScheduledRequest("a", a[5:], 5, ta), ScheduledRequest("b", b[5 + _GAP :], 5 + _GAP, tb)],
    )
    runner.reset()
    return max(_difference(chunk, prefill), _difference(step["a"], decode))


def _equal_off(probe: _Probe, prefill: np.ndarray, decode: np.ndarray) -> float:
    """The probe sequence in a ragged prefill beside a longer chunk at the same start, then
    decoding beside a sequence of the same length."""
    (a, _, c), (ta, _, tc) = probe.tokens, probe.tables
    runner = probe.runner
    runner.reset()
    first = _run(
        runner, [ScheduledRequest("a", a[:5], 0, ta), ScheduledRequest("c", c, 0, tc, False)]
    )["a"]
    step = _run(
        runner, [ScheduledRequest("a", a[5:], 5, ta), ScheduledRequest("c", c[5:6], 5, tc)]
    )["a"]
    runner.reset()
    return max(_difference(first, prefill), _difference(step, decode))


_CHECKS = (
    (
        BatchLayout.PADDED,
        _padded_off,
        BatchLayout.EQUAL_LENGTH,
        "a sequence beside a longer one (padded past) gave logits {off:.2g} of their scale "
        "away from the sequence alone: only sequences whose pasts have the same length share "
        "a pass",
    ),
    (
        BatchLayout.EQUAL_LENGTH,
        _equal_off,
        BatchLayout.SINGLE,
        "a sequence beside another of the same length gave logits {off:.2g} of their scale "
        "away from the sequence alone: one sequence per pass",
    ),
)
"""Each layout's check, the layout to try when it disagrees, and the reason then."""


def _probe(runner: ModelRunner, vocab_size: int, half: bool) -> _Probe | None:
    """Tokens and block tables for the checks; None when the pool is too small for them."""
    storage = runner.storage
    lengths = (_LENGTH, _LENGTH + _GAP, _LENGTH + 1)
    counts = [-(-n // storage.block_size) for n in lengths]
    if sum(counts) > storage.num_blocks:
        return None
    rng = np.random.default_rng(0)
    tokens = tuple(rng.integers(0, vocab_size, n).tolist() for n in lengths)
    first = np.cumsum([0, *counts])
    tables = tuple(list(range(int(first[i]), int(first[i + 1]))) for i in range(3))
    tolerance = _HALF_TOLERANCE if half else _FLOAT32_TOLERANCE
    return _Probe(runner, tolerance, tables, tokens)  # type: ignore[arg-type]


def check_layout(
    runner: ModelRunner, choice: LayoutChoice, vocab_size: int, half: bool
) -> LayoutChoice:
    """The layout to serve with: `choice` when the model agrees with it, else the next
    safer one that it agrees with (the reason says what was measured). Sets the runner's
    layout. Raises ModelLoadError when the model disagrees with itself alone."""
    probe = _probe(runner, vocab_size, half)
    if probe is None:
        return choice
    original = runner.layout
    runner.layout = BatchLayout.SINGLE
    prefill, decode = _alone(probe)
    runner.layout = original
    layout, reason = choice.layout, choice.reason
    for checked, measure, fallback, failed in _CHECKS:
        if layout is not checked:
            continue
        runner.layout = checked
        off = measure(probe, prefill, decode)
        if off > probe.tolerance:
            layout, reason = fallback, failed.format(off=off)
        elif layout is choice.layout:
            reason += f" (checked at load: as alone within {off:.1g})"
    runner.layout = layout
    return LayoutChoice(layout, reason)
