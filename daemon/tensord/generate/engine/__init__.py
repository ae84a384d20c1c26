"""The engine of one generator model: its thread and async front, the output processor
(detokenizing, stop strings, stream chunks) and the loader that builds it."""
