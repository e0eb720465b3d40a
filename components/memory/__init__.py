"""The memory estimate before launch: pure arithmetic over the architecture numbers (no torch, no
Hydra), the strategy ladder of strategy=auto, and its rendering."""
