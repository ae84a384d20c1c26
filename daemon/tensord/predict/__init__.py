"""The Predict path: signature checks before a request is queued."""
