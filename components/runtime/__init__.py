"""What a run does around its trainer: the run context and instantiated components, the shared
lifecycle (Session), the pre-load checks, run dirs, resume, signals, checkpoints and trainer callbacks."""
