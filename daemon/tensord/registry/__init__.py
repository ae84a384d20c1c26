"""The model repository on disk and the registry of loaded model versions."""
