"""Serving with several processes: gRPC frontends and one engine, and what joins them."""
