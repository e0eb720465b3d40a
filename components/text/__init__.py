"""Text before the model: tokenizer set-up, chat templates and the assistant-only mask, label masks,
padding-free batches, and the data preparation that mode=plan and training share."""
