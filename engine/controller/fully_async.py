"""The fully async schedule's producer (verl 0.9.1's experimental/fully_async_policy, FullyAsyncRollouter).

The rollout pool streams groups: `GroupStream.refill` hands it, in one call, the groups the version's budget allows
(every replica a run of whole groups, as even as the count allows) and returns at once. Each replica keeps at most
`concurrent_samples_per_replica` groups in its engine (verl's concurrent requests per replica) and answers each
group the moment its last response ends (RolloutWorker.generate_streamed, a Ray streaming generator; on vLLM the
next group joins the running batch then), tagged with the weight version that generated it. The trainer `take`s
`groups_per_step` groups (verl's ppo_mini_batch_size × require_batches), the oldest call's first, each as soon as it
is finished, waiting if the pool is behind; and every `sync_every` steps (trigger_parameter_sync_step) the actor's
weights are pushed.

The bound is verl's: at most `max_groups_per_version` groups are started under one weight version, counting those
still queued or generating when it was pushed (verl's staleness_samples, reset at each push to what is in flight).
So a group waits behind fewer than that many, and is trained at most `schedule.max_staleness` steps after its
weights (rlconf.normalize.fully_async_sizes). A group older than that is dropped, not trained, and counted
(verl's queue drops its oldest sample when full); with the bound kept above, none is.

No threads: the controller is the only caller, and the queue (`GroupQueue`) holds the calls in flight and the groups
not yet trained. A push waits for the calls queued before it (the rollout workers run calls in order). Without
partial rollouts they finish on the weights they began with. With them (verl's partial_rollout, the default) the
push first interrupts the pool: the call running answers at once with every group not finished, cut where it was,
and so do the calls queued behind it; the weights go over, and the unfinished rows are sent back with their tokens
to be finished on the new weights (engine.rollout.partial), in the queue's order. A call keeps the version it
started under: the staleness bound counts from it, as the budget above counts the call among the groups in flight
at the push (a group cut before its first engine step has no tokens of that version: its staleness errs high,
never low).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from engine.batch import TensorBatch, concat, select
from engine.controller.offpolicy import (Generated, GenerationQueue, Resumed, RolloutPool, load_pending,
                                         pending_state)
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
    """The trainer's batch: the taken groups' samples and rows, in the order they were taken."""
    return join_samples([g.samples for g in chunks]), concat([g.rows for g in chunks])


def rows_of_groups(samples: StepInputs, groups: list[int], n: int) -> StepInputs:
    """The samples of `groups` (indices of n-row groups in `samples`), in that order."""
    rows = [group * n + i for group in groups for i in range(n)]
    index = torch.tensor(rows, dtype=torch.long)
    return StepInputs({key: value[index] for key, value in samples.prompts.items()},
                      *([values[row] for row in rows] if values else []
                        for values in (samples.group_ids, samples.data_sources, samples.ground_truths,
                                       samples.extra_infos, samples.raw_prompts)))


def join_samples(pieces: list[StepInputs]) -> StepInputs:
    """Samples of whole groups one after another (a call's, drawn apart; a step's, taken apart), in order."""
    return StepInputs(concat([piece.prompts for piece in pieces]),
                      *([value for piece in pieces for value in getattr(piece, name)]
                        for name in ("group_ids", "data_sources", "ground_truths", "extra_infos", "raw_prompts")))


def groups_in(generated: Generated, n: int) -> int:
    return len(generated.samples.group_ids) // n


def split_generated(generated: Generated, groups: int, n: int) -> tuple[Generated, Generated]:
    """Its first `groups` groups and the rest. The call's own account (seconds, backend timings) goes with the
    first part, so a step that takes either counts it once."""
    cut, total = groups * n, groups_in(generated, n)

    def part(rows: slice, chosen: range, first: bool) -> Generated:
        return Generated(
            rows_of_groups(generated.samples, list(chosen), n),
            {key: value[rows] for key, value in generated.rows.items()}, generated.version,
            generated.generate_seconds if first else 0.0, generated.idle_seconds if first else 0.0,
            generated.backend if first else [],
            *(None if value is None else value[rows] for value in (generated.generated_tokens, generated.unfinished)),
            generated.last_version, None if generated.resumed is None else generated.resumed[rows], generated.replica)

    return part(slice(0, cut), range(groups), True), part(slice(cut, None), range(groups, total), False)


class StreamedCall:
    """A call the pool generates group by group (RolloutWorker.generate_streamed on every rank): each replica's
    groups come back as they finish, whichever replica finishes first. `next_chunk` hands them out, each with the
    seconds its replica spent on it (since its previous answer) and, for a replica's first, the idle time before
    the call; the replicas' backend timings go with the call's last chunk, once."""

    def __init__(self, group: Any, samples: StepInputs, streams: list[Any], shares: list[list[int]],
                 tensor_parallel_size: int, n: int) -> None:
        self.group, self.samples, self.n, self.tp = group, samples, n, tensor_parallel_size
        self.shares = shares  # replica -> the call's group indices it generates, in its own order
        self.streams = streams  # one per rank; rank r belongs to replica r // tp, whose leader is rank r // tp × tp
        self.open = set(range(len(shares)))  # replicas whose leader's stream has not ended
        # the other ranks of a tensor-parallel replica answer the same groups: read and dropped as they come, so a
        # failed one is seen at once (its leader would wait in a collective with it and never answer)
        self.followers = {rank for rank in range(len(streams)) if rank % tensor_parallel_size}
        self.unread = sum(len(share) for share in shares)  # groups not yet read from any stream
        self.pending: deque[Generated] = deque()  # read, not yet handed out
        self.accounts: dict[int, dict[str, Any]] = {}  # replica -> its last answer (its backend timings)
        self.accounted = False  # the accounts went out with the call's last chunk

    def groups_left(self) -> int:
        return self.unread + sum(groups_in(g, self.n) for g in self.pending)

    def next_chunk(self) -> Generated | None:
        """The next finished groups, waiting for them; None once every group was handed out."""
        while not self.pending and self.unread:
            self._read()
        if not self.pending:
            return None
        chunk = self.pending.popleft()
        if not self.pending and not self.unread and not self.accounted:  # the last chunk: with the accounts
            while self.open or self.followers:
                self._read()
            chunk = self._with_accounts(chunk)
            self.accounted = True
        return chunk

    def materialize(self) -> list[Generated]:
        """Every group not yet handed out, waiting for all of them (a checkpoint, a weight push)."""
        out = []
        while (chunk := self.next_chunk()) is not None:
            out.append(chunk)
        return out

    def _read(self) -> None:
        """One answer from whichever open stream has one first: a leader's is kept, a follower's dropped."""
        ranks = [replica * self.tp for replica in sorted(self.open)] + sorted(self.followers)
        rank = ranks[self.group.first_ready([self.streams[rank] for rank in ranks])]
        replica = rank // self.tp
        try:
            answer = self.group.next_from(rank, self.streams[rank])
        except StopIteration:
            if rank in self.followers:
                self.followers.discard(rank)
                return
            raise RuntimeError(f"rollout replica {replica} ended a streamed call without its account") from None
        if rank in self.followers:
            return
        if answer.get("done"):
            self.accounts[replica] = answer
            self.open.discard(replica)
            if self.unread and not self.open:
                raise RuntimeError(f"rollout replicas ended a streamed call with {self.unread} of its groups unanswered")
            return
        groups = [self.shares[replica][group] for group in answer["groups"]]
        self.unread -= len(groups)
        partial = {key: answer[key] for key in ("generated_tokens", "unfinished") if key in answer}
        self.pending.append(Generated(rows_of_groups(self.samples, groups, self.n), answer["rows"],
                                      answer["version"], answer["generate_seconds"], answer["idle_seconds"], [],
                                      replica=replica, **partial))

    def _with_accounts(self, chunk: Generated) -> Generated:
        accounts = [self.accounts[replica] for replica in sorted(self.accounts)]
        versions = {a["version"] for a in accounts} | {chunk.version}
        if len(versions) != 1:
            raise RuntimeError(f"rollout replicas generated one call with different weight versions {sorted(versions)}")
        backend = []  # per rank, as the one-step schedule reports them: the leaders' (a follower's are the same)
        for replica, account in zip(sorted(self.accounts), accounts):
            backend += [{} for _ in range(replica * self.tp - len(backend))]
            backend.append(account.get("backend", {}))
        return dataclasses.replace(chunk, backend=backend)


class GroupQueue(GenerationQueue):
    """The fully async queue: streamed calls (and, after a push or a resume, their generated chunks), handed to the
    trainer a few whole groups at a time."""

    def __init__(self, capacity: int, n: int) -> None:
        super().__init__(capacity)
        self.n = n

    def groups(self) -> int:
        """Groups in the queue, generating or generated."""
        return sum(item.groups_left() if isinstance(item, StreamedCall)
                   else groups_in(item.cut if isinstance(item, Resumed) else item, self.n) for item in self._items)

    def take_groups(self, most: int) -> Generated | None:
        """Up to `most` whole groups from the oldest item, as soon as it has some finished (a streamed call: its
        next finished ones); the rest of a larger chunk stays at the head. None: the queue ran empty."""
        while self._items:
            head = self._items[0]
            if isinstance(head, StreamedCall):
                chunk = head.next_chunk()
                if chunk is None:
                    self._items.popleft()
                    continue
            else:
                chunk = self.take()
            if groups_in(chunk, self.n) > most:
                chunk, rest = split_generated(chunk, most, self.n)
                if isinstance(head, StreamedCall):
                    head.pending.appendleft(rest)
                else:
                    self._items.appendleft(rest)
            if isinstance(head, StreamedCall) and not head.groups_left():
                self._items.popleft()  # handed out whole: the next refill's call is the head
            return chunk
        return None

    def complete(self) -> list[Generated]:
        """Wait for everything in flight; each streamed call becomes its chunks, still queued (in order)."""
        done: list[Generated] = []
        for item in self._items:
            if isinstance(item, StreamedCall):
                done += item.materialize()
            else:
                done.append(item if isinstance(item, Generated) else item.result())
        self._items = deque(done)
        return done


class StreamingPool(RolloutPool):
    """The rollout pool of the fully async schedule: the one-step pool's weights and interrupts, and calls that
    stream their groups."""

    def stream(self, samples: StepInputs, window: int) -> Any:
        """Start generating `samples` (whole groups of rollout.n rows) as one streamed call (the fully async
        schedule): every replica a run of whole groups, at most `window` of them in its engine at once;
        returns at once a StreamedCall, which hands the groups out as they finish."""
        rollout = self.resolved.roles.rollout
        groups = len(samples.group_ids) // rollout.n
        # runs of whole groups, as even as the count allows (they differ by one at most); a replica may get none
        shares = [share.tolist() for share in torch.tensor_split(torch.arange(groups), rollout.replicas)]
        prompts = [select(samples.prompts, slice(share[0] * rollout.n, (share[-1] + 1) * rollout.n)) if share
                   else {key: value[:0] for key, value in samples.prompts.items()} for share in shares]
        per_rank = [prompts[rank // rollout.tensor_parallel_size] for rank in range(self.group.world_size)]
        streams = self.group.submit_streamed("generate_streamed", per_rank, window)
        return StreamedCall(self.group, samples, streams, shares, rollout.tensor_parallel_size, rollout.n)


class GroupStream:
    """The rollout pool as a stream of groups, bounded by verl's staleness rule."""

    def __init__(self, resolved: ResolvedPlan, pool: RolloutPool, draw: Callable[[int], StepInputs],
                 total_steps: int) -> None:
        sched = resolved.schedule
        self.pool, self.draw, self.n = pool, draw, resolved.roles.rollout.n
        self.log_probs = resolved.roles.rollout.log_probs  # what a checkpoint's generated rows must carry
        self.partial = sched.partial_rollout
        self.per_step = sched.groups_per_step
        self.max_per_version, self.max_staleness, self.sync_every = (sched.max_groups_per_version,
                                                                      sched.max_staleness, sched.sync_every)
        self.window = sched.replica_window  # verl's concurrent requests per replica: groups in its engine at once
        self.total_groups = total_steps * self.per_step
        self.queue = GroupQueue(self.max_per_version, self.n)
        self.unsubmitted: list[StepInputs] = []  # groups drawn from the data, not yet given to the pool (one each)
        self.started = 0  # groups started under the pool's weights, with those in flight when they were pushed
        self.drawn = 0  # prompt batches drawn from the data order (the group ids' base)
        self.trained = 0  # groups the trainer took and trained
        self.dropped = 0  # groups taken too stale to train
        self._drained = False  # drain() ran since the last push

    def queued(self) -> int:
        """Groups given to the pool and not yet taken (generating, or generated and waiting)."""
        return self.queue.groups()

    def refill(self) -> None:
        """Give the pool, in one streamed call, every group the version's budget allows and the run still needs."""
        count = min(self.max_per_version - self.started, self.total_groups - self.trained - self.queued())
        if count <= 0:
            return
        while len(self.unsubmitted) < count:
            self.drawn += 1
            self.unsubmitted += split_groups(self.draw(self.drawn), 1, self.n)
        call, self.unsubmitted = self.unsubmitted[:count], self.unsubmitted[count:]
        self.queue.put(self.pool.stream(join_samples(call), self.window))
        self.started += count

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
        """groups_per_step groups for `step`, which trains the weights of version step − 1: the oldest call's groups
        first, each as soon as it is finished; groups whose weights are more than max_staleness versions older are
        dropped (counted), and others taken instead."""
        taken: list[Generated] = []
        need = self.per_step
        while need:
            if not self.queue.groups():
                self.refill()
            chunk = self.queue.take_groups(need)
            if chunk is None:
                raise RuntimeError(
                    f"step {step} needs {need} more groups, but the rollout pool may start none: {self.started} of "
                    f"{self.max_per_version} groups started under weight version {self.pool.version} ({self.dropped} "
                    f"dropped as too stale so far)")
            if chunk.unfinished is not None and bool(chunk.unfinished.any()):
                raise RuntimeError(f"step {step} took a batch with rows a weight push cut off and nobody resumed")
            if step - 1 - chunk.version > self.max_staleness:
                # no longer in flight: its place in the version's budget goes to a group started now (a checkpoint
                # of a looser bound, resumed with a tighter one, would otherwise leave the step short for good)
                self.dropped += groups_in(chunk, self.n)
                self.started = max(0, self.started - groups_in(chunk, self.n))
                continue
            taken.append(chunk)
            need -= groups_in(chunk, self.n)
        self.trained += self.per_step
        return taken

    # --- checkpoints ------------------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        return {"started": self.started, "drawn": self.drawn, "trained": self.trained, "dropped": self.dropped}

    def file_state(self) -> dict[str, Any]:
        """Everything given to the pool, generated (the checkpoint waits for it), and the calls not yet given."""
        state = pending_state(self.queue.complete())
        state["unsubmitted"] = pending_state([Generated(s, {}, -1, 0.0, 0.0) for s in self.unsubmitted])["batches"]
        return state

    def load(self, counters: dict[str, int], state: dict[str, Any] | None) -> None:
        """The counters and queue of a checkpoint. What was in flight is whole groups, taken a few at a time, so a
        plan with another concurrent_samples_per_replica or another rollout pool resumes it as it is."""
        chunks = [] if state is None else load_pending(state, self.log_probs)
        unsubmitted = [] if state is None else [g.samples for g in load_pending({"batches": state.get("unsubmitted", [])})]
        self.started, self.drawn = int(counters["started"]), int(counters["drawn"])
        self.trained, self.dropped = int(counters["trained"]), int(counters["dropped"])
        self.queue = GroupQueue(max(self.queue.capacity, len(chunks)), self.n)
        for generated in chunks:
            self.queue.put(generated)
        # one group each, as `refill` draws them (a checkpoint of calls drawn whole has several in a piece)
        self.unsubmitted = [group for piece in unsubmitted for group in split_groups(piece, 1, self.n)]


def backend_per_rank(taken: list[Generated]) -> list[dict[str, float]]:
    """Each rollout rank's backend timings summed over the step's calls (what rollout_backend_metrics reads)."""
    per_rank: list[dict[str, float]] = []
    for generated in taken:
        for rank, timings in enumerate(generated.backend):
            if rank == len(per_rank):
                per_rank.append({})
            per_rank[rank] = add_backend_timings(per_rank[rank], timings)
    return per_rank


def slowest_replica(taken: list[Generated], field: str) -> float:
    """A step's seconds of one kind (generating, idle), the slowest replica's: each replica's chunks add up (they
    came one after another), the replicas ran side by side."""
    per_replica: dict[int, float] = {}
    for generated in taken:
        per_replica[generated.replica] = per_replica.get(generated.replica, 0.0) + getattr(generated, field)
    return max(per_replica.values())


def staleness_metrics(step: int, taken: list[Generated], stream: GroupStream) -> dict[str, float]:
    """offpolicy/*: the versions that generated the step's groups and how far behind the trained weights they are."""
    versions = [g.version for g in taken]
    behind = [step - 1 - v for v in versions]
    groups = [groups_in(g, stream.n) for g in taken]  # a chunk holds one group or many: the mean is over groups
    return {
        "offpolicy/generation_version_min": min(versions),
        "offpolicy/generation_version_max": max(g.newest_version for g in taken),
        "offpolicy/staleness_min": min(behind),
        "offpolicy/staleness_mean": sum(b * count for b, count in zip(behind, groups)) / sum(groups),
        "offpolicy/staleness_max": max(behind),
        "offpolicy/weight_version": stream.pool.version,
        "offpolicy/queued_groups": stream.queued(),
        "offpolicy/dropped_stale_groups": stream.dropped,
        **({"offpolicy/resumed_samples": sum(g.resumed_rows for g in taken)} if stream.partial else {}),
        "timing/rollout_idle": slowest_replica(taken, "idle_seconds"),
        "timing/rollout_generate": slowest_replica(taken, "generate_seconds"),
    }

