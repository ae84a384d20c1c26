"""Text embedding models: sentence-transformers folders, read as the Hub publishes them."""
