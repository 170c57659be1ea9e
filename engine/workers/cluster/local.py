"""An in-process stand-in for RayWorkerGroup with one rank: the single-process debug path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.workers.cluster.failure import WorkerFailure


class LocalWorkerGroup:
    def __init__(self, worker_cls: type, role: str, world_size: int, **worker_kwargs: Any) -> None:
        if world_size != 1:
            raise ValueError(f"LocalWorkerGroup runs one rank in this process, not {world_size}")
        self.role, self.world_size = role, 1
        from engine.workers.cluster.device import listen_for_rendezvous, set_rendezvous_env

        set_rendezvous_env(0, 1, "127.0.0.1", listen_for_rendezvous("127.0.0.1"), "127.0.0.1")
        self.worker = worker_cls(rank=0, world_size=1, **worker_kwargs)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return [self._call(method, *args)]

    def call_sharded(self, method: str, shards: Sequence[Any]) -> list[Any]:
        (shard,) = shards
        return [self._call(method, shard)]

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.worker, method)(*args)
        except Exception as exc:
            raise WorkerFailure(self.role, 0, exc) from exc

    def kill(self) -> None:
        self.worker.shutdown()
