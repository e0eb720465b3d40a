"""What spans processes and that hydratune does itself: FSDP2 fully_shard for loops it owns, and signals
relayed from the launcher to its workers (every rank stops after the same step)."""
