"""One /metrics for the daemon's processes: the supervisor serves `[metrics] listen` and,
at each scrape, reads every child's own endpoint (a loopback port of its own) and adds
them up.

Frontends count requests and generated tokens (their data planes make the streams), the
engine the models, batches and KV caches: a series found in
several processes (the same name and labels) is their sum, so `tensord_requests_total` counts
every frontend's calls and `process_cpu_seconds_total` the whole daemon's CPU. The
exceptions are what a sum would make meaningless: start times (the earliest) and limits and
info series (the largest). A child that does not answer within the timeout is left out of
that scrape, and `tensord_metrics_children_missing` says how many were.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = structlog.get_logger("tensord.supervisor")

SCRAPE_TIMEOUT_S = 2.0
_EARLIEST = ("_start_time_seconds",)
_LARGEST = ("_max_fds", "_info", "_bytes_limit")


def _combine(sample_name: str, values: list[float]) -> float:
    if sample_name.endswith(_EARLIEST):
        return min(values)
    if sample_name.endswith(_LARGEST):
        return max(values)
    return sum(values)


class ChildrenCollector(Collector):
    """Collects the children's metrics, merged; `ports()` lists their endpoints."""

    def __init__(self, ports: Callable[[], list[int]]) -> None:
        self.ports = ports

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        values: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[float]] = {}
        missing = 0
        for port in self.ports():
            try:
                text = _scrape(port)
            except OSError as exc:
                missing += 1
                log.warning("metrics.child_unanswered", port=port, error=str(exc))
                continue
            for family in text_string_to_metric_families(text):
                kept = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                    values.setdefault(key, []).append(sample.value)
                del kept  # samples are added below, once all children are read
        for (family_name, sample_name, labels), found in values.items():
            families[family_name].add_sample(
                sample_name, dict(labels), _combine(sample_name, found)
            )
        yield from families.values()
        gauge = GaugeMetricFamily(
            "tensord_metrics_children_missing",
            "Processes of the daemon whose metrics this scrape could not read.",
        )
        gauge.add_metric([], missing)
        yield gauge


def _scrape(port: int) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    with urllib.request.urlopen(request, timeout=SCRAPE_TIMEOUT_S) as answer:
        body: Any = answer.read()
    return str(body.decode("utf-8"))
