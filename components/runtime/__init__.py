"""What a run does around its trainer: the run context and instantiated components, the shared lifecycle
(Session), the pre-load checks, the data preparation mode=plan and training share, run dirs, resume,
checkpoints, trainer callbacks and hooks, and what the inference-only recipes share."""
