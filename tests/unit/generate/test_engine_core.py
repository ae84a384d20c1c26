"""The engine core driven as the engine loop drives it, over a pool that stores token ids.

The stand-in model keeps, per block slot, the token id written there (where a real model
writes keys and values) and computes its next-token logits from the sequence it gathers
back through the block table. A wrong block table, a shared block overwritten, or an
evicted prefix still in use would change what it reads and so the tokens it produces;
the test compares every request with the same request run alone.
"""

from __future__ import annotations

import random

import numpy as np

from tensord.generate.core.kv_cache_manager import KVCacheManager
from tensord.generate.core.request import Request, RequestStatus
from tensord.generate.core.scheduler import Scheduler, SchedulerConfig
from tensord.generate.core.scheduler_output import SchedulerOutput
from tensord.generate.worker.sampler import Sampler
from tests.unit.generate.helpers import make_request

VOCAB = 50
BLOCK = 4
EOS = 0


def next_logits(sequence: list[int]) -> np.ndarray:
    """A deterministic function of the whole sequence, spread over the vocabulary."""
    weights = np.arange(1, len(sequence) + 1)
    favourite = int((np.asarray(sequence) * weights).sum() * 7919 + len(sequence)) % (VOCAB - 1)
    logits = np.sin(np.arange(VOCAB) * (favourite + 1)).astype(np.float32)
    logits[favourite + 1] += 4.0  # never EOS: requests end on max_tokens
    return logits


class TokenPool:
    """The stand-in model: scatter the step's tokens, gather each sequence, score it."""

    def __init__(self, num_blocks: int) -> None:
        self.slots = np.full((num_blocks, BLOCK), -1, np.int64)

    def execute(self, output: SchedulerOutput) -> np.ndarray:
        rows = []
        for item in output.scheduled:
            assert item.num_tokens >= 1  # a step without new tokens yields no logits
            table = item.block_ids
            for t, token in enumerate(item.token_ids):
                p = item.start_pos + t
                self.slots[table[p // BLOCK], p % BLOCK] = token
            gathered = [int(self.slots[table[p // BLOCK], p % BLOCK]) for p in range(item.seq_len)]
            assert gathered == item.request.all_token_ids[: item.seq_len]
            if item.sample:
                rows.append(next_logits(gathered))
        return np.stack(rows) if rows else np.zeros((0, VOCAB), np.float32)


def run_engine(
    requests: list[Request], num_blocks: int, budget: int, seqs: int, arrivals: dict[str, int]
) -> tuple[dict[str, list[int]], Scheduler, int]:
    config = SchedulerConfig(max_model_len=64, max_num_seqs=seqs, max_num_batched_tokens=budget)
    scheduler = Scheduler(config, KVCacheManager(num_blocks, BLOCK))
    pool, sampler = TokenPool(num_blocks), Sampler()
    results: dict[str, list[int]] = {}
    preemptions, step = 0, 0
    pending = sorted(requests, key=lambda r: arrivals[r.request_id])
    while pending or scheduler.has_unfinished_requests():
        while pending and arrivals[pending[0].request_id] <= step:
            scheduler.add_request(pending.pop(0))
        output = scheduler.schedule(float(step))
        preemptions += len(output.preempted_req_ids)
        logits = pool.execute(output)
        sampling = [item.request for item in output.scheduled if item.sample]
        tokens = sampler.sample(logits, sampling).token_ids if sampling else []
        sampled = {r.request_id: int(t) for r, t in zip(sampling, tokens, strict=True)}
        for done in scheduler.update_from_output(output, sampled):
            if done.finished:
                request = next(r for r in requests if r.request_id == done.request_id)
                results[done.request_id] = list(request.output_token_ids)
        step += 1
    return results, scheduler, preemptions


def build(seed: int) -> tuple[list[Request], dict[str, int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, VOCAB) for _ in range(9)]  # a shared prefix: 2 full blocks
    requests, arrivals = [], {}
    for i in range(16):
        own = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 14))]
        prompt = (system + own) if i % 2 else own
        sampling = {"temperature": 0.8, "top_k": 10, "seed": i} if i % 3 == 0 else {}
        requests.append(
            make_request(f"r{i}", prompt, max_tokens=rng.randrange(3, 20), **sampling)  # type: ignore[arg-type]
        )
        arrivals[f"r{i}"] = rng.randrange(0, 12)
    return requests, arrivals


def test_batched_paged_generation_matches_each_request_alone() -> None:
    requests, arrivals = build(1)
    batched, scheduler, preemptions = run_engine(
        requests, num_blocks=14, budget=12, seqs=6, arrivals=arrivals
    )
    alone = {}
    for request in build(1)[0]:
        out, _, _ = run_engine(
            [request], num_blocks=14, budget=64, seqs=1, arrivals={request.request_id: 0}
        )
        alone.update(out)
    assert batched == alone
    assert len(batched) == 16
    for request in requests:
        assert len(batched[request.request_id]) == request.sampling_params.max_tokens
    assert preemptions > 0  # the small pool forced recomputation
    stats = scheduler.stats().kv_cache
    assert stats.prefix_hits > 0  # the shared prefix was reused
    assert (stats.used_blocks, stats.free_blocks) == (0, 14)
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    assert len({tuple(t) for t in batched.values()}) == 16  # outputs differ across prompts
