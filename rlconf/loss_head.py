"""Which kernels compute the actor's loss head (the log-prob and entropy math over the vocabulary).

One answer for the memory estimate (rlconf.estimate), the compiler's rules, the launch's checks
(engine.capabilities) and the engine's passes (engine/workers/roles/actor_rollout_ref.py), so that what is
estimated is what runs.

- "triton": rlconf's Triton kernels (engine/workers/sequence/triton_head.py): one pass over the logits each
  way, nothing fp32 vocab-wide kept. Asked for by `model.fused_kernel_options.impl_backend: triton`, and what
  `actor.use_torch_compile` (verl's default: true) gets on CUDA. verl compiles the same math with
  torch.compile; rlconf's kernels were measured faster than the compiled head (1.10× the update of a 1.5B
  actor, 4 B per token × vocab at the head's peak against 8-12 B, docs/benchmarks.md) and have nothing to
  compile, where torch.compile took 44 s of the first step, or 62-88 s in a background thread that slowed
  every step it overlapped (the actor's process runs the training loop and the vLLM engine: one GIL).
- "torch": eager PyTorch (engine/workers/passes/logprob.py), on every device; the plan's chunking knobs
  (entropy_from_logits_with_chunking, entropy_checkpointing) apply to it alone.

`model.use_fused_kernels` picks the fused head (logits never built), whose chunks run on either answer.
"""

from __future__ import annotations

from typing import Literal

LossHeadKernels = Literal["triton", "torch"]


def loss_head_kernels(impl_backend: str, use_torch_compile: bool, use_fused_kernels: bool,
                      device: str) -> LossHeadKernels:
    """The loss head's kernels for a plan's actor_rollout_ref.model / actor knobs and trainer.device.

    use_torch_compile leaves the fused head as it is (verl compiles no part of it either)."""
    if impl_backend == "triton":
        return "triton"
    if use_torch_compile and device == "cuda" and not use_fused_kernels:
        return "triton"
    return "torch"


def plan_loss_head_kernels(plan) -> LossHeadKernels:
    """`loss_head_kernels` of a validated plan (rlconf.schema's root model)."""
    arr = plan.actor_rollout_ref
    return loss_head_kernels(arr.model.fused_kernel_options.impl_backend, arr.actor.use_torch_compile,
                             arr.model.use_fused_kernels, plan.trainer.device)
