"""model.use_liger: liger-kernel's Triton RMSNorm, SwiGLU MLP and RoPE patched into the HF model
instance before FSDP wraps it (actor and reference), as verl does.

Not liger's fused linear cross-entropy: that returns a loss, and the engine needs per-token
log-probs (model.use_fused_kernels covers the head). Liger's kernels are Triton: CUDA only; the
capability check (`liger_problems`) stops a launch before any model loads when they cannot run.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the launch checks liger_problems before it imports torch
    from torch import nn

from engine.problems import MachineShortfall

INSTALL_HINT = "`pip install 'rlconf[liger]'` (or `pip install liger-kernel`)"


def liger_importable() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def liger_problems(use_liger: bool, device: str, liger_found: Any = None) -> list[str]:
    """Why model.use_liger cannot run here (empty: it can). `liger_found`: for tests."""
    if not use_liger:
        return []
    if device != "cuda":
        return [f"actor_rollout_ref.model.use_liger=true needs CUDA (liger-kernel's kernels are Triton), and "
                f"trainer.device={device}; set use_liger to false on this device"]
    if not (liger_found or liger_importable)():
        return [MachineShortfall(f"actor_rollout_ref.model.use_liger=true, but liger-kernel is not installed in this "
                                 f"Python; install it with {INSTALL_HINT}, or set use_liger to false")]
    return []


def liger_module_count(model: nn.Module) -> int:
    """Modules running a liger kernel (liger renames the patched instances `Liger...`)."""
    return sum(module._get_name().startswith("Liger") for module in model.modules())


def apply_liger(model: nn.Module) -> int:
    """Patch `model` in place (RMSNorm, SwiGLU, RoPE; no fused cross-entropy); returns the count of
    patched modules, 0 when liger has no kernels for this model type.

    Liger also replaces the modeling module's RMSNorm and MLP classes, which would give every model
    built later in this process (a colocated critic, a bench's next variant) its kernels unasked: those
    classes are put back, and `model`'s own modules stay patched. Its RoPE function stays replaced
    module-wide: the patched model's attention looks it up there at every call.
    """
    import sys

    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    modeling = sys.modules[type(model).__module__]
    classes = {name: value for name, value in vars(modeling).items() if isinstance(value, type)}
    try:
        _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                        fused_linear_cross_entropy=False)
    finally:
        for name, value in classes.items():
            setattr(modeling, name, value)
    return liger_module_count(model)
