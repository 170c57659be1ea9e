"""Tuning advice from verl's performance guide (RL6xx, warnings): valid plans that leave speed
or memory on the table."""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, warning
from rlconf.modelinfo import ModelInfo
from rlconf.normalize import Normalized
from rlconf.schema import PlanConfig


def check_tuning(plan: PlanConfig, norm: Normalized, model: ModelInfo | None) -> Iterator[Diagnostic]:
    arr = plan.actor_rollout_ref
    rollout = arr.rollout
    gpu = plan.trainer.device == "cuda"
    if gpu and rollout.name == "vllm" and rollout.max_num_batched_tokens <= 2048:
        yield warning("RL601", "actor_rollout_ref.rollout.max_num_batched_tokens",
                      f"max_num_batched_tokens {rollout.max_num_batched_tokens} limits the decode batch; the tuning guide recommends > 2048",
                      help="try 8192 or more")
    offloaded = arr.actor.fsdp_config.param_offload or arr.actor.fsdp_config.optimizer_offload or arr.actor.fsdp_config.offload_policy
    # Only where vLLM shares the GPUs with the actor's states: a rollout pool of its own (off-policy) holds nothing else.
    if gpu and rollout.gpu_memory_utilization > 0.7 and not offloaded and norm.schedule.mode == "colocated_sync":
        yield warning("RL602", "actor_rollout_ref.rollout.gpu_memory_utilization",
                      f"gpu_memory_utilization {rollout.gpu_memory_utilization} with the actor's parameters and optimizer on the GPU risks OOM",
                      help="use 0.5-0.7, or enable actor fsdp_config.param_offload / optimizer_offload")
    yield from _forward_vs_training(plan, norm)
    family = model.family if model is not None else None
    if gpu and family and not arr.model.use_remove_padding:
        yield warning("RL604", "actor_rollout_ref.model.use_remove_padding",
                      f"sequence packing is off, but the {family} family supports it",
                      help="set `use_remove_padding: true` to skip pad tokens in training and log-prob passes")
    if norm.critic is not None:
        critic_tokens = plan.critic.ppo_max_token_len_per_gpu
        actor_tokens = arr.actor.ppo_max_token_len_per_gpu
        if norm.critic.use_dynamic_bsz and critic_tokens < actor_tokens:
            yield warning("RL605", "critic.ppo_max_token_len_per_gpu",
                          f"critic token budget {critic_tokens} is below the actor's {actor_tokens}; a value head needs far less memory than a vocabulary head",
                          help=f"use at least {2 * actor_tokens} (the tuning guide: critic ≥ 2× actor)")
        actor_micro = norm.actor.ppo_micro_batch_size_per_gpu
        critic_micro = norm.critic.ppo_micro_batch_size_per_gpu
        if (not norm.critic.use_dynamic_bsz and actor_micro and critic_micro and actor_micro.value and critic_micro.value
                and critic_micro.value < actor_micro.value):
            yield warning("RL605", "critic.ppo_micro_batch_size_per_gpu",
                          f"critic micro batch {critic_micro.value} per GPU is below the actor's {actor_micro.value}",
                          help="the critic's value head is small: its micro batch can be larger than the actor's")
    if not arr.model.enable_gradient_checkpointing and norm.actor.use_dynamic_bsz is False and gpu:
        yield warning("RL606", "actor_rollout_ref.model.enable_gradient_checkpointing",
                      "gradient checkpointing is off: activations of every layer stay in memory",
                      help="turn it on to afford larger micro batches (the tuning guide's first batch-size tip)")


def _forward_vs_training(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    """Forward-only passes keep no activations for backward: their micro batches can be ~2× larger."""
    train = norm.actor.ppo_micro_batch_size_per_gpu
    if norm.actor.use_dynamic_bsz or train is None or not train.value:
        return
    for fwd in (norm.rollout.log_prob, norm.ref):
        if fwd is None or fwd.use_dynamic_bsz or fwd.micro_batch_size_per_gpu is None:
            continue
        micro = fwd.micro_batch_size_per_gpu.value
        if micro and micro < train.value:
            key = f"{fwd.micro_key}_per_gpu"
            yield warning("RL603", key,
                          f"{fwd.role} log-prob micro batch {micro} per GPU is smaller than the actor's training micro batch {train.value}",
                          help=f"forward-only passes can use more, e.g. {2 * train.value}")
