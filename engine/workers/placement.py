"""Which Ray resources each worker group runs on: CPU slots, or the GPUs of the plan's pools.

On CPU every worker takes one Ray CPU. On GPU each pool of `resolved.placement` becomes a Ray
placement group of one bundle per GPU, and rank r of every worker group on that pool runs in
bundle r: a group's ranks never share a GPU (NCCL needs one GPU per rank), while groups on the same
pool (the actor's and a colocated critic's) share each GPU, with an equal fraction each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlconf.resolved import ResolvedPlan

# Worker groups by the plan role whose pool they run on (the actor's worker also runs rollout and ref).
GROUP_POOL_ROLE = {"actor_rollout_ref": "actor", "critic": "critic"}
PLACEMENT_READY_TIMEOUT_S = 60.0


class PlacementError(RuntimeError):
    """The cluster cannot hold the plan's pools (too few GPUs)."""


def worker_group_roles(resolved: ResolvedPlan) -> list[str]:
    return ["actor"] + (["critic"] if resolved.roles.critic is not None else [])


def groups_per_pool(resolved: ResolvedPlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for role in worker_group_roles(resolved):
        pool = resolved.placement.roles[role]
        counts[pool] = counts.get(pool, 0) + 1
    return counts


def worker_group_factory(resolved: ResolvedPlan) -> Callable[..., Any]:
    """`factory(worker_cls, group_role, world_size, **kwargs)` -> RayWorkerGroup placed as the plan says.

    Call after ray.init. On GPU this reserves every pool's GPUs first and fails with a
    PlacementError, instead of waiting forever, when the cluster does not have them.
    """
    from engine.workers.group import RayWorkerGroup

    if resolved.world.device != "cuda":
        return RayWorkerGroup
    sharing = groups_per_pool(resolved)
    bundles = {pool: reserve_pool(pool, resolved.placement.pools[pool].gpus, sharing[pool]) for pool in sharing}

    def factory(worker_cls: type, role: str, world_size: int, **kwargs: Any) -> RayWorkerGroup:
        pool = resolved.placement.roles[GROUP_POOL_ROLE[role]]
        share = 1.0 / sharing[pool]
        return RayWorkerGroup(worker_cls, role, world_size, cpus_per_worker=share, gpus_per_worker=share,
                              placement_group=bundles[pool], **kwargs)

    return factory


def reserve_pool(pool: str, gpus: int, groups: int) -> Any:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"GPU": 1, "CPU": 1}] * gpus, strategy="STRICT_PACK", name=f"rlconf-{pool}")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_READY_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        have = ray.cluster_resources().get("GPU", 0)
        raise PlacementError(f"pool `{pool}` needs {gpus} GPU(s) ({groups} worker group(s) sharing them), but "
                             f"after {PLACEMENT_READY_TIMEOUT_S:.0f}s Ray could not reserve them: the cluster has "
                             f"{have:g} GPU(s) in all; lower trainer.n_gpus_per_node / trainer.nnodes or add GPUs") from None
    return group
