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
    if norm.schedule.mode != "one_step_off_policy":
        return
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
    if not correction.bypass_mode and correction.rollout_is is None:
        yield warning("RL365", "algorithm.rollout_correction.bypass_mode",
                      "one-step off-policy trains each batch one weight version after the weights that generated it, "
                      "and no rollout correction is on: the PPO ratio starts from the recomputed π_old and the "
                      "staleness goes uncorrected",
                      help="set algorithm.rollout_correction.bypass_mode=true (verl's one-step off-policy default: "
                           "π_old is the rollout's own log-probs) or rollout_is=token (truncated importance sampling)")
