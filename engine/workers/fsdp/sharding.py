"""FSDP2 for HF decoder models: `fully_shard` per decoder layer, then on the root (torchtitan style).

Sharding each layer separately lets FSDP all-gather one layer at a time; the root call covers
what is left (embeddings, final norm, lm_head, which tied embeddings share with the input).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlconf.schema.model import FSDPConfig


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF causal LM (llama/qwen/mistral layout: model.model.layers)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers on {type(model).__name__} (expected .model.layers)")
    return list(layers)


def apply_fsdp(model: nn.Module, compute_dtype: torch.dtype, reshard_after_forward: bool, device: torch.device,
               offload_policy: bool = False, forward_prefetch: bool = False, min_num_params: int = 0,
               fsdp_size: int = -1) -> nn.Module:
    """Shard `model` (its parameters may still be on the CPU) over every rank, onto `device`.

    The mesh names the device explicitly: FSDP2's default mesh takes the machine's accelerator,
    which would be wrong for trainer.device=cpu on a GPU machine. fully_shard moves each layer's
    parameters to the mesh's device as it shards them, so the full model is never on the device at once.
    `offload_policy` (fsdp_config.offload_policy): the shards, their gradients and the optimizer step
    stay on the CPU instead (CPUOffloadPolicy; pinned memory on CUDA, which a CPU-only torch cannot pin).
    `forward_prefetch` (fsdp_config.forward_prefetch): see set_forward_prefetch.
    `min_num_params` (fsdp_config.wrap_policy.min_num_params): more modules get their own
    fully_shard, see modules_to_shard.
    `fsdp_size` (fsdp_config.fsdp_size): shard over groups of that many ranks, see mesh_shape.
    """
    shape = mesh_shape(dist.get_world_size(), fsdp_size)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard")[-len(shape):])
    # Parameters stay fp32 (master weights); compute casts to the plan's dtype and gradients
    # are reduced in fp32 so small updates are not lost to bf16 rounding.
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload_policy else OffloadPolicy()
    layers = decoder_layers(model)
    for module in modules_to_shard(model, layers, min_num_params):
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward,
                    offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward, offload_policy=offload)
    if forward_prefetch:
        set_forward_prefetch(layers)
    return model


def shard_frozen(model: nn.Module, compute_dtype: torch.dtype, fsdp: Any, device: torch.device) -> nn.Module:
    """A model that never trains (the reference, the reward model), sharded with its `fsdp_config` in eval mode.

    Frozen, so no fp32 master copy: FSDP casts each gathered layer to the compute dtype anyway, so
    shards kept in it give the same outputs in half the memory (the estimate's 2 B per parameter in bf16).
    """
    for param in model.parameters():
        param.data = param.data.to(compute_dtype)
    return apply_fsdp(model, compute_dtype, fsdp.reshard_after_forward, device, forward_prefetch=fsdp.forward_prefetch,
                      min_num_params=fsdp.wrap_policy.min_num_params).eval()


def apply_fsdp_plan(model: nn.Module, compute_dtype: torch.dtype, fsdp: FSDPConfig, device: torch.device) -> nn.Module:
    """apply_fsdp with every knob of a trained model's `fsdp_config` (the actor's, the critic's)."""
    return apply_fsdp(model, compute_dtype, fsdp.reshard_after_forward, device, fsdp.offload_policy,
                      forward_prefetch=fsdp.forward_prefetch, min_num_params=fsdp.wrap_policy.min_num_params,
                      fsdp_size=fsdp.fsdp_size)


def mesh_shape(world_size: int, fsdp_size: int) -> tuple[int, ...]:
    """The device mesh FSDP2 shards over: (world_size,) or, hybrid, (replicas, fsdp_size).

    fsdp_size -1 (or at least the world): every rank holds 1/world of each parameter. A smaller
    fsdp_size (verl's HSDP): consecutive groups of fsdp_size ranks each hold a whole copy, sharded
    among them, and gradients are reduced within the group then averaged across the copies. The
    gradient is the same mean over all ranks; each rank holds 1/fsdp_size of the model's states,
    and the all-gathers stay within a group (one node, when fsdp_size is the GPUs per node).
    """
    if fsdp_size <= 0 or fsdp_size >= world_size:
        return (world_size,)
    if world_size % fsdp_size:
        raise ValueError(f"fsdp_size {fsdp_size} does not divide the {world_size} ranks of the worker group "
                         "(hybrid sharding needs whole replicas); use -1 or a divisor")
    return (world_size // fsdp_size, fsdp_size)


def modules_to_shard(model: nn.Module, layers: list[nn.Module], min_num_params: int) -> list[nn.Module]:
    """The modules below the root that get their own fully_shard, children before their parents.

    Always each decoder layer. With min_num_params > 0 (verl's size-based wrap policy) also, bottom
    up, every module whose parameters not already in a wrapped module below it number at least
    min_num_params; a wrapped module's parameters no longer count for its parents. Never wrapped on
    their own: the root (sharded last by the caller), containers without a forward (ModuleList,
    ModuleDict), and a module holding a parameter that is also reachable outside it (tied embedding
    and LM head), which is left to the enclosing module so that one FSDP group owns it. Each FSDP
    group is one all-gather; smaller groups hold less unsharded weight at a time, more of them cost
    more collectives. The numbers are the same either way.
    """
    always = {id(layer) for layer in layers}
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)
    counted: set[int] = set()
    chosen: list[nn.Module] = []

    def self_contained(module: nn.Module, prefix: str) -> bool:
        return all(name.startswith(prefix) for param in module.parameters() for name in owners[id(param)])

    def unwrapped(module: nn.Module, prefix: str) -> int:
        """Parameters of `module` not yet in a wrapped module (each counted once); wraps it if due."""
        count = 0
        for param in module.parameters(recurse=False):
            if id(param) not in counted:
                counted.add(id(param))
                count += param.numel()
        for name, child in module.named_children():
            count += unwrapped(child, f"{prefix}{name}.")
        if module is model or isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            return count
        if id(module) in always or (0 < min_num_params <= count and self_contained(module, prefix)):
            chosen.append(module)
            return 0
        return count

    unwrapped(model, "")
    return chosen


def set_forward_prefetch(layers: list[nn.Module]) -> None:
    """Each sharded decoder layer starts the next layer's all-gather when its own forward begins.

    FSDP2 otherwise issues a layer's all-gather only when that layer's forward starts (after the
    CPU has launched the previous layer's kernels); explicit prefetch overlaps it with the previous
    layer's compute, at the cost of one more layer's full parameters held at a time. The numbers
    are the same: only when the gather is issued changes.
    """
    for layer, following in zip(layers, layers[1:]):
        layer.set_modules_to_forward_prefetch([following])


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """All-gather every sharded tensor into a plain full tensor (a collective: all ranks call it)."""
    out = {}
    for name, value in model.state_dict().items():
        value = _on_mesh_device(value)  # a CPU-offloaded shard gathers on its mesh's device
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = full.detach()
    return out


def _on_mesh_device(value: torch.Tensor) -> torch.Tensor:
    """A DTensor whose shard waits on the CPU, moved to its mesh's device (NCCL reduces no CPU tensor).

    The shard moves as a local tensor, placements kept: `DTensor.to(device)` may first redistribute a
    partial value, a collective that would still run on the CPU.
    """
    if isinstance(value, DTensor) and value.device.type != value.device_mesh.device_type:
        local = value.to_local().to(value.device_mesh.device_type)
        return DTensor.from_local(local, value.device_mesh, value.placements, shape=value.shape, stride=value.stride())
    return value


def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for FSDP2 gradients, CPU-offloaded ones (offload_policy) included.

    The same arithmetic: each gradient's norm where it lies, the norm of those norms, then the
    gradients scaled by min(1, max_norm / (norm + 1e-6)). Only the reduction over the ranks runs on
    the mesh's device, on the small stack of per-gradient norms (still partial over the ranks until
    then). Returns the global norm, a plain tensor.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    norms = _on_mesh_device(torch.stack(torch._foreach_norm([p.grad for p in params], 2.0)))
    total = torch.linalg.vector_norm(norms, 2.0)  # over the ranks too: an all-reduce for a DTensor
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
