"""Translation: beam search, sampling and the generator that drives the model."""
