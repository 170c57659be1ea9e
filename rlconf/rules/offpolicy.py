"""A rollout pool of its own and the one-step off-policy schedule (RL36x).

verl 0.9.1 runs rollout apart from the actor only in its off-policy trainers
(experimental/one_step_off_policy, fully_async_policy), which assert `hybrid_engine` false, while
its synchronous trainer asserts it true (trainer/ppo/ray_trainer.py). Its one-step recipe config
(one_step_off_ppo_trainer.yaml) sizes the rollout pool with `rollout.nnodes` / `rollout.n_gpus_per_node`
on top of the trainer's GPUs, keeps the KV cache (`free_cache_engine: False`), pushes weights over
NCCL (`checkpoint_engine.backend: nccl`) and trains in bypass mode against the rollout log-probs.
rlconf reads the same keys (rlconf.normalize.schedule) and says here where a plan departs from them.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.normalize import Normalized
from rlconf.schema import PlanConfig

POOL_KEYS = "actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=N"


def check_rollout_pool(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    arr = plan.actor_rollout_ref
    rollout = arr.rollout
    where = norm.placement
    apart = where.roles.get("rollout") is not None and where.roles.get("rollout") != where.roles.get("actor")
    if rollout.nnodes > 0 and plan.placement is not None:
        yield error("RL367", "actor_rollout_ref.rollout.nnodes",
                    f"rollout.nnodes is {rollout.nnodes} and the plan has a `placement` section: two ways of giving "
                    "rollout its GPUs",
                    help="keep one: verl's keys (rollout.nnodes, rollout.n_gpus_per_node beside trainer.*) or "
                         "rlconf's placement.pools with placement.roles.rollout")
        return
    written = plan.async_training is not None
    if written and (arr.hybrid_engine or not apart):
        yield error("RL368", "async_training",
                    "the plan writes `async_training` (verl's fully async mode), but "
                    + ("hybrid_engine is true" if arr.hybrid_engine else "rollout has no GPUs of its own")
                    + ": verl's fully async trainer asserts hybrid_engine false and streams on a rollout pool apart "
                      "from the trainer's GPUs",
                    help=f"set actor_rollout_ref.hybrid_engine=false and give rollout its GPUs ({POOL_KEYS}), or "
                         "remove the async_training section to train synchronously")
        return
    if not arr.hybrid_engine and not apart:
        yield error("RL361", "actor_rollout_ref.hybrid_engine",
                    "hybrid_engine is false, but rollout has no GPUs of its own: the off-policy schedule generates on "
                    "a rollout pool while the trainer's GPUs train",
                    help=f"give rollout its GPUs ({POOL_KEYS}; verl's recipe spells them rollout.nnodes and "
                         "rollout.n_gpus_per_node), or set hybrid_engine back to true")
        return
    if arr.hybrid_engine and rollout.nnodes > 0:
        yield error("RL362", "actor_rollout_ref.rollout.nnodes",
                    f"rollout.nnodes is {rollout.nnodes}: a rollout pool of its own, but hybrid_engine is true "
                    "(rollout colocated with the actor, the stages taking turns); verl's synchronous trainer asserts "
                    "hybrid_engine and its off-policy trainers assert the opposite",
                    help="set actor_rollout_ref.hybrid_engine=false to generate on the rollout pool one step ahead "
                         "(one-step off-policy), or rollout.nnodes=0 to colocate")
        return
    if norm.schedule.mode not in ("one_step_off_policy", "fully_async"):
        return
    if norm.schedule.mode == "fully_async":
        yield from check_fully_async(plan, norm)
    rollout_pool = where.roles["rollout"]
    shared = sorted(role for role, pool in where.roles.items() if pool == rollout_pool and role != "rollout")
    if shared:
        yield error("RL366", f"placement.roles.{shared[0]}",
                    f"{' and '.join(shared)} placed on the rollout pool `{rollout_pool}`: with hybrid_engine false "
                    "that pool generates all the time, and only rollout runs there",
                    help=f"place {' and '.join(shared)} on the actor's pool `{where.roles['actor']}` or a pool of "
                         "its own")
    if rollout.free_cache_engine:
        yield warning("RL363", "actor_rollout_ref.rollout.free_cache_engine",
                      "free_cache_engine is true on a rollout pool of its own: nothing else uses those GPUs, so the "
                      "engine keeps its KV cache between batches whatever this says",
                      help="set it to false, as verl's one-step off-policy recipe does (it must be off there for the "
                           "weight sync)")
    backend = rollout.checkpoint_engine.backend
    collective = norm.schedule.weight_sync
    if backend == "naive":
        yield warning("RL364", "actor_rollout_ref.rollout.checkpoint_engine.backend",
                      "checkpoint_engine.backend is naive (the colocated actor's own processes), but rollout has a "
                      f"pool of its own: weights will go trainer → rollout over {collective}",
                      help="set it to nccl, as verl's one-step off-policy recipe does (rlconf runs the same push on "
                           "gloo between CPU processes)")
    correction = plan.algorithm.rollout_correction
    # Rejection sampling (rollout_rs) drops the tokens whose π_old / π_rollout ratio the staleness moved too far,
    # as verl's own one-step `ris` script uses it: a correction too.
    if not correction.bypass_mode and correction.rollout_is is None and correction.rollout_rs is None:
        yield warning("RL365", "algorithm.rollout_correction.bypass_mode",
                      f"{'fully async' if norm.schedule.mode == 'fully_async' else 'one-step off-policy'} trains "
                      f"groups up to {norm.schedule.max_staleness} weight version(s) after the weights that generated "
                      "them, and no rollout correction is on: the PPO ratio starts from the recomputed π_old and the "
                      "staleness goes uncorrected",
                      help="set algorithm.rollout_correction.bypass_mode=true (verl's one-step off-policy default: "
                           "π_old is the rollout's own log-probs), rollout_is=token (truncated importance sampling) "
                           "or rollout_rs (rejection sampling)")


def check_fully_async(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    """What verl's fully async trainer and rollouter assert (experimental/fully_async_policy), in rlconf's terms."""
    cfg, sched = plan.async_training, norm.schedule
    batch = plan.data.train_batch_size
    if batch != sched.groups_per_step:
        yield error("RL369", "data.train_batch_size",
                    f"train_batch_size is {batch}, but a fully async trainer step takes "
                    f"{sched.formulas['groups_per_step']} groups from the queue (verl's "
                    "required_samples; verl asserts train_batch_size 0 and derives the step from these two)",
                    help=f"set data.train_batch_size={sched.groups_per_step}, or change ppo_mini_batch_size or "
                         "async_training.require_batches to give the step you want")
    share, per_replica, n = sched.replica_share, sched.replica_window, plan.actor_rollout_ref.rollout.n
    if plan.actor_rollout_ref.rollout.name == "vllm" and per_replica < share:
        yield warning("RL371", "async_training.concurrent_samples_per_replica",
                      f"each rollout replica holds at most {per_replica} groups in its engine at once "
                      f"(concurrent_samples_per_replica), of the {share} it generates for a step: each engine step "
                      f"carries at most {per_replica * n} sequences instead of {share * n}, so the step's generation "
                      "takes more engine steps",
                      help=f"set async_training.concurrent_samples_per_replica={share} (a step's share in the engine "
                           "at once), unless responses vary in length enough that fewer groups in flight, each "
                           "reaching the trainer sooner, pay for it (docs/off-policy.md, Throughput)")
    tp = plan.actor_rollout_ref.rollout.tensor_model_parallel_size
    if cfg.partial_rollout and tp > 1:
        yield error("RL108", "async_training.partial_rollout",
                    f"`async_training.partial_rollout` is true (verl's default: responses interrupted at a weight push "
                    f"resume on the new weights) with rollout tensor_model_parallel_size {tp}; rlconf runs partial "
                    "rollouts on replicas of one GPU only: the ranks of a tensor-parallel replica step their engines "
                    "in lockstep and would have to stop at the same engine step",
                    help="set async_training.partial_rollout=false (a push then waits for the groups in flight), or "
                         "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    if cfg.use_dynamic_resource_scheduling:
        yield error("RL108", "async_training.use_dynamic_resource_scheduling",
                    "`async_training.use_dynamic_resource_scheduling` is true: verl then also generates on the "
                    "trainer's GPUs between updates; rlconf does not run that yet: only the rollout pool generates",
                    help="set async_training.use_dynamic_resource_scheduling=false")
    if cfg.use_trainer_do_validate:
        yield warning("RL109", "async_training.use_trainer_do_validate",
                      "`async_training.use_trainer_do_validate` is true; rlconf accepts it and does not apply it: "
                      "validation generates on the rollout pool, after the groups in flight, with the weights just "
                      "trained",
                      help="remove it (the validation scores are the same policy's either way)")
