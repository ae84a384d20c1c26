"""Out of memory on a batch: split it in half by rows and retry before failing it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import numpy as np
import structlog

from tensord.errors import OutOfMemoryError
from tensord.executor.base import RunResult

log = structlog.get_logger("tensord.executor")

Parts = Sequence[Mapping[str, np.ndarray]]
Run = Callable[[Parts, Sequence[str], float | None], Awaitable[RunResult]]


def rows_of(parts: Parts) -> int:
    """Rows (first-dimension entries) across the parts."""
    return sum(next(iter(p.values())).shape[0] for p in parts if p)


def split_rows(
    parts: Parts, rows: int
) -> tuple[list[Mapping[str, np.ndarray]], list[Mapping[str, np.ndarray]]]:
    """The first `rows` rows and the rest, splitting one part if the cut falls inside it."""
    left: list[Mapping[str, np.ndarray]] = []
    right: list[Mapping[str, np.ndarray]] = []
    remaining = rows
    for part in parts:
        size = next(iter(part.values())).shape[0]
        if remaining >= size:
            left.append(part)
            remaining -= size
        elif remaining > 0:
            left.append({k: v[:remaining] for k, v in part.items()})
            right.append({k: v[remaining:] for k, v in part.items()})
            remaining = 0
        else:
            right.append(part)
    return left, right


async def run_splitting_on_oom(
    run: Run, parts: Parts, output_names: Sequence[str], deadline: float | None = None
) -> RunResult:
    """`run` the batch; on OutOfMemoryError run each half (recursively) and join the outputs."""
    try:
        return await run(parts, output_names, deadline)
    except OutOfMemoryError:
        rows = rows_of(parts)
        if rows <= 1:
            raise
        log.warning("batch.split_on_oom", rows=rows)
        left, right = split_rows(parts, rows // 2)
        first = await run_splitting_on_oom(run, left, output_names, deadline)
        second = await run_splitting_on_oom(run, right, output_names, deadline)
        outputs = [
            np.concatenate([a, b]) for a, b in zip(first.outputs, second.outputs, strict=True)
        ]
        return RunResult(outputs, first.queue_s, first.compute_s + second.compute_s)
