"""End to end: `rlconf launch presets/quickstart.yaml` trains GRPO on CPU with 2 Ray workers.

The quickstart runs once per session (about 30 s on 2 cores; the `quickstart_run` fixture of
tests/engine/conftest.py, which tests/engine/test_cluster.py shares); the tests read what it left in
the run directory.

Learning criterion: the mean reward of the last 5 steps is at least twice the first 5 steps' AND at
least 0.1 (a random policy scores about 0.01). Measured on 2 cores, 2026-11-23 (deterministic for a
seed): 0.023 -> 0.120 (the preset's seeds), 0.010 -> 0.151, 0.005 -> 0.169, 0.009 -> 0.176
(trainer.seed = data.seed = 1, 2, 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import PRESETS, assert_learns, read_metrics

@pytest.mark.slow
def test_quickstart_runs_every_step_and_writes_the_resolved_plan(quickstart_run) -> None:
    resolved, run_dir, code = quickstart_run
    assert code == 0
    assert json.loads((run_dir / "plan.resolved.json").read_text()) == json.loads(resolved.model_dump_json())
    steps = [m["step"] for m in read_metrics(run_dir)]
    assert steps == list(range(1, resolved.config.trainer.total_training_steps + 1))


@pytest.mark.slow
def test_quickstart_mean_reward_of_last_5_steps_at_least_doubles_the_first_5(quickstart_run) -> None:
    _, run_dir, code = quickstart_run
    assert code == 0
    assert_learns(read_metrics(run_dir))


@pytest.mark.slow
def test_workers_run_the_micro_batch_and_accumulation_steps_of_the_resolved_plan(quickstart_run) -> None:
    resolved, run_dir, code = quickstart_run
    assert code == 0
    actor = resolved.roles.actor
    for m in read_metrics(run_dir):
        assert m["actor/micro_batch_size"] == actor.ppo_micro_batch_size_per_gpu
        assert m["actor/grad_accum_steps"] == actor.grad_accum_steps
        assert m["actor/optimizer_steps"] == actor.optimizer_steps_per_train_step


@pytest.mark.slow
def test_every_stage_of_a_step_is_timed(quickstart_run) -> None:
    _, run_dir, _ = quickstart_run
    first = read_metrics(run_dir)[0]
    for stage in ("generate", "reward", "adv", "update_actor", "weight_sync", "step"):
        assert first[f"timing/{stage}"] >= 0
    # One optimizer step a training step: π_old comes from the update, no old-log-prob pass runs.
    assert "timing/old_log_prob" not in first
    assert first["perf/tokens_per_second"] > 0
    assert first["perf/tokens_per_second_per_gpu"] == pytest.approx(first["perf/tokens_per_second"] / 2)
    # two workers generate side by side: the slowest one's seconds, and the fastest one's beside them
    assert 0 < first["timing/rollout_generate_in_worker_min"] <= first["timing/rollout_generate_in_worker"]


@pytest.mark.slow
def test_the_sampling_policys_entropy_is_logged_every_step_and_falls_as_it_learns(quickstart_run) -> None:
    import math

    _, run_dir, _ = quickstart_run
    entropy = [m["actor/entropy"] for m in read_metrics(run_dir)]
    assert all(0 < e <= math.log(512) for e in entropy)  # the tiny tokenizer's vocabulary has 512 tokens
    assert sum(entropy[-5:]) / 5 < sum(entropy[:5]) / 5, entropy


def test_invalid_plan_makes_launch_exit_1_without_starting_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rlconf.cli import app

    started: list[str] = []
    try:
        import engine.launch

        monkeypatch.setattr(engine.launch, "run_launch", lambda *a, **k: started.append("engine") or 0)
        monkeypatch.setattr(engine.launch, "start_ray", lambda *a, **k: started.append("ray"))
    except ImportError:  # no engine installed: launch cannot start Ray either way
        pass
    # 64 sequences per GPU per mini batch do not split into micro batches of 12.
    result = CliRunner().invoke(app, ["launch", str(PRESETS / "quickstart.yaml"), "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=12",
                                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "not launching" in result.output
    assert started == []
    assert not (tmp_path / "run").exists()
