"""The fully async schedule's producer (verl 0.9.1's experimental/fully_async_policy, FullyAsyncRollouter).

The rollout pool streams groups: `GroupStream.refill` hands it prompts a call at a time (`groups_per_call` groups,
every replica an equal share) and returns at once; Ray runs the calls in the rollout workers' processes one after
another while the trainer trains. Each call's groups come back with the weight version that generated them. The
trainer `take`s `groups_per_step` groups (verl's ppo_mini_batch_size × require_batches), waiting for them if the
pool is behind, and every `sync_every` steps (trigger_parameter_sync_step) the actor's weights are pushed.

The bound is verl's: at most `max_groups_per_version` groups are started under one weight version, counting those
still queued or generating when it was pushed (verl's staleness_samples, reset at each push to what is in flight).
So a group waits behind fewer than that many, and is trained at most `schedule.max_staleness` steps after its
weights (rlconf.normalize.fully_async_sizes). A group older than that is dropped, not trained, and counted
(verl's queue drops its oldest sample when full); with the bound kept above, none is.

No threads: the controller is the only caller, and the queue is the existing GenerationQueue of calls in flight.
A push waits for the calls queued before it (the rollout workers run calls in order). Without partial rollouts they
finish on the weights they began with. With them (verl's partial_rollout, the default) the push first interrupts
the pool: the call running and those queued behind it answer at once with what they sampled, the weights go over,
and each call's unfinished rows are sent back with their tokens to be finished on the new weights
(engine.rollout.partial), in the queue's order. A call keeps the version it started under: the staleness bound
counts from it, as the budget above counts the call among the groups in flight at the push (a call cut before
its first engine step has no tokens of that version: its staleness errs high, never low).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.batch import TensorBatch, concat
from engine.checkpoint import CheckpointError
from engine.controller.offpolicy import Generated, GenerationQueue, RolloutPool, load_pending, pending_state
from engine.controller.samples import StepInputs
from engine.rollout.base import add_backend_timings
from rlconf.resolved import ResolvedPlan


def split_groups(samples: StepInputs, groups: int, n: int) -> list[StepInputs]:
    """`samples` (n rows per group, groups contiguous) in pieces of `groups` groups."""
    rows = groups * n
    return [StepInputs({key: value[start:start + rows] for key, value in samples.prompts.items()},
                       samples.group_ids[start:start + rows], samples.data_sources[start:start + rows],
                       samples.ground_truths[start:start + rows], samples.extra_infos[start:start + rows],
                       samples.raw_prompts[start:start + rows])
            for start in range(0, len(samples.group_ids), rows)]


def merge(chunks: list[Generated]) -> tuple[StepInputs, TensorBatch]:
    """The trainer's batch: the taken calls' samples and rows, in the order they were generated."""
    samples = StepInputs(concat([g.samples.prompts for g in chunks]),
                         *([value for g in chunks for value in getattr(g.samples, name)]
                           for name in ("group_ids", "data_sources", "ground_truths", "extra_infos", "raw_prompts")))
    return samples, concat([g.rows for g in chunks])


class GroupStream:
    """The rollout pool as a stream of groups, bounded by verl's staleness rule."""

    def __init__(self, resolved: ResolvedPlan, pool: RolloutPool, draw: Callable[[int], StepInputs],
                 total_steps: int) -> None:
        sched = resolved.schedule
        self.pool, self.draw, self.n = pool, draw, resolved.roles.rollout.n
        self.partial = sched.partial_rollout
        self.per_step, self.per_call = sched.groups_per_step, sched.groups_per_call
        self.max_per_version, self.max_staleness, self.sync_every = (sched.max_groups_per_version,
                                                                      sched.max_staleness, sched.sync_every)
        self.total_groups = total_steps * self.per_step
        self.queue = GenerationQueue(self.max_per_version // self.per_call)
        self.unsubmitted: list[StepInputs] = []  # calls drawn from the data, not yet given to the pool
        self.started = 0  # groups started under the pool's weights, with those in flight when they were pushed
        self.drawn = 0  # prompt batches drawn from the data order (the group ids' base)
        self.trained = 0  # groups the trainer took and trained
        self.dropped = 0  # groups taken too stale to train
        self._drained = False  # drain() ran since the last push

    def queued(self) -> int:
        """Groups given to the pool and not yet taken (generating, or generated and waiting)."""
        return len(self.queue) * self.per_call

    def refill(self) -> None:
        """Start calls while the version's budget allows and the run still needs groups."""
        while (self.started + self.per_call <= self.max_per_version
               and self.trained + self.queued() < self.total_groups):
            if not self.unsubmitted:
                self.drawn += 1
                self.unsubmitted = split_groups(self.draw(self.drawn), self.per_call, self.n)
            self.queue.put(self.pool.submit(self.unsubmitted.pop(0)))
            self.started += self.per_call

    def drain(self) -> None:
        """Before a push: wait for the calls queued (with partial rollouts: cut them off first, so they answer at
        once). The trainer times it apart from the push: it is the trainer waiting for the pool, not weights moving."""
        # The push is a collective with every rollout rank, which takes it only after the calls queued before it:
        # wait for those here, so the actor never sits inside the broadcast (under its timeout) while they run.
        if self.partial:
            self.pool.interrupt()  # ... which then answer at once, with the rows cut off where they were
        self.queue.complete()
        self._drained = True

    def push(self, actor: Any, version: int) -> float:
        """The actor's weights (`version`) to the pool, after the calls queued before (drain, unless the caller
        did); the new version's budget counts what is still in flight, as verl's reset_staleness does. Returns
        seconds."""
        if not self._drained:
            self.drain()
        self._drained = False
        seconds = self.pool.push(actor, version)
        if self.partial:
            self.queue.resume(self.pool.resume)
        self.started = self.queued()
        return seconds

    def sync_due(self, step: int) -> int | None:
        """The version to push before `step` trains: after a resume (the pool's weights are unknown) the actor's,
        else the last multiple of sync_every the pool lacks; None: no push."""
        if self.pool.version is None:
            return step - 1
        due = (step - 1) // self.sync_every * self.sync_every
        return due if self.pool.version < due else None

    def take(self, step: int) -> list[Generated]:
        """groups_per_step groups for `step`, which trains the weights of version step − 1, oldest first; a call
        whose weights are more than max_staleness versions older is dropped (counted), and the next one taken."""
        taken: list[Generated] = []
        while len(taken) * self.per_call < self.per_step:
            if not self.queue:
                self.refill()
                if not self.queue:
                    raise RuntimeError(
                        f"step {step} needs {self.per_step - len(taken) * self.per_call} more groups, but the rollout "
                        f"pool may start none: {self.started} of {self.max_per_version} groups started under weight "
                        f"version {self.pool.version} ({self.dropped} dropped as too stale so far)")
            generated = self.queue.take()
            if generated.unfinished is not None and bool(generated.unfinished.any()):
                raise RuntimeError(f"step {step} took a batch with rows a weight push cut off and nobody resumed")
            if step - 1 - generated.version > self.max_staleness:
                self.dropped += self.per_call
                continue
            taken.append(generated)
        self.trained += self.per_step
        return taken

    # --- checkpoints ------------------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        return {"started": self.started, "drawn": self.drawn, "trained": self.trained, "dropped": self.dropped,
                "groups_per_call": self.per_call}

    def file_state(self) -> dict[str, Any]:
        """Everything given to the pool, generated (the checkpoint waits for it), and the calls not yet given."""
        state = pending_state(self.queue.complete())
        state["unsubmitted"] = pending_state([Generated(s, {}, -1, 0.0, 0.0) for s in self.unsubmitted])["batches"]
        return state

    def load(self, counters: dict[str, int], state: dict[str, Any] | None) -> None:
        calls = [] if state is None else load_pending(state)
        unsubmitted = [] if state is None else [g.samples for g in load_pending({"batches": state.get("unsubmitted", [])})]
        # The calls in flight at the checkpoint are whole calls of the plan that wrote it; the queue, the budget
        # and `take` count this plan's. A different call size (concurrent_samples_per_replica, the rollout GPUs)
        # would make steps of the wrong size: refused, not regrouped (calls of different weight versions cannot
        # be merged).
        rows = self.per_call * self.n
        sizes = sorted({len(samples.group_ids) for samples in [*(g.samples for g in calls), *unsubmitted]})
        saved_per_call = int(counters.get("groups_per_call", self.per_call))
        if saved_per_call != self.per_call or any(size != rows for size in sizes):
            found = (f"calls of {saved_per_call} groups" if saved_per_call != self.per_call
                     else f"calls of {', '.join(str(size) for size in sizes)} samples")
            raise CheckpointError(
                f"the checkpoint's rollout pool had {found} in flight, and this plan generates calls of "
                f"{self.per_call} groups ({rows} samples): resume with the async_training.concurrent_samples_per_"
                f"replica and rollout GPUs of the run that wrote it (they may change in a new run)")
        self.started, self.drawn = int(counters["started"]), int(counters["drawn"])
        self.trained, self.dropped = int(counters["trained"]), int(counters["dropped"])
        self.queue = GenerationQueue(self.queue.capacity)
        for generated in calls:
            self.queue.put(generated)
        self.unsubmitted = unsubmitted


def backend_per_rank(taken: list[Generated]) -> list[dict[str, float]]:
    """Each rollout rank's backend timings summed over the step's calls (what rollout_backend_metrics reads)."""
    per_rank: list[dict[str, float]] = []
    for generated in taken:
        for rank, timings in enumerate(generated.backend):
            if rank == len(per_rank):
                per_rank.append({})
            per_rank[rank] = add_backend_timings(per_rank[rank], timings)
    return per_rank


def staleness_metrics(step: int, taken: list[Generated], stream: GroupStream) -> dict[str, float]:
    """offpolicy/*: the versions that generated the step's groups and how far behind the trained weights they are."""
    versions = [g.version for g in taken]
    behind = [step - 1 - v for v in versions]
    return {
        "offpolicy/generation_version_min": min(versions),
        "offpolicy/generation_version_max": max(g.newest_version for g in taken),
        "offpolicy/staleness_min": min(behind),
        "offpolicy/staleness_mean": sum(behind) / len(behind),
        "offpolicy/staleness_max": max(behind),
        "offpolicy/weight_version": stream.pool.version,
        "offpolicy/queued_groups": stream.queued(),
        "offpolicy/dropped_stale_groups": stream.dropped,
        **({"offpolicy/resumed_samples": sum(g.resumed_rows for g in taken)} if stream.partial else {}),
        "timing/rollout_idle": sum(g.idle_seconds for g in taken),
        "timing/rollout_generate": sum(g.generate_seconds for g in taken),
    }

