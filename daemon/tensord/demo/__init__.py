"""The embedded demo repository and the seeded builders of its models (no downloads)."""
