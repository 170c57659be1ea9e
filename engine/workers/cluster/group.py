"""A group of Ray actors, one per device slot, that run the same method on their shard of a batch.

Results are collected as they finish, and the first failure is raised at once as a
WorkerFailure naming the role, rank and node, instead of waiting for the remaining ranks: those
are usually blocked in a collective with the dead one and would only time out much later.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from engine.workers.cluster.rendezvous import (
    SharedDirError,
    WorkerLocation,
    meet_at,
    open_rendezvous,
    probe_shared_dir,
    where_am_i,
    write_probe,
)
from engine.workers.cluster.failure import WorkerFailure
from engine.workers.cluster.lazy import LazyWorker, build, invoke, spec_name

DEATH_NOTICE_S = 10.0  # how long a failure waits for Ray to report a dead peer (node lost, process killed)


CONTROL = "control"  # the concurrency group of `signal_all`: a thread of its own beside the worker's calls


class RayWorkerGroup:
    def __init__(self, worker_cls: type | tuple[str, str], role: str, world_size: int, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, bundles: Sequence[tuple[Any, int]] | None = None,
                 control: bool = False, **worker_kwargs: Any) -> None:
        """`bundles`: rank r runs in (placement group, bundle index) `bundles[r]` (engine.workers.cluster.placement);
        `worker_cls`: the class, or its (module, qualified name), imported in the workers only (engine.workers.
        cluster.lazy).

        Returns once every rank is placed, built with `worker_kwargs` and knows where the group meets: rank
        0's node, on a port rank 0 opened there (engine.workers.cluster.rendezvous); `init_model` then joins
        the process group. `spawn` + `start` do the same in two halves. `control`: the workers also take
        `signal_all` calls while they run others (a second thread; off, every call runs in the actor's one thread).
        """
        self.spawn(worker_cls, role, world_size, cpus_per_worker, gpus_per_worker, bundles, control=control)
        self.start(**worker_kwargs)

    @classmethod
    def spawned(cls, worker_cls: type | tuple[str, str], role: str, world_size: int, cpus_per_worker: float = 1,
                gpus_per_worker: float = 0, bundles: Sequence[tuple[Any, int]] | None = None,
                preload: tuple[str, ...] = (), control: bool = False) -> RayWorkerGroup:
        """The workers' processes asked for (they import the worker's module, and `preload`, meanwhile); `start`
        builds them."""
        group = cls.__new__(cls)
        group.spawn(worker_cls, role, world_size, cpus_per_worker, gpus_per_worker, bundles, preload, control)
        return group

    def spawn(self, worker_cls: type | tuple[str, str], role: str, world_size: int, cpus_per_worker: float,
              gpus_per_worker: float, bundles: Sequence[tuple[Any, int]] | None, preload: tuple[str, ...] = (),
              control: bool = False) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.role, self.world_size, self.spec = role, world_size, worker_cls
        self.num_threads = max(1, int(cpus_per_worker))
        self.class_name = spec_name(worker_cls)
        # Named after the worker: Ray prefixes the workers' console lines with it ("(ActorRolloutRefWorker pid=…)").
        actor_cls = type(self.class_name, (LazyWorker,), {"__module__": LazyWorker.__module__})
        # With `control`, Ray runs the worker's calls in one thread and signal_all's in another ("control"), so a
        # signal reaches a worker in the middle of a long call (partial rollouts: a push interrupts a generation).
        groups = {"concurrency_groups": {CONTROL: 1}} if control else {}
        self.control = control
        remote_cls = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=0, **groups)(actor_cls)
        self.workers = []
        for rank in range(world_size):
            options = {} if bundles is None else {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                bundles[rank][0], placement_group_bundle_index=bundles[rank][1])}
            self.workers.append(remote_cls.options(**options).remote(worker_cls, preload))
        self.locations: list[WorkerLocation | None] = [None] * world_size

    def start(self, **worker_kwargs: Any) -> None:
        """Wait for the spawned ranks, build each worker (rank, world_size and num_threads added to `worker_kwargs`),
        and meet at rank 0's rendezvous."""
        self.locations = self._gather([w.__ray_call__.remote(where_am_i) for w in self.workers])
        self._gather([w.__ray_call__.remote(build, {**worker_kwargs, "rank": rank, "world_size": self.world_size,
                                                    "num_threads": self.num_threads})
                      for rank, w in enumerate(self.workers)])
        master_addr = self.locations[0].node_ip
        (master_port,) = self._gather([self.workers[0].__ray_call__.remote(open_rendezvous, master_addr)])
        self._gather([w.__ray_call__.remote(meet_at, rank, self.world_size, master_addr, master_port, where.node_ip)
                      for rank, (w, where) in enumerate(zip(self.workers, self.locations))])

    def check_shared_dir(self, run_dir: Path) -> None:
        """Every rank reads a file the controller wrote into `run_dir` and writes one the controller reads back."""
        probe, token = write_probe(run_dir)
        replies = [probe.with_name(f"{probe.name}-{self.role}-{rank}") for rank in range(self.world_size)]
        try:
            problems = self._gather([w.__ray_call__.remote(probe_shared_dir, str(probe), token, str(reply))
                                     for w, reply in zip(self.workers, replies)])
            for rank, problem in enumerate(problems):
                if problem is None and not (replies[rank].is_file() and replies[rank].read_text() == token):
                    problem = f"writes {replies[rank]}, but the controller does not see it"
                if problem is not None:
                    raise SharedDirError(
                        f"the run directory {run_dir} must be on storage every node sees (workers write checkpoints "
                        f"into it): {self.role} rank {rank} on node {self.locations[rank].describe()} {problem}; "
                        "pass --run-dir on a shared file system (NFS, ...) mounted at the same path on every node")
        finally:
            for path in (probe, *replies):
                path.unlink(missing_ok=True)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """Every rank runs `method(*args)`."""
        return self._gather(self.submit_all(method, *args))

    def call_sharded(self, method: str, shards: Sequence[Any]) -> list[Any]:
        """Rank r runs `method(shards[r])`."""
        if len(shards) != self.world_size:
            raise ValueError(f"{len(shards)} shards for {self.world_size} {self.role} workers")
        return self._gather(self.submit_sharded(method, shards))

    def submit_all(self, method: str, *args: Any) -> list[ray.ObjectRef]:
        """As call_all, without waiting: the ranks run `method` while the caller goes on (collect() waits)."""
        return [self._call(w, method).remote(invoke, method, *args) for w in self.workers]

    def submit_sharded(self, method: str, shards: Sequence[Any]) -> list[ray.ObjectRef]:
        """As call_sharded, without waiting (collect() waits)."""
        if len(shards) != self.world_size:
            raise ValueError(f"{len(shards)} shards for {self.world_size} {self.role} workers")
        return [self._call(w, method).remote(invoke, method, s) for w, s in zip(self.workers, shards)]

    def submit_streamed(self, method: str, shards: Sequence[Any], *args: Any) -> list[Any]:
        """Rank r runs the generator `method(shards[r], *args)`; each thing it yields reaches the controller as soon
        as it is yielded (Ray's streaming generators): one stream per rank, read with `next_from`."""
        if len(shards) != self.world_size:
            raise ValueError(f"{len(shards)} shards for {self.world_size} {self.role} workers")
        return [w.stream_call.options(name=f"{self.class_name}.{method}", num_returns="streaming")
                .remote(method, s, *args) for w, s in zip(self.workers, shards)]

    @staticmethod
    def first_ready(streams: list[Any]) -> int:
        """The index of a stream (submit_streamed) whose next answer, or end, is there; waits for one."""
        ready, _ = ray.wait(list(streams), num_returns=1)
        return next(i for i, stream in enumerate(streams) if stream is ready[0])

    def next_from(self, rank: int, stream: Any) -> Any:
        """What rank `rank`'s `stream` (submit_streamed) yields next, waiting for it; StopIteration once it ended. A
        failed rank raises WorkerFailure, as `collect` does."""
        try:
            ref = next(stream)
            return ray.get(ref)
        except StopIteration:
            raise
        except (ray.exceptions.RayError, Exception) as exc:
            where = self.locations[rank]
            raise WorkerFailure(self.role, rank, exc, where.describe() if where else "") from exc

    def signal_all(self, method: str, *args: Any) -> list[Any]:
        """Every rank runs `method(*args)` in its control thread, beside the call it may be running (the group must
        have been spawned with `control`); returns once every rank has."""
        if not self.control:
            raise RuntimeError(f"{self.role} workers were started without a control thread: {method} would wait for "
                               "the calls before it")
        return self._gather([w.__ray_call__.options(name=f"{self.class_name}.{method}", concurrency_group=CONTROL)
                             .remote(invoke, method, *args) for w in self.workers])

    def submit_to(self, rank: int, method: str, *args: Any) -> list[ray.ObjectRef]:
        """Rank `rank` alone runs `method(*args)`, without waiting (collect() waits)."""
        return [self._call(self.workers[rank], method).remote(invoke, method, *args)]

    def _call(self, worker: Any, method: str) -> Any:
        """The actor's `__ray_call__`, its task named after the worker's method (process titles, Ray's dashboard and
        timeline, tracebacks: `ActorRolloutRefWorker.generate`, not `__ray_call__`)."""
        return worker.__ray_call__.options(name=f"{self.class_name}.{method}")

    def collect(self, refs: list[ray.ObjectRef]) -> list[Any]:
        """The results of submitted calls, in rank order; a failed rank raises WorkerFailure as call_all does."""
        return self._gather(refs)

    def rendezvous_on_rank0(self) -> tuple[str, int]:
        """A port opened on rank 0's node for another group to meet at (engine.workers.cluster.weight_sync)."""
        address = self.locations[0].node_ip
        (port,) = self._gather([self.workers[0].__ray_call__.remote(open_rendezvous, address)])
        return address, port

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
                    rank, cause = self._root_failure(rank_of[ref], exc, pending, rank_of)
                    where = self.locations[rank]
                    raise WorkerFailure(self.role, rank, cause, where.describe() if where else "") from cause
        return [results[rank] for rank in range(len(refs))]

    def _root_failure(self, rank: int, exc: BaseException, pending: list[ray.ObjectRef],
                      rank_of: dict[ray.ObjectRef, int]) -> tuple[int, BaseException]:
        """The rank to blame: when a node or process is lost, its peers' collectives fail too, often first
        (gloo: connection reset); a rank whose actor died within DEATH_NOTICE_S is the cause."""
        if isinstance(exc, ray.exceptions.RayActorError) or not pending:
            return rank, exc
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_NOTICE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as died:
                return rank_of[ref], died
            except Exception:  # another rank's own error: keep looking for a dead one
                continue
        return rank, exc

    def kill(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)


def collect_together(*calls: tuple[RayWorkerGroup, list[ray.ObjectRef]]) -> list[list[Any]]:
    """The results of calls submitted to several groups that wait on one another (a collective spanning them),
    per group in rank order. The first failure in any group raises (as that group's `collect` names it): waiting
    on one group first would sit out its collective's timeout when the failing rank is in the other."""
    owner = {ref: (group, refs) for group, refs in calls for ref in refs}
    pending = list(owner)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            try:
                ray.get(ref)
            except (ray.exceptions.RayError, Exception):
                group, refs = owner[ref]
                group.collect(refs)  # raises WorkerFailure for the rank to blame
                raise
    return [group.collect(refs) for group, refs in calls]
