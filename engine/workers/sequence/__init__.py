"""A micro batch's tokens on the device: packed rows, Ulysses shards, attention and loss-head kernels."""
