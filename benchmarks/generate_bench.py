"""Generate throughput and latency of tensord against the plain ONNX Runtime loop.

    python benchmarks/generate_bench.py [--streams 1,4,16,32] [--rounds 9] [--quick]

For each stream count N, N concurrent clients each send greedy requests back to back
(`--requests` each; by default at least 3, and enough for 1024 tokens a window), prompts
of `--prompt-len` tokens, `--new-tokens` tokens each, ignore_eos, to `tensord serve` on
the demo repository. It reports aggregate generated tokens/s, time to first token
(p50/p99, from sending the request to the first chunk) and inter-token latency (p50/p99;
a chunk holding k tokens counts as k gaps of 1/k of its wait). The limit is an in-process
plain ONNX Runtime batched greedy loop with a contiguous KV cache on the same model, with
the engine's thread settings (benchmarks/generate_limit.py), timed by wall clock like the
served streams and over the same tokens. Each N is measured in `--rounds` paired rounds,
the limit and then tensord back to back, and the median of the rounds' ratios counts: on
a host whose speed drifts between windows, each ratio compares like with like, and
neither side is a best-of-several. At N=16 each round also serves the same 16 requests
one at a time, for the continuous-batching gain (median of the rounds' gains). Targets
on a 2-core host: >= 0.8x the limit at 16 streams, >= 0.7x at 1, and 16 concurrent
streams >= 5x the one-at-a-time throughput.
Results go to benchmarks/results/generate-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
import onnxruntime as ort
import use_venv
from cpustat import MachineCpu
from generate_limit import greedy_with_past, make_session, sample_prompts
from machine import write_results
from procs import ProcessGroup, exit_on_signals
from servers import start_tensord
from stats import percentile

from tensord.eventloop import run
from tensord.generate.model.model_dir import GeneratorSpec, read_generator_spec
from tensord.modelconfig.generator import GeneratorConfig
from tensord.registry.repository import scan_repository
from tensord.v1 import inference_pb2 as pb
from tensord_client import AsyncClient

REPO = use_venv.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"
DEFAULT_REPOSITORY = REPO / "build" / "demo-models"
MODEL = "tinylm"
TARGETS = {1: 0.7, 16: 0.8}
BATCHING_GAIN_TARGET = 5.0
_WINDOW_TOKENS = 1024
"""Tokens a measured window generates at least (shorter ones drift with the host)."""


@dataclass(slots=True)
class Window:
    """What one measured load (one round of one stream count) gave."""

    tokens: int
    wall_s: float
    ttft_s: list[float]
    itl_s: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


@dataclass(slots=True)
class Round:
    """One paired round: the limit, then tensord, back to back."""

    tokens_per_s: float
    limit_tokens_per_s: float
    ratio: float
    steal: float = 0.0
    """Share of the machine's CPU time the hypervisor took during tensord's window."""


@dataclass(slots=True)
class StreamPoint:
    """One stream count's figures: medians over the rounds, latencies pooled."""

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
    rounds: list[Round] = field(default_factory=list)


def _limit_tokens_per_s(
    session: ort.InferenceSession,
    spec: GeneratorSpec,
    prompts: list[list[int]],
    new_tokens: int,
    batches: int,
) -> float:
    """The plain loop's tokens/s over `batches` batches back to back (wall clock), the
    same tokens a round's served window generates."""
    loops = [greedy_with_past(session, spec, prompts, new_tokens) for _ in range(batches)]
    return len(prompts) * new_tokens * batches / sum(loop.total_s for loop in loops)


async def _wait_ready(target: str, timeout_s: float = 120.0) -> None:
    """Until the daemon reports SERVING (it loads and warms its models first)."""
    deadline = time.monotonic() + timeout_s
    async with AsyncClient(target, timeout=5) as client:
        while True:
            try:
                health = await client.health()
                if health.status == pb.SERVING_STATUS_SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"generate_bench: the daemon at {target} is not serving")
            await asyncio.sleep(0.1)


def _summarise(streams: int, requests: int, windows: list[Window]) -> StreamPoint:
    ttft = sorted(t for w in windows for t in w.ttft_s)
    itl = sorted(t for w in windows for t in w.itl_s)
    return StreamPoint(
        streams=streams,
        requests=requests * len(windows),
        tokens=sum(w.tokens for w in windows),
        wall_s=sum(w.wall_s for w in windows),
        tokens_per_s=statistics.median(w.tokens_per_s for w in windows),
        ttft_ms_p50=percentile(ttft, 50) * 1e3,
        ttft_ms_p99=percentile(ttft, 99) * 1e3,
        itl_ms_p50=percentile(itl, 50) * 1e3 if itl else 0.0,
        itl_ms_p99=percentile(itl, 99) * 1e3 if itl else 0.0,
    )


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
) -> Window:
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
    return Window(tokens, wall, ttft, itl)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", default="1,4,16,32", help="comma-separated stream counts")
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests per stream and round (default: at least 3, and enough for "
        f"{_WINDOW_TOKENS} tokens a window)",
    )
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--rounds", type=int, default=9, help="paired rounds per stream count; the median counts"
    )
    parser.add_argument("--quick", action="store_true", help="1 request per stream, 2 rounds")
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
    lines.append("(ratio: median of the paired rounds' ratios; tok/s and limit: that round's)")
    if sequential is not None and gain is not None:
        verdict = "ok" if gain >= BATCHING_GAIN_TARGET else f"< {BATCHING_GAIN_TARGET}"
        lines.append(
            f"16 one at a time: {sequential.tokens_per_s:.0f} tok/s; 16 concurrent / one at a "
            f"time = {gain:.2f}x, median of the rounds ({verdict})"
        )
    by_streams = {p.streams: p for p in points}
    if 1 in by_streams and 16 in by_streams:
        # What batching buys the plain loop itself: serving at equal efficiency at 1 and 16
        # streams gives the same gain, so this is the gain's ceiling on this host.
        loop_gain = by_streams[16].limit_tokens_per_s / by_streams[1].limit_tokens_per_s
        lines.append(f"the plain loop itself: batch 16 / batch 1 = {loop_gain:.2f}x")
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
    sequential_windows: list[Window] = []
    gains: list[float] = []
    threads = _engine_threads(args.model_repository)
    rounds = 2 if args.quick else max(1, args.rounds)
    session = make_session(spec, threads)
    with ProcessGroup() as procs, tempfile.TemporaryFile("w+") as log:
        server = start_tensord(procs, args.model_repository, log)
        # The clients run on the daemon's default loop (uvloop where installed): the cheaper
        # the client per chunk, the less it takes from the daemon on a small host.
        run(_wait_ready(server.target))
        for n in counts:
            prompts = sample_prompts(spec, n, args.prompt_len, seed=n)
            windows: list[Window] = []
            paired: list[Round] = []
            per_stream = requests or max(3, -(-_WINDOW_TOKENS // (n * args.new_tokens)))
            # One untimed round of each first: ONNX Runtime's arenas grow on the first
            # passes at a new batch size and length, on both sides.
            greedy_with_past(session, spec, prompts, args.new_tokens)
            run(_streams(server.target, prompts, 1, args.new_tokens, True))
            for _ in range(rounds):
                # The limit and the daemon back to back (the daemon idle meanwhile), over
                # the same tokens, so each round's ratio compares like with like on a host
                # whose speed drifts.
                limit = _limit_tokens_per_s(session, spec, prompts, args.new_tokens, per_stream)
                before = MachineCpu.read()
                window = run(_streams(server.target, prompts, per_stream, args.new_tokens, True))
                stolen = MachineCpu.read().steal_s - before.steal_s
                windows.append(window)
                paired.append(
                    Round(
                        window.tokens_per_s,
                        limit,
                        window.tokens_per_s / limit,
                        stolen / (window.wall_s * (os.cpu_count() or 1)),
                    )
                )
                if n == 16:
                    alone = run(_streams(server.target, prompts, 1, args.new_tokens, False))
                    sequential_windows.append(alone)
                    gains.append(window.tokens_per_s / alone.tokens_per_s)
            point = _summarise(n, per_stream, windows)
            point.rounds = paired
            # tok/s and limit of the round with the median ratio (with an odd number of
            # rounds, the default, ratio = tok/s / limit in the table).
            middle = sorted(paired, key=lambda r: r.ratio)[len(paired) // 2]
            point.tokens_per_s = middle.tokens_per_s
            point.limit_tokens_per_s = middle.limit_tokens_per_s
            point.ratio = statistics.median(r.ratio for r in paired)
            points.append(point)
            print(
                f"{n} streams: tensord / limit per round: "
                + ", ".join(
                    f"{r.tokens_per_s:.0f} / {r.limit_tokens_per_s:.0f} = {r.ratio:.2f}"
                    + (f" (steal {r.steal:.0%})" if r.steal >= 0.01 else "")
                    for r in paired
                ),
                flush=True,
            )
            if n == 16:
                print(
                    "16 streams: concurrent / one at a time per round: "
                    + ", ".join(f"{g:.2f}x" for g in gains),
                    flush=True,
                )
        procs.stop_all()
    sequential = _summarise(1, 16, sequential_windows) if sequential_windows else None
    gain = statistics.median(gains) if gains else None
    print(_render(points, sequential, gain))
    write_results(
        REPO,
        args.results_dir,
        "generate",
        started,
        {
            "settings": {
                "streams": counts,
                "requests_per_stream": requests or "auto",
                "rounds": rounds,
                "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens,
                "targets": TARGETS,
                "batching_gain_target": BATCHING_GAIN_TARGET,
                "intra_op_threads": threads,
            },
            "points": [asdict(p) for p in points],
            "sequential_16": asdict(sequential) if sequential else None,
            "batching_gain_16": gain,
            "batching_gains_16": gains,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
