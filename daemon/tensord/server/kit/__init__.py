"""What every protocol's server shares: request intake, the tensor codec core, and the
per-call plumbing (request ids, one error mapping from typed errors, access logs)."""
