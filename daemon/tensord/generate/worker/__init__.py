"""The worker: one scheduled step run on the model (the past gathered from the KV pool, the
pass, the new keys and values scattered back) and the sampler."""
