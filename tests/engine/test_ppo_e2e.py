"""End to end: PPO with GAE and a critic on CPU, through `run_launch` on a local Ray cluster.

Two runs, once per module:
- `presets/quickstart_ppo.yaml` as shipped: 40 steps, actor and critic colocated on 2 CPU slots
  (4 worker processes), about 70 s on 2 idle cores (up to 2 minutes when they are shared).
- a short run with the reward shaped by an adaptive KL controller, the critic on a pool of its own
  (actor pool 2 slots, critic pool 1), a 2-step critic warmup and a profiled step 2, 5 steps.

Learning criterion for the first run: the mean reward of the last 5 steps is at least twice the
first 5 steps' AND at least 0.1. A random policy scores about 0.01 on the echo task, so the
absolute floor keeps "twice almost nothing" from passing. Measured on 2 cores (the run is
deterministic for a seed): 0.008 -> 0.194 (trainer.seed 0, the preset's), 0.009 -> 0.225
(trainer.seed 1, data.seed 1), 0.013 -> 0.248 (trainer.seed 2, data.seed 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import assert_learns, launch_preset, read_metrics

KL_ON_SPLIT_POOLS = [
    "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.05",
    # Short horizon: β moves by up to 0.2 × 48 sequences ÷ 100 = 9.6% per step, visible in 5 steps.
    "algorithm.kl_ctrl.horizon=100",
    "trainer.n_gpus_per_node=3", "data.train_batch_size=48", "actor_rollout_ref.actor.ppo_mini_batch_size=48",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=8",
    "placement.pools.policy.n_gpus_per_node=2", "placement.pools.value.n_gpus_per_node=1",
    "placement.roles.actor=policy", "placement.roles.rollout=policy", "placement.roles.ref=policy",
    "placement.roles.critic=value",
    "trainer.critic_warmup=2", "trainer.total_training_steps=5", "trainer.experiment_name=ppo-kl-split",
    "trainer.profile_steps=[2]",
]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> tuple[object, Path, int]:
    return launch_preset(tmp_path_factory, "ppo", "quickstart_ppo.yaml", address=ray_address)


@pytest.fixture(scope="module")
def kl_split_run(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> tuple[object, Path, int]:
    return launch_preset(tmp_path_factory, "ppo_kl_split", "quickstart_ppo.yaml", KL_ON_SPLIT_POOLS,
                         address=ray_address)


@pytest.mark.slow
def test_ppo_quickstart_mean_reward_of_last_5_steps_at_least_doubles_the_first_5(ppo_run) -> None:
    resolved, run_dir, code = ppo_run
    assert code == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, resolved.config.trainer.total_training_steps + 1))
    assert_learns(metrics)


@pytest.mark.slow
def test_critic_and_actor_run_the_micro_batch_and_accumulation_steps_of_the_resolved_plan(ppo_run) -> None:
    resolved, run_dir, code = ppo_run
    assert code == 0
    critic, actor = resolved.roles.critic, resolved.roles.actor
    # 4 mini batches of 16 sequences, 8 per GPU in one micro batch (accumulation over several micro
    # batches runs in the split-pool run below: actor 3, critic 6).
    assert (critic.optimizer_steps_per_train_step, critic.grad_accum_steps) == (4, 1)
    for m in read_metrics(run_dir):
        assert m["critic/micro_batch_size"] == critic.ppo_micro_batch_size_per_gpu
        assert m["critic/grad_accum_steps"] == critic.grad_accum_steps
        assert m["critic/optimizer_steps"] == critic.optimizer_steps_per_train_step
        assert m["actor/micro_batch_size"] == actor.ppo_micro_batch_size_per_gpu
        assert m["actor/grad_accum_steps"] == actor.grad_accum_steps


@pytest.mark.slow
def test_every_ppo_step_logs_critic_values_timings_and_peak_memory_per_role(ppo_run) -> None:
    resolved, run_dir, code = ppo_run
    assert code == 0
    for m in read_metrics(run_dir):
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/values_mean",
                    "critic/returns_mean", "critic/vf_explained_var", "timing/values", "timing/update_critic"):
            assert key in m, key
        assert m["critic/lr"] == resolved.config.critic.optim.lr
        assert 0 < m["memory/actor_peak_gb"] < 64 and 0 < m["memory/critic_peak_gb"] < 64
    last = read_metrics(run_dir)[-1]
    # The critic tracks the policy's improving returns (both start near 0).
    assert abs(last["critic/values_mean"] - last["critic/returns_mean"]) < 0.2


@pytest.mark.slow
def test_kl_in_reward_run_logs_beta_as_the_adaptive_controller_moves_it(kl_split_run) -> None:
    resolved, run_dir, code = kl_split_run
    assert code == 0
    metrics = read_metrics(run_dir)
    kl_ctrl = resolved.config.algorithm.kl_ctrl
    sequences = resolved.roles.rollout.sequences_per_step
    betas = [m["kl_in_reward/beta"] for m in metrics]
    assert betas[0] == kl_ctrl.kl_coef
    for m, next_beta in zip(metrics, betas[1:]):
        error = min(max(m["kl_in_reward/kl"] / kl_ctrl.target_kl - 1, -0.2), 0.2)
        assert next_beta == pytest.approx(m["kl_in_reward/beta"] * (1 + error * sequences / kl_ctrl.horizon))
    # The rollout policy is the reference until the actor first moves (step 3, after the warmup).
    assert [m["kl_in_reward/kl"] for m in metrics[:3]] == pytest.approx([0, 0, 0], abs=1e-6)
    assert metrics[-1]["kl_in_reward/kl"] > 0
    assert betas[-1] < betas[0]  # KL far below target_kl 0.1: the controller relaxes β


@pytest.mark.slow
def test_the_actor_waits_for_the_critic_warmup(kl_split_run) -> None:
    resolved, run_dir, code = kl_split_run
    assert code == 0
    warmup = resolved.config.trainer.critic_warmup
    updated = ["actor/pg_loss" in m for m in read_metrics(run_dir)]
    assert updated == [step > warmup for step in range(1, len(updated) + 1)]
    assert all("critic/vf_loss" in m for m in read_metrics(run_dir))


@pytest.mark.slow
def test_a_critic_on_its_own_pool_trains_with_that_pools_per_gpu_sizes(kl_split_run) -> None:
    resolved, run_dir, code = kl_split_run
    assert code == 0
    critic, actor = resolved.roles.critic, resolved.roles.actor
    # 1 critic slot holds all 48 sequences (6 micro batches of 8); each of the 2 actor slots holds 24 (3 of 8).
    assert (critic.world_size, critic.grad_accum_steps, actor.world_size, actor.grad_accum_steps) == (1, 6, 2, 3)
    for m in read_metrics(run_dir):
        assert m["critic/grad_accum_steps"] == critic.grad_accum_steps
        assert m["critic/micro_batch_size"] == critic.ppo_micro_batch_size_per_gpu
        if "actor/grad_accum_steps" in m:
            assert m["actor/grad_accum_steps"] == actor.grad_accum_steps


@pytest.mark.slow
def test_profile_steps_writes_one_chrome_trace_per_worker_for_each_listed_step(kl_split_run) -> None:
    resolved, run_dir, code = kl_split_run
    assert code == 0
    assert resolved.config.trainer.profile_steps == [2]
    traces = sorted(path.name for path in (run_dir / "profile").iterdir())
    assert traces == ["step2_actor_rollout_ref_rank0.json", "step2_actor_rollout_ref_rank1.json",
                      "step2_critic_rank0.json"]
    for name in traces:
        events = json.loads((run_dir / "profile" / name).read_text())["traceEvents"]
        assert any(event.get("name", "").startswith("aten::") for event in events), name
