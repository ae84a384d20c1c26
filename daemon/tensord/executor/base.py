"""What every executor offers the batcher and the data plane."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tensord.cuda.pools import PoolStats


@dataclass(slots=True)
class RunResult:
    """Outputs of one run and where its time went (seconds)."""

    outputs: list[np.ndarray]
    queue_s: float
    compute_s: float


@dataclass(slots=True)
class LaneStats:
    """One lane (a worker thread, or a CUDA stream): runs begun, failed, and busy time."""

    runs: int = 0
    failed: int = 0
    busy_s: float = 0.0


@dataclass(slots=True)
class ExecutorStats:
    """A snapshot of an executor."""

    kind: str
    lanes: list[LaneStats]
    queue_depth: int
    running: int
    pools: dict[str, PoolStats] = field(default_factory=dict)

    @property
    def started(self) -> int:
        """Runs that began, across lanes."""
        return sum(lane.runs for lane in self.lanes)


class Executor(Protocol):
    """Runs a model's batches on its lanes; `run` is awaited without blocking the loop."""

    kind: str
    reason: str

    async def run(
        self,
        parts: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        deadline: float | None = None,
    ) -> RunResult:
        """Join `parts` along dimension 0, run once, return the joined outputs."""
        ...

    def run_blocking(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """Run on the caller's thread (warm-up)."""
        ...

    def stats(self) -> ExecutorStats:
        """A snapshot of lanes, queue and pools."""
        ...

    def terminate_runs(self) -> None:
        """Cut the runs in progress short (the drain's grace has run out)."""
        ...

    def close(self) -> None:
        """Stop the lanes and free every buffer."""
        ...
