"""Executors run batches on a device: lanes, buffer pools, stats; CPU and CUDA alike."""
