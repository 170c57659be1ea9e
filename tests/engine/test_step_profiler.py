"""trainer.profile_steps: which steps the controller asks every worker group to profile."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")


class RecordingGroup:
    def __init__(self, role: str, calls: list) -> None:
        self.role, self.calls = role, calls

    def call_all(self, method: str, *args):
        self.calls.append((self.role, method, *args))
        return []


def test_only_the_listed_steps_are_profiled_on_every_worker_group(tmp_path: Path) -> None:
    from engine.workers.cluster.profiling import profiled_step

    calls: list = []
    groups = [RecordingGroup("actor_rollout_ref", calls), RecordingGroup("critic", calls)]
    for step in range(1, 5):
        with profiled_step(groups, tmp_path, step, profile_steps=[2, 4]):
            calls.append(("controller", "step", step))
    started = [("actor_rollout_ref", "start_profile"), ("critic", "start_profile")]

    def stopped(step: int) -> list[tuple]:
        return [("actor_rollout_ref", "stop_profile", str(tmp_path), step), ("critic", "stop_profile", str(tmp_path), step)]

    assert calls == [("controller", "step", 1),
                     *started, ("controller", "step", 2), *stopped(2),
                     ("controller", "step", 3),
                     *started, ("controller", "step", 4), *stopped(4)]

def test_stop_without_start_names_the_role_rank_and_step() -> None:
    from engine.workers.cluster.profiling import StepProfiler

    class Worker(StepProfiler):
        ROLE, rank = "critic", 1

    with pytest.raises(RuntimeError, match=r"critic rank 1: stop_profile called for step 7 without start_profile"):
        Worker().stop_profile("unused", 7)
