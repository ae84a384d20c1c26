"""A decoder as exported: its directory and Hugging Face files, its graph's inputs and KV
layout, the batch layout it is served with, and the checks run on it before it serves."""
