"""The reward model served by a rollout engine (verl 0.9.1's reward loop): its pool and replicas.

verl (experimental/reward_loop/reward_model.py, trainer/main_ppo_v0.py init_resource_pool_mgr) serves
the reward model on `reward_model.rollout.name`'s engine, one replica per tensor_model_parallel_size
GPUs, in one of two places:

- colocated (enable_resource_pool false): on the actor's pool, the trainer's nnodes × n_gpus_per_node
  GPUs, split into replicas of tp GPUs each (split_resource_pool asserts tp divides the pool); with
  free_cache_engine it sleeps except while it scores, after the rollout and before training;
- its own pool (enable_resource_pool true): reward_model.nnodes × reward_model.n_gpus_per_node further
  GPUs (both must be > 0), replicas = GPUs ÷ tp, floored.

Pure arithmetic of the plan, like rlconf/normalize.py, which calls it.
"""

from __future__ import annotations

from typing import NamedTuple

from rlconf.schema import PlanConfig

OWN_POOL = "reward_pool"  # verl's name for the reward model's own resource pool


def serves_reward_model(plan: PlanConfig) -> bool:
    """The reward model is served (the reward loop) rather than run by the FSDP reward-model worker: it is on, the
    plan names a serving engine, and verl's pre-0.9 switch `use_reward_loop` is not turned off."""
    rm = plan.reward_model
    return rm.enable and rm.use_reward_loop is not False and rm.rollout.name is not None


class ServedRewardModel(NamedTuple):
    backend: str  # reward_model.rollout.name
    pool: str  # "reward_pool" (its own) or the actor's pool (colocated)
    colocated: bool
    pool_gpus: int
    pool_formula: str
    tensor_parallel_size: int
    replicas: int  # floored, as verl's `world_size // rollout_world_size`
    replicas_formula: str
    replicas_exact: bool  # tp divides the pool's GPUs
    gpu_memory_utilization: float
    free_cache_engine: bool  # asleep except while scoring
    max_model_len: int | None  # None: the model's max_position_embeddings (verl's vLLM server)


def served_reward_model(plan: PlanConfig, actor_pool: str, actor_pool_gpus: int) -> ServedRewardModel | None:
    if not serves_reward_model(plan):
        return None
    rm = plan.reward_model
    rollout = rm.rollout
    tp = rollout.tensor_model_parallel_size
    if rm.enable_resource_pool:
        gpus = rm.nnodes * rm.n_gpus_per_node
        pool, colocated = OWN_POOL, False
        pool_formula = f"reward_model.nnodes {rm.nnodes} × n_gpus_per_node {rm.n_gpus_per_node} = {gpus}"
    else:
        gpus, pool, colocated = actor_pool_gpus, actor_pool, True
        pool_formula = f"the actor's pool `{actor_pool}`: {gpus} GPUs (colocated)"
    replicas = gpus // tp
    exact = gpus % tp == 0
    text = f"{gpus} GPUs ÷ tp {tp}"
    replicas_formula = f"{text} = {replicas}" if exact else f"⌊{text}⌋ = {replicas} ({gpus % tp} GPUs idle)"
    return ServedRewardModel(rollout.name, pool, colocated, gpus, pool_formula, tp, replicas, replicas_formula, exact,
                             rollout.gpu_memory_utilization, rollout.free_cache_engine, rollout.max_model_len)
