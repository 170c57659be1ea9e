"""The reward loop's rules: verl 0.9.1's reward model served by a rollout engine (rlconf.reward_loop).

What verl checks before it serves one (main_ppo_v0.init_resource_pool_mgr, reward_loop/reward_model.py,
reward_loop.py), what cannot start on a GPU (two engines reserving more than the GPU at once), and
the settings that belong to the other path (the FSDP reward-model worker) and have no effect.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.normalize import Normalized
from rlconf.reward_loop import OWN_POOL
from rlconf.schema import PlanConfig

# Keys of the FSDP reward-model worker (verl up to 0.8's legacy worker), which a served reward model does not read.
FSDP_WORKER_KEYS = ("micro_batch_size", "micro_batch_size_per_gpu", "max_length", "use_dynamic_bsz",
                    "forward_max_token_len_per_gpu")


def check_reward_loop(plan: PlanConfig, norm: Normalized, raw: dict) -> Iterator[Diagnostic]:
    rm = plan.reward_model
    written = raw.get("reward_model") if isinstance(raw.get("reward_model"), dict) else {}
    if rm.enable and rm.use_reward_loop is True and rm.rollout.name is None:
        yield error("RL540", "reward_model.use_reward_loop",
                    "reward_model.use_reward_loop is true, but reward_model.rollout.name names no engine to serve the "
                    "reward model with (verl requires it: `name: ???`)",
                    help="set reward_model.rollout.name=vllm, or use_reward_loop=false for the FSDP reward-model worker")
    served = norm.served_reward_model
    if served is None:
        if rm.enable and rm.use_reward_loop is False and "rollout" in written:
            yield warning("RL545", "reward_model.rollout",
                          "reward_model.use_reward_loop is false: the FSDP reward-model worker scores, and the "
                          "reward_model.rollout settings (the served engine's) have no effect",
                          help="remove reward_model.rollout, or use_reward_loop to serve the model")
        return
    if rm.enable_resource_pool and (rm.nnodes <= 0 or rm.n_gpus_per_node <= 0):
        key = "reward_model.nnodes" if rm.nnodes <= 0 else "reward_model.n_gpus_per_node"
        yield error("RL541", key,
                    f"reward_model.enable_resource_pool gives the reward model a pool of its own, of reward_model.nnodes "
                    f"{rm.nnodes} × n_gpus_per_node {rm.n_gpus_per_node} GPUs: verl requires both to be > 0",
                    help="set reward_model.nnodes (verl's default is 0) and n_gpus_per_node to the pool's size, or "
                         "enable_resource_pool=false to colocate it with the actor")
        return
    tp_key = "reward_model.rollout.tensor_model_parallel_size"
    if served.replicas == 0:
        yield error("RL542", tp_key,
                    f"the served reward model needs {served.tensor_parallel_size} GPUs per replica and its pool "
                    f"`{served.pool}` has {served.pool_gpus}: not one replica fits (verl asserts num_replicas > 0)",
                    help=f"use a tensor_model_parallel_size of at most {served.pool_gpus}, or give the pool more GPUs")
    elif not served.replicas_exact:
        divisors = [d for d in range(1, served.pool_gpus + 1) if served.pool_gpus % d == 0]
        if served.colocated:
            yield error("RL542", tp_key,
                        f"the colocated reward model's replicas of tp {served.tensor_parallel_size} GPUs do not split the "
                        f"actor's pool of {served.pool_gpus} GPUs (verl's split_resource_pool asserts tp divides it)",
                        help=f"use a divisor of {served.pool_gpus}: {', '.join(map(str, divisors))}")
        else:
            yield warning("RL543", tp_key,
                          f"the reward model's pool of {served.pool_gpus} GPUs holds {served.replicas} replica(s) of tp "
                          f"{served.tensor_parallel_size}: {served.pool_gpus % served.tensor_parallel_size} GPU(s) stay idle",
                          help=f"use a divisor of {served.pool_gpus} ({', '.join(map(str, divisors))}), or size "
                               f"{OWN_POOL} to a multiple of the tensor parallel size")
    rollout = plan.actor_rollout_ref.rollout
    # Colocated with the actor, the served model shares GPUs with the actor's vLLM only when the rollout runs on the
    # actor's pool too (the synchronous step); off-policy, the rollout has a pool of its own.
    if served.colocated and rollout.name == "vllm" and norm.schedule.mode == "colocated_sync":
        both_awake = not served.free_cache_engine or not rollout.free_cache_engine
        total = served.gpu_memory_utilization + rollout.gpu_memory_utilization
        if both_awake and total > 1.0:
            awake = ("reward_model.rollout.free_cache_engine is false" if not served.free_cache_engine
                     else "actor_rollout_ref.rollout.free_cache_engine is false")
            yield error("RL544", "reward_model.rollout.gpu_memory_utilization",
                        f"the reward model is colocated and {awake}, so both engines hold their share of each GPU at "
                        f"once: {served.gpu_memory_utilization:g} + {rollout.gpu_memory_utilization:g} = {total:g} of "
                        "the GPU; the second engine cannot start",
                        help="let both sleep (free_cache_engine true), lower the shares to sum to at most 1, or give "
                             "the reward model its own pool (enable_resource_pool)")
    set_here = [key for key in FSDP_WORKER_KEYS if key in written]
    if set_here:
        yield warning("RL545", f"reward_model.{set_here[0]}",
                      f"the reward model is served by {served.backend} (the reward loop), which batches requests itself: "
                      f"{', '.join('reward_model.' + key for key in set_here)} (the FSDP reward-model worker's) "
                      f"{'has' if len(set_here) == 1 else 'have'} no effect",
                      help="remove them, or use_reward_loop=false for the FSDP worker that reads them")
    if not plan.data.return_raw_chat:
        yield error("RL546", "data.return_raw_chat",
                    "a served reward model scores the raw chat (the prompt's messages and the response, in the reward "
                    "model's chat template), and data.return_raw_chat is false (verl asserts raw_prompt is there)",
                    help="set data.return_raw_chat=true")
