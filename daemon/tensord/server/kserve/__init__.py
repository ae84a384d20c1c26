"""The Open Inference Protocol (KServe v2) gRPC service, a facade over the same data plane."""
