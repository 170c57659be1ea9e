"""The one-step off-policy schedule's producer, and the bounded queue between it and the trainer.

With hybrid_engine off (verl 0.9.1's one-step off-policy trainer) the rollout workers generate on a
pool of their own. The producer is that pool: `RolloutPool.submit` hands it a batch of prompts and
returns at once (Ray runs the call in the rollout workers' processes while the controller goes on),
so no thread of the controller generates. `GenerationQueue` holds what is in flight, at most
`max_staleness` batches: the consumer (engine/trainer.py) `take`s the oldest, waiting for it if it
is not done, and the time it waited is the trainer's idle time. Each batch comes back with the
weight version that generated it and the rollout workers' own idle time before it began.

Weights move only while the pool is idle (between `take` and the next `submit`): `push` runs the
actor's push_weights and the rollout's receive_weights together, a broadcast over the trainer →
rollout group (engine.workers.cluster.weight_sync).

The fully async schedule (engine.controller.fully_async) streams from the same pool and queue; with partial
rollouts its push first `interrupt`s the pool, and `resume` sends each batch's cut rows back to be finished on
the new weights: the queue then holds a `Resumed` batch in that batch's place.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.batch import TensorBatch, concat, select, split_even
from engine.controller.samples import StepInputs
from engine.rollout.base import add_backend_timings
from rlconf.resolved import ResolvedPlan

PENDING_FILE = "pending_batches.pt"  # <step dir>/pending_batches.pt: generated batches not trained yet


@dataclass
class Generated:
    """A batch the rollout pool generated, with what the trainer reports about it."""

    samples: StepInputs
    rows: TensorBatch
    version: int  # the weight version (training steps behind the weights) that generated it
    generate_seconds: float  # the slowest rollout rank's generation
    idle_seconds: float  # the longest any rollout rank sat idle, waiting for the trainer, before it began
    # The rollout backend's own timings of this generation (engine.controller.stages.rollout_backend_metrics), one
    # dict per rank; not kept in checkpoints (a batch read back from one reports none).
    backend: list[dict[str, float]] = field(default_factory=list)
    # Partial rollouts only (engine.rollout.partial; None otherwise): each row's token count, and which rows a
    # weight push cut off (to be resumed, engine.controller.fully_async); never in a checkpoint (resumed first).
    generated_tokens: torch.Tensor | None = None
    unfinished: torch.Tensor | None = None
    last_version: int | None = None  # the newest weights that sampled any of its tokens (resumed rows); None: version
    # rows whose response was cut off with tokens sampled and finished on newer weights (each row once, however
    # many pushes cut it); None: none
    resumed: torch.Tensor | None = None
    replica: int = 0  # a streamed call's groups: the rollout replica that generated them (its seconds are its own)

    @property
    def resumed_rows(self) -> int:
        return 0 if self.resumed is None else int(self.resumed.sum())

    @property
    def newest_version(self) -> int:
        return self.version if self.last_version is None else self.last_version


class InFlight:
    """A batch the rollout pool is generating: `result()` waits for it (once)."""

    def __init__(self, group: Any, samples: StepInputs, refs: list[Any], order: torch.Tensor | None,
                 tensor_parallel_size: int) -> None:
        self.group, self.samples, self.refs, self.order, self.tp = group, samples, refs, order, tensor_parallel_size
        self._done: Generated | None = None

    def result(self) -> Generated:
        if self._done is None:
            answers = self.group.collect(self.refs)
            kept = answers[::self.tp]  # the ranks of one tensor-parallel replica return the same rows
            rows = concat([answer["rows"] for answer in kept])
            if self.order is not None:
                rows = select(rows, torch.argsort(self.order))
            versions = {answer["version"] for answer in answers}
            if len(versions) != 1:
                raise RuntimeError(f"rollout ranks generated one batch with different weight versions {sorted(versions)}")
            partial = {}
            if "unfinished" in kept[0]:  # partial rollouts: per-row counts, in the rows' order
                partial = {key: torch.cat([answer[key] for answer in kept])
                           for key in ("generated_tokens", "unfinished")}
                if self.order is not None:
                    partial = {key: value[torch.argsort(self.order)] for key, value in partial.items()}
            self._done = Generated(self.samples, rows, versions.pop(),
                                   max(answer["generate_seconds"] for answer in answers),
                                   max(answer["idle_seconds"] for answer in answers),
                                   [answer.get("backend", {}) for answer in answers], **partial)
        return self._done


class Resumed:
    """A batch a weight push cut off, whose unfinished rows the pool is finishing on the new weights: `result()`
    waits for them and puts them in their places (once)."""

    def __init__(self, group: Any, cut: Generated, rows: torch.Tensor, refs: list[Any], ranks: list[int]) -> None:
        self.group, self.cut, self.rows, self.refs, self.ranks = group, cut, rows, refs, ranks
        self._done: Generated | None = None

    def result(self) -> Generated:
        if self._done is None:
            answers = self.group.collect(self.refs)
            cut = self.cut
            finished = concat([answer["rows"] for answer in answers])
            rows = {key: value.clone() for key, value in cut.rows.items()}
            for key, value in rows.items():
                value[self.rows] = finished[key]
            counts, still = cut.generated_tokens.clone(), cut.unfinished.clone()
            counts[self.rows] = torch.cat([answer["generated_tokens"] for answer in answers])
            still[self.rows] = torch.cat([answer["unfinished"] for answer in answers])
            resumed = (torch.zeros_like(cut.unfinished) if cut.resumed is None else cut.resumed).clone()
            resumed[self.rows] |= cut.generated_tokens[self.rows] > 0
            backend = list(cut.backend)  # each rank's: the cut call's timings, then its share of the resumed rows'
            for rank, answer in zip(self.ranks, answers):
                backend += [{} for _ in range(rank + 1 - len(backend))]
                backend[rank] = add_backend_timings(backend[rank], answer.get("backend", {}))
            # The resumed rows went to every rank; their slowest rank's seconds count for the cut chunk's replica.
            self._done = Generated(cut.samples, rows, cut.version,
                                   cut.generate_seconds + max(answer["generate_seconds"] for answer in answers),
                                   cut.idle_seconds, backend,
                                   counts, still, max(answer["version"] for answer in answers),
                                   resumed, cut.replica)
        return self._done


class GenerationQueue:
    """Batches between the producer and the consumer, oldest first, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[InFlight | Resumed | Generated] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: InFlight | Resumed | Generated) -> None:
        if len(self._items) >= self.capacity:
            raise RuntimeError(f"{len(self._items)} batches already in flight, the schedule allows {self.capacity}")
        self._items.append(item)

    def resume(self, finish: Any) -> None:
        """After complete(): each batch replaced by `finish(batch)` (a Resumed one where rows were cut off), in order."""
        self._items = deque(finish(item) for item in self._items)

    def take(self) -> Generated:
        """The oldest batch, once generated (the caller times the wait)."""
        item = self._items.popleft()
        return item if isinstance(item, Generated) else item.result()

    def complete(self) -> list[Generated]:
        """Wait for everything in flight; the batches stay queued, now generated (a checkpoint saves them)."""
        done = [item if isinstance(item, Generated) else item.result() for item in self._items]
        self._items = deque(done)
        return done


class RolloutPool:
    """The rollout worker group as the producer of the off-policy schedule."""

    def __init__(self, resolved: ResolvedPlan, group: Any, dispatch: Any) -> None:
        self.resolved, self.group, self.dispatch = resolved, group, dispatch
        self.version: int | None = None  # the weights the pool holds; None: not pushed yet (start, resume)
        self._received_seconds = 0.0  # the slowest rank's receive_weights since the last timings()

    def connect(self, actor: Any) -> int:
        """Open the trainer → rollout group (actor rank 0 + every rollout rank); returns the tensors per push."""
        infos = actor.call_all("rollout_weight_infos")[0]
        address, port = actor.rendezvous_on_rank0()
        from engine.workers.cluster.group import collect_together

        refs = actor.submit_all("join_weight_group", address, port, self.group.world_size)
        rollout_refs = self.group.submit_all("join_weight_group", address, port, infos)
        collect_together((self.group, rollout_refs), (actor, refs))
        return len(infos)

    def push(self, actor: Any, version: int) -> float:
        """The actor's current weights (`version`) to every rollout rank; the pool must be idle. Returns seconds."""
        started = time.perf_counter()
        from engine.workers.cluster.group import collect_together

        sent = actor.submit_all("push_weights")
        received = self.group.submit_all("receive_weights", version)
        seconds, _ = collect_together((self.group, received), (actor, sent))
        self._received_seconds += max(seconds)
        self.version = version
        return time.perf_counter() - started

    def interrupt(self) -> None:
        """Partial rollouts: every rollout rank ends the generation it runs, and those queued, where they are (in
        the workers' control thread; the answers come back through the calls' own results)."""
        self.group.signal_all("interrupt")

    def resume(self, generated: Generated) -> Resumed | Generated:
        """`generated`'s unfinished rows sent back to the pool with their tokens, to be finished on the weights it
        holds now, spread over the ranks in order (a rank with none gets no call); `generated` if none is."""
        if generated.unfinished is None or not bool(generated.unfinished.any()):
            return generated
        rows = torch.nonzero(generated.unfinished).flatten()
        prompts = select(generated.samples.prompts, rows)
        prefix = {"responses": generated.rows["responses"][rows], "generated_tokens": generated.generated_tokens[rows]}
        if "rollout_log_probs" in generated.rows:  # absent where the plan's rollout returns none
            prefix["rollout_log_probs"] = generated.rows["rollout_log_probs"][rows]
        refs, ranks = [], []
        for rank, share in enumerate(torch.tensor_split(torch.arange(len(rows)), self.group.world_size)):
            if len(share):
                refs += self.group.submit_to(rank, "generate", select(prompts, share), select(prefix, share))
                ranks.append(rank)
        return Resumed(self.group, generated, rows, refs, ranks)

    def submit(self, samples: StepInputs) -> InFlight:
        """Start generating `samples` on the pool's replicas (returns at once)."""
        rollout = self.resolved.roles.rollout
        prompts = samples.prompts
        order = self.dispatch.balanced_order(prompts, rollout.replicas)
        if order is not None:
            prompts = select(prompts, order)
        shares = split_even(prompts, rollout.replicas)
        per_rank = [shares[rank // rollout.tensor_parallel_size] for rank in range(self.group.world_size)]
        return InFlight(self.group, samples, self.group.submit_sharded("generate", per_rank), order,
                        rollout.tensor_parallel_size)

    def timings(self) -> dict[str, float]:
        """Seconds the rollout ranks took receiving weights since the last call (the slowest rank's, summed over
        pushes), as timing/rollout_receive_weights. From the answers already collected: a call to the workers
        would queue behind the generation in flight and stall the trainer until the pool finished it."""
        seconds, self._received_seconds = self._received_seconds, 0.0
        return {"timing/rollout_receive_weights": seconds}


# --- checkpoints: generated batches not trained yet ----------------------------------------------------

def pending_state(batches: list[Generated]) -> dict[str, Any]:
    """What `torch.load(weights_only=True)` can read back: tensors, and the rest as JSON text."""
    return {"batches": [{
        "prompts": dict(g.samples.prompts), "rows": dict(g.rows),
        "meta": json.dumps({"group_ids": g.samples.group_ids, "data_sources": g.samples.data_sources,
                            "ground_truths": g.samples.ground_truths, "extra_infos": g.samples.extra_infos,
                            "raw_prompts": g.samples.raw_prompts,
                            "version": g.version, "generate_seconds": g.generate_seconds,
                            "idle_seconds": g.idle_seconds, "replica": g.replica}, default=str),
    } for g in batches]}


def load_pending(state: dict[str, Any], log_probs: bool | None = None) -> list[Generated]:
    """The generated batches of a checkpoint. `log_probs`: whether this plan's rollout returns the sampled tokens'
    log-probs (roles.rollout.log_probs), for rows generated before the checkpoint: a plan that does not drops the
    saved ones (the batches of a step are joined key by key); a plan that returns them cannot train rows saved
    without them beside its own, and says so. None: rows without responses (prompts not yet submitted)."""
    from engine.checkpoint import CheckpointError

    out = []
    for saved in state["batches"]:
        meta = json.loads(saved["meta"])
        # raw_prompts: the chats a reward model re-renders (absent in checkpoints written before they were kept).
        samples = StepInputs(saved["prompts"], meta["group_ids"], meta["data_sources"], meta["ground_truths"],
                             meta["extra_infos"], meta.get("raw_prompts", []))
        rows = dict(saved["rows"])
        if log_probs is False:
            rows.pop("rollout_log_probs", None)
        elif log_probs and "rollout_log_probs" not in rows:
            raise CheckpointError(
                "the checkpoint's generated batches were sampled without log-probs (rollout.calculate_log_probs "
                "false), and this plan's rollout returns them (rlconf explain's `sampled tokens' log-probs` row says "
                "why): a step's batches are joined key by key, so rows with and without them cannot train together; "
                "resume with the plan that wrote the checkpoint, or from a checkpoint of a run that returned them")
        out.append(Generated(samples, rows, meta["version"], meta["generate_seconds"], meta["idle_seconds"],
                             replica=meta.get("replica", 0)))
    return out
