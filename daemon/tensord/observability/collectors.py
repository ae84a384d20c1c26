"""Collectors that read the daemon's state when Prometheus scrapes, not on a timer.

They run on the metrics endpoint's thread: they only read (the registry's lists, the
executors' locked stats, the batchers' counters) and never hold the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from tensord.registry.version import GeneratorVersion, PredictVersion

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from tensord.generate.engine.engine import EngineStats
    from tensord.registry.registry import ModelRegistry
    from tensord.registry.version import ModelVersion

log = structlog.get_logger("tensord.metrics")

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_GENERATOR: tuple[
    tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, Callable[[EngineStats], float]],
    ...,
] = (
    (
        GaugeMetricFamily,
        "tensord_kv_blocks_used",
        "KV-cache blocks held by sequences.",
        lambda stats: stats.kv_cache.used_blocks,
    ),
    (
        GaugeMetricFamily,
        "tensord_kv_blocks_free",
        "KV-cache blocks free to allocate (cached prefixes included).",
        lambda stats: stats.kv_cache.free_blocks,
    ),
    (
        GaugeMetricFamily,
        "tensord_kv_blocks_cached",
        "KV-cache blocks holding a reusable prefix.",
        lambda stats: stats.kv_cache.cached_blocks,
    ),
    (
        GaugeMetricFamily,
        "tensord_generate_sequences_running",
        "Sequences decoding now.",
        lambda stats: stats.running,
    ),
    (
        GaugeMetricFamily,
        "tensord_generate_sequences_waiting",
        "Generate requests waiting for room (preempted ones included).",
        lambda stats: stats.waiting,
    ),
    (
        CounterMetricFamily,
        "tensord_generate_preemptions",
        "Sequences preempted because KV blocks ran out.",
        lambda stats: stats.preemptions,
    ),
    (
        CounterMetricFamily,
        "tensord_generate_prefix_query_tokens",
        "Prompt tokens looked up for a reusable prefix (the hit rate's denominator).",
        lambda stats: stats.prefix_query_tokens,
    ),
    (
        CounterMetricFamily,
        "tensord_generate_prefix_hit_tokens",
        "Prompt tokens whose keys and values came from a cached prefix.",
        lambda stats: stats.prefix_hit_tokens,
    ),
)
"""The generation engines' gauges and counters, one sample per model version: kind,
name, help and the value read from the engine's stats."""


def _snapshot(registry: ModelRegistry) -> list[ModelVersion]:
    """The registry's versions; a load on the event loop may resize its dict mid-copy."""
    for _ in range(5):
        try:
            return registry.versions()
        except RuntimeError:  # dictionary changed size during iteration
            continue
    return []


class ModelCollector(Collector):
    """Model states, batcher queues and batch sizes, executor lanes and buffer pools."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        versions = _snapshot(self._registry)
        yield self._states(versions)
        yield from self._batching(versions)
        yield from self._executors(versions)
        yield from self._generators(versions)

    @staticmethod
    def _states(versions: Iterable[ModelVersion]) -> Metric:
        from tensord.registry.version import ModelState

        counts = {state.name.lower(): 0 for state in ModelState}
        for mv in versions:
            counts[mv.state.name.lower()] += 1
        family = GaugeMetricFamily(
            "tensord_model_versions", "Model versions by state.", labels=["state"]
        )
        for state, count in counts.items():
            family.add_metric([state], count)
        return family

    @staticmethod
    def _batching(versions: Iterable[ModelVersion]) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "tensord_batch_queue_depth",
            "Requests waiting in a model's dynamic batcher.",
            labels=["model", "version"],
        )
        sizes = HistogramMetricFamily(
            "tensord_batch_size",
            "Rows per batch run by a model's dynamic batcher.",
            labels=["model", "version"],
        )
        for mv in versions:
            batcher = mv.batcher if isinstance(mv, PredictVersion) else None
            if batcher is None:
                continue
            labels = [mv.name, str(mv.version)]
            depth.add_metric(labels, batcher.queue_depth)
            stats = batcher.stats
            counts = dict(stats.batch_sizes)
            buckets = [
                (str(bound), sum(n for size, n in counts.items() if size <= bound))
                for bound in BATCH_SIZE_BUCKETS
            ]
            buckets.append(("+Inf", sum(counts.values())))
            sizes.add_metric(labels, buckets, sum(s * n for s, n in counts.items()))
        yield depth
        yield sizes

    @staticmethod
    def _generators(versions: Iterable[ModelVersion]) -> Iterator[Metric]:
        labels = ["model", "version"]
        families = [
            (kind(name, text, labels=labels), value) for kind, name, text, value in _GENERATOR
        ]
        copied = CounterMetricFamily(
            "tensord_kv_prefix_copied_bytes",
            "Bytes copied between KV slots and the host prefix store "
            '(direction "load": into slots; "save": into the store).',
            labels=[*labels, "direction"],
        )
        for values, engine in _running(versions, GeneratorVersion, "engine"):
            stats = engine.stats()
            for family, value in families:
                family.add_metric(values, value(stats))
            copied.add_metric([*values, "load"], stats.prefix_bytes_loaded)
            copied.add_metric([*values, "save"], stats.prefix_bytes_saved)
        yield from (family for family, _ in families)
        yield copied

    @staticmethod
    def _executors(versions: Iterable[ModelVersion]) -> Iterator[Metric]:
        labels = ["model", "version"]
        queued = GaugeMetricFamily(
            "tensord_executor_queued_runs", "Runs waiting for a free lane.", labels=labels
        )
        running = GaugeMetricFamily(
            "tensord_executor_running_runs", "Runs in progress on a lane.", labels=labels
        )
        runs = CounterMetricFamily(
            "tensord_executor_runs", "Runs begun on the executor's lanes.", labels=labels
        )
        busy = CounterMetricFamily(
            "tensord_executor_busy_seconds",
            "Time the executor's lanes spent running, summed over lanes.",
            labels=labels,
        )
        pool_labels = [*labels, "pool"]
        in_use = GaugeMetricFamily(
            "tensord_pool_in_use_bytes",
            "Bytes of pooled buffers handed out (pools: host, pinned, device).",
            labels=pool_labels,
        )
        cached = GaugeMetricFamily(
            "tensord_pool_cached_bytes",
            "Bytes of pooled buffers kept for reuse.",
            labels=pool_labels,
        )
        high = GaugeMetricFamily(
            "tensord_pool_high_water_bytes",
            "Most bytes ever in use at once.",
            labels=pool_labels,
        )
        for values, executor in _running(versions, PredictVersion, "executor"):
            stats = executor.stats()
            queued.add_metric(values, stats.queue_depth)
            running.add_metric(values, stats.running)
            runs.add_metric(values, stats.started)
            busy.add_metric(values, sum(lane.busy_s for lane in stats.lanes))
            for pool, ps in stats.pools.items():
                in_use.add_metric([*values, pool], ps.in_use_bytes)
                cached.add_metric([*values, pool], ps.cached_bytes)
                high.add_metric([*values, pool], ps.high_water_bytes)
        yield from (queued, running, runs, busy, in_use, cached, high)


def _running(
    versions: Iterable[ModelVersion], kind: type[ModelVersion], part: str
) -> Iterator[tuple[list[str], Any]]:
    """Each loaded version of `kind` with its running `part` (its engine, its executor):
    the metrics' label values (model, version) and the part."""
    for mv in versions:
        running = getattr(mv, part) if isinstance(mv, kind) else None
        if running is not None:
            yield [mv.name, str(mv.version)], running


class GpuMemoryCollector(Collector):
    """Memory of the daemon's CUDA device: total always, used once the daemon holds a
    context there (a scrape never creates one: that would take device memory itself)."""

    def __init__(self, device_id: int) -> None:
        self._device = device_id

    def collect(self) -> Iterator[Metric]:
        from tensord.devices import probe_gpus

        report = probe_gpus()
        if not any(g.index == self._device for g in report.gpus):
            return
        gpu = str(self._device)
        total = GaugeMetricFamily(
            "tensord_gpu_memory_total_bytes", "Memory of the CUDA device.", labels=["gpu"]
        )
        used = GaugeMetricFamily(
            "tensord_gpu_memory_used_bytes",
            "Memory in use on the CUDA device (all processes), while the daemon has a "
            "context there.",
            labels=["gpu"],
        )
        reading = gpu_memory(self._device)
        if reading is not None:
            free_b, total_b = reading
            total.add_metric([gpu], total_b)
            used.add_metric([gpu], total_b - free_b)
        else:
            device = next(g for g in report.gpus if g.index == self._device)
            total.add_metric([gpu], device.total_memory_bytes)
        yield total
        yield used


def gpu_memory(device_id: int) -> tuple[int, int] | None:
    """(free, total) bytes from cudaMemGetInfo when the device's primary context is active;
    None without one (or without a usable driver)."""
    try:
        from cuda.bindings import driver, runtime

        ok = driver.CUresult.CUDA_SUCCESS
        if driver.cuInit(0)[0] != ok:
            return None
        err, dev = driver.cuDeviceGet(device_id)
        if err != ok:
            return None
        err, _flags, active = driver.cuDevicePrimaryCtxGetState(dev)
        if err != ok or not active:
            return None
        # The context exists: binding this thread to it creates nothing.
        if runtime.cudaSetDevice(device_id)[0] != runtime.cudaError_t.cudaSuccess:
            return None
        err, free_b, total_b = runtime.cudaMemGetInfo()
    except Exception as exc:  # a scrape must never fail on the driver
        log.warning("metrics.gpu_memory_failed", gpu=device_id, error=repr(exc))
        return None
    if err != runtime.cudaError_t.cudaSuccess:
        log.warning("metrics.gpu_memory_failed", gpu=device_id, error=str(err))
        return None
    return int(free_b), int(total_b)
