"""An embedding folder's model on the predict executor: the backend with pooling after it,
the warm-up that learns the vector's length, and the feeds of one text's tokens."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import numpy as np

from tensord.backends.base import Backend, TensorSpec
from tensord.batching.batcher import DynamicBatcher
from tensord.embedding.folder import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    EmbeddingSpec,
)
from tensord.errors import DeviceLostError, ModelLoadError
from tensord.executor.base import Executor, RunResult
from tensord.processing.host import HostProcessedBackend
from tensord.processing.plan import PoolPlan, plan_pooling

POOLED = "embedding"
"""The pooled output's name on the executor (and Predict's)."""


def embedding_backend(backend: Backend, spec: EmbeddingSpec) -> Backend:
    """`backend` with the folder's pooling and normalisation after it (NumPy, on the run's
    lane): its one output is float32 [N, dimensions]."""
    try:
        pool = PoolPlan(
            spec.output,
            spec.pooling,
            spec.normalize and not spec.graph_pools,
            ATTENTION_MASK,
            POOLED,
        )
        plan = plan_pooling(backend.inputs, backend.outputs, pool)
        provider = backend.placement.provider
        reason = f"the model runs on {provider}; pooling on the host (NumPy)"
        return HostProcessedBackend(backend, plan, reason)
    except BaseException:
        backend.close()
        raise


def token_feeds(
    spec: EmbeddingSpec, inputs: Sequence[TensorSpec], ids: np.ndarray
) -> dict[str, np.ndarray]:
    """The model's inputs for one text's token ids: [1, len] each."""
    n = len(ids)
    feeds = {}
    for each in inputs:
        dtype = each.dtype.numpy
        if each.name == INPUT_IDS:
            feeds[each.name] = ids.astype(dtype, copy=False).reshape(1, n)
        elif each.name == ATTENTION_MASK:
            feeds[each.name] = np.ones((1, n), dtype)
        elif each.name == POSITION_IDS:
            feeds[each.name] = np.arange(n, dtype=dtype).reshape(1, n)
        else:  # token_type_ids: one segment
            feeds[each.name] = np.zeros((1, n), dtype)
    return feeds


def warm_up_embedding(
    executor: Executor, spec: EmbeddingSpec, inputs: Sequence[TensorSpec]
) -> EmbeddingSpec:
    """Run two short texts padded together (so the first request pays no lazy set-up, and
    padding is known to work); the spec with the vector's length the run shows."""
    one = token_feeds(spec, inputs, np.array([spec.pad_token_id], dtype=np.int64))
    two = token_feeds(spec, inputs, np.array([spec.pad_token_id] * 2, dtype=np.int64))
    feeds = {}
    for name, a in two.items():
        short = np.zeros_like(a)
        short[:, :1] = one[name]
        if name == INPUT_IDS:
            short[:, 1:] = spec.pad_token_id
        feeds[name] = np.concatenate([a, short])
    try:
        (vectors,) = executor.run_blocking(feeds, [POOLED])
    except DeviceLostError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"{spec.model_path}: a warm-up run on two short texts failed: {exc}"
        ) from None
    if vectors.ndim != 2 or vectors.shape[0] != 2 or vectors.shape[1] < 1:
        raise ModelLoadError(
            f"{spec.model_path}: the pooled output of two texts has shape {list(vectors.shape)}, "
            "not [2, dimensions]"
        )
    dims = int(vectors.shape[1])
    if spec.dimensions and spec.dimensions != dims:
        raise ModelLoadError(
            f"{spec.model_path}: vectors have {dims} values, where the graph declares "
            f"{spec.dimensions}"
        )
    return dataclasses.replace(spec, dimensions=dims)


async def embed_each(
    batcher: DynamicBatcher,
    spec: EmbeddingSpec,
    inputs: Sequence[TensorSpec],
    token_ids: np.ndarray,
    lengths: np.ndarray,
    deadline: float | None,
) -> list[RunResult]:
    """Each text's ids as one request of the batcher, which packs texts by length into
    runs; each text's vector (a [1, dimensions] output), in order."""
    batcher.check_room(len(lengths))  # all of the call's texts queue, or none
    ends = np.cumsum(lengths)
    starts = ends - lengths
    runs = [
        asyncio.ensure_future(
            batcher.submit(token_feeds(spec, inputs, token_ids[a:b]), [POOLED], deadline)
        )
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    ]
    try:
        return list(await asyncio.gather(*runs))
    finally:  # one text refused (its queue full, say): the others leave the queue too
        for run in runs:
            run.cancel()
