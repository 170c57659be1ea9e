"""A group of Ray actors, one per device slot, that run the same method on their shard of a batch.

Results are collected as they finish, and the first failure is raised at once as a
WorkerFailure naming the role and rank, instead of waiting for the remaining ranks: those are
usually blocked in a collective with the dead one and would only time out much later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray

from engine.workers.failure import WorkerFailure, free_port


class RayWorkerGroup:
    def __init__(self, worker_cls: type, role: str, world_size: int, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, placement_group: Any = None, **worker_kwargs: Any) -> None:
        """`placement_group`: rank r runs in its bundle r (engine.workers.placement: one GPU a bundle)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.role, self.world_size = role, world_size
        remote_cls = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=0)(worker_cls)
        port = free_port()
        self.workers = []
        for rank in range(world_size):
            options = {} if placement_group is None else {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group, placement_group_bundle_index=rank)}
            self.workers.append(remote_cls.options(**options).remote(
                rank=rank, world_size=world_size, master_port=port, num_threads=max(1, int(cpus_per_worker)),
                **worker_kwargs))

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """Every rank runs `method(*args)`."""
        return self._gather([getattr(w, method).remote(*args) for w in self.workers])

    def call_sharded(self, method: str, shards: Sequence[Any]) -> list[Any]:
        """Rank r runs `method(shards[r])`."""
        if len(shards) != self.world_size:
            raise ValueError(f"{len(shards)} shards for {self.world_size} {self.role} workers")
        return self._gather([getattr(w, method).remote(s) for w, s in zip(self.workers, shards)])

    def _gather(self, refs: list[ray.ObjectRef]) -> list[Any]:
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except (ray.exceptions.RayError, Exception) as exc:
                    raise WorkerFailure(self.role, rank_of[ref], exc) from exc
        return [results[rank] for rank in range(len(refs))]

    def kill(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
