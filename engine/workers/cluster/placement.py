"""Which Ray resources each worker group runs on: the device slots of the plan's pools, node by node.

Each pool of `resolved.placement` (nnodes × gpus_per_node slots) becomes one Ray placement group per
node, of one bundle per slot (`{GPU: 1, CPU: 1}` on GPU, `{CPU: groups}` on CPU) packed on one node
(STRICT_PACK), so a pool spans nodes as the plan says. Rank r of every worker group on that pool runs
in bundle r (node r ÷ gpus_per_node): a group's ranks never share a GPU (NCCL needs one GPU per
rank), while groups on the same pool (the actor's and a colocated critic's) share each GPU, with an
equal fraction each. Ray picks the nodes; a node with room for two of a pool's nodes may hold both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlconf.resolved import PoolView, ResolvedPlan

# Worker groups by the plan role whose pool they run on (the actor's worker also runs rollout and ref; the
# reward model's group is its FSDP workers, or its served replicas: the actor's pool when colocated, or reward_pool).
GROUP_POOL_ROLE = {"actor_rollout_ref": "actor", "critic": "critic", "reward_model": "reward_model", "rollout": "rollout"}
PLACEMENT_READY_TIMEOUT_S = 60.0
WORKERS_FILE = "workers.json"  # <run_dir>/workers.json: where Ray placed each rank


class PlacementError(RuntimeError):
    """The cluster cannot hold the plan's pools (too few GPUs, or CPU slots on a CPU plan)."""


def worker_group_roles(resolved: ResolvedPlan) -> list[str]:
    roles = resolved.roles
    reward_model = roles.reward_model is not None or roles.served_reward_model is not None
    return (["actor"] + (["critic"] if roles.critic is not None else []) + (["reward_model"] if reward_model else [])
            + (["rollout"] if resolved.schedule.off_policy else []))  # a worker group of its own only when apart


def groups_per_pool(resolved: ResolvedPlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for role in worker_group_roles(resolved):
        pool = resolved.placement.roles[role]
        counts[pool] = counts.get(pool, 0) + 1
    return counts


def slot_bundle(device: str, groups: int) -> dict[str, float]:
    """One device slot of a pool that `groups` worker groups share: a GPU, or one CPU per worker process."""
    return {"GPU": 1, "CPU": 1} if device == "cuda" else {"CPU": groups}


def worker_group_factory(resolved: ResolvedPlan, run_dir: Path | None = None) -> WorkerGroupFactory:
    """`factory(worker_cls, group_role, world_size, **kwargs)` -> RayWorkerGroup placed as the plan says.

    Call after ray.init. This reserves every pool's slots first and fails with a PlacementError,
    instead of waiting forever, when the cluster does not have them. With `run_dir`, each group
    checks that its ranks see that directory, and `<run_dir>/workers.json` records where they run.
    """
    device = resolved.world.device
    sharing = groups_per_pool(resolved)
    bundles = {pool: reserve_pool(pool, resolved.placement.pools[pool], sharing[pool], device) for pool in sharing}
    return WorkerGroupFactory(resolved, run_dir, sharing, bundles)


class WorkerGroupFactory:
    def __init__(self, resolved: ResolvedPlan, run_dir: Path | None, sharing: dict[str, int],
                 bundles: dict[str, list[tuple[Any, int]]]) -> None:
        self.resolved, self.run_dir, self.sharing, self.bundles = resolved, run_dir, sharing, bundles
        self.placed: dict[str, list[dict[str, Any]]] = {}
        self._spawned: dict[str, Any] = {}  # role -> a RayWorkerGroup spawned ahead of its call (not started)

    def _control(self, role: str) -> bool:
        """Partial rollouts interrupt the rollout pool's generation from the controller: its workers take signals."""
        return role == "rollout" and self.resolved.schedule.partial_rollout

    def _slots(self, role: str) -> tuple[str, float, float]:
        pool = self.resolved.placement.roles[GROUP_POOL_ROLE[role]]
        share = 1.0 / self.sharing[pool]
        cpus, gpus = (share, share) if self.resolved.world.device == "cuda" else (1, 0)
        return pool, cpus, gpus

    def spawn(self, worker_spec: type | tuple[str, str], role: str, world_size: int,
              preload: tuple[str, ...] = ()) -> None:
        """Start `role`'s worker processes now (they import the worker's module and `preload` meanwhile); the
        factory's call for that role then builds them instead of starting new ones."""
        from engine.workers.cluster.group import RayWorkerGroup

        if role in self._spawned:  # one group a role (the factory's call rebuilds it if it is not the one needed)
            return
        pool, cpus, gpus = self._slots(role)
        self._spawned[role] = RayWorkerGroup.spawned(worker_spec, role, world_size, cpus_per_worker=cpus,
                                                     gpus_per_worker=gpus, bundles=self.bundles[pool], preload=preload,
                                                     control=self._control(role))

    def __call__(self, worker_cls: type, role: str, world_size: int, **kwargs: Any) -> Any:
        from engine.workers.cluster.group import RayWorkerGroup

        pool, cpus, gpus = self._slots(role)
        group = self._spawned.pop(role, None)
        wanted = (worker_cls.__module__, worker_cls.__qualname__)
        if group is not None and (group.world_size != world_size or group.spec not in (worker_cls, wanted)):
            group.kill()  # not what was foreseen: its slots back first
            group = None
        if group is not None:
            group.start(**kwargs)
        else:
            group = RayWorkerGroup(worker_cls, role, world_size, cpus_per_worker=cpus, gpus_per_worker=gpus,
                                   bundles=self.bundles[pool], control=self._control(role), **kwargs)
        if self.run_dir is not None:
            self.placed[role] = [{"rank": rank, "pool": pool, "node_id": where.node_id, "node_ip": where.node_ip,
                                  "pid": where.pid, "gpu_ids": list(where.gpu_ids)}
                                 for rank, where in enumerate(group.locations)]
            (self.run_dir / WORKERS_FILE).write_text(json.dumps(self.placed, indent=2) + "\n")
            group.check_shared_dir(self.run_dir)
        return group


def reserve_pool(pool: str, view: PoolView, groups: int, device: str) -> list[tuple[Any, int]]:
    """One STRICT_PACK placement group per node of the pool; (placement group, bundle index) of each rank."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = slot_bundle(device, groups)
    per_node = [placement_group([bundle] * view.gpus_per_node, strategy="STRICT_PACK", name=f"rlconf-{pool}-node{i}")
                for i in range(view.nnodes)]
    deadline = time.monotonic() + PLACEMENT_READY_TIMEOUT_S
    try:
        for group in per_node:
            ray.get(group.ready(), timeout=max(0.0, deadline - time.monotonic()))
    except ray.exceptions.GetTimeoutError:
        for group in per_node:
            remove_placement_group(group)
        raise PlacementError(shortage_message(pool, view, groups, device)) from None
    return [(group, index) for group in per_node for index in range(view.gpus_per_node)]


def shortage_message(pool: str, view: PoolView, groups: int, device: str) -> str:
    import ray

    resource = "GPU" if device == "cuda" else "CPU"
    need = view.gpus_per_node * (1 if device == "cuda" else groups)
    nodes = [node["Resources"].get(resource, 0) for node in ray.nodes() if node.get("Alive")]
    have = ", ".join(f"{n:g}" for n in sorted(nodes, reverse=True)) or "none"
    what = "GPU(s)" if device == "cuda" else f"CPU(s) (one per worker process, {groups} worker group(s) sharing the pool)"
    return (f"pool `{pool}` needs {view.nnodes} node(s) with {need} {what} each ({view.gpus} slot(s) in all), but after "
            f"{PLACEMENT_READY_TIMEOUT_S:.0f}s Ray could not reserve them: the cluster has {sum(nodes):g} {resource}(s) "
            f"in all, per node {have}; lower trainer.n_gpus_per_node / trainer.nnodes or add nodes")
