"""End to end: PPO and GRPO learning from a reward model on CPU, through `run_launch` on a local Ray cluster.

The reward model is `tiny://qwen2-reward`, whose score is (nearly) the fraction of digit tokens in the
sequence (tests/engine/test_reward_model.py checks that exactly). The echo task's rule scorer gives a
digit nothing, so a reward that rises here can only have come from the model.

Learning criterion: the quickstart's (tests/engine/launching.assert_learns: the last 5 steps' mean
reward at least twice the first 5 steps' and at least 0.1). Measured on 2 cores, 2026-11-26:
- presets/ppo_reward_model.yaml (PPO, GAE, critic, 40 steps): 0.008 -> 0.251;
- presets/quickstart.yaml with the reward model (GRPO, n 8, 40 steps): 0.005 -> 0.249.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launching import assert_learns, launch_preset, read_metrics

REWARD_MODEL = ["reward_model.enable=true", "reward_model.model.path=tiny://qwen2-reward"]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> tuple[object, Path, int]:
    return launch_preset(tmp_path_factory, "ppo_rm", "ppo_reward_model.yaml", ["trainer.save_freq=-1"],
                         address=ray_address)


@pytest.mark.slow
def test_ppo_learns_from_the_reward_model(ppo_run):
    resolved, run_dir, code = ppo_run
    assert code == 0
    assert resolved.roles.reward_model is not None and resolved.roles.critic is not None
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 41))
    assert_learns(metrics)
    assert metrics[0]["timing/startup_reward_model_load"] > 0


@pytest.mark.slow
def test_grpo_learns_from_the_reward_model(tmp_path_factory, ray_address):
    resolved, run_dir, code = launch_preset(tmp_path_factory, "grpo_rm", "quickstart.yaml",
                                            [*REWARD_MODEL, "trainer.save_freq=-1"], address=ray_address)
    assert code == 0
    assert resolved.config.algorithm.adv_estimator == "grpo"
    assert_learns(read_metrics(run_dir))
