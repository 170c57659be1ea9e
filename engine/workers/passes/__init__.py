"""What a role runs over its shard of a batch: the PPO update loop, log-prob forwards, micro batches."""
