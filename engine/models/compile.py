"""model.compile_layers: torch.compile each decoder layer's forward (torchtitan's per-block compile).

Why per layer and not the whole model: every decoder layer runs the same code, so inductor compiles
one graph (forward and backward) that all layers share; the embedding, the loss head and the FSDP
hooks stay eager. What it buys is fusion of the elementwise work between the matmuls (RMSNorm,
rotary embedding, SwiGLU, residual adds, casts), which in eager mode is one kernel each and one
round trip through GPU memory each.

Only the layer's `forward` is replaced, on the instance: the module keeps its class, its parameter
names (state dicts, weight sync and checkpoints see no `_orig_mod.` prefix), and FSDP2's hooks and
gradient checkpointing keep running around it in eager mode. `dynamic=True`: packed micro batches
change length every call, and a graph specialized to each length would recompile every step.
"""

from __future__ import annotations

import torch
from torch import nn


def compile_decoder_layers(layers: list[nn.Module]) -> int:
    """Replace each layer's forward by its compiled version, in place; returns how many were compiled.

    Call before FSDP wraps the layers and after anything that swaps their submodules (Liger, LoRA),
    so the compiled code sees the modules it will run. Compilation happens at the first call.
    """
    for layer in layers:
        if not is_compiled(layer):
            layer.forward = torch.compile(layer.forward, dynamic=True)
    return len(layers)


def is_compiled(layer: nn.Module) -> bool:
    """Whether `layer.forward` is a compiled function (set by compile_decoder_layers)."""
    return hasattr(layer.__dict__.get("forward"), "_torchdynamo_orig_callable")
