"""tensord.v1.InferenceService: Predict, Generate, Health and Info."""
