"""Prometheus metrics: what the server records per call, and the generation engine's API.

Everything lives in one CollectorRegistry per server (not prometheus_client's global one),
so two servers in one process keep separate counts. State that already exists elsewhere
(queues, pools, model states, GPU memory) is read at scrape time by the collectors in
`tensord.observability.collectors`; only events are recorded here.

Names follow the Prometheus conventions: a `tensord_` prefix, base units in the name
(`_seconds`, `_bytes`), `_total` on counters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.metrics import MetricWrapperBase

from tensord import __version__

# Inference spans 100 us (a tiny model) to a minute (a long generation).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


M = TypeVar("M", bound=MetricWrapperBase)


class _Children(Generic[M]):
    """Cached labelled children: `.labels()` takes a lock and builds a key on every call."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._cache: dict[tuple[str, ...], M] = {}

    def get(self, *labels: str) -> M:
        child = self._cache.get(labels)
        if child is None:
            child = self._cache[labels] = self._metric.labels(*labels)
        return child


class RequestMetrics:
    """Calls by RPC, model and status, and where their time went."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = _Children(
            Counter(
                "tensord_requests",
                "Finished calls by RPC, model and gRPC status code.",
                ["rpc", "model", "code"],
                registry=registry,
            )
        )
        self._duration = _Children(
            Histogram(
                "tensord_request_duration_seconds",
                "Time from the call's arrival at the servicer to its answer.",
                ["rpc", "model"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._queue = _Children(
            Histogram(
                "tensord_request_queue_seconds",
                "Time a Predict waited (batcher and executor queues) before it ran.",
                ["model"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._compute = _Children(
            Histogram(
                "tensord_request_compute_seconds",
                "Time the run holding a Predict took on its lane (the whole batch's run).",
                ["model"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )

    def finished(self, rpc: str, model: str, code: str, total_s: float) -> None:
        """One finished call (any status)."""
        self._requests.get(rpc, model, code).inc()
        self._duration.get(rpc, model).observe(total_s)

    def rejected(self, rpc: str, code: str) -> None:
        """A call refused before its handler ran (no model, no meaningful duration)."""
        self._requests.get(rpc, "", code).inc()

    def predict_timings(self, model: str, queue_s: float, compute_s: float) -> None:
        """Queue and compute time of a served Predict."""
        self._queue.get(model).observe(queue_s)
        self._compute.get(model).observe(compute_s)


class GenerationMetrics:
    """What Generate streams record: tokens, time to first token and inter-token latency.
    The data plane calls `stream(model)` per request. (KV-cache blocks and queues are read
    from the engines at scrape time: collectors.ModelCollector.)"""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._tokens = _Children(
            Counter(
                "tensord_generated_tokens",
                "Tokens generated and streamed.",
                ["model"],
                registry=registry,
            )
        )
        self._prompt_tokens = _Children(
            Counter(
                "tensord_prompt_tokens",
                "Prompt tokens of Generate requests admitted (counted at their first chunk).",
                ["model"],
                registry=registry,
            )
        )
        self._ttft = _Children(
            Histogram(
                "tensord_time_to_first_token_seconds",
                "Time from a Generate request's arrival to its first token.",
                ["model"],
                buckets=TTFT_BUCKETS,
                registry=registry,
            )
        )
        self._itl = _Children(
            Histogram(
                "tensord_inter_token_latency_seconds",
                "Time between consecutive tokens of one stream.",
                ["model"],
                buckets=ITL_BUCKETS,
                registry=registry,
            )
        )

    def stream(self, model: str, prompt_tokens: int = 0) -> Stream:
        """A token counter for one Generate stream. Its prompt tokens count at its first
        chunk: a request the engine refuses (queue full, too long for the pool) never
        counts."""
        prompt = functools.partial(self._prompt_tokens.get(model).inc, prompt_tokens)
        return Stream(prompt, self._tokens.get(model).inc)

    def timings(self, model: str) -> TokenTimings:
        """Where one model's generation engine reports its streams' token timings (its
        output processor measures them once, for these histograms and each stream's
        Usage alike)."""
        return TokenTimings(self._ttft.get(model).observe, self._itl.get(model).observe)


class Stream:
    """One stream's token count; the prompt's tokens count at the first chunk."""

    __slots__ = ("_count", "_prompt")

    def __init__(self, prompt: Callable[[], None], count: Callable[[float], None]) -> None:
        self._prompt: Callable[[], None] | None = prompt
        self._count = count

    def tokens(self, n: int = 1) -> None:
        """`n` tokens were streamed together."""
        if self._prompt is not None:  # the first chunk: the engine admitted the request
            self._prompt()
            self._prompt = None
        if n > 0:
            self._count(n)


class TokenTimings:
    """One model's time to first token and inter-token latency histograms."""

    __slots__ = ("_itl", "_ttft")

    def __init__(self, ttft: Callable[[float], None], itl: Callable[[float], None]) -> None:
        self._ttft, self._itl = ttft, itl

    def first_token(self, seconds: float) -> None:
        """A request's first token came `seconds` after the server received it."""
        self._ttft(seconds)

    def inter_token(self, seconds: float, tokens: int) -> None:
        """`tokens` more tokens came, each `seconds` after the one before."""
        for _ in range(tokens):
            self._itl(seconds)


class Metrics:
    """The registry and the recorders of one server."""

    def __init__(self) -> None:
        # No `_created` series beside every counter and histogram: they double the scrape
        # and Prometheus itself ignores them in the text format.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = RequestMetrics(self.registry)
        self.generation = GenerationMetrics(self.registry)
        Gauge(
            "tensord_build_info", "tensord's version.", ["version"], registry=self.registry
        ).labels(__version__).set(1)
