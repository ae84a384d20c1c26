"""Dynamic batching for Predict: compatible requests joined along the batch dimension."""
