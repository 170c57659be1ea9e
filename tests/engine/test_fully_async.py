"""The fully async schedule's producer without Ray: a stand-in pool that generates at once, tagging each call with
the weights it holds, driven by GroupStream as the trainer drives it (engine.trainer._fully_async_step); and a
streamed call read from stand-in streams whose groups finish in an order the test sets."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.controller.fully_async import GroupStream, merge, slowest_replica, split_groups  # noqa: E402
from engine.controller.offpolicy import Generated  # noqa: E402
from engine.controller.samples import StepInputs  # noqa: E402
from rlconf.compile import compile_plan  # noqa: E402

N = 8  # samples per group: the quickstart's rollout.n


class InstantPool:
    """Generates each call when it is submitted, with the weights it holds then; records what it was given."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.submitted: list[list[int]] = []  # the group ids of each call

    def push(self, actor: object, version: int) -> float:
        self.version = version
        return 0.0

    def stream(self, samples: StepInputs, window: int) -> Generated:
        self.submitted.append(sorted(set(samples.group_ids)))
        # with the sampled tokens' log-probs, as a real backend returns them for the preset (its bypass mode reads them)
        responses = samples.prompts["input_ids"].clone()
        rows = {"responses": responses, "rollout_log_probs": torch.zeros(responses.shape)}
        return Generated(samples, rows, self.version, 0.01, 0.0)


def _draw(prompts: int):
    def draw(batch: int) -> StepInputs:
        ids = [batch * prompts + i for i in range(prompts) for _ in range(N)]
        return StepInputs({"input_ids": torch.tensor(ids).unsqueeze(1)}, ids, ["echo"] * len(ids), [""] * len(ids),
                          [{}] * len(ids))
    return draw


def _resolved(**async_training: object):
    overrides = [f"async_training.{key}={value}" for key, value in async_training.items()]
    result = compile_plan("presets/quickstart_fullasync.yaml", overrides)
    assert result.resolved is not None, [d.message for d in result.errors]
    return result.resolved


def _run(resolved, steps: int) -> tuple[GroupStream, InstantPool, list[list[Generated]]]:
    pool = InstantPool()
    stream = GroupStream(resolved, pool, _draw(resolved.schedule.groups_per_step), steps)
    return stream, pool, _steps(stream, range(1, steps + 1))


@pytest.mark.parametrize("threshold, sync_every", [(0.5, 2), (0.0, 1), (1.0, 1), (0.1, 4), (2.0, 2)])
def test_every_trained_group_is_within_the_staleness_bound_and_the_bound_is_reached(threshold, sync_every) -> None:
    resolved = _resolved(staleness_threshold=threshold, trigger_parameter_sync_step=sync_every)
    sched = resolved.schedule
    stream, pool, taken = _run(resolved, 12)
    behind = [step - 1 - g.version for step, calls in enumerate(taken, 1) for g in calls]
    assert max(behind) == sched.max_staleness  # the bound holds, and is the tightest one
    assert min(behind) >= 0 and stream.dropped == 0
    # Each step trains groups_per_step groups, every group once, in the order drawn.
    ids = [i for calls in taken for g in calls for i in dict.fromkeys(g.samples.group_ids)]
    assert len(ids) == 12 * sched.groups_per_step and ids == sorted(ids)
    # Weights reach the pool every trigger_parameter_sync_step steps: the versions are multiples of it.
    assert {g.version for calls in taken for g in calls} <= set(range(0, 12, sync_every))


def test_the_quickstarts_versions_step_by_step() -> None:
    # 16 groups a step, 48 a version (16 × 1.5 × 2), weights every 2 steps: 48 groups of version 0 start first (one
    # call); steps 1-3 train them; after step 2's push 32 more start with version 2 (16 still queued count).
    stream, pool, taken = _run(_resolved(), 8)
    assert [sorted({g.version for g in calls}) for calls in taken] == [[0], [0], [0], [2], [2], [4], [4], [6]]
    assert [max(step - 1 - g.version for g in calls) for step, calls in enumerate(taken, 1)] == [0, 1, 2, 1, 2, 1, 2, 1]


def test_a_group_older_than_the_bound_is_dropped_and_counted_not_trained() -> None:
    resolved = _resolved()  # bound: 2 steps
    pool = InstantPool()
    stream = GroupStream(resolved, pool, _draw(16), 10)
    stream.push(None, 4)
    stale = split_groups(_draw(16)(99), 4, N)[0]
    stream.queue.put(Generated(stale, {}, 1, 0.0, 0.0))  # a call of version 1 still queued (as no schedule leaves)
    stream.started = 4
    stream.refill()
    taken = stream.take(5)  # step 5 trains version 4: version 1 is 3 behind
    assert stream.dropped == 4
    assert {g.version for g in taken} == {4} and sum(len(g.samples.group_ids) for g in taken) == 16 * N
    assert not set(stale.group_ids) & set(merge(taken)[0].group_ids)


def test_split_and_merge_keep_each_group_whole_and_in_order() -> None:
    samples = _draw(6)(1)
    calls = split_groups(samples, 2, N)
    assert [sorted(set(c.group_ids)) for c in calls] == [[6, 7], [8, 9], [10, 11]]
    merged, rows = merge([Generated(c, {"x": c.prompts["input_ids"]}, 0, 0.0, 0.0) for c in calls])
    assert merged.group_ids == samples.group_ids and torch.equal(rows["x"], samples.prompts["input_ids"])


def _steps(stream: GroupStream, steps: range) -> list[list[Generated]]:
    taken = []
    for step in steps:  # in engine.trainer.Trainer._fully_async_step's order
        version = stream.sync_due(step)
        if version is not None:
            stream.push(None, version)
        stream.refill()
        taken.append(stream.take(step))
        stream.refill()
    return taken


@pytest.mark.parametrize("before_window, after_window", [(16, 4), (4, 16)])
def test_a_resume_with_another_window_and_pool_trains_every_group_once(before_window, after_window) -> None:
    """What is in flight at a checkpoint is whole groups, taken a few at a time: a plan with another
    concurrent_samples_per_replica and another rollout pool (2 replicas) resumes it, and every group is trained
    once, none lost, none twice."""
    old = _resolved(staleness_threshold=0.1, trigger_parameter_sync_step=1, concurrent_samples_per_replica=before_window)
    new = compile_plan("presets/quickstart_fullasync.yaml", [
        "async_training.staleness_threshold=0.1", "async_training.trigger_parameter_sync_step=1",
        f"async_training.concurrent_samples_per_replica={after_window}", "actor_rollout_ref.rollout.n_gpus_per_node=2",
        "trainer.n_gpus_per_node=2"]).resolved
    assert new.roles.rollout.replicas == 2 and new.schedule.max_groups_per_version == 17  # not rounded to 2 replicas
    before = GroupStream(old, StreamingInstantPool(), _draw(old.schedule.groups_per_step), 12)
    first = _steps(before, range(1, 5))
    counters, state = before.counters(), before.file_state()
    assert before.queued() > 0  # groups were in flight at the checkpoint
    after = GroupStream(new, StreamingInstantPool(), _draw(new.schedule.groups_per_step), 12)
    after.load(counters, state)
    after.pool.version = None  # a resumed pool's weights are pushed again
    rest = _steps(after, range(5, 13))
    ids = [i for calls in first + rest for g in calls for i in dict.fromkeys(g.samples.group_ids)]
    # every group once (the stand-in's groups finish last first: the order within a call is theirs)
    assert sorted(ids) == list(range(old.schedule.groups_per_step, 13 * old.schedule.groups_per_step))
    assert len(set(ids)) == len(ids)


def test_a_resume_with_a_tighter_bound_drops_what_is_too_old_and_starts_others_in_its_place() -> None:
    loose = _resolved(staleness_threshold=2.0, trigger_parameter_sync_step=1)
    tight = _resolved(staleness_threshold=0.0, trigger_parameter_sync_step=1)
    assert (loose.schedule.max_staleness, tight.schedule.max_staleness) == (2, 0)
    before = GroupStream(loose, StreamingInstantPool(), _draw(16), 12)
    first = _steps(before, range(1, 5))
    counters, state = before.counters(), before.file_state()
    after = GroupStream(tight, StreamingInstantPool(), _draw(16), 12)
    after.load(counters, state)
    after.pool.version = None
    rest = _steps(after, range(5, 13))  # without the dropped groups' places the first step would find none to start
    assert after.dropped > 0
    ids = [i for calls in first + rest for g in calls for i in dict.fromkeys(g.samples.group_ids)]
    assert len(ids) == len(set(ids)) == 12 * 16  # every step full, no group twice
    assert all(step - 1 - g.version == 0 for step, calls in enumerate(rest, 5) for g in calls)


def test_staleness_mean_is_over_groups_and_the_replica_survives_a_checkpoint() -> None:
    from engine.controller.fully_async import staleness_metrics
    from engine.controller.offpolicy import load_pending, pending_state

    stream = GroupStream(_resolved(), InstantPool(), _draw(16), 4)
    stream.pool.version = 3
    one, three = _draw(1)(0), _draw(3)(1)
    taken = [Generated(one, {"x": one.prompts["input_ids"]}, 1, 0.0, 0.0, replica=1),
             Generated(three, {"x": three.prompts["input_ids"]}, 3, 0.0, 0.0)]
    metrics = staleness_metrics(4, taken, stream)
    assert metrics["offpolicy/staleness_mean"] == (2 * 1 + 0 * 3) / 4  # not (2 + 0) / 2 over chunks
    (saved_one, _) = load_pending(pending_state(taken))
    assert saved_one.replica == 1 and saved_one.version == 1


class StreamsGroup:
    """Stand-in rollout workers: each stream is a list of answers (RolloutWorker.generate_streamed's), and
    `first_ready` picks the stream named next in `order` (the replica whose group finishes first), else any with
    answers left."""

    def __init__(self, order: list[int]) -> None:
        self.order = order
        self.read: list[int] = []  # ranks read, in order

    def first_ready(self, streams: list) -> int:
        for rank in self.order:
            for i, stream in enumerate(streams):
                if stream["rank"] == rank and stream["answers"]:
                    self.order.remove(rank)
                    return i
        return next((i for i, stream in enumerate(streams) if stream["answers"]), 0)

    def next_from(self, rank: int, stream: dict):
        if not stream["answers"]:
            raise StopIteration
        self.read.append(rank)
        return stream["answers"].pop(0)


def _answer(groups: list[int], seconds: float, idle: float = 0.0) -> dict:
    # rows with the sampled tokens' log-probs, as a backend returns them for the preset (its bypass mode reads them)
    rows = {"responses": torch.arange(len(groups) * N), "rollout_log_probs": torch.zeros(len(groups) * N)}
    return {"groups": groups, "rows": rows, "version": 3, "generate_seconds": seconds, "idle_seconds": idle}


def _account(seconds: float) -> dict:
    return {"done": True, "version": 3, "backend": {"generate_in_worker": seconds}}


def test_a_streamed_calls_groups_are_handed_out_as_they_finish_with_the_calls_account_once() -> None:
    from engine.controller.fully_async import GroupQueue, StreamedCall

    samples = _draw(4)(2)  # groups 8-11: replica 0 generates the call's groups 0 and 1, replica 1 groups 2 and 3
    # replica 1's second group finishes first, then replica 0's groups (in one engine step), then replica 1's first
    streams = [{"rank": 0, "answers": [_answer([1, 0], 2.0, idle=0.5), _account(2.25)]},
               {"rank": 1, "answers": [_answer([1], 1.0, idle=0.25), _answer([0], 2.5), _account(3.5)]}]
    group = StreamsGroup(order=[1, 0, 1, 0, 1])
    queue = GroupQueue(capacity=4, n=N)
    queue.put(StreamedCall(group, samples, streams, [[0, 1], [2, 3]], tensor_parallel_size=1, n=N))
    assert queue.groups() == 4
    first = queue.take_groups(1)
    assert first.samples.group_ids == [11] * N and queue.groups() == 3
    assert (first.generate_seconds, first.idle_seconds, first.replica) == (1.0, 0.25, 1)
    second = queue.take_groups(1)  # replica 0 answered two groups at once: one is taken, one stays at the head
    assert second.samples.group_ids == [9] * N and queue.groups() == 2
    assert (second.generate_seconds, second.idle_seconds, second.replica) == (2.0, 0.5, 0)  # the answer's seconds
    rest = queue.take_groups(4)
    assert rest.samples.group_ids == [8] * N and len(queue) == 1  # replica 0's other group, then ...
    assert (rest.generate_seconds, rest.idle_seconds) == (0.0, 0.0)  # ... counted once, with its first part
    last = queue.take_groups(4)
    assert last.samples.group_ids == [10] * N and len(queue) == 0 and queue.take_groups(4) is None
    # the call's last group carries the replicas' backend timings, each rank's own
    assert (last.generate_seconds, last.replica) == (2.5, 1)
    assert last.backend == [{"generate_in_worker": 2.25}, {"generate_in_worker": 3.5}]
    assert torch.equal(last.rows["responses"], torch.arange(N)) and last.version == 3
    # a step that took all four: each replica's seconds add up, the slowest replica's count
    assert slowest_replica([first, second, rest, last], "generate_seconds") == 1.0 + 2.5
    assert slowest_replica([first, second, rest, last], "idle_seconds") == 0.5


def test_a_calls_last_answer_split_over_two_steps_carries_its_account_once() -> None:
    from engine.controller.fully_async import GroupQueue, StreamedCall, backend_per_rank

    # one replica answers its two groups at once (an HF batch, or the groups a weight push cut)
    streams = [{"rank": 0, "answers": [_answer([0, 1], 2.0), _account(0.5)]}]
    queue = GroupQueue(capacity=4, n=N)
    queue.put(StreamedCall(StreamsGroup(order=[]), _draw(2)(0), streams, [[0, 1]], tensor_parallel_size=1, n=N))
    one, two = queue.take_groups(1), queue.take_groups(1)
    assert backend_per_rank([one, two]) == [{"generate_in_worker": 0.5}]
    assert one.generate_seconds + two.generate_seconds == 2.0


def test_a_streamed_call_waits_for_every_group_when_completed_and_keeps_them_queued_in_order() -> None:
    from engine.controller.fully_async import GroupQueue, StreamedCall

    samples = _draw(2)(0)
    streams = [{"rank": 0, "answers": [_answer([1], 0.5), _answer([0], 0.5), _account(1.0)]},
               {"rank": 1, "answers": [_answer([1], 0.5), _answer([0], 0.5), _account(1.0)]}]  # tensor parallel 2
    group = StreamsGroup(order=[0, 0, 0])
    queue = GroupQueue(capacity=4, n=N)
    queue.put(StreamedCall(group, samples, streams, [[0, 1]], tensor_parallel_size=2, n=N))
    done = queue.complete()  # a checkpoint, or a weight push
    assert [g.samples.group_ids[0] for g in done] == [1, 0] and queue.groups() == 2
    assert streams[1]["answers"] == [] and group.read.count(1) == 3  # the follower's stream was read to its end
    assert done[-1].generate_seconds == 0.5 and done[-1].backend == [{"generate_in_worker": 1.0}]


def test_a_failed_tensor_parallel_follower_stops_the_call_before_its_leader_answers() -> None:
    """Its leader would wait in a collective with it and never answer: the follower's stream is watched too."""
    from engine.controller.fully_async import GroupQueue, StreamedCall

    class Failing(StreamsGroup):
        def next_from(self, rank: int, stream: dict):
            if rank == 1:
                raise RuntimeError("worker rollout rank 1 failed: CUDA out of memory")
            return super().next_from(rank, stream)

    streams = [{"rank": 0, "answers": []}, {"rank": 1, "answers": [_answer([0], 0.5)]}]
    queue = GroupQueue(capacity=4, n=N)
    queue.put(StreamedCall(Failing(order=[1]), _draw(1)(0), streams, [[0]], tensor_parallel_size=2, n=N))
    with pytest.raises(RuntimeError, match="rollout rank 1"):
        queue.take_groups(1)


class StreamingInstantPool(InstantPool):
    """InstantPool whose calls stream: each group its own answer, in reverse order, as a StreamedCall reads them."""

    def stream(self, samples: StepInputs, window: int):
        from engine.controller.fully_async import StreamedCall

        self.submitted.append(sorted(set(samples.group_ids)))
        groups = len(samples.group_ids) // N
        answers = [dict(_answer([g], 0.1), version=self.version) for g in reversed(range(groups))]
        answers.append(dict(_account(0.1), version=self.version))
        return StreamedCall(StreamsGroup(order=[]), samples, [{"rank": 0, "answers": answers}], [list(range(groups))],
                            tensor_parallel_size=1, n=N)


@pytest.mark.parametrize("threshold, sync_every", [(0.5, 2), (1.0, 1), (0.1, 4)])
def test_the_stream_over_streamed_calls_trains_every_group_once_within_the_bound(threshold, sync_every) -> None:
    resolved = _resolved(staleness_threshold=threshold, trigger_parameter_sync_step=sync_every)
    sched = resolved.schedule
    stream = GroupStream(resolved, StreamingInstantPool(), _draw(sched.groups_per_step), 12)
    taken = _steps(stream, range(1, 13))
    ids = [i for calls in taken for g in calls for i in dict.fromkeys(g.samples.group_ids)]
    assert sorted(ids) == list(range(sched.groups_per_step, 13 * sched.groups_per_step)) and len(set(ids)) == len(ids)
    behind = [step - 1 - g.version for step, calls in enumerate(taken, 1) for g in calls]
    assert max(behind) == sched.max_staleness and min(behind) >= 0 and stream.dropped == 0
    assert all(sum(len(g.samples.group_ids) for g in calls) == sched.groups_per_step * N for calls in taken)
