"""Other protocols' generated modules: the Open Inference Protocol (KServe v2) in `v2`."""
