"""FSDP2 for HF decoder models: `fully_shard` per decoder layer, then on the root (torchtitan style).

Sharding each layer separately lets FSDP all-gather one layer at a time; the root call covers
what is left (embeddings, final norm, lm_head, which tied embeddings share with the input).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF causal LM (llama/qwen/mistral layout: model.model.layers)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers on {type(model).__name__} (expected .model.layers)")
    return list(layers)


def apply_fsdp(model: nn.Module, compute_dtype: torch.dtype, reshard_after_forward: bool = True) -> nn.Module:
    # Parameters stay fp32 (master weights); compute casts to the plan's dtype and gradients
    # are reduced in fp32 so small updates are not lost to bf16 rounding.
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """All-gather every sharded tensor into a plain full tensor (a collective: all ranks call it)."""
    out = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = full.detach()
    return out
