"""Generation from a model: length-sorted batched sampling, the exact-match eval of generations, and
what the inference-only recipes share."""
