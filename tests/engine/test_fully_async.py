"""The fully async schedule's producer without Ray: a stand-in pool that generates at once, tagging each call with
the weights it holds, driven by GroupStream as the trainer drives it (engine.trainer._fully_async_step)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.controller.fully_async import GroupStream, merge, split_groups  # noqa: E402
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

    def submit(self, samples: StepInputs) -> Generated:
        self.submitted.append(sorted(set(samples.group_ids)))
        rows = {"responses": samples.prompts["input_ids"].clone()}
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
    taken = []
    for step in range(1, steps + 1):  # the order of engine.trainer.Trainer._fully_async_step
        version = stream.sync_due(step)
        if version is not None:
            stream.push(None, version)
        stream.refill()
        taken.append(stream.take(step))
        stream.refill()
    return stream, pool, taken


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
    # 16 groups a step, 4 a call, 48 a version (16 × 1.5 × 2), weights every 2 steps: 48 groups of version 0 are
    # started first; steps 1-3 train them; after step 2's push 32 more start with version 2 (16 still queued count).
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
    assert [g.version for g in taken] == [4] * 4 and not set(stale.group_ids) & set(merge(taken)[0].group_ids)


def test_split_and_merge_keep_each_group_whole_and_in_order() -> None:
    samples = _draw(6)(1)
    calls = split_groups(samples, 2, N)
    assert [sorted(set(c.group_ids)) for c in calls] == [[6, 7], [8, 9], [10, 11]]
    merged, rows = merge([Generated(c, {"x": c.prompts["input_ids"]}, 0, 0.0, 0.0) for c in calls])
    assert merged.group_ids == samples.group_ids and torch.equal(rows["x"], samples.prompts["input_ids"])


@pytest.mark.parametrize("before_calls, after_calls", [(16, 4), (4, 16)])
def test_a_resume_with_another_call_size_is_refused_with_the_keys_to_keep(before_calls, after_calls) -> None:
    """The calls in flight at a checkpoint are whole calls of the run that wrote it; a plan with another call size
    (concurrent_samples_per_replica, the rollout GPUs) would train steps of the wrong size (16 → 4: a step of 28
    groups) or stop on the queue's capacity (4 → 16): refused, naming what to keep."""
    from engine.checkpoint import CheckpointError

    def resolved(calls: int):
        return _resolved(staleness_threshold=1.0, trigger_parameter_sync_step=1, concurrent_samples_per_replica=calls)

    old, new = resolved(before_calls), resolved(after_calls)
    assert (old.schedule.groups_per_call, new.schedule.groups_per_call) == (before_calls, after_calls)
    before = GroupStream(old, InstantPool(), _draw(old.schedule.groups_per_step), 12)
    for step in range(1, 5):  # 4 of 12 steps, in engine.trainer.Trainer._fully_async_step's order
        version = before.sync_due(step)
        if version is not None:
            before.push(None, version)
        before.refill()
        before.take(step)
        before.refill()
    counters, state = before.counters(), before.file_state()
    assert len(before.queue)  # calls were in flight at the checkpoint
    after = GroupStream(new, InstantPool(), _draw(new.schedule.groups_per_step), 12)
    with pytest.raises(CheckpointError, match="concurrent_samples_per_replica"):
        after.load(counters, state)
    # a checkpoint written before the call size was saved: the calls' own sizes tell
    legacy = {key: value for key, value in counters.items() if key != "groups_per_call"}
    with pytest.raises(CheckpointError, match=f"calls of {before_calls * new.roles.rollout.n} samples"):
        GroupStream(new, InstantPool(), _draw(new.schedule.groups_per_step), 12).load(legacy, state)
    # the same call size resumes
    GroupStream(old, InstantPool(), _draw(old.schedule.groups_per_step), 12).load(counters, state)
