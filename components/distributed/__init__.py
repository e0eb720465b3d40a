"""Sharding code hydratune calls itself (FSDP2 fully_shard for loops it owns)."""
