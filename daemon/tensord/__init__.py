"""tensord: a gRPC inference daemon for GPU hosts."""

__version__ = "0.1.0"
