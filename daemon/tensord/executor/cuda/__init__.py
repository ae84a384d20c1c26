"""The CUDA executor on cuda-python: streams as lanes, pinned and device buffer pools."""
