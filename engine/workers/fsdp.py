"""FSDP2 for HF decoder models: `fully_shard` per decoder layer, then on the root (torchtitan style).

Sharding each layer separately lets FSDP all-gather one layer at a time; the root call covers
what is left (embeddings, final norm, lm_head, which tied embeddings share with the input).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF causal LM (llama/qwen/mistral layout: model.model.layers)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers on {type(model).__name__} (expected .model.layers)")
    return list(layers)


def apply_fsdp(model: nn.Module, compute_dtype: torch.dtype, reshard_after_forward: bool, device: torch.device
               ) -> nn.Module:
    """Shard `model` (its parameters may still be on the CPU) over every rank, onto `device`.

    The mesh names the device explicitly: FSDP2's default mesh takes the machine's accelerator,
    which would be wrong for trainer.device=cpu on a GPU machine. fully_shard moves each layer's
    parameters to the mesh's device as it shards them, so the full model is never on the device at once.
    """
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # Parameters stay fp32 (master weights); compute casts to the plan's dtype and gradients
    # are reduced in fp32 so small updates are not lost to bf16 rounding.
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """All-gather every sharded tensor into a plain full tensor (a collective: all ranks call it)."""
    out = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = full.detach()
    return out


def full_tensors(sharded: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for each of `sharded`'s tensors, gathered one at a time (a collective:
    every rank iterates in the same order).

    Each shard is cast to `dtype` before the all-gather, so a bf16 rollout receives half the bytes
    and no rank ever holds an unsharded fp32 copy of the model, only one full tensor at a time.
    A tensor tied to an earlier one (a shared embedding and LM head) is sent once, under the
    first name: backends load tied weights from either name.
    """
    seen: set[int] = set()
    for name, value in sharded.state_dict().items():
        local = value.to_local() if hasattr(value, "to_local") else value
        if local.data_ptr() in seen and local.numel():
            continue  # tied weights (lm_head = embed_tokens): one gather serves both names
        seen.add(local.data_ptr())
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        yield name, full
        del full
