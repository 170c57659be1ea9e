"""The PPO update loop the actor and the critic share: epochs -> mini batches -> micro batches.

One optimizer step per mini batch, as the resolved plan says: `ppo_mini_batch_size_per_gpu` rows on
each rank, cut into micro batches whose gradients accumulate: `ppo_micro_batch_size_per_gpu` rows
each, or with use_dynamic_bsz as many rows as `ppo_max_token_len_per_gpu` holds
(engine.workers.passes.micro_batches; every rank then runs the same number of them).

The loss of an optimizer step is the plan's `loss_agg_mode` over the *global* mini batch (every
rank's rows): each micro batch backpropagates its share of it (engine.algos.losses.BatchCounts), so
the gradient does not depend on the performance knobs (micro batch size, number of GPUs). The
mini batch's counts are summed over the data-parallel ranks before its first micro batch, and each
share is multiplied by the world size because FSDP averages the gradients over all ranks.

With Ulysses (engine.workers.sequence.ulysses) the sp ranks of a dp group hold the same rows and the same
loss, each backpropagating its sequence slice's part: the counts take each row once per group, the
gradient scale stays the world size (dp × sp), and the reported loss terms are scaled by dp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from engine.algos.losses import BatchCounts
from engine.batch import TensorBatch, batch_size, chunk
from engine.rank_timeline import TIMELINE
from engine.workers.fsdp.sharding import clip_grad_norm_
from engine.workers.passes.micro_batches import micro_batches, plan_micro_batches
from engine.workers.sequence.packing import pack_ahead
from engine.workers.sequence.ulysses import sequence_parallel_size


@dataclass(frozen=True)
class MicroResult:
    """What one micro batch's step gives back.

    loss: this micro batch's share of the mini batch's loss (what is backpropagated, before dp scaling).
    loss_terms: named parts of `loss` (also shares), summed over the mini batch in the metrics.
    diagnostics: per-micro-batch means (clip fraction, approx KL, ...), averaged over micro batches.
    Both may hold detached device tensors: ppo_update sums them where they are and reads them back
    once at the end, so no micro batch waits for the GPU to finish its forward before its backward
    is queued (float() on a CUDA tensor is a sync).
    """

    loss: torch.Tensor
    loss_terms: dict[str, float | torch.Tensor]
    diagnostics: dict[str, float | torch.Tensor]


MicroStep = Callable[[TensorBatch, BatchCounts], MicroResult]


def global_counts(response_mask: torch.Tensor, sp_size: int = 1) -> BatchCounts:
    """The counts of the global mini batch this rank's `response_mask` rows belong to (a collective).

    `sp_size`: consecutive ranks holding the same rows (Ulysses), counted once.
    """
    counts = BatchCounts.of(response_mask.cpu())
    if dist.is_initialized() and dist.get_world_size() > 1:
        # float64 on CPU: gloo reduces it everywhere; NCCL needs the tensor on the device.
        device = response_mask.device if dist.get_backend() == "nccl" else torch.device("cpu")
        counts = counts.to(device)
        dist.all_reduce(counts)
    # Whole numbers in float64: the division by sp is exact.
    return BatchCounts.from_tensor(counts.cpu() / sp_size, width=float(response_mask.shape[-1]))


def ppo_update(model: nn.Module, optimizer: torch.optim.Optimizer, batch: TensorBatch, *, epochs: int,
               mini_batch_size: int, micro_batch_size: int | None, token_budget: int, grad_clip: float,
               shuffle: bool, generator: torch.Generator, micro_step: MicroStep, prefix: str,
               packed: bool = False,
               optimizer_step: Callable[[], AbstractContextManager] = nullcontext,
               keep_gathered: bool = False, no_grad_sync: bool = False) -> dict[str, float]:
    """Run the update; return `<prefix>/...` metrics (loss terms, diagnostics, grad norm, executed sizes).

    `packed` (use_remove_padding): token budgets count real tokens, not padded ones.
    `keep_gathered`, `no_grad_sync`: what FSDP2 does between the micro batches of one optimizer step
    (`between_micro_batches`).
    `optimizer_step`: a context around each `optimizer.step()` (optimizer_offload brings the
    moments to the device inside it: engine.workers.fsdp.offload).
    A non-finite gradient norm skips that optimizer step and ends the update on every rank (the norm
    is global, so all ranks see it); the controller then stops the run on the reported norm. With a
    fused Adam the step skips itself on the device (`skips_nonfinite_step`) and the update ends at
    the next mini batch.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    sp_size = sequence_parallel_size(model)
    dp_size = world_size // sp_size
    loss_sums: dict[str, float | torch.Tensor] = {}
    diagnostic_sums: dict[str, float | torch.Tensor] = {}
    micro_sizes: set[int] = set()
    micro_sizes_all: list[int] = []
    accum_counts: list[int] = []
    grad_norms: list[float | torch.Tensor] = []
    model.train()
    for epoch in range(epochs):
        if grad_norms and not is_finite(grad_norms):
            break
        data = batch
        if shuffle and epoch > 0:
            order = torch.randperm(batch_size(batch), generator=generator)
            data = {name: tensor[order.to(tensor.device)] for name, tensor in batch.items()}
        for mini in chunk(data, mini_batch_size):
            if grad_norms and not is_finite(grad_norms):
                break  # the step before was skipped on the device (skips_nonfinite_step)
            # Fixed-size slices, or token-budget groups (micro_batch_size None: use_dynamic_bsz).
            micros = micro_batches(mini, plan_micro_batches(mini, micro_batch_size, token_budget, packed))
            if packed:
                pack_ahead(micros)  # the packing's read-backs now, none between the micro batches
            accum_counts.append(len(micros))
            # Spans (engine.rank_timeline) add no sync: `counts` and the clip read values back (with
            # several ranks they also wait for the peers there), the micro batches' span is mostly the
            # CPU queueing forwards and backwards ahead of the GPU.
            with TIMELINE.span("counts"):
                counts = global_counts(mini["response_mask"], sp_size)
            optimizer.zero_grad(set_to_none=True)
            with TIMELINE.span("micro_batches", count=len(micros)):
                for index, micro in enumerate(micros):
                    between_micro_batches(model, index == len(micros) - 1, keep_gathered, no_grad_sync)
                    micro_sizes.add(batch_size(micro))
                    micro_sizes_all.append(batch_size(micro))
                    result = micro_step(micro, counts)
                    (result.loss * world_size).backward()  # FSDP averages over every rank
                    # x dp_size: the dp groups' shares of one mini batch, averaged back by the controller, sum to its loss.
                    for key, value in result.loss_terms.items():
                        loss_sums[key] = loss_sums.get(key, 0.0) + value * dp_size
                    for key, value in result.diagnostics.items():
                        diagnostic_sums[key] = diagnostic_sums.get(key, 0.0) + value
            with TIMELINE.span("clip_grad_norm"):
                norm = clip_grad_norm_(model, grad_clip)
            if skips_nonfinite_step(optimizer):
                # No read-back here: the kernel skips the step itself where the norm is not finite,
                # and the next mini batch (or the metrics) reads the norm once the GPU got there.
                grad_norms.append(norm)
                optimizer.found_inf = (~torch.isfinite(norm)).to(torch.float32)
            else:
                grad_norms.append(float(norm))
                if not math.isfinite(grad_norms[-1]):
                    optimizer.zero_grad(set_to_none=True)
                    break
            with TIMELINE.span("optimizer_step"), optimizer_step():
                optimizer.step()
            optimizer.__dict__.pop("found_inf", None)
    # Free the gradients: they would otherwise sit on the device through weight sync and the next rollout.
    optimizer.zero_grad(set_to_none=True)
    # Back to eval, the mode every other pass runs in (models are built in it). Compiled decoder layers guard on the
    # mode, so a log-prob pass in the mode an update left compiled its graphs again at step 2 (1-2 s at 1.5B-7B on
    # H200s, 2026-11-28). It is also the numbers: before, π_old passes from step 2 on ran with any dropout live (a
    # saved adapter's lora_dropout, a config's attention_dropout) while step 1's did not; now none does.
    model.eval()
    optimizer_steps, micro_count = max(1, len(accum_counts)), max(1, sum(accum_counts))
    # Every device value read back in one transfer: one sync per update.
    with TIMELINE.span("read_back"):
        floats = as_floats({**{f"sum/{key}": value for key, value in loss_sums.items()},
                            **{f"diag/{key}": value for key, value in diagnostic_sums.items()},
                            **{f"norm/{index}": value for index, value in enumerate(grad_norms)}})
    metrics = {f"{prefix}/{key}": floats[f"sum/{key}"] / optimizer_steps for key in loss_sums}
    metrics.update({f"{prefix}/{key}": floats[f"diag/{key}"] / micro_count for key in diagnostic_sums})
    metrics.update({
        f"{prefix}/grad_norm": sum(floats[f"norm/{index}"] for index in range(len(grad_norms))) / len(grad_norms),
        f"{prefix}/optimizer_steps": float(len(accum_counts)),
    })
    if micro_batch_size is None:  # token budgets: sizes vary by design, so report their means
        metrics[f"{prefix}/micro_batch_size"] = float(sum(micro_sizes_all)) / micro_count
        metrics[f"{prefix}/grad_accum_steps"] = float(micro_count) / optimizer_steps
    else:  # sizes must agree with the plan on every micro and mini batch: a disagreement shows as -1
        metrics[f"{prefix}/micro_batch_size"] = float(max(micro_sizes)) if len(micro_sizes) == 1 else -1.0
        metrics[f"{prefix}/grad_accum_steps"] = float(accum_counts[0]) if len(set(accum_counts)) == 1 else -1.0
    return metrics


def skips_nonfinite_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` skips itself on the device where `optimizer.found_inf` is 1.

    torch's fused Adam/AdamW kernels take a found_inf flag (GradScaler's) and leave the weights, moments
    and step counts as they were when it is set. With them the gradient norm need not be read back
    before the step: a read-back (a sync) there leaves the GPU idle while the CPU then queues the
    step (~6 ms of a 1.5B model's update on an H100, bench/profile_update.py).
    """
    groups = optimizer.param_groups
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and all(g.get("fused") for g in groups)


def is_finite(grad_norms: list[float | torch.Tensor]) -> bool:
    """Whether the last optimizer step's gradient norm is finite (a read-back if it is a device tensor)."""
    return math.isfinite(float(grad_norms[-1]))


def between_micro_batches(model: nn.Module, last: bool, keep_gathered: bool, no_grad_sync: bool) -> None:
    """Set FSDP2's behaviour for the coming micro batch's backward; `last`: the optimizer step follows it.

    `keep_gathered` (fsdp_config.reshard_after_forward=false): the gathered compute-dtype weights,
    already kept from each forward to its backward, stay until the optimizer step, so the next micro
    batch's forward gathers (and casts) nothing. They are the weights of this step throughout.
    `no_grad_sync` (fsdp_config.use_no_sync_for_gradient_accumulation): gradients accumulate unsharded
    (fp32, FSDP2's accumulator for a reduce dtype above the compute dtype) and are reduce-scattered
    once, after the last micro batch: one collective per step instead of one per micro batch, for
    the whole model's fp32 gradient on every rank (on one rank, the same bytes as the shard's).
    The gradient is the same sum either way.
    """
    if keep_gathered and hasattr(model, "set_reshard_after_backward"):
        model.set_reshard_after_backward(last)
    if no_grad_sync and hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(last)


def as_floats(values: dict[str, float | torch.Tensor]) -> dict[str, float]:
    """Python floats of `values`, the device tensors among them read back in one transfer."""
    tensors = {key: value for key, value in values.items() if isinstance(value, torch.Tensor)}
    out = {key: float(value) for key, value in values.items() if key not in tensors}
    if tensors:
        stacked = torch.stack([value.detach().reshape(()).to(torch.float64) for value in tensors.values()])
        out.update(zip(tensors, stacked.tolist(), strict=True))
    return {key: out[key] for key in values}
