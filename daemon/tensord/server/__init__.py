"""The gRPC server: a thin servicer, converters, health, reflection and lifecycle."""
