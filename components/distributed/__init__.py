"""What spans processes and that hydratune does itself: FSDP2 fully_shard for loops it owns, signals
relayed from the launcher to its workers (every rank stops after the same step), the multi-node roll call
and watch, the CPU process group with its collective timeout, and DeepSpeed's hostfile checks."""
