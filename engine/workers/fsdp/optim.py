"""AdamW and the learning-rate schedule of `actor.optim` (linear warmup, then constant or cosine)."""

from __future__ import annotations

import math

import torch
from torch import nn

from rlconf.schema.optim import OptimConfig


def warmup_steps(optim: OptimConfig, total_steps: int) -> int:
    if optim.lr_warmup_steps >= 0:
        return optim.lr_warmup_steps
    return int(optim.lr_warmup_steps_ratio * total_steps)


def lr_factor(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Multiplier on the peak lr after `step` scheduler steps (verl's warmup + constant/cosine)."""
    warmup = warmup_steps(optim, total_steps)
    if step < warmup:
        return (step + 1) / warmup  # the first step already trains: never a zero lr
    if optim.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * optim.num_cycles * progress))
    return optim.min_lr_ratio + (1.0 - optim.min_lr_ratio) * max(0.0, cosine)


def use_fused_adamw(params: list[torch.Tensor]) -> bool:
    """AdamW's fused CUDA kernel when every parameter is on a GPU: one launch per parameter group
    reading each parameter, gradient and moment once, where the default (foreach) implementation
    makes several passes and allocates a temporary per parameter (on an H100, 47 ms of a 1.5B
    model's update; bench/profile_update.py). Parameters on the CPU (offload_policy) keep foreach."""
    return bool(params) and all(param.device.type == "cuda" for param in params)


def build_optimizer(model: nn.Module, optim: OptimConfig, total_steps: int
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    # Frozen parameters (a LoRA model's base) get no Adam states: only what trains is handed over.
    trainable = [param for param in model.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=optim.lr, betas=tuple(optim.betas),
                                  weight_decay=optim.weight_decay, fused=use_fused_adamw(trainable))
    if optim.total_training_steps > 0:
        total_steps = optim.total_training_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, optim, total_steps))
    return optimizer, scheduler
