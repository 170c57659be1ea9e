"""Token rewards -> advantages: the KL in the reward, then the plan's adv_estimator (verl's names).

Pure functions of tensors and the plan's algorithm section; the controller calls them once a step.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.algos.advantages import (
    compute_gae,
    compute_gpg_advantages,
    compute_grpo_advantages,
    compute_grpo_passk_advantages,
    compute_opo_advantages,
    compute_optimal_token_baseline_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_remax_advantages,
    compute_rloo_advantages,
    compute_tir_optimal_token_baseline_advantages,
    masked_mean,
    masked_var,
    masked_whiten,
)
from engine.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_in_reward
from engine.batch import TensorBatch, batch_size
from rlconf.schema.sections import AlgorithmConfig, KLControl


def kl_in_reward(controller: FixedKLController | AdaptiveKLController, token_scores: torch.Tensor,
                 batch: TensorBatch, kind: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Token rewards minus β·KL(rollout policy || ref); β is this step's, then the controller sees the KL.

    The controller lives in the controller process: one β for the whole batch, updated once per step.
    """
    beta = controller.value
    token_rewards, mean_kl = apply_kl_in_reward(token_scores, batch["old_log_probs"], batch["ref_log_probs"],
                                                batch["response_mask"], beta, kind)
    # verl's convention: the adaptive controller's horizon counts sequences, so n_steps is the batch size.
    controller.update(float(mean_kl), n_steps=batch_size(batch))
    return token_rewards, {"kl_in_reward/kl": float(mean_kl), "kl_in_reward/beta": beta}


# Group estimators: (scores [B], group ids, response mask, algorithm config) -> advantages [B, T].
# grpo_vectorized is verl's batched grpo (it floors the group variance at 1e-6, which changes only
# groups whose std is below 1e-3); rloo_vectorized gives a singleton group 0 where rloo keeps its score.
GROUP_ADVANTAGES: dict[str, Any] = {
    "grpo": lambda s, g, m, a: compute_grpo_advantages(s, g, m, norm_by_std=a.norm_adv_by_std_in_grpo)[0],
    "grpo_vectorized": lambda s, g, m, a: compute_grpo_advantages(s, g, m, norm_by_std=a.norm_adv_by_std_in_grpo)[0],
    "rloo": lambda s, g, m, a: compute_rloo_advantages(s, g, m)[0],
    "rloo_vectorized": lambda s, g, m, a: compute_rloo_advantages(s, g, m, singleton_keeps_score=False)[0],
    "reinforce_plus_plus_baseline": lambda s, g, m, a: compute_reinforce_plus_plus_baseline_advantages(s, g, m)[0],
    "opo": lambda s, g, m, a: compute_opo_advantages(s, g, m)[0],
    "grpo_passk": lambda s, g, m, a: compute_grpo_passk_advantages(s, g, m, norm_by_std=a.norm_adv_by_std_in_grpo)[0],
    "gpg": lambda s, g, m, a: compute_gpg_advantages(s, g, m)[0],
}


# Token-baseline estimators: verl's defaults (handle_zero_tail off for OTB, on for the multi-turn variant).
TOKEN_BASELINE_ADVANTAGES: dict[str, Any] = {
    "optimal_token_baseline": compute_optimal_token_baseline_advantages,
    "tir_optimal_token_baseline": compute_tir_optimal_token_baseline_advantages,
}


def compute_advantages(algorithm: AlgorithmConfig, token_rewards: torch.Tensor, group_ids: list[int],
                       batch: TensorBatch, reward_baselines: torch.Tensor | None = None) -> TensorBatch:
    """{"advantages"} for the group estimators; also "returns" for GAE (needs batch["values"]) and REINFORCE++."""
    mask = batch["response_mask"]
    if algorithm.adv_estimator == "gae":
        advantages, returns = compute_gae(token_rewards, batch["values"], mask, algorithm.gamma, algorithm.lam)
        # Whitened over the batch (as verl): the policy step no longer scales with the reward's units.
        return {"advantages": masked_whiten(advantages, mask) * mask, "returns": returns}
    if algorithm.adv_estimator == "reinforce_plus_plus":
        # No critic and no groups: the discounted reward-to-go of each token, whitened over the batch.
        advantages, returns = compute_reinforce_plus_plus_advantages(token_rewards, mask, algorithm.gamma)
        return {"advantages": advantages, "returns": returns}
    if algorithm.adv_estimator == "remax":
        if reward_baselines is None:
            raise ValueError("adv_estimator remax needs the greedy responses' rewards (reward_baselines)")
        advantages, returns = compute_remax_advantages(token_rewards, reward_baselines, mask)
        return {"advantages": advantages, "returns": returns}
    if algorithm.adv_estimator in TOKEN_BASELINE_ADVANTAGES:
        # Per-token group baselines weighted by the old policy's path energy (its Σπ² comes from compute_log_prob).
        advantages, returns = TOKEN_BASELINE_ADVANTAGES[algorithm.adv_estimator](
            token_rewards, mask, group_ids, batch["old_log_probs"], batch["sum_pi_squared"],
            rollout_is_weights=batch.get("rollout_is_weights"))
        return {"advantages": advantages, "returns": returns}
    # Group estimators compare whole responses: a response's reward is its token rewards summed.
    scores = token_rewards.sum(-1)
    estimator = GROUP_ADVANTAGES.get(algorithm.adv_estimator)
    if estimator is None:
        raise ValueError(f"adv_estimator {algorithm.adv_estimator!r} is not run by this engine")
    return {"advantages": estimator(scores, group_ids, mask, algorithm)}


def value_metrics(batch: TensorBatch) -> dict[str, float]:
    """How well the rollout-time values predicted the returns (1 - Var[R - V] / Var[R]: 1 perfect, <= 0 useless)."""
    mask = batch["response_mask"]
    values, returns = batch["values"], batch["returns"]
    explained = 1.0 - masked_var(returns - values, mask) / masked_var(returns, mask).clamp_min(1e-8)
    return {
        "critic/values_mean": float(masked_mean(values, mask)),
        "critic/returns_mean": float(masked_mean(returns, mask)),
        "critic/advantages_mean": float(masked_mean(batch["advantages"], mask)),
        "critic/vf_explained_var": float(explained),
    }


def build_kl_controller(kl_ctrl: KLControl) -> FixedKLController | AdaptiveKLController:
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    return FixedKLController(kl_ctrl.kl_coef)
