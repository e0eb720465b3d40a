"""Generation from a model: length-sorted batched sampling and the exact-match eval of generations."""
