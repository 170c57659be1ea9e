"""FSDP2 mechanics: sharding, offload, full weights for the rollout, sharded checkpoints, optimizer, memory."""
