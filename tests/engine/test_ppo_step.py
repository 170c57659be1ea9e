"""The controller's PPO pieces without workers: token rewards, KL in the reward, GAE, what the engine runs."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

PPO_PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart_ppo.yaml"
SPLIT_POOLS = ["trainer.n_gpus_per_node=3", "data.train_batch_size=48", "actor_rollout_ref.actor.ppo_mini_batch_size=48",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=8",
               "placement.pools.policy.n_gpus_per_node=2", "placement.pools.value.n_gpus_per_node=1",
               "placement.roles.actor=policy", "placement.roles.rollout=policy", "placement.roles.critic=value"]


def _plan(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PPO_PRESET, list(overrides))
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def test_the_outcome_score_sits_on_the_last_response_token() -> None:
    from engine.algos.advantages import outcome_token_scores

    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    scores = outcome_token_scores(torch.tensor([1.0, 0.5, -2.0]), mask)
    assert scores.tolist() == [[0, 0, 1.0, 0], [0.5, 0, 0, 0], [0, 0, 0, -2.0]]


def _kl_batch() -> dict[str, torch.Tensor]:
    return {"old_log_probs": torch.tensor([[-1.0, -1.0], [-2.0, -0.5]]),
            "ref_log_probs": torch.tensor([[-1.5, -1.0], [-2.0, -1.0]]),
            "response_mask": torch.tensor([[1, 1], [1, 1]])}


def test_kl_in_reward_subtracts_this_steps_beta_then_updates_the_adaptive_controller() -> None:
    from engine.algos.kl import AdaptiveKLController
    from engine.controller.advantages import kl_in_reward

    controller = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=10)
    token_scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    rewards, metrics = kl_in_reward(controller, token_scores, _kl_batch(), "kl")
    # k1 = old - ref per token: [[0.5, 0], [0, 0.5]]; mean per sequence 0.25, batch mean 0.25.
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, 1.0], [0.0, -0.1]]))
    assert metrics == {"kl_in_reward/kl": pytest.approx(0.25), "kl_in_reward/beta": 0.2}
    # KL 0.25 is above the target 0.1: error clipped to +0.2, times 2 sequences / horizon 10.
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 2 / 10))


def test_a_fixed_controller_keeps_beta() -> None:
    from engine.controller.advantages import build_kl_controller, kl_in_reward

    plan = _plan("algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.05")
    controller = build_kl_controller(plan.config.algorithm.kl_ctrl)
    for _ in range(3):
        _, metrics = kl_in_reward(controller, torch.zeros(2, 2), _kl_batch(), "kl")
        assert metrics["kl_in_reward/beta"] == 0.05


def test_gae_with_gamma_and_lambda_1_gives_reward_to_go_returns_and_whitened_advantages() -> None:
    from engine.algos.advantages import masked_mean, masked_var, outcome_token_scores
    from engine.controller.advantages import compute_advantages

    algorithm = _plan().config.algorithm
    assert (algorithm.gamma, algorithm.lam) == (1.0, 1.0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.5, 0.0], [0.4, 0.4, 0.4]])
    rewards = outcome_token_scores(torch.tensor([1.0, 0.0, 0.5]), mask)
    out = compute_advantages(algorithm, rewards, [0, 1, 2], {"response_mask": mask, "values": values})
    # Undiscounted: every token's return is the outcome of its response.
    torch.testing.assert_close(out["returns"], torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]))
    assert float(masked_mean(out["advantages"], mask)) == pytest.approx(0.0, abs=1e-6)
    assert float(masked_var(out["advantages"], mask)) == pytest.approx(1.0, abs=1e-4)
    assert torch.all(out["advantages"][mask == 0] == 0)
    raw = (out["returns"] - values) * mask  # GAE with lambda 1 is the Monte-Carlo return minus the value
    assert torch.corrcoef(torch.stack([raw[mask == 1], out["advantages"][mask == 1]]))[0, 1] == pytest.approx(1.0)


def test_group_estimators_rank_responses_by_their_summed_token_rewards() -> None:
    from engine.controller.advantages import compute_advantages

    algorithm = _plan("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2").config.algorithm
    mask = torch.ones(4, 2, dtype=torch.long)
    rewards = torch.tensor([[0.0, 1.0], [-0.1, 0.0], [0.0, 0.5], [0.0, 0.5]])  # KL shaped into the first token
    out = compute_advantages(algorithm, rewards, [0, 0, 1, 1], {"response_mask": mask})
    assert out["advantages"][0, 0] > 0 > out["advantages"][1, 0]
    assert torch.all(out["advantages"][2:] == 0)  # equal sums: no preference
    assert "returns" not in out


def test_the_ppo_quickstart_with_kl_in_reward_and_a_critic_on_its_own_pool_is_runnable() -> None:
    from engine.capabilities import unsupported_features

    assert unsupported_features(_plan()) == []
    assert unsupported_features(_plan("algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive")) == []
    split = _plan(*SPLIT_POOLS)
    assert (split.roles.actor.world_size, split.roles.critic.world_size) == (2, 1)
    assert unsupported_features(split) == []


def test_a_reference_policy_away_from_the_actors_pool_is_refused_with_the_fix() -> None:
    from engine.capabilities import unsupported_features

    plan = _plan(*SPLIT_POOLS, "algorithm.use_kl_in_reward=true", "placement.roles.ref=value")
    assert unsupported_features(plan) == [
        "placement: ref on a pool other than the actor's (`policy`) is not implemented; place ref on `policy` "
        "(the critic may have its own pool)"]


def test_token_budget_micro_batches_run_for_actor_ref_and_critic_in_process(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """use_dynamic_bsz everywhere: training and forward micro batches cut by ppo/log_prob_max_token_len_per_gpu."""
    pytest.importorskip("transformers")
    from engine.capabilities import unsupported_features
    from launching import train_in_process

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = _plan("trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                     "algorithm.use_kl_in_reward=true", "trainer.total_training_steps=2",
                     "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=80",
                     "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
                     "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
                     "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=80")
    assert resolved.roles.actor.grad_accum_steps is None and resolved.roles.critic.grad_accum_steps is None
    assert unsupported_features(resolved) == []
    trainer = train_in_process(resolved, tmp_path / "run")
    rows_per_mini_batch = resolved.roles.actor.ppo_mini_batch_size_per_gpu
    for m in trainer.history:
        for role in ("actor", "critic"):
            # At most 80 padded tokens a micro batch (rows of ~20 tokens once trimmed): the mini batch is cut up.
            assert m[f"{role}/grad_accum_steps"] > 1
            assert m[f"{role}/micro_batch_size"] * m[f"{role}/grad_accum_steps"] == pytest.approx(rows_per_mini_batch)
        assert all(torch.isfinite(torch.tensor(m[key])) for key in ("actor/pg_loss", "critic/vf_loss", "kl_in_reward/kl"))


def test_reinforce_plus_plus_advantages_are_the_whitened_discounted_reward_to_go_of_the_kl_shaped_rewards() -> None:
    from engine.algos.advantages import compute_reinforce_plus_plus_advantages
    from engine.capabilities import unsupported_features
    from engine.controller.advantages import compute_advantages

    resolved = _plan("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.5")
    assert unsupported_features(resolved) == []
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, -0.1, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = compute_advantages(resolved.config.algorithm, token_rewards, [0, 1], {"response_mask": mask})
    # Reward-to-go with gamma 0.5: row 0 -> [0.25, 0.5, 1.0]; row 1 -> [0.45, -0.1, 0].
    torch.testing.assert_close(out["returns"], torch.tensor([[0.25, 0.5, 1.0], [0.45, -0.1, 0.0]]))
    expected, _ = compute_reinforce_plus_plus_advantages(token_rewards, mask, gamma=0.5)
    torch.testing.assert_close(out["advantages"], expected)


def test_reinforce_plus_plus_trains_in_process_without_a_critic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from launching import train_in_process

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = _plan("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=true",
                     "trainer.n_gpus_per_node=1", "data.train_batch_size=8",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.total_training_steps=2")
    assert resolved.roles.critic is None
    trainer = train_in_process(resolved, tmp_path / "run")
    assert [m["step"] for m in trainer.history] == [1, 2]
    assert all(torch.isfinite(torch.tensor(m["actor/pg_loss"])) for m in trainer.history)


def test_ppo_steps_run_in_process_with_one_rank_per_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The single-process debug path: LocalWorkerGroup for the actor and the critic, sharing one-rank gloo."""
    pytest.importorskip("transformers")
    from launching import train_in_process

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = _plan("trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                     "algorithm.use_kl_in_reward=true", "trainer.critic_warmup=1", "trainer.total_training_steps=2")
    trainer = train_in_process(resolved, tmp_path / "run")
    first, second = trainer.history
    assert "actor/pg_loss" not in first and "actor/pg_loss" in second  # the critic warmup
    for m in (first, second):
        assert m["critic/grad_accum_steps"] == resolved.roles.critic.grad_accum_steps
        assert m["kl_in_reward/beta"] == resolved.config.algorithm.kl_ctrl.kl_coef  # fixed controller


def test_metrics_read_back_from_device_tensors_keep_their_keys_order_and_values() -> None:
    torch = pytest.importorskip("torch")
    from engine.workers.passes.ppo_update import as_floats

    values = {"loss": torch.tensor(0.25), "clip": 0.5, "kl": torch.tensor([1.5], dtype=torch.float64)}
    out = as_floats(values)
    assert list(out) == ["loss", "clip", "kl"]
    assert out == {"loss": 0.25, "clip": 0.5, "kl": 1.5}
    assert all(type(value) is float for value in out.values())
