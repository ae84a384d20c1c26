"""Other protocols tensord serves: the Open Inference Protocol (KServe v2) in `v2`."""
