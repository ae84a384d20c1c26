"""The `model.toml` schema: a model's settings, its generator and processing sections, and
the names of execution providers. Pure configuration: validated values, no loading."""
