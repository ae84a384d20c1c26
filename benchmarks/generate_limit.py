"""The generation limit: a plain ONNX Runtime batched greedy loop with a contiguous KV cache.

This is the usual Hugging Face loop with no server, scheduler or paging around it: one
prefill pass over the batch's prompts (left-padded when their lengths differ), then one
pass per new token that feeds the previous pass's `present` tensors back as
`past_key_values`, choosing each token with an argmax. Its aggregate tokens/s at a batch
size, timed from the first pass to the last token chosen (wall clock: the loop's own
argmax and feeds count, as a served step's do), is what serving that many streams could
reach on this host.

    python benchmarks/generate_limit.py --batch-sizes 1,4,16,32 --prompt-len 32 --new-tokens 64

prints one JSON object per batch size (importable: `measure_limit`, `greedy_with_past`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tensord.generate.model.model_dir import GeneratorSpec, read_generator_spec

DEFAULT_MODEL = Path("build/demo-models/tinylm")


def make_session(
    spec: GeneratorSpec, intra_op_threads: int = 0, allow_spinning: bool = False
) -> ort.InferenceSession:
    """A CPU session built the way the daemon builds one (full optimisation, no spinning
    unless asked); intra_op_threads 0 lets ONNX Runtime use one thread per core."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    spin = "1" if allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return ort.InferenceSession(str(spec.model_path), options, providers=["CPUExecutionProvider"])


@dataclass(slots=True)
class GreedyRun:
    """Tokens per sequence and the time each pass took."""

    tokens: list[list[int]]
    prefill_s: float
    decode_step_s: list[float] = field(default_factory=list)
    """Each decode pass alone (ONNX Runtime's run)."""
    total_s: float = 0.0
    """The whole loop, wall clock: feeds, passes and argmaxes, prefill to last token."""


def _prefill_feeds(
    spec: GeneratorSpec, prompts: Sequence[Sequence[int]]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Left-padded prompts with their mask and positions; the per-sequence lengths."""
    batch, width = len(prompts), max(len(p) for p in prompts)
    ids = np.full((batch, width), spec.pad_token_id or 0, np.int64)
    mask = np.zeros((batch, width), np.int64)
    for b, prompt in enumerate(prompts):
        if prompt:
            ids[b, width - len(prompt) :] = prompt
            mask[b, width - len(prompt) :] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    if spec.has_position_ids:
        feeds["position_ids"] = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    empty = np.zeros((batch, spec.num_kv_heads, 0, spec.head_dim), spec.kv_dtype.numpy)
    for key, value in spec.past_input_names:
        feeds[key] = feeds[value] = empty
    return feeds, mask.sum(axis=1)


def greedy_with_past(
    session: ort.InferenceSession,
    spec: GeneratorSpec,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
) -> GreedyRun:
    """Greedy decoding of `new_tokens` tokens for every prompt at once, with a KV cache
    (no stop tokens: every sequence runs to the end)."""
    if not prompts or any(len(p) == 0 for p in prompts) or new_tokens < 1:
        raise ValueError("greedy_with_past needs non-empty prompts and new_tokens >= 1")
    outputs = ["logits"] + [name for pair in spec.present_output_names for name in pair]
    past_names = [name for pair in spec.past_input_names for name in pair]
    began = time.perf_counter()
    feeds, lengths = _prefill_feeds(spec, prompts)
    start = time.perf_counter()
    logits, *present = session.run(outputs, feeds)
    run = GreedyRun([[] for _ in prompts], time.perf_counter() - start)
    mask = feeds["attention_mask"]
    ones = np.ones((len(prompts), 1), np.int64)
    for step in range(new_tokens):
        chosen = logits[:, -1].argmax(axis=-1)
        for tokens, token in zip(run.tokens, chosen, strict=True):
            tokens.append(int(token))
        if step == new_tokens - 1:
            run.total_s = time.perf_counter() - began
            break
        mask = np.concatenate([mask, ones], axis=1)
        feeds = {"input_ids": chosen[:, None].astype(np.int64), "attention_mask": mask}
        if spec.has_position_ids:
            feeds["position_ids"] = (lengths + step)[:, None].astype(np.int64)
        feeds.update(zip(past_names, present, strict=True))
        start = time.perf_counter()
        logits, *present = session.run(outputs, feeds)
        run.decode_step_s.append(time.perf_counter() - start)
    return run


def _right_aligned(rows: list[np.ndarray], width: int) -> np.ndarray:
    """Per-sequence pasts [1, H, L, D] stacked right-aligned into [B, H, width, D]."""
    first = rows[0]
    out = np.zeros((len(rows), first.shape[1], width, first.shape[3]), first.dtype)
    for b, row in enumerate(rows):
        out[b, :, width - row.shape[2] :] = row[0]
    return out


def greedy_continuous(
    session: ort.InferenceSession,
    spec: GeneratorSpec,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    steps: int,
) -> float:
    """The plain loop under continuous arrivals: len(prompts) slots, each running one
    request after another (its prompt, then `new_tokens` greedy tokens), the first ones cut
    to 1/B, 2/B, ... of the length so that sequences join and leave at different steps. A
    newcomer's prompt runs alone; the decode batch keeps the pasts right-aligned (left
    padding, masked) and feeds `present` back as it is, re-stacking only when a sequence
    joins. Returns generated tokens/s, wall clock, over `steps` decode steps after a
    request's length of warm-up: the best a loop over this graph does with staggered
    sequences, with no server around it."""
    outputs = ["logits"] + [name for pair in spec.present_output_names for name in pair]
    past_names = [name for pair in spec.past_input_names for name in pair]
    b = len(prompts)
    left = [max(1, new_tokens * (i + 1) // b) for i in range(b)]
    """Tokens each slot's current request has still to make (0: the next request joins)."""
    lengths = [0] * b
    last = [0] * b
    past: list[np.ndarray] = []
    mask = np.zeros((b, 0), np.int64)
    tokens, began = 0, time.perf_counter()
    for step in range(new_tokens + steps):
        if step == new_tokens:
            tokens, began = 0, time.perf_counter()
        joined = {i: _prefill_alone(session, spec, prompts[i], outputs) for i in range(b)
                  if step == 0 or left[i] == 0}  # fmt: skip
        if joined:
            rows = [[p[r : r + 1, :, p.shape[2] - lengths[r] :] for p in past] for r in range(b)]
            for i, (token, present) in joined.items():
                rows[i], last[i], lengths[i] = present, token, len(prompts[i])
                left[i] = (left[i] or new_tokens) - 1
                tokens += 1
            width = max(lengths)
            past = [
                _right_aligned([rows[r][j] for r in range(b)], width)
                for j in range(len(past_names))
            ]
            mask = (np.arange(width)[None, :] >= width - np.array(lengths)[:, None]).astype(
                np.int64
            )
        mask = np.concatenate([mask, np.ones((b, 1), np.int64)], axis=1)
        feeds = {"input_ids": np.array(last, np.int64)[:, None], "attention_mask": mask}
        if spec.has_position_ids:
            feeds["position_ids"] = np.array(lengths, np.int64)[:, None]
        feeds.update(zip(past_names, past, strict=True))
        logits, *past = session.run(outputs, feeds)
        last = [int(t) for t in logits[:, -1].argmax(axis=-1)]
        lengths = [n + 1 for n in lengths]
        left = [n - 1 for n in left]
        tokens += b
    return tokens / (time.perf_counter() - began)


def _prefill_alone(
    session: ort.InferenceSession, spec: GeneratorSpec, prompt: Sequence[int], outputs: list[str]
) -> tuple[int, list[np.ndarray]]:
    """One prompt's pass: its first token and its present [1, H, L, D] per past input."""
    feeds, _ = _prefill_feeds(spec, [prompt])
    logits, *present = session.run(outputs, feeds)
    return int(logits[0, -1].argmax()), present


def sample_prompts(spec: GeneratorSpec, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    """`batch` seeded prompts of `length` tokens (BOS first when the model uses one)."""
    rng = np.random.default_rng(seed)
    special = {spec.bos_token_id, spec.pad_token_id, *spec.eos_token_ids}
    allowed = np.array([t for t in range(spec.vocab_size) if t not in special])
    prompts = [[int(t) for t in rng.choice(allowed, size=length)] for _ in range(batch)]
    if spec.add_bos_token and spec.bos_token_id is not None:
        prompts = [[spec.bos_token_id, *p[1:]] for p in prompts]
    return prompts


@dataclass(slots=True, frozen=True)
class LimitResult:
    """Throughput of the plain loop at one batch size."""

    batch_size: int
    prompt_len: int
    new_tokens: int
    tokens_per_s: float
    """Generated tokens (batch_size * new_tokens) per second of the whole loop, wall clock."""
    decode_tokens_per_s: float
    """Tokens per second of the decode passes alone."""
    prefill_ms: float
    decode_step_ms_p50: float
    decode_step_ms_p99: float
    total_s: float
    intra_op_threads: int


def measure_limit(
    directory: Path,
    batch_size: int,
    prompt_len: int = 32,
    new_tokens: int = 64,
    *,
    intra_op_threads: int = 0,
    allow_spinning: bool = False,
    repeats: int = 3,
    session: ort.InferenceSession | None = None,
) -> LimitResult:
    """The fastest of `repeats` runs (after one warm-up run) of the plain loop."""
    spec = read_generator_spec(directory)
    session = session or make_session(spec, intra_op_threads, allow_spinning)
    prompts = sample_prompts(spec, batch_size, prompt_len)
    greedy_with_past(session, spec, prompts, min(new_tokens, 4))  # lazy set-up, page-in
    best = min(
        (greedy_with_past(session, spec, prompts, new_tokens) for _ in range(max(1, repeats))),
        key=lambda r: r.total_s,
    )
    steps = np.array(best.decode_step_s or [0.0]) * 1e3
    decode_s = sum(best.decode_step_s)
    return LimitResult(
        batch_size=batch_size,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        tokens_per_s=batch_size * new_tokens / best.total_s,
        decode_tokens_per_s=batch_size * (new_tokens - 1) / decode_s if decode_s else 0.0,
        prefill_ms=best.prefill_s * 1e3,
        decode_step_ms_p50=float(np.percentile(steps, 50)),
        decode_step_ms_p99=float(np.percentile(steps, 99)),
        total_s=best.total_s,
        intra_op_threads=intra_op_threads,
    )


def main(argv: list[str] | None = None) -> int:
    """Measure each batch size and print one JSON line per result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--batch-sizes", default="1,4,16,32")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--intra-op-threads", type=int, default=0)
    parser.add_argument("--allow-spinning", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    spec = read_generator_spec(args.model_dir)
    session = make_session(spec, args.intra_op_threads, args.allow_spinning)
    for size in (int(s) for s in args.batch_sizes.split(",")):
        result = measure_limit(
            args.model_dir,
            size,
            args.prompt_len,
            args.new_tokens,
            intra_op_threads=args.intra_op_threads,
            repeats=args.repeats,
            session=session,
        )
        print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
