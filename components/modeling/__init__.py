"""Where model weights come from: hub availability, GGUF conversion, a finished run dir's model,
and the varlen SDPA attention kernel."""
