"""The CPU executor: worker threads as lanes, joins into pooled aligned host buffers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack

import numpy as np

from tensord.backends.base import Backend
from tensord.cuda.pools import HostBufferPool, PoolStats
from tensord.executor.lanes import LaneExecutor


def join_into(
    parts: Sequence[Mapping[str, np.ndarray]], take: Callable[[int], np.ndarray]
) -> dict[str, np.ndarray]:
    """One request's inputs as they are; several joined along dimension 0 into buffers
    from `take(nbytes)` (object arrays, which hold Python strings, are joined normally)."""
    if len(parts) == 1:
        return dict(parts[0])
    joined = {}
    for name, first in parts[0].items():
        arrays = [p[name] for p in parts]
        if first.dtype == object:
            joined[name] = np.concatenate(arrays)
            continue
        shape = (sum(a.shape[0] for a in arrays), *first.shape[1:])
        nbytes = int(np.prod(shape, dtype=np.int64)) * first.dtype.itemsize
        out = take(nbytes)[:nbytes].view(first.dtype).reshape(shape)
        np.concatenate(arrays, out=out)
        joined[name] = out
    return joined


class CpuExecutor(LaneExecutor):
    """Lanes sharing one backend (ONNX Runtime sessions are safe to run from many threads)."""

    kind = "cpu"

    def __init__(self, name: str, backend: Backend, lanes: int, reason: str = "") -> None:
        self._backend = backend
        self._host = HostBufferPool()
        super().__init__(name, lanes, reason)

    def _execute(
        self, lane: int, parts: Sequence[Mapping[str, np.ndarray]], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        with ExitStack() as buffers:

            def take(nbytes: int) -> np.ndarray:
                buffer = self._host.acquire(nbytes)
                buffers.callback(self._host.release, buffer)
                return buffer

            return self._backend.run(join_into(parts, take), output_names)

    def _pools(self) -> dict[str, PoolStats]:
        return {"host": self._host.stats()}

    def _idle(self) -> None:
        self._host.trim()

    def terminate_runs(self) -> None:
        """Cut the runs in progress short: their callers get UNAVAILABLE."""
        self._backend.terminate_runs()

    def close(self) -> None:
        """Stop the lanes, drop cached buffers and close the backend.

        Queued runs are cancelled; a run in progress finishes on its thread, holding its own
        reference to the session.
        """
        self._stop_lanes(wait=False)
        self._host.clear()
        self._backend.close()
