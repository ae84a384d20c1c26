"""The engine core: requests, the scheduler (continuous batching, token budget, preemption)
and the KV cache manager over the block pool. Pure bookkeeping, no model and no threads."""
