"""Pre- and post-processing around a model: raw uint8 images in, top-k classes or boxes out.

`config` holds the model.toml sections, `plan` derives the served signature, `host` runs
the NumPy twins (CPU executor) and `device` the CUDA kernels on a lane's stream.
"""
