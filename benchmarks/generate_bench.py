"""Generate throughput and latency of tensord against the plain ONNX Runtime loop.

    python benchmarks/generate_bench.py [--streams 1,4,16,32] [--requests 3] [--quick]

For each stream count N, N concurrent clients each send `--requests` greedy requests back
to back (prompts of `--prompt-len` tokens, `--new-tokens` tokens each, ignore_eos) to
`tensord serve` on the demo repository, and it reports aggregate generated tokens/s, time
to first token (p50/p99, from sending the request to the first chunk) and inter-token
latency (p50/p99; a chunk holding k tokens counts as k gaps of 1/k of its wait). The same
run measures the limit at each N, just before and just after tensord's point: an
in-process plain ONNX Runtime batched greedy loop with a contiguous KV cache on the same
model, with the engine's thread settings (benchmarks/generate_limit.py); the faster of the
two counts. It also serves the N=16 requests one at a time, for the
continuous-batching gain. Targets on a 2-core host: >= 0.8x the limit at 16 streams,
>= 0.7x at 1, and 16 concurrent streams >= 5x the one-at-a-time throughput.
Results go to benchmarks/results/generate-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import use_venv
from generate_limit import measure_limit, sample_prompts
from machine import machine_info
from procs import ProcessGroup, exit_on_signals
from servers import start_tensord
from stats import percentile

from tensord.generate.model_dir import read_generator_spec
from tensord.registry.generator_config import GeneratorConfig
from tensord.registry.repository import scan_repository
from tensord_client import AsyncClient

REPO = use_venv.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"
DEFAULT_REPOSITORY = REPO / "build" / "demo-models"
MODEL = "tinylm"
TARGETS = {1: 0.7, 16: 0.8}
BATCHING_GAIN_TARGET = 5.0


@dataclass(slots=True)
class StreamPoint:
    """One stream count's figures."""

    streams: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    limit_tokens_per_s: float = 0.0
    ratio: float = 0.0


async def _one(
    client: AsyncClient, prompt: list[int], new_tokens: int
) -> tuple[float, list[float], int]:
    """(time to first token, per-token gaps, tokens) of one streamed request."""
    sent = time.perf_counter()
    previous = sent
    first = 0.0
    gaps: list[float] = []
    count = 0
    async for chunk in client.generate(
        MODEL, token_ids=prompt, max_tokens=new_tokens, temperature=0, ignore_eos=True
    ):
        n = len(chunk.token_ids)
        if not n:
            continue
        now = time.perf_counter()
        if count == 0:
            first = now - sent
            gaps.extend([(now - previous) / n] * (n - 1))
        else:
            gaps.extend([(now - previous) / n] * n)
        previous = now
        count += n
    return first, gaps, count


async def _streams(
    target: str, prompts: list[list[int]], requests: int, new_tokens: int, concurrent: bool
) -> StreamPoint:
    async with AsyncClient(target, timeout=600) as client:
        # Warm-up: one request per stream (not measured).
        await asyncio.gather(*(_one(client, p, 4) for p in prompts))
        ttft: list[float] = []
        itl: list[float] = []
        tokens = 0

        async def stream(prompt: list[int]) -> None:
            nonlocal tokens
            for _ in range(requests):
                first, gaps, count = await _one(client, prompt, new_tokens)
                ttft.append(first)
                itl.extend(gaps)
                tokens += count

        start = time.perf_counter()
        if concurrent:
            await asyncio.gather(*(stream(p) for p in prompts))
        else:
            for prompt in prompts:
                await stream(prompt)
        wall = time.perf_counter() - start
    ttft.sort()
    itl.sort()
    return StreamPoint(
        streams=len(prompts) if concurrent else 1,
        requests=len(prompts) * requests,
        tokens=tokens,
        wall_s=wall,
        tokens_per_s=tokens / wall,
        ttft_ms_p50=percentile(ttft, 50) * 1e3,
        ttft_ms_p99=percentile(ttft, 99) * 1e3,
        itl_ms_p50=percentile(itl, 50) * 1e3 if itl else 0.0,
        itl_ms_p99=percentile(itl, 99) * 1e3 if itl else 0.0,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", default="1,4,16,32", help="comma-separated stream counts")
    parser.add_argument("--requests", type=int, default=3, help="requests per stream")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="1 request per stream")
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def _engine_threads(repository: Path) -> int:
    """The generator's [generator] intra_op_threads, as the daemon resolves it."""
    for source in scan_repository(repository):
        if source.name == MODEL and source.config.generator is not None:
            return source.config.generator.intra_op_threads
    return GeneratorConfig().intra_op_threads


def _render(points: list[StreamPoint], sequential: StreamPoint | None, gain: float | None) -> str:
    lines = [
        f"{'streams':>7} {'tok/s':>8} {'limit':>8} {'ratio':>6} {'ttft p50':>9} {'p99':>8} "
        f"{'itl p50':>8} {'p99':>7}  (ms)"
    ]
    for p in points:
        mark = ""
        if p.streams in TARGETS:
            mark = " ok" if p.ratio >= TARGETS[p.streams] else f" < {TARGETS[p.streams]}"
        lines.append(
            f"{p.streams:>7} {p.tokens_per_s:>8.0f} {p.limit_tokens_per_s:>8.0f} {p.ratio:>6.2f} "
            f"{p.ttft_ms_p50:>9.1f} {p.ttft_ms_p99:>8.1f} {p.itl_ms_p50:>8.2f} {p.itl_ms_p99:>7.2f}"
            f"{mark}"
        )
    if sequential is not None and gain is not None:
        verdict = "ok" if gain >= BATCHING_GAIN_TARGET else f"< {BATCHING_GAIN_TARGET}"
        lines.append(
            f"16 one at a time: {sequential.tokens_per_s:.0f} tok/s; 16 concurrent / one at a "
            f"time = {gain:.2f}x ({verdict})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()
    requests = 1 if args.quick else args.requests
    counts = [int(s) for s in args.streams.split(",")]
    model_dir = args.model_repository / MODEL
    spec = read_generator_spec(model_dir)
    started = datetime.now(UTC)
    points: list[StreamPoint] = []
    sequential = None
    threads = _engine_threads(args.model_repository)
    with ProcessGroup() as procs, tempfile.TemporaryFile("w+") as log:
        server = start_tensord(procs, args.model_repository, log)
        for n in counts:
            # The limit just before and just after the daemon's point (the daemon idle in
            # between; the faster run counts), so that the ratio compares like with like
            # on a host whose speed drifts.
            before = measure_limit(model_dir, n, args.prompt_len, args.new_tokens,
                                   intra_op_threads=threads)  # fmt: skip
            prompts = sample_prompts(spec, n, args.prompt_len, seed=n)
            point = asyncio.run(_streams(server.target, prompts, requests, args.new_tokens, True))
            after = measure_limit(model_dir, n, args.prompt_len, args.new_tokens,
                                  intra_op_threads=threads)  # fmt: skip
            point.limit_tokens_per_s = max(before.tokens_per_s, after.tokens_per_s)
            point.ratio = point.tokens_per_s / point.limit_tokens_per_s
            points.append(point)
            print(
                f"{n} streams: tensord {point.tokens_per_s:.0f} tok/s, limit "
                f"{before.tokens_per_s:.0f} before / {after.tokens_per_s:.0f} after",
                flush=True,
            )
        if 16 in counts:
            prompts = sample_prompts(spec, 16, args.prompt_len, seed=16)
            sequential = asyncio.run(_streams(server.target, prompts, 1, args.new_tokens, False))
        procs.stop_all()
    by_streams = {p.streams: p for p in points}
    gain = (
        by_streams[16].tokens_per_s / sequential.tokens_per_s
        if sequential is not None and 16 in by_streams
        else None
    )
    print(_render(points, sequential, gain))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"generate-{started:%Y%m%d-%H%M%S}.json"
    result: dict[str, Any] = {
        "schema": 1,
        "started_at": started.isoformat(timespec="seconds"),
        "machine": machine_info(REPO),
        "settings": {
            "streams": counts,
            "requests_per_stream": requests,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "targets": TARGETS,
            "batching_gain_target": BATCHING_GAIN_TARGET,
            "intra_op_threads": threads,
        },
        "points": [asdict(p) for p in points],
        "sequential_16": asdict(sequential) if sequential else None,
        "batching_gain_16": gain,
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"results: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
