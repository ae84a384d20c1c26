"""Reference greedy decoding with no KV cache: plain ONNX Runtime recomputes the whole
sequence at every step (an empty past, a full attention mask, positions 0..n-1).

Greedy outputs from a KV cache may differ from it in the last float bits, so two decoders
can pick different tokens where the top two logits are (almost) equal. The near-tie rule:
compare token for token, and stop comparing at the first step whose reference top-2 logit
gap is below NEAR_TIE times the largest logit's magnitude (that step and all after it are
not compared).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime as ort

from tensord.generate.model.model_dir import GeneratorSpec, read_generator_spec

NEAR_TIE = 1e-5
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark_module(name: str) -> ModuleType:
    """A script from benchmarks/ (not a package) imported as a module, e.g. generate_limit."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@dataclass(slots=True, frozen=True)
class ReferenceRun:
    """One prompt's greedy continuation, with the logit margins of every step."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    top2_gaps: tuple[float, ...]
    """Per step: the largest logit minus the second largest."""
    max_logits: tuple[float, ...]
    """Per step: the largest logit."""
    tie_gap: float | None = None
    """An absolute top-2 gap below which a step is a near tie; None: NEAR_TIE of the
    largest logit's magnitude."""

    @classmethod
    def from_record(cls, run: Mapping[str, Any], tie_gap: float | None = None) -> ReferenceRun:
        """A run from its plain record (hf_families.greedy_steps, a reference.json)."""
        return cls(
            tuple(run["prompt"]),
            tuple(run["tokens"]),
            tuple(run["top2_gaps"]),
            tuple(run["max_logits"]),
            tie_gap=tie_gap,
        )

    def near_tie(self, step: int) -> bool:
        """Whether step's top two logits are within tie_gap (or NEAR_TIE of the largest's
        magnitude) of each other."""
        if self.tie_gap is not None:
            return self.top2_gaps[step] < self.tie_gap
        return self.top2_gaps[step] < NEAR_TIE * abs(self.max_logits[step])

    @property
    def comparable(self) -> int:
        """Steps before the first near tie: the tokens a KV-cache decoder must reproduce."""
        return next((i for i in range(len(self.tokens)) if self.near_tie(i)), len(self.tokens))

    def check(self, actual: Sequence[int]) -> int:
        """Assert that `actual` equals this run over the comparable steps it covers;
        returns how many tokens were compared."""
        count = min(len(actual), self.comparable)
        for step in range(count):
            if int(actual[step]) != self.tokens[step]:
                raise AssertionError(
                    f"step {step}: got token {actual[step]}, the reference picks "
                    f"{self.tokens[step]} (reference top-2 gap {self.top2_gaps[step]:.3g}, largest "
                    f"logit {self.max_logits[step]:.3g}); prompt {list(self.prompt)[:12]}..., "
                    f"got {list(actual[: step + 1])}, want {list(self.tokens[: step + 1])}"
                )
        return count


class ReferenceModel:
    """A generator directory run with plain ONNX Runtime and no KV cache."""

    def __init__(self, directory: Path, *, threads: int = 1) -> None:
        self.spec: GeneratorSpec = read_generator_spec(directory)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(self.spec.model_path), options, providers=["CPUExecutionProvider"]
        )

    def last_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits for the token after `ids`, from one pass over the whole sequence."""
        spec = self.spec
        length = len(ids)
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, length), np.int64),
        }
        if spec.has_position_ids:
            feeds["position_ids"] = np.arange(length, dtype=np.int64)[None]
        empty = np.zeros((1, spec.num_kv_heads, 0, spec.head_dim), spec.kv_dtype.numpy)
        for key, value in spec.past_input_names:
            feeds[key] = feeds[value] = empty
        (logits,) = self.session.run(["logits"], feeds)
        return np.asarray(logits[0, -1], np.float64)

    def greedy(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        stop_token_ids: Collection[int] = (),
    ) -> ReferenceRun:
        """Greedy decoding of `max_new_tokens` tokens (fewer when a stop token comes; it is
        included), recomputing everything at every step."""
        ids = [int(t) for t in prompt]
        tokens: list[int] = []
        gaps: list[float] = []
        maxima: list[float] = []
        for _ in range(max_new_tokens):
            logits = self.last_logits(ids + tokens)
            second, first = np.partition(logits, -2)[-2:]
            tokens.append(int(logits.argmax()))
            gaps.append(float(first - second))
            maxima.append(float(first))
            if tokens[-1] in stop_token_ids:
                break
        return ReferenceRun(tuple(ids), tuple(tokens), tuple(gaps), tuple(maxima))


def reference_greedy(
    directory: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> list[ReferenceRun]:
    """The no-cache greedy reference for each prompt."""
    model = ReferenceModel(directory)
    return [model.greedy(prompt, max_new_tokens) for prompt in prompts]
