"""Generate on KV slots on a GPU: tokens/s of tensord's engine at 1, 16 and 64 streams.

    python benchmarks/gpu_generate_bench.py [--model DIR] [--streams 1,16,64] [--rounds 3]
        [--prompt-len 32] [--new-tokens 64] [--out FILE] [--quick]

Loads the fp16 CUDA model-builder folder of the Generate benchmark's Llama
(build/gpu-models/llama-fp16-cuda, `make gpu-models`) through tensord's own loader
(load_engine: the CUDA provider where this onnxruntime has it, the KV slots in device
memory; elsewhere the CPU, so `--quick` checks the script on any host) and drives
GenerationEngine.generate directly, without gRPC: for each stream count N, an untimed
warm-up round, then --rounds timed rounds of N concurrent greedy streams (ignore_eos,
seeded --prompt-len-token prompts, --new-tokens new tokens each). A round's tokens/s is
its generated tokens over the wall time from the first request to the last token; the
median round counts. Also per N: time to first token and inter-token latency (p50 over
the streams, from each stream's usage), the engine's steps and mean sequences per pass,
and the share of the wall time inside the model's passes.

Writes JSON (--out, else benchmarks/results/gpu-generate-<time>.json) and prints a table.
GPU call 2's `generate-bench` step runs it (tests/gpu/run-ort-gpu.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import use_venv

from tensord.backends.base import DeviceOptions
from tensord.devices import probe_gpus
from tensord.generate.core.sampling_params import SamplingParams
from tensord.generate.engine.engine import GenerationEngine
from tensord.generate.engine.loader import load_engine
from tensord.modelconfig.generator import GeneratorConfig
from tensord.modelconfig.model import ModelConfig

DEFAULT_MODEL = use_venv.REPO / "build" / "gpu-models" / "llama-fp16-cuda"


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """`count` seeded prompts of ordinary token ids (none of the special ids 0..2)."""
    rng = np.random.default_rng(seed)
    return rng.integers(3, vocab, size=(count, length)).tolist()


async def one_stream(
    engine: GenerationEngine, prompt: list[int], new_tokens: int
) -> tuple[int, float, float]:
    """(tokens, time to first token ms, mean inter-token ms) of one greedy stream."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    tokens, usage = 0, None
    async for chunk in engine.generate(prompt, params):
        tokens += len(chunk.token_ids)
        usage = chunk.usage or usage
    assert usage is not None and tokens == new_tokens, (tokens, usage)
    return tokens, usage.time_to_first_token_ms, usage.mean_inter_token_ms


async def one_round(
    engine: GenerationEngine, batch: list[list[int]], new_tokens: int
) -> dict[str, Any]:
    """N concurrent streams; tokens/s over the round's wall time, and the engine's work."""
    before = engine.stats()
    start = time.perf_counter()
    results = await asyncio.gather(*(one_stream(engine, p, new_tokens) for p in batch))
    wall = time.perf_counter() - start
    after = engine.stats()
    passes = after.passes.passes - before.passes.passes
    sequences = after.passes.sequences - before.passes.sequences
    # PassStats.run_seconds: time inside the model's passes (absent from older trees)
    began, ended = (getattr(s.passes, "run_seconds", None) for s in (before, after))
    in_passes = None
    if began is not None and ended is not None:
        in_passes = (ended - began) / wall
    return {
        "tokens": sum(r[0] for r in results),
        "seconds": wall,
        "tokens_per_s": sum(r[0] for r in results) / wall,
        "ttft_ms": [r[1] for r in results],
        "itl_ms": [r[2] for r in results],
        "steps": after.steps - before.steps,
        "passes": passes,
        "sequences_per_pass": sequences / passes if passes else 0.0,
        "in_passes": in_passes,
    }


def summarise(streams: int, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round's tokens/s and the pooled latencies of N streams."""
    rates = [r["tokens_per_s"] for r in rounds]
    ttft = [t for r in rounds for t in r["ttft_ms"]]
    itl = [t for r in rounds for t in r["itl_ms"]]
    shares = [r["in_passes"] for r in rounds if r["in_passes"] is not None]
    return {
        "streams": streams,
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_rounds": rates,
        "ttft_p50_ms": statistics.median(ttft),
        "itl_p50_ms": statistics.median(itl),
        "steps_per_round": statistics.median(r["steps"] for r in rounds),
        "sequences_per_pass": statistics.median(r["sequences_per_pass"] for r in rounds),
        "in_passes": statistics.median(shares) if shares else None,
    }


async def measure(engine: GenerationEngine, args: argparse.Namespace) -> list[dict[str, Any]]:
    vocab = engine.directory.spec.vocab_size
    rows = []
    for streams in args.streams:
        batch = prompts(streams, args.prompt_len, vocab, seed=streams)
        await one_round(engine, batch, args.new_tokens)  # warm-up: bindings for N rows
        rounds = [await one_round(engine, batch, args.new_tokens) for _ in range(args.rounds)]
        row = summarise(streams, rounds)
        rows.append(row)
        share = f"{row['in_passes']:.0%}" if row["in_passes"] is not None else "-"
        print(
            f"| {streams:3d} | {row['tokens_per_s']:9.0f} | {row['ttft_p50_ms']:8.2f} | "
            f"{row['itl_p50_ms']:7.2f} | {row['sequences_per_pass']:5.1f} | {share:>5} |",
            flush=True,
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="builder folder")
    parser.add_argument("--streams", default="1,16,64", help="comma-separated stream counts")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per stream count")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="1 and 4 streams, 8 tokens, 1 round")
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.rounds, args.new_tokens = "1,4", 1, 8
    args.streams = [int(n) for n in str(args.streams).split(",")]
    if not (args.model / "genai_config.json").is_file():
        print(f"gpu_generate_bench: {args.model} is not a builder folder (make gpu-models)")
        return 2
    gpus = probe_gpus()
    config = ModelConfig(
        kind="generator",
        preferred_provider="cuda",
        generator=GeneratorConfig(max_num_seqs=max(64, *args.streams)),
    )
    start = time.perf_counter()
    engine, placement, _, _ = load_engine(
        "llama-fp16-cuda", args.model / "model.onnx", config, DeviceOptions()
    )
    loaded = time.perf_counter() - start
    storage = engine.kv.storage
    device = getattr(storage, "device", "?")
    gpu = gpus.gpus[0].name if gpus.gpus else None
    print(
        f"gpu_generate_bench: {args.model.name} on {placement.provider} ({gpu or 'no GPU'}), "
        f"KV {engine.kv.name} in {device} memory, {engine.limits.num_blocks} slots of "
        f"{engine.limits.max_model_len} positions; loaded in {loaded:.1f} s"
    )
    print(
        f"{args.prompt_len}-token prompts, {args.new_tokens} new tokens, greedy, ignore_eos; "
        f"median of {args.rounds} round(s)"
    )
    print("| streams | tokens/s | TTFT p50 ms | ITL p50 ms | seqs/pass | in passes |")
    print("| --- | --- | --- | --- | --- | --- |")
    try:
        rows = asyncio.run(measure(engine, args))
    finally:
        engine.close()
    results = {
        "benchmark": "gpu_generate_bench",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": gpu,
        "driver": gpus.driver_version if gpus.gpus else None,
        "provider": placement.provider,
        "provider_reason": placement.provider_reason,
        "kv_path": engine.kv.name,
        "kv_device": device,
        "slots": engine.limits.num_blocks,
        "max_model_len": engine.limits.max_model_len,
        "model": str(args.model),
        "load_seconds": loaded,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "python": sys.version.split()[0],
        "results": rows,
    }
    out = args.out or (
        use_venv.REPO
        / "benchmarks"
        / "results"
        / f"gpu-generate-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
