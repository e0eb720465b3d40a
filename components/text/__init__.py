"""Text before the model: tokenizer set-up, chat templates and the assistant-only mask, label masks and
padding-free batches."""
