"""Worker processes: one per GPU (per CPU slot on CPU), forming one torch.distributed group."""
