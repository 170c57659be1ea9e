"""The three launches both off-policy end-to-end tests make (one-step and fully async): the whole run, the same run
with its rollout worker killed in a step after a checkpoint, and the relaunch that resumes from that checkpoint."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from launching import PRESETS, read_metrics

UNTIMED = ("timing/", "perf/tokens_per_second", "memory/")


def launch(preset: str, overrides: list[str], run_dir: Path, address: str | None = None) -> tuple[int, str]:
    """`run_launch` of presets/<preset> (joining the Ray cluster at `address`, or a local one of its own):
    (exit code, what it printed on stderr)."""
    from engine.launch import run_launch
    from rlconf.compile import compile_plan

    result = compile_plan(PRESETS / preset, overrides)
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    output = io.StringIO()
    with contextlib.redirect_stderr(output):
        code = run_launch(result.resolved, run_dir=run_dir, address=address)
    return code, output.getvalue()


@contextlib.contextmanager
def kill_the_rollout_worker_in_step(step: int):
    """At the start of `step`, the rollout worker's process is killed (as by the OOM killer) while it generates."""
    import ray

    from engine.trainer import Trainer

    original = Trainer.step

    def step_with_kill(self, current: int):
        if current == step:
            ray.kill(self.rollout_pool.group.workers[0], no_restart=True)
        return original(self, current)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "step", step_with_kill)
        yield


def whole_killed_resumed(tmp_path_factory: pytest.TempPathFactory, preset: str, overrides: list[str],
                         kill_in_step: int, address: str | None = None) -> dict:
    """{"whole", "killed", "resumed": (code, output), "whole_dir", "eventful_dir"}, with a fresh model cache; each
    launch joins the Ray cluster at `address` (or starts a local one)."""
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCONF_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        whole, eventful = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("eventful")
        result = {"whole_dir": whole, "eventful_dir": eventful, "whole": launch(preset, overrides, whole, address)}
        with kill_the_rollout_worker_in_step(kill_in_step):
            result["killed"] = launch(preset, overrides, eventful, address)
        result["resumed"] = launch(preset, overrides, eventful, address)
    return result


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    """Each step's metrics without the timed ones (which no two runs share), checking no step is written twice."""
    lines = read_metrics(run_dir)
    steps = [m["step"] for m in lines]
    assert len(steps) == len(set(steps)), f"metrics.jsonl repeats steps: {steps}"
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(UNTIMED)} for m in lines}
