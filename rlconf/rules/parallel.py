"""Parallel-size and placement rules (RL3xx)."""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.modelinfo import ModelInfo
from rlconf.normalize import Normalized, active_roles
from rlconf.rules.arith import divisors, nearest_divisors, or_list
from rlconf.schema import PlanConfig

REQUIRED_ROLES = ("actor", "rollout")


def check_parallel(plan: PlanConfig, norm: Normalized, model: ModelInfo | None) -> Iterator[Diagnostic]:
    arr = plan.actor_rollout_ref
    trainer = plan.trainer
    sp_roles = [
        ("actor", norm.actor.pool_gpus, arr.actor.ulysses_sequence_parallel_size, "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
         arr.model.use_remove_padding, "actor_rollout_ref.model.use_remove_padding"),
    ]
    if norm.ref is not None and arr.ref.ulysses_sequence_parallel_size is not None:
        sp_roles.append(("ref", norm.ref.pool_gpus, arr.ref.ulysses_sequence_parallel_size,
                         "actor_rollout_ref.ref.ulysses_sequence_parallel_size", arr.model.use_remove_padding,
                         "actor_rollout_ref.model.use_remove_padding"))
    if norm.critic is not None:
        sp_roles.append(("critic", norm.critic.pool_gpus, plan.critic.ulysses_sequence_parallel_size,
                         "critic.ulysses_sequence_parallel_size", plan.critic.model.use_remove_padding,
                         "critic.model.use_remove_padding"))
    if norm.reward_model is not None:
        sp_roles.append(("reward_model", norm.reward_model.pool_gpus, plan.reward_model.ulysses_sequence_parallel_size,
                         "reward_model.ulysses_sequence_parallel_size", plan.reward_model.model.use_remove_padding,
                         "reward_model.model.use_remove_padding"))
    for role, gpus, sp, key, packing, packing_key in sp_roles:
        if gpus and gpus % sp:
            yield error("RL301", key, f"{role} ulysses_sequence_parallel_size {sp} does not divide its {gpus} GPUs",
                        note=f"{gpus} ÷ {sp} = {gpus / sp:g}",
                        help=f"use a divisor of {gpus} ({or_list(nearest_divisors(gpus, sp))})")
        if sp > 1 and not packing:
            yield error("RL306", packing_key, f"{role} uses Ulysses sequence parallelism (sp {sp}) but sequence packing is off",
                        help=f"set `{packing_key}: true` (verl requires it for sp > 1)")
        if sp > 1 and model is not None and model.num_attention_heads:
            yield from _heads_divisible(role, sp, key, model)

    tp = arr.rollout.tensor_model_parallel_size
    tp_key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    rollout_gpus = norm.rollout.pool_gpus
    # A replica over several nodes runs (verl places it on whole nodes), but its all-reduces cross the network.
    rollout_pool = norm.placement.pool_of("rollout")
    node_gpus = min(trainer.n_gpus_per_node, rollout_pool.gpus_per_node) if rollout_pool else trainer.n_gpus_per_node
    where = "per node" if node_gpus == trainer.n_gpus_per_node else f"per node in pool `{rollout_pool.name}`"
    if tp > node_gpus:
        yield warning("RL303", tp_key, f"rollout tensor_model_parallel_size {tp} spans more than one node ({node_gpus} GPUs {where}): "
                      "every layer's all-reduce crosses the inter-node network",
                      help=f"use at most {node_gpus} unless the nodes are linked by InfiniBand / RoCE (docs/cluster.md)")
    if rollout_gpus and rollout_gpus % tp:
        yield error("RL302", tp_key, f"rollout tensor_model_parallel_size {tp} does not divide the rollout pool's {rollout_gpus} GPUs",
                    note=f"{rollout_gpus} GPUs ÷ tp {tp} = {rollout_gpus / tp:g} replicas",
                    help=f"use {or_list([d for d in nearest_divisors(rollout_gpus, tp) if d <= node_gpus])}")
    if model is not None and model.num_attention_heads and model.num_attention_heads % tp and tp > 1:
        yield error("RL305", tp_key, f"the model's {model.num_attention_heads} attention heads do not split over tensor parallel size {tp}",
                    help=f"use a divisor of {model.num_attention_heads} ({or_list(nearest_divisors(model.num_attention_heads, tp))})")

    yield from _vllm_executor(plan, tp, tp_key)

    for role, fsdp_size, key in (("actor", arr.actor.fsdp_config.fsdp_size, "actor_rollout_ref.actor.fsdp_config.fsdp_size"),
                                 ("critic", plan.critic.model.fsdp_config.fsdp_size, "critic.model.fsdp_config.fsdp_size")):
        gpus = norm.actor.pool_gpus if role == "actor" else (norm.critic.pool_gpus if norm.critic else 0)
        if fsdp_size > 0 and gpus and fsdp_size < gpus and gpus % fsdp_size:
            yield error("RL307", key, f"{role} fsdp_size {fsdp_size} does not divide its {gpus} GPUs (hybrid sharding needs whole replicas)",
                        help=f"use -1 (shard over all GPUs) or a divisor of {gpus} ({or_list(nearest_divisors(gpus, fsdp_size))})")


VLLM_EXECUTORS = ("external_launcher", "mp")


def _vllm_executor(plan: PlanConfig, tp: int, tp_key: str) -> Iterator[Diagnostic]:
    """rollout.engine_kwargs.vllm.distributed_executor_backend: rlconf runs vLLM in the worker's process
    (`external_launcher`, unset) or in processes of its own on the worker's GPU (`mp`, verl's layout: the weights
    cross by CUDA IPC, engine/rollout/vllm_processes.py). A Ray worker owns one GPU, so an `mp` engine cannot
    reach the GPUs of a tensor-parallel replica's other ranks; `uni` and `ray` are not layouts rlconf runs."""
    rollout = plan.actor_rollout_ref.rollout
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"
    executor = rollout.engine_kwargs.vllm.get("distributed_executor_backend")
    if executor is None:
        return
    if executor not in VLLM_EXECUTORS:
        yield error("RL372", key, f"distributed_executor_backend {executor!r} is not a layout rlconf runs vLLM in",
                    help="leave it unset (`external_launcher`: vLLM in the worker's process) or use `mp` (vLLM's engine "
                         "core and model runner in processes of their own on the worker's GPU, tensor parallel size 1)")
    elif executor == "mp" and rollout.name != "vllm":
        yield error("RL372", key, f"distributed_executor_backend `mp` is vLLM's, but rollout.name is `{rollout.name}`",
                    help="set actor_rollout_ref.rollout.name: vllm, or drop the key")
    elif executor == "mp" and "worker_extension_cls" in rollout.engine_kwargs.vllm:
        yield error("RL372", "actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls",
                    "worker_extension_cls with distributed_executor_backend `mp`: rlconf's own extension carries the "
                    "weights into vLLM's model runner there",
                    help="drop worker_extension_cls, or leave the backend unset (vLLM in the worker's process)")
    elif executor == "mp" and tp > 1:
        yield error("RL372", key, f"distributed_executor_backend `mp` with rollout tensor_model_parallel_size {tp}: each "
                                  "worker owns one GPU, and an `mp` engine would need the replica's other GPUs",
                    help=f"set {tp_key}: 1 (the model fits one GPU's share), or leave the backend unset "
                         "(`external_launcher` runs tensor-parallel replicas across the workers)")


def _heads_divisible(role: str, sp: int, key: str, model: ModelInfo) -> Iterator[Diagnostic]:
    """verl models/transformers/monkey_patch.py: Ulysses scatters attention heads over sp ranks."""
    heads, kv = model.num_attention_heads, model.num_key_value_heads or model.num_attention_heads
    if heads % sp:
        yield error("RL305", key, f"{role} sp {sp} does not divide the model's {heads} attention heads",
                    help=f"use a divisor of {heads} ({or_list([d for d in divisors(heads) if d <= max(sp * 2, 2)][-3:])})")
    elif kv % sp and sp % kv:
        yield error("RL305", key, f"{role} sp {sp} and the model's {kv} key/value heads: neither divides the other",
                    help=f"use a divisor or a multiple of {kv}")


def check_placement(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    if plan.placement is None:
        return
    where = norm.placement
    trainer = plan.trainer
    total = 0
    for name, pool in where.pools.items():
        key = f"placement.pools.{name}"
        total += pool.gpus
        if pool.gpus_per_node > trainer.n_gpus_per_node:
            yield error("RL351", f"{key}.n_gpus_per_node", f"pool `{name}` wants {pool.gpus_per_node} GPUs per node; nodes have {trainer.n_gpus_per_node}",
                        help=f"use at most trainer.n_gpus_per_node = {trainer.n_gpus_per_node}")
        if pool.nnodes > trainer.nnodes:
            yield error("RL351", f"{key}.nnodes", f"pool `{name}` wants {pool.nnodes} nodes; the cluster has {trainer.nnodes}",
                        help=f"use at most trainer.nnodes = {trainer.nnodes}")
    if total > where.cluster_gpus:
        sizes = " + ".join(f"{p.gpus}" for p in where.pools.values())
        yield error("RL351", "placement.pools", f"the pools need {total} GPUs but the cluster has {where.cluster_gpus}",
                    note=f"{sizes} = {total} > {trainer.nnodes} nodes × {trainer.n_gpus_per_node} GPUs",
                    help="shrink a pool or raise trainer.nnodes / trainer.n_gpus_per_node")
    mapped = plan.placement.roles
    for role, pool_name in mapped.items():
        if pool_name not in where.pools:
            yield error("RL352", f"placement.roles.{role}", f"role `{role}` is placed on pool `{pool_name}`, which is not defined",
                        help=f"defined pools: {', '.join(where.pools) or '(none)'}")
    for role in active_roles(plan):
        if role not in mapped:
            yield error("RL353", "placement.roles", f"this plan runs the `{role}` role but `placement.roles` gives it no pool",
                        help=f"add `{role}: <pool>` under placement.roles")
    if (mapped.get("actor") in where.pools and mapped.get("rollout") in where.pools
            and mapped["actor"] != mapped["rollout"] and plan.actor_rollout_ref.hybrid_engine):
        yield error("RL354", "placement.roles.rollout",
                    f"rollout is on pool `{mapped['rollout']}` but the actor is on `{mapped['actor']}`, and "
                    "hybrid_engine is true (rollout colocated with the actor)",
                    help=f"place rollout on `{mapped['actor']}`, or set actor_rollout_ref.hybrid_engine=false to "
                         f"generate on `{mapped['rollout']}` one step ahead of training (one-step off-policy)")
    for role in mapped:
        if role not in active_roles(plan):
            yield warning("RL355", f"placement.roles.{role}", f"role `{role}` is placed but this plan does not run it",
                          help="remove it, or enable what needs it (critic: adv_estimator gae; ref: a KL term; reward_model: enable)")
    used = set(mapped.values())
    for name in where.pools:
        if name not in used:
            yield warning("RL356", f"placement.pools.{name}", f"pool `{name}` has no role: its GPUs stay idle",
                          help="remove the pool or place a role on it")
