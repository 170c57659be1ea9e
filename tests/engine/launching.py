"""Helpers for the end-to-end engine tests: compile a bundled preset, launch it, read its metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

PRESETS = Path(__file__).resolve().parents[2] / "presets"


def compile_preset(preset: str, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """The resolved plan of presets/<preset> with overrides; fails the test on any compiler error."""
    from rlconf.compile import compile_plan

    result = compile_plan(PRESETS / preset, list(overrides))
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def launch_preset(tmp_path_factory: pytest.TempPathFactory, name: str, preset: str,
                  overrides: list[str] | tuple[str, ...] = (), address: str | None = None) -> tuple[Any, Path, int]:
    """`run_launch` with a fresh model cache: (resolved plan, run dir, exit code). `address`: join that Ray cluster
    (the module's, tests/engine/conftest.py `ray_address`); None: start a local one, as `rlconf launch` does."""
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    from engine.launch import run_launch

    resolved = compile_preset(preset, overrides)
    mp = pytest.MonkeyPatch()
    mp.setenv("RLCONF_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    run_dir = tmp_path_factory.mktemp(name)
    try:
        code = run_launch(resolved, run_dir=run_dir, address=address, dashboard=False)
    finally:
        mp.undo()
    return resolved, run_dir, code


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_ran_and_saved(run_dir: Path, code: int, steps: int) -> None:
    """The launch exited 0 after `steps` training steps with finite policy losses, and saved a checkpoint."""
    assert code == 0
    rows = [row for row in read_metrics(run_dir) if row.get("step", 0) > 0]
    assert [row["step"] for row in rows] == list(range(1, steps + 1))
    assert all(math.isfinite(row["actor/pg_loss"]) for row in rows)
    assert (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())


def train_in_process(resolved: Any, run_dir: Path, checkpoints: bool = False, factory: Any = None,
                     startup: Any = None) -> Any:
    """Train the plan in this process (LocalWorkerGroup, one rank a role, or `factory`); the workers are shut
    down even when training raises. `checkpoints`: save them under run_dir as a launch would. `startup`: a
    StartupClock, for what the launch's start-up announces. Returns the Trainer."""
    from engine.trainer import build_trainer
    from engine.workers.cluster.local import LocalWorkerGroup

    trainer = build_trainer(resolved, run_dir, factory or LocalWorkerGroup, log=lambda line: None, startup=startup)
    if checkpoints:
        trainer.run_dir = run_dir
    try:
        trainer.train()
    finally:
        trainer.close()
        for group in (trainer.critic_group, trainer.group, trainer.rm_group):
            if group is not None:
                group.kill()
    return trainer


def assert_learns(metrics: list[dict]) -> None:
    """The quickstart's learning criterion, one place for every end-to-end test: the mean reward of the
    last 5 steps is at least twice the first 5 steps' AND at least 0.1 (a random policy scores about 0.01)."""
    rewards = [m["reward/mean"] for m in metrics]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= 2 * first and last >= 0.1, f"reward first 5 steps {first:.3f}, last 5 steps {last:.3f}: {rewards}"


def capture_advantages(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Record what the trainer's advantage stage gets and gives: the dict fills with `rewards` (token
    rewards), `groups`, `batch`, `baselines` (ReMax's) and the outputs (`advantages`, `returns`, ...)."""
    import engine.controller.stages

    seen: dict = {}
    real = engine.controller.stages.compute_advantages

    def capture(algorithm, token_rewards, group_ids, batch, reward_baselines=None):
        out = real(algorithm, token_rewards, group_ids, batch, reward_baselines)
        seen.update(rewards=token_rewards, groups=list(group_ids), batch=dict(batch), baselines=reward_baselines, **out)
        return out

    monkeypatch.setattr(engine.controller.stages, "compute_advantages", capture)
    return seen
