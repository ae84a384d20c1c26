"""Backends run a model: ONNX Runtime with per-provider selection (CPU always last)."""
