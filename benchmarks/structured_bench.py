"""Structured output's cost: served tokens/s with a JSON-schema constraint against none, the
token masks' time per step at the demo vocabulary and at a 32k one, and compile times.

    python benchmarks/structured_bench.py [--streams 1,16] [--rounds 5] [--requests 4]

Served: `tensord serve` on the demo repository; at each stream count N, N concurrent
streams of greedy requests to `tinylm`, each held to a JSON schema (an array of 48 integers
in [0, 999], about 150 tokens compact) or unconstrained with as many tokens as the
constrained reply to the same prompt had (ignore_eos),
in paired rounds that alternate which goes first; the median of the rounds' tokens/s
ratios (constrained / unconstrained) is the figure, and every constrained reply is checked
against the schema. Target: overhead at most 10 % at 16 streams (ratio >= 0.90).

Masks: in this process, 16 matchers of that schema advanced by random tokens, one pass's
masks filled (llguidance's threads) and applied to [16, V] logits, per step and per token,
at V = 2,048 (the demo tokenizer) and V = 32,768 (a byte-level BPE trained here on
synthetic words, cached in build/). Compile: each schema of the tests' corpus
(tests/structured_schemas.py) compiled cold at V = 32,768: median and max ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import use_venv
from generate_bench import _wait_ready
from machine import write_results
from procs import ProcessGroup, exit_on_signals
from servers import start_tensord

from tensord.eventloop import run
from tensord.generate.core.sampling_params import Constraint
from tensord.generate.worker.grammar import Grammars, Masks, apply_masks
from tensord_client import AsyncClient

REPO = use_venv.REPO
MODEL = "tinylm"
NUMBERS = 48
SCHEMA = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 999},
    "minItems": NUMBERS,
    "maxItems": NUMBERS,
}
TARGET = 0.90
_BIG_VOCAB = 32_768


async def _window(
    target: str, streams: int, requests: int, lengths: dict[str, int] | None
) -> tuple[int, float, dict[str, str], dict[str, int]]:
    """`streams` concurrent streams of `requests` requests each: constrained when `lengths`
    is None, else unconstrained with as many tokens as the constrained reply to the same
    prompt had. Tokens, seconds, and each prompt's reply and token count."""
    replies: dict[str, str] = {}
    counts: dict[str, int] = {}
    async with AsyncClient(target, timeout=600) as client:

        async def one(i: int) -> None:
            for r in range(requests):
                prompt = f"{i} {r} numbers:"
                if lengths is None:
                    chunks = client.generate(
                        MODEL,
                        prompt,
                        max_tokens=400,
                        temperature=0,
                        constraint={"json_schema": SCHEMA},
                    )
                else:
                    chunks = client.generate(MODEL, prompt, max_tokens=lengths[prompt],
                                             temperature=0, ignore_eos=True)  # fmt: skip
                text, tokens = [], 0
                async for chunk in chunks:
                    tokens += len(chunk.token_ids)
                    text.append(chunk.text)
                replies[prompt], counts[prompt] = "".join(text), tokens

        await asyncio.gather(*(one(i) for i in range(streams)))  # warm-up, not counted
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(counts.values()), time.perf_counter() - start, replies, counts


def served(args: argparse.Namespace) -> list[dict[str, Any]]:
    points = []
    with ProcessGroup() as procs, tempfile.TemporaryFile("w+") as log:
        server = start_tensord(procs, args.repository, log)
        run(_wait_ready(server.target))
        for n in (int(s) for s in args.streams.split(",")):
            lengths = run(_window(server.target, n, args.requests, None))[3]
            rounds = []
            for r in range(args.rounds):
                got = {}
                for constrained in (True, False) if r % 2 == 0 else (False, True):
                    got[constrained] = run(
                        _window(server.target, n, args.requests, None if constrained else lengths)
                    )
                for reply in got[True][2].values():
                    values = json.loads(reply)
                    assert len(values) == NUMBERS and all(0 <= v <= 999 for v in values), reply
                assert got[True][0] == got[False][0]  # the same tokens on each side
                rates = {k: v[0] / v[1] for k, v in got.items()}
                rounds.append({"constrained": rates[True], "plain": rates[False],
                               "ratio": rates[True] / rates[False]})  # fmt: skip
                print(f"  {n:>2} streams, round {r + 1}: constrained {rates[True]:,.0f}, "
                      f"plain {rates[False]:,.0f} tok/s", flush=True)  # fmt: skip
            points.append({
                "streams": n, "rounds": rounds,
                "constrained": statistics.median(x["constrained"] for x in rounds),
                "plain": statistics.median(x["plain"] for x in rounds),
                "ratio": statistics.median(x["ratio"] for x in rounds),
            })  # fmt: skip
    return points


def big_tokenizer(path: Path) -> Any:
    """A byte-level BPE of 32,768 tokens trained on synthetic words (cached at `path`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if path.exists():
        return Tokenizer.from_file(str(path))
    rng = random.Random(0)
    syllables = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiou"] + list('0123456789{}[],:"')
    lines = (
        " ".join("".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(40))
        for _ in range(60_000)
    )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BIG_VOCAB, special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tokenizer.train_from_iterator(lines, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return tokenizer


def masks(tokenizer: Any, steps: int = 200) -> dict[str, float]:
    """Per step: masks of 16 sequences filled and applied to [16, V] logits (median µs)."""
    vocab = tokenizer.get_vocab_size()
    grammars = Grammars(tokenizer, vocab, [0])
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    rng = np.random.default_rng(0)
    fills, applies = [], []
    filler = Masks(vocab)
    matchers = [grammars.matcher(constraint) for _ in range(16)]
    for _ in range(steps):
        start = time.perf_counter()
        bitmask = filler.fill(matchers)
        filled = time.perf_counter()
        logits = rng.standard_normal((16, vocab), dtype=np.float32)
        begun = time.perf_counter()
        apply_masks(logits, list(range(16)), bitmask)
        applies.append(time.perf_counter() - begun)
        fills.append(filled - start)
        for i, matcher in enumerate(matchers):
            token = int(logits[i].argmax())
            if matcher.is_stopped() or not matcher.consume_token(token):
                matchers[i] = grammars.matcher(constraint)  # a fresh sequence takes its row
    fill_us = statistics.median(fills) * 1e6
    apply_us = statistics.median(applies) * 1e6
    return {"vocab": vocab, "fill_us_per_step": fill_us, "apply_us_per_step": apply_us,
            "us_per_token": (fill_us + apply_us) / 16}  # fmt: skip


def compiles(tokenizer: Any) -> dict[str, float]:
    """Each corpus schema compiled cold (a fresh Grammars, its tokenizer built first)."""
    sys.path.insert(0, str(REPO))
    from tests.structured_schemas import SCHEMAS

    vocab = tokenizer.get_vocab_size()
    warm = Grammars(tokenizer, vocab, [0])
    start = time.perf_counter()
    warm.tokenizer()
    tokenizer_ms = (time.perf_counter() - start) * 1e3
    times = []
    for schema in SCHEMAS.values():
        grammars = Grammars(tokenizer, vocab, [0])
        grammars._tokenizer = warm.tokenizer()  # the model's, built once at first use
        start = time.perf_counter()
        grammars.matcher(Constraint("json_schema", json.dumps(schema)))
        times.append((time.perf_counter() - start) * 1e3)
    return {"vocab": vocab, "schemas": len(times), "median_ms": statistics.median(times),
            "max_ms": max(times), "tokenizer_ms": tokenizer_ms}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=4, help="requests per stream a window")
    parser.add_argument("--repository", type=Path, default=REPO / "build" / "demo-models")
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--skip-served", action="store_true")
    args = parser.parse_args()
    exit_on_signals()
    started = datetime.now(UTC)
    from tokenizers import Tokenizer

    demo = Tokenizer.from_file(str(args.repository / MODEL / "tokenizer.json"))
    big = big_tokenizer(REPO / "build" / "bench-tokenizer-32k.json")
    mask_rows = [masks(demo), masks(big)]
    compile_row = compiles(big)
    points = [] if args.skip_served else served(args)
    if points:
        print("\n| streams | constrained tok/s | plain tok/s | ratio | target |")
        print("| --- | --- | --- | --- | --- |")
        for p in points:
            goal = f">= {TARGET}" if p["streams"] >= 16 else ""
            print(f"| {p['streams']} | {p['constrained']:,.0f} | {p['plain']:,.0f} "
                  f"| {p['ratio']:.3f} | {goal} |")  # fmt: skip
    print("\n| vocabulary | fill µs/step (16 rows) | apply µs/step | µs per token |")
    print("| --- | --- | --- | --- |")
    for m in mask_rows:
        print(f"| {m['vocab']:,} | {m['fill_us_per_step']:.0f} | {m['apply_us_per_step']:.0f} "
              f"| {m['us_per_token']:.1f} |")  # fmt: skip
    print(
        f"\ncompile at V = {compile_row['vocab']:,}: {compile_row['schemas']} schemas, median "
        f"{compile_row['median_ms']:.1f} ms, max {compile_row['max_ms']:.1f} ms "
        f"(the model's tokenizer for llguidance: {compile_row['tokenizer_ms']:.0f} ms, once)"
    )
    write_results(REPO, args.results_dir, "structured", started,
                  {"served": points, "masks": mask_rows, "compile": compile_row})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
