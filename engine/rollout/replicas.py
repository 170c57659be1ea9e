"""Rollout replicas: which ranks generate which prompts.

A replica is one tensor-parallel group of the actor's ranks (consecutive ranks, vLLM's layout);
with tensor_model_parallel_size 1 every rank is a replica of its own.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.batch import TensorBatch, concat, select, split_even


def generate_on_replicas(group: Any, method: str, prompts: TensorBatch, replicas: int, tensor_parallel_size: int,
                         order: torch.Tensor | None = None) -> TensorBatch:
    """Run `method` with each replica's share of the prompts; rows come back in the prompts' order.

    Replica k is the tensor-parallel group of ranks k·tp .. k·tp + tp - 1 (vLLM's layout): each of
    them gets the same share and samples the same tokens, and the first one's rows are kept.
    """
    if order is not None:
        prompts = select(prompts, order)
    shares = split_even(prompts, replicas)
    per_rank = [shares[rank // tensor_parallel_size] for rank in range(replicas * tensor_parallel_size)]
    out = concat(group.call_sharded(method, per_rank)[::tensor_parallel_size])
    return out if order is None else select(out, torch.argsort(order))
