"""The Predict path: signature checks and the runner that queues and runs requests."""
