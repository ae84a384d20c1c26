"""Generate throughput and latency of tensord against the plain ONNX Runtime loop.

    python benchmarks/generate_bench.py [--streams 1,4,16,32] [--rounds 9] [--quick]
    python benchmarks/generate_bench.py --frontends 0,1,2 [--connections K] [--quick]
    python benchmarks/generate_bench.py --frontends 0,1 --base REV [--rounds 3]

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

--frontends runs one daemon per `[server] frontends` count (0: the one-process daemon,
the default), all started at once and taking turns in each round after the limit, and adds
each one's tokens/s over the one-process daemon's in the same round (median of the
rounds) and the CPU time (user + system, /proc) of each of its processes over the
windows per generated token: the one-process daemon, or the supervisor, the engine and
the frontends (summed), and the client (this process). SO_REUSEPORT balances
connections, not calls, so the streams spread over `--connections` TCP connections
(stream i on connection i mod K; by default one per stream as soon as a count above 0
is listed, else one for all), the same for every daemon. Every request's
tokens are compared with the plain loop's for its prompt and with the first daemon's;
each daemon's log lines at warning and above, failed calls and stalls (a gap of a
second or more between two chunks of a stream) are reported.

--base REV also starts, for each frontends count, the same daemon from REV's checkout
(build/ab/<sha>, a detached git worktree as ab_bench.py makes, kept for later runs;
labelled `base 1 process`, `base 1 frontend`, ...): they take turns in each round like the
others, their tokens are compared with the first daemon's, and their `/ 1 proc` is over
the base one-process daemon's. A last table gives, for each frontends count and stream
count, the CPU µs per generated token of this checkout's daemon and of the base's and
their ratio (this / base): for the engine, the frontends (summed) and the whole daemon
(supervisor, engine and frontends; at 0 frontends the one process), and the median of
the rounds' tokens/s ratios.
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
from collections.abc import Sequence
from contextlib import AsyncExitStack, ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import onnxruntime as ort
import use_venv
from cpustat import CpuSample, cpu_between
from frontends_bench import Daemon, daemon_log_notes, frontend_connections, log_lines, start_daemon
from generate_limit import greedy_with_past, make_session, sample_prompts
from machine import write_results
from procs import ProcessGroup, exit_on_signals
from servers import (
    Server,
    checkout,
    checkout_pythonpath,
    foreign_tensord_note,
    start_tensord,
)
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
_OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)
"""Given to each channel when the streams spread over several (as loadgen.py does): each
then opens its own TCP connection instead of sharing one."""
_STALL_S = 1.0
"""A gap between two chunks of one stream at least this long is reported as a stall."""


@dataclass(slots=True)
class Window:
    """What one measured load (one round of one stream count) gave."""

    tokens: int
    wall_s: float
    ttft_s: list[float]
    itl_s: list[float]
    outputs: list[tuple[int, list[int]]] = field(default_factory=list)
    """(prompt index, generated tokens) of each request that ended OK."""
    errors: list[str] = field(default_factory=list)
    """`CODE: details` of each request that failed."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds over the window by watched process, as cpustat.cpu_between gives them."""
    frontend_connections: dict[str, int] = field(default_factory=dict)
    """Connections each frontend held during the window (a daemon with frontends)."""

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
    other_cores: float = 0.0
    """Cores of CPU that no watched process used during the window (load from outside)."""
    vs_one_process: float | None = None
    """tokens/s over the one-process daemon's in the same round (with --frontends)."""
    vs_base: float | None = None
    """tokens/s over the base daemon's with as many frontends, same round (with --base)."""
    frontend_connections: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class TokenCheck:
    """How one daemon's tokens at one stream count compare (greedy: they should match)."""

    requests: int = 0
    differ_from_loop: int = 0
    """Requests whose tokens are not the plain loop's for the same prompt."""
    differ_from_first: int = 0
    """Requests whose tokens are not the first daemon's for the same prompt."""
    first_difference: str = ""


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
    itl_ms_max: float = 0.0
    limit_tokens_per_s: float = 0.0
    ratio: float = 0.0
    rounds: list[Round] = field(default_factory=list)
    frontends: int = 0
    connections: int = 1
    vs_one_process: float | None = None
    """Median of the rounds' tokens/s over the one-process daemon's (with --frontends)."""
    base: bool = False
    """Whether the daemon is REV's (--base)."""
    vs_base: float | None = None
    """Median of the rounds' tokens/s over the base daemon's (with --base)."""
    cpu_us_per_token: dict[str, float] = field(default_factory=dict)
    """CPU µs per generated token over the rounds' windows, by process: `daemon` (one
    process) or `supervisor`, `engine`, `frontend.i`; `client` (this process)."""
    errors: list[str] = field(default_factory=list)
    stalls: int = 0
    tokens_check: TokenCheck = field(default_factory=TokenCheck)


@dataclass
class BaseDaemon(Daemon):
    """A daemon of REV's checkout (--base)."""

    @property
    def label(self) -> str:
        return "base " + super().label


Key = tuple[int, bool]
"""A daemon's frontends count and whether it is REV's (--base)."""


def _key(daemon: Daemon) -> Key:
    return daemon.frontends, isinstance(daemon, BaseDaemon)


def _point_key(point: StreamPoint) -> Key:
    return point.frontends, point.base


def _limit(
    session: ort.InferenceSession,
    spec: GeneratorSpec,
    prompts: list[list[int]],
    new_tokens: int,
    batches: int,
) -> tuple[float, list[list[int]]]:
    """The plain loop's tokens/s over `batches` batches back to back (wall clock), the
    same tokens a round's served window generates; and the tokens of each prompt."""
    loops = [greedy_with_past(session, spec, prompts, new_tokens) for _ in range(batches)]
    rate = len(prompts) * new_tokens * batches / sum(loop.total_s for loop in loops)
    return rate, loops[0].tokens


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


def requests_per_stream(streams: int, new_tokens: int) -> int:
    """The default requests per stream and window: at least 3, and enough for
    _WINDOW_TOKENS tokens a window."""
    return max(3, -(-_WINDOW_TOKENS // (streams * new_tokens)))


def _summarise(streams: int, requests: int, windows: list[Window]) -> StreamPoint:
    ttft = sorted(t for w in windows for t in w.ttft_s)
    itl = sorted(t for w in windows for t in w.itl_s)
    return StreamPoint(
        streams=streams,
        requests=requests * len(windows),
        tokens=sum(w.tokens for w in windows),
        wall_s=sum(w.wall_s for w in windows),
        tokens_per_s=statistics.median(w.tokens_per_s for w in windows),
        ttft_ms_p50=percentile(ttft, 50) * 1e3 if ttft else 0.0,
        ttft_ms_p99=percentile(ttft, 99) * 1e3 if ttft else 0.0,
        itl_ms_p50=percentile(itl, 50) * 1e3 if itl else 0.0,
        itl_ms_p99=percentile(itl, 99) * 1e3 if itl else 0.0,
        itl_ms_max=itl[-1] * 1e3 if itl else 0.0,
        errors=[e for w in windows for e in w.errors],
        stalls=sum(1 for t in itl if t >= _STALL_S),
    )


async def _one(
    client: AsyncClient, prompt: list[int], new_tokens: int
) -> tuple[float, list[float], list[int]]:
    """(time to first token, per-token gaps, tokens) of one streamed request."""
    sent = time.perf_counter()
    previous = sent
    first = 0.0
    gaps: list[float] = []
    tokens: list[int] = []
    async for chunk in client.generate(
        MODEL, token_ids=prompt, max_tokens=new_tokens, temperature=0, ignore_eos=True
    ):
        n = len(chunk.token_ids)
        if not n:
            continue
        now = time.perf_counter()
        if not tokens:
            first = now - sent
            gaps.extend([(now - previous) / n] * (n - 1))
        else:
            gaps.extend([(now - previous) / n] * n)
        previous = now
        tokens.extend(chunk.token_ids)
    return first, gaps, tokens


async def _streams(
    target: str,
    prompts: list[list[int]],
    requests: int,
    new_tokens: int,
    concurrent: bool,
    connections: int = 1,
    watch: Sequence[tuple[str, int]] = (),
    server: Server | None = None,
) -> Window:
    """One window: a stream per prompt, stream i on channel i mod `connections` (each
    channel its own TCP connection when there are several); the CPU of the `watch`ed
    processes and the connections each of `server`'s frontends holds, over the window."""
    links = max(1, min(connections, len(prompts)))
    options = [_OWN_CONNECTION] if links > 1 else []
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(AsyncClient(target, timeout=600, options=options))
            for _ in range(links)
        ]
        # Warm-up: one request per stream (not measured).
        await asyncio.gather(*(_one(clients[i % links], p, 4) for i, p in enumerate(prompts)))
        window = Window(0, 0.0, [], [])
        if server is not None and server.parts:
            window.frontend_connections = frontend_connections(server)

        async def stream(index: int, prompt: list[int]) -> None:
            client = clients[index % links]
            for _ in range(requests):
                try:
                    first, gaps, tokens = await _one(client, prompt, new_tokens)
                except grpc.aio.AioRpcError as exc:
                    window.errors.append(f"{exc.code().name}: {exc.details()}")
                    continue
                window.ttft_s.append(first)
                window.itl_s.extend(gaps)
                window.tokens += len(tokens)
                window.outputs.append((index, tokens))

        before = CpuSample.take(watch)
        start = time.perf_counter()
        if concurrent:
            await asyncio.gather(*(stream(i, p) for i, p in enumerate(prompts)))
        else:
            for i, prompt in enumerate(prompts):
                await stream(i, prompt)
        window.wall_s = time.perf_counter() - start
        window.cpu_s = cpu_between(before, CpuSample.take(watch))
    return window


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
    parser.add_argument(
        "--frontends",
        default="0",
        help="comma-separated [server] frontends counts, a daemon each (0: one process; 0)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=0,
        help="TCP connections the streams spread over, at most one per stream (default: one "
        "per stream when --frontends lists a count above 0, else 1)",
    )
    parser.add_argument(
        "--base",
        metavar="REV",
        help="also run each daemon from REV's checkout, and compare CPU per token with it",
    )
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    try:
        args.streams = [int(s) for s in args.streams.split(",")]
        args.frontends = [int(s) for s in args.frontends.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    if min(args.streams) < 1 or min(args.frontends) < 0 or args.connections < 0:
        parser.error("--streams must be >= 1; --frontends and --connections >= 0")
    if len(set(args.frontends)) != len(args.frontends):
        parser.error("--frontends: each count at most once")
    return args


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


def _num(value: float | None, fmt: str = ".0f") -> str:
    return format(value, fmt) if value is not None else "-"


def _heading(title: str, head: str) -> list[str]:
    """A table's first lines: its title, its column heads, a rule under them."""
    return [title, head, "-" * len(head)]


def _render_modes(points: list[StreamPoint], labels: dict[Key, str]) -> str:
    """Tokens/s of each daemon against the one-process one, and CPU per token by process."""
    w = max(12, *map(len, labels.values()))
    head = (
        f"{'daemon':<{w}} {'streams':>7} {'conn':>4} {'tok/s':>7} {'/ 1 proc':>8} {'/ limit':>7} "
        f"| {'1 proc':>6} {'superv':>6} {'engine':>6} {'fronts':>6} {'client':>6} | "
        f"{'conn/fe':>8}"
    )
    lines = _heading(
        "CPU µs per generated token (user+sys over the windows / tokens in them) by process", head
    )
    for p in sorted(points, key=lambda p: (p.streams, p.frontends, p.base)):
        cpu = p.cpu_us_per_token
        fronts = [v for k, v in cpu.items() if k.startswith("frontend.")]
        middle = sorted(p.rounds, key=lambda r: r.ratio)[len(p.rounds) // 2]
        spread = middle.frontend_connections
        lines.append(
            f"{labels[_point_key(p)]:<{w}} {p.streams:>7} {p.connections:>4} "
            f"{p.tokens_per_s:>7.0f} "
            f"{_num(p.vs_one_process, '.2f'):>8} {p.ratio:>7.2f} | {_num(cpu.get('daemon')):>6} "
            f"{_num(cpu.get('supervisor'), '.1f'):>6} {_num(cpu.get('engine')):>6} "
            f"{_num(sum(fronts) if fronts else None):>6} {_num(cpu.get('client')):>6} | "
            f"{'/'.join(str(spread[k]) for k in sorted(spread)) or '-':>8}"
        )
    lines.append(
        "(/ 1 proc: median of the rounds' tokens/s over the one-process daemon's; fronts: the "
        "frontends summed; conn/fe: connections each frontend held, median round)"
    )
    return "\n".join(lines)


def _daemon_cpu(cpu: dict[str, float]) -> dict[str, float | None]:
    """CPU µs per token of the engine, the frontends (summed) and the whole daemon (the one
    process, or the supervisor, the engine and the frontends); None where it has none."""
    fronts = [v for k, v in cpu.items() if k.startswith("frontend.")]
    if "daemon" in cpu:
        total: float | None = cpu["daemon"]
    elif "engine" in cpu:
        total = cpu.get("supervisor", 0.0) + cpu["engine"] + sum(fronts)
    else:
        total = None
    return {
        "engine": cpu.get("engine"),
        "frontends": sum(fronts) if fronts else None,
        "daemon": total,
    }


def _ratio(this: float | None, base: float | None) -> float | None:
    return this / base if this is not None and base else None


def compare_base(points: list[StreamPoint]) -> list[dict[str, Any]]:
    """For each frontends count and stream count: CPU µs per token of this checkout's
    daemon and of the base's, by part, and this / base; and the rounds' median tokens/s
    ratio."""
    bases = {(p.frontends, p.streams): p for p in points if p.base}
    out = []
    for p in sorted(points, key=lambda p: (p.frontends, p.streams)):
        b = bases.get((p.frontends, p.streams))
        if p.base or b is None:
            continue
        this, base = _daemon_cpu(p.cpu_us_per_token), _daemon_cpu(b.cpu_us_per_token)
        out.append(
            {
                "frontends": p.frontends,
                "streams": p.streams,
                "cpu_us_per_token": {"this": this, "base": base},
                "cpu_ratio": {k: _ratio(this[k], base[k]) for k in this},
                "tokens_per_s": {"this": p.tokens_per_s, "base": b.tokens_per_s},
                "tokens_per_s_ratio": p.vs_base,
            }
        )
    return out


def _render_base(rows: list[dict[str, Any]], labels: dict[Key, str], base: str) -> str:
    """compare_base's rows as a table."""
    w = max(12, *map(len, labels.values()))
    head = (
        f"{'daemon':<{w}} {'streams':>7} | {'engine':>6} {'base':>6} {'ratio':>6} | "
        f"{'fronts':>6} {'base':>6} {'ratio':>6} | {'daemon':>6} {'base':>6} {'ratio':>6} | "
        f"{'tok/s ratio':>11}"
    )
    lines = _heading(
        f"this checkout against {base}: CPU µs per generated token, this, base and this / base",
        head,
    )
    for row in rows:
        this, old = row["cpu_us_per_token"]["this"], row["cpu_us_per_token"]["base"]
        ratio = row["cpu_ratio"]
        cells = [
            f"{_num(this[k]):>6} {_num(old[k]):>6} {_num(ratio[k], '.3f'):>6}"
            for k in ("engine", "frontends", "daemon")
        ]
        lines.append(
            f"{labels[(row['frontends'], False)]:<{w}} {row['streams']:>7} | "
            + " | ".join(cells)
            + f" | {_num(row['tokens_per_s_ratio'], '.3f'):>11}"
        )
    lines.append(
        "(fronts: the frontends summed; daemon: the one process, or the supervisor, the "
        "engine and the frontends; tok/s ratio: median of the rounds' this / base)"
    )
    return "\n".join(lines)


def _difference(what: str, index: int, got: list[int], want: list[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if at is None:
        return f"prompt {index}: {len(got)} tokens where {what} has {len(want)}"
    return f"prompt {index}: token {at} is {got[at]} where {what} has {want[at]}"


def _check_tokens(
    outputs: list[tuple[int, list[int]]],
    loop: list[list[int]],
    first: dict[int, list[int]] | None,
    first_label: str,
) -> TokenCheck:
    """Each request's tokens against the plain loop's and the first daemon's."""
    check = TokenCheck(requests=len(outputs))
    for index, tokens in outputs:
        if tokens != loop[index]:
            check.differ_from_loop += 1
            if not check.first_difference:
                check.first_difference = _difference("the loop", index, tokens, loop[index])
        if first is not None and index in first and tokens != first[index]:
            check.differ_from_first += 1
            if not check.first_difference:
                check.first_difference = _difference(first_label, index, tokens, first[index])
    return check


def _token_lines(points: list[StreamPoint], labels: dict[Key, str], first: Key) -> list[str]:
    checked = sum(p.tokens_check.requests for p in points)
    odd = [p for p in points if p.tokens_check.differ_from_loop or p.tokens_check.differ_from_first]
    if not odd:
        return [f"tokens: all {checked} requests match the plain loop's, token for token"]
    lines = [f"tokens: of {checked} requests, some differ:"]
    for p in odd:
        c = p.tokens_check
        lines.append(
            f"  {labels[_point_key(p)]}, {p.streams} streams: {c.differ_from_loop} of "
            f"{c.requests} differ from the plain loop, {c.differ_from_first} from "
            f"{labels[first]}; first: {c.first_difference}"
        )
    return lines


def _warning_lines(points: list[StreamPoint], labels: dict[Key, str]) -> list[str]:
    out = []
    for p in points:
        where = f"{labels[_point_key(p)]}, {p.streams} streams"
        if p.errors:
            out.append(f"  {where}: {len(p.errors)} failed requests, first {p.errors[0]!r}")
        if p.stalls:
            out.append(
                f"  {where}: {p.stalls} gaps of {_STALL_S:g} s or more between chunks "
                f"(longest {p.itl_ms_max:.0f} ms)"
            )
        other = max(r.other_cores for r in p.rounds)
        if other > 0.1:
            out.append(f"  {where}: up to {other:.2f} cores of other load in a window")
    return ["", "Warnings:", *out] if out else []


def _start_daemon(
    procs: ProcessGroup,
    stack: ExitStack,
    repository: Path,
    frontends: int,
    base: Path | None = None,
) -> Daemon:
    """`tensord serve`: one process logging at warning, or a supervisor logging
    at info (it names its children there); `base`: the one of that checkout."""
    if frontends and base is None:
        return start_daemon(procs, stack, repository, frontends)
    log = stack.enter_context(tempfile.TemporaryFile("w+"))  # noqa: SIM115 - the stack closes it
    if base is None:
        return Daemon(start_tensord(procs, repository, log, frontends=0), 0, log)
    name = "base-tensord" + (f"-f{frontends}" if frontends else "")
    server = start_tensord(
        procs,
        repository,
        log,
        "info" if frontends else "warning",
        frontends=frontends,
        name=name,
        pythonpath=checkout_pythonpath(base),
    )
    return BaseDaemon(server, frontends, log)


def _watch(daemon: Daemon, daemons: list[Daemon]) -> list[tuple[str, int]]:
    """The processes whose CPU a window of `daemon` records, by role."""
    watch = [("server", daemon.server.pid), *daemon.server.parts, ("client", os.getpid())]
    for other in daemons:
        if other is not daemon:
            watch.append(("idle_servers", other.server.pid))
            watch += [("idle_servers", pid) for _, pid in other.server.parts]
    return watch


def _cpu_per_token(daemon: Daemon, windows: list[Window]) -> dict[str, float]:
    """CPU µs per generated token over `windows`, by process."""
    tokens = sum(w.tokens for w in windows)
    top = "supervisor" if daemon.frontends else "daemon"
    roles = ["server", *(role for role, _ in daemon.server.parts), "client", "idle_servers"]
    return {
        (top if role == "server" else role): sum(w.cpu_s.get(role, 0.0) for w in windows)
        / tokens
        * 1e6
        for role in roles
        if tokens and any(role in w.cpu_s for w in windows)
    }


@dataclass
class Measured:
    """What the rounds at one stream count gave, by daemon."""

    windows: dict[Key, list[Window]]
    paired: dict[Key, list[Round]]
    outputs: dict[Key, list[tuple[int, list[int]]]]
    """(prompt index, tokens) of every request that ended OK, concurrent or alone."""

    @classmethod
    def of(cls, keys: list[Key]) -> Measured:
        return cls({k: [] for k in keys}, {k: [] for k in keys}, {k: [] for k in keys})


@dataclass
class Bench:
    """One run: its settings, its daemons by key, and what their rounds gave."""

    args: argparse.Namespace
    requests: int
    """Requests per stream in a window (0: requests_per_stream's default)."""
    connections: int
    """TCP connections the streams spread over (0: one per stream)."""
    spec: GeneratorSpec
    started: datetime
    base: Path | None
    """REV's checkout (--base)."""
    keys: list[Key]
    threads: int
    rounds: int
    session: ort.InferenceSession
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    daemons: list[Daemon] = field(default_factory=list)
    labels: dict[Key, str] = field(default_factory=dict)
    points: list[StreamPoint] = field(default_factory=list)
    sequential_windows: dict[Key, list[Window]] = field(default_factory=dict)
    """The 16 requests of each round at N=16 served one at a time, by daemon."""
    gains: dict[Key, list[float]] = field(default_factory=dict)
    """Each round's concurrent over one-at-a-time tokens/s at N=16, by daemon."""

    @classmethod
    def prepare(cls, args: argparse.Namespace) -> Bench:
        """The settings from the arguments, the model's spec, REV's checkout (--base) and
        the plain loop's session."""
        modes: list[int] = args.frontends
        requests = 1 if args.quick else args.requests
        # 0: one connection per stream.
        connections = args.connections or (1 if modes == [0] else 0)
        spec = read_generator_spec(args.model_repository / MODEL)
        started = datetime.now(UTC)
        base = checkout(args.base) if args.base else None
        if base is not None and (note := foreign_tensord_note()):
            print(note, flush=True)
        # Each daemon by its frontends count and whether it is the base's (--base).
        keys: list[Key] = [(f, False) for f in modes]
        if base is not None:
            keys += [(f, True) for f in modes]
        threads = _engine_threads(args.model_repository)
        rounds = 2 if args.quick else max(1, args.rounds)
        session = make_session(spec, threads)
        return cls(
            args, requests, connections, spec, started, base, keys, threads, rounds, session,
            sequential_windows={k: [] for k in keys}, gains={k: [] for k in keys},
        )  # fmt: skip

    @property
    def modes(self) -> list[int]:
        """The frontends counts (--frontends)."""
        return list(self.args.frontends)

    def start_daemons(self, procs: ProcessGroup, stack: ExitStack) -> None:
        """Every daemon, at once; until each is serving."""
        self.daemons = [
            _start_daemon(
                procs, stack, self.args.model_repository, f, self.base if of_base else None
            )
            for f, of_base in self.keys
        ]
        self.labels = {_key(d): d.label for d in self.daemons}
        # The clients run on the daemon's default loop (uvloop where installed): the cheaper
        # the client per chunk, the less it takes from the daemon on a small host.
        for d in self.daemons:
            run(_wait_ready(d.server.target))

    def measure(self, n: int) -> None:
        """Every daemon at `n` streams: an untimed round, the paired rounds, then a point
        for each daemon, printed as it comes."""
        args = self.args
        prompts = sample_prompts(self.spec, n, args.prompt_len, seed=n)
        links = min(self.connections or n, n)
        per_stream = self.requests or requests_per_stream(n, args.new_tokens)
        measured = Measured.of(self.keys)
        # One untimed round of each first: ONNX Runtime's arenas grow on the first
        # passes at a new batch size and length, on both sides.
        loop_tokens = greedy_with_past(self.session, self.spec, prompts, args.new_tokens).tokens
        for d in self.daemons:
            run(_streams(d.server.target, prompts, 1, args.new_tokens, True, links))
        for r in range(self.rounds):
            loop_tokens = self._round(r, n, prompts, per_stream, links, measured)
        first: dict[int, list[int]] = {}
        for index, tokens in measured.outputs[self.keys[0]]:
            first.setdefault(index, tokens)
        for d in self.daemons:
            self.points.append(self._point(d, n, per_stream, links, measured, loop_tokens, first))
            self._print_rounds(d, n, measured.paired[_key(d)])

    def _round(
        self,
        r: int,
        n: int,
        prompts: list[list[int]],
        per_stream: int,
        links: int,
        measured: Measured,
    ) -> list[list[int]]:
        """The limit and the daemons back to back (the others idle meanwhile), over
        the same tokens, so each round's ratios compare like with like on a host
        whose speed drifts; the daemons take turns at going first. Returns the plain
        loop's tokens for each prompt."""
        limit, loop_tokens = _limit(
            self.session, self.spec, prompts, self.args.new_tokens, per_stream
        )
        turn = r % len(self.daemons)
        for d in self.daemons[turn:] + self.daemons[:turn]:
            self._daemon_round(d, n, prompts, per_stream, links, limit, measured)
        for f, of_base in self.keys:
            last = measured.paired[(f, of_base)][-1]
            if 0 in self.modes:
                last.vs_one_process = (
                    last.tokens_per_s / measured.paired[(0, of_base)][-1].tokens_per_s
                )
            if self.base is not None and not of_base:
                last.vs_base = last.tokens_per_s / measured.paired[(f, True)][-1].tokens_per_s
        return loop_tokens

    def _daemon_round(
        self,
        d: Daemon,
        n: int,
        prompts: list[list[int]],
        per_stream: int,
        links: int,
        limit: float,
        measured: Measured,
    ) -> None:
        """One daemon's measured window of a round (and at N=16 the same requests one at
        a time)."""
        args = self.args
        k = _key(d)
        window = run(
            _streams(
                d.server.target,
                prompts,
                per_stream,
                args.new_tokens,
                True,
                links,
                _watch(d, self.daemons),
                d.server,
            )
        )
        measured.windows[k].append(window)
        measured.outputs[k] += window.outputs
        measured.paired[k].append(
            Round(
                window.tokens_per_s,
                limit,
                window.tokens_per_s / limit,
                window.cpu_s["steal"] / (window.wall_s * self.cores),
                window.cpu_s["other"] / window.wall_s,
                frontend_connections=window.frontend_connections,
            )
        )
        if n == 16:
            alone = run(_streams(d.server.target, prompts, 1, args.new_tokens, False, links))
            self.sequential_windows[k].append(alone)
            measured.outputs[k] += alone.outputs
            self.gains[k].append(window.tokens_per_s / alone.tokens_per_s)

    def _point(
        self,
        d: Daemon,
        n: int,
        per_stream: int,
        links: int,
        measured: Measured,
        loop_tokens: list[list[int]],
        first: dict[int, list[int]],
    ) -> StreamPoint:
        """One daemon's figures at `n` streams over the rounds."""
        k = _key(d)
        paired = measured.paired[k]
        point = _summarise(n, per_stream, measured.windows[k])
        point.rounds = paired
        # tok/s and limit of the round with the median ratio (with an odd number of
        # rounds, the default, ratio = tok/s / limit in the table).
        middle = sorted(paired, key=lambda r: r.ratio)[len(paired) // 2]
        point.tokens_per_s = middle.tokens_per_s
        point.limit_tokens_per_s = middle.limit_tokens_per_s
        point.ratio = statistics.median(r.ratio for r in paired)
        point.frontends, point.base = k
        point.connections = links
        if 0 in self.modes:
            point.vs_one_process = statistics.median(r.vs_one_process or 0.0 for r in paired)
        if self.base is not None and not point.base:
            point.vs_base = statistics.median(r.vs_base or 0.0 for r in paired)
        point.cpu_us_per_token = _cpu_per_token(d, measured.windows[k])
        first_key = self.keys[0]
        point.tokens_check = _check_tokens(
            measured.outputs[k], loop_tokens, first if k != first_key else None,
            self.labels[first_key],
        )  # fmt: skip
        return point

    def _print_rounds(self, d: Daemon, n: int, paired: list[Round]) -> None:
        where = f"{n} streams" if len(self.keys) == 1 else f"{n} streams, {d.label}"
        print(
            f"{where}: tensord / limit per round: "
            + ", ".join(
                f"{r.tokens_per_s:.0f} / {r.limit_tokens_per_s:.0f} = {r.ratio:.2f}"
                + (f" (steal {r.steal:.0%})" if r.steal >= 0.01 else "")
                for r in paired
            ),
            flush=True,
        )
        if n == 16:
            print(
                f"{where}: concurrent / one at a time per round: "
                + ", ".join(f"{g:.2f}x" for g in self.gains[_key(d)]),
                flush=True,
            )

    def by_mode(self) -> dict[Key, dict[str, Any]]:
        """Each daemon's label and its one-at-a-time figures at N=16."""
        by_mode: dict[Key, dict[str, Any]] = {}
        for k in self.keys:
            windows = self.sequential_windows[k]
            gains = self.gains[k]
            by_mode[k] = {
                "label": self.labels[k],
                "sequential_16": _summarise(1, 16, windows) if windows else None,
                "batching_gain_16": statistics.median(gains) if gains else None,
                "batching_gains_16": gains,
            }
        return by_mode

    def report(
        self, by_mode: dict[Key, dict[str, Any]], notes: dict[str, list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Print the tables, the token check, the daemons' log lines and the warnings;
        returns the comparison with the base daemons (--base)."""
        for k in self.keys:
            if len(self.keys) > 1:
                print(f"\n{self.labels[k]}:")
            mode_points = [p for p in self.points if _point_key(p) == k]
            print(_render(mode_points, by_mode[k]["sequential_16"], by_mode[k]["batching_gain_16"]))
        print()
        print(_render_modes(self.points, self.labels))
        against_base = compare_base(self.points) if self.base is not None else []
        if self.base is not None:
            print()
            print(_render_base(against_base, self.labels, f"{self.args.base} ({self.base.name})"))
        lines = _token_lines(self.points, self.labels, self.keys[0]) + log_lines(notes)
        print("\n".join(lines + _warning_lines(self.points, self.labels)))
        return against_base

    def results(
        self,
        by_mode: dict[Key, dict[str, Any]],
        against_base: list[dict[str, Any]],
        described: dict[str, dict[str, Any]],
        notes: dict[str, list[dict[str, Any]]],
    ) -> dict[str, Any]:
        """What benchmarks/results/generate-<timestamp>.json holds."""
        args, base = self.args, self.base
        first_mode = by_mode[self.keys[0]]
        return {
            "settings": {
                "streams": args.streams,
                "requests_per_stream": self.requests or "auto",
                "rounds": self.rounds,
                "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens,
                "targets": TARGETS,
                "batching_gain_target": BATCHING_GAIN_TARGET,
                "intra_op_threads": self.threads,
                "frontends": self.modes,
                "connections": self.connections or "one per stream",
                "base": {"rev": args.base, "commit": base.name, "checkout": str(base)}
                if base is not None
                else None,
            },
            "points": [asdict(p) for p in self.points],
            "sequential_16": asdict(first_mode["sequential_16"])
            if first_mode["sequential_16"]
            else None,
            "batching_gain_16": first_mode["batching_gain_16"],
            "batching_gains_16": first_mode["batching_gains_16"],
            "by_frontends": {
                ("base " if of_base else "") + str(f): {
                    **m,
                    "sequential_16": asdict(m["sequential_16"]) if m["sequential_16"] else None,
                }
                for (f, of_base), m in by_mode.items()
            },
            "against_base": against_base,
            "daemons": described,
            "daemon_log": notes,
        }


def _note_unclean_stops(
    described: dict[str, dict[str, Any]], notes: dict[str, list[dict[str, Any]]]
) -> None:
    """A daemon that exited non-zero or left a process behind gets a note in its log's."""
    for name, info in described.items():
        stopped = info["stopped"]
        if stopped["exit_code"] or stopped["processes_left"]:
            notes.setdefault(name, []).append({"event": "bench.unclean_stop", **stopped})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()
    bench = Bench.prepare(args)
    with ProcessGroup() as procs, ExitStack() as stack:
        bench.start_daemons(procs, stack)
        for n in args.streams:
            bench.measure(n)
        described = {d.server.name: d.describe() for d in bench.daemons}
        for d in bench.daemons:
            described[d.server.name]["stopped"] = d.stop(procs)
        notes = daemon_log_notes(bench.daemons)
        procs.stop_all()
    _note_unclean_stops(described, notes)
    by_mode = bench.by_mode()
    against_base = bench.report(by_mode, notes)
    results = bench.results(by_mode, against_base, described, notes)
    write_results(REPO, args.results_dir, "generate", bench.started, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
