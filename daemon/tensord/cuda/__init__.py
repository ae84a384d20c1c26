"""CUDA foundations: checked runtime calls, the sticky-error table, size-class buffer pools.

Backends, kernels, processing and the executor build on these; nothing here imports any
of them. `runtime` and `memory` import cuda-python; `device_fault` and `pools` do not, so
CPU hosts import them freely.
"""
