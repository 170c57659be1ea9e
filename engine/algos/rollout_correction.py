"""Truncated importance sampling between the rollout engine's policy and the trainer's (verl's
`algorithm.rollout_correction`, IS weights in its decoupled mode).

vLLM samples with bf16 kernels of its own; the actor recomputes the same tokens' log-probs with
the trainer's kernels. The two policies differ a little, so the PPO ratio is taken against π_old
(the trainer's) while the data came from π_rollout. Weighting each token's policy loss by
ρ = π_old / π_rollout, truncated from above at a threshold, corrects that bias with bounded
variance. `token`: one ρ per token; `sequence`: the product over the response, one per sequence.

Where π_old comes from (rlconf.normalize.old_log_prob_source) decides what the policy loss sees
(`policy_loss_inputs`): a recomputed π_old with the weights above; the update's own detached
log-probs when the update is one optimizer step (the same π_old, no separate pass); or, in verl's
bypass mode, π_rollout itself, with PPO's clipped ratio against it (`ppo_clip`: no weights, the
ratio already carries π_θ/π_rollout) or REINFORCE weighted by truncated π_θ/π_rollout (`reinforce`).
"""

from __future__ import annotations

from typing import Any

import torch

# verl bounds the log of a ratio to ±20 before exponentiating, whatever the threshold.
SAFETY_LOG_BOUND = 20.0


def rollout_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor,
                       level: str, threshold: float) -> torch.Tensor:
    """[b, R] weights, 0 on padding; each min(ρ, threshold) with ρ from `level` ("token" or "sequence")."""
    mask = response_mask.to(old_log_probs.dtype)
    log_ratio = (old_log_probs - rollout_log_probs) * mask
    if level == "token":
        per_token = log_ratio
    elif level == "sequence":
        per_token = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is must be 'token' or 'sequence', got {level!r}")
    weights = torch.exp(per_token.clamp(-SAFETY_LOG_BOUND, SAFETY_LOG_BOUND)).clamp(max=threshold)
    return weights * mask


def rollout_is_metrics(weights: torch.Tensor, response_mask: torch.Tensor, threshold: float) -> dict[str, float]:
    valid = weights[response_mask.bool()]
    if valid.numel() == 0:
        return {}
    return {"rollout/is_weight_mean": float(valid.mean()),
            "rollout/is_truncated_fraction": float((valid >= threshold).float().mean())}


def log_prob_gap_metrics(log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                         response_mask: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the trainer's for the same tokens and weights.

    A bf16 sampler and an fp32-master trainer never agree exactly; a gap that grows over training is
    the mismatch rollout correction exists for.
    """
    diff = (rollout_log_probs - log_probs).abs()[response_mask.bool()]
    if diff.numel() == 0:
        return {}
    return {"rollout/log_prob_diff_mean": float(diff.mean()), "rollout/log_prob_diff_max": float(diff.max())}


def policy_loss_inputs(source: str, loss_mode: str, correction: Any, log_probs: torch.Tensor,
                       response_mask: torch.Tensor, old_log_probs: torch.Tensor | None = None,
                       rollout_log_probs: torch.Tensor | None = None, is_weights: torch.Tensor | None = None
                       ) -> tuple[str, torch.Tensor, torch.Tensor | None]:
    """(loss mode, π_old's log-probs, IS weights or None) for one micro batch's policy loss.

    `source`: "recompute" (π_old and the weights were computed before the update and arrive as
    `old_log_probs`, `is_weights`), "update" (π_old = this forward's detached `log_probs`; the
    weights, if `correction.rollout_is`, from them) or "rollout" (bypass mode: π_old = π_rollout;
    `correction.loss_type` picks the loss, overriding `loss_mode` as verl does).
    """
    if source == "recompute":
        return loss_mode, old_log_probs, is_weights
    if rollout_log_probs is None and (source == "rollout" or correction.rollout_is is not None):
        raise ValueError("the rollout backend returned no log-probs, which bypass mode and rollout_is need")
    current = log_probs.detach()
    if source == "update":
        weights = None
        if correction.rollout_is is not None:
            weights = rollout_is_weights(current, rollout_log_probs, response_mask, correction.rollout_is,
                                         correction.rollout_is_threshold)
        return loss_mode, current, weights
    if source != "rollout":
        raise ValueError(f"unknown source of old log-probs {source!r}")
    if correction.loss_type == "ppo_clip":
        return "vanilla", rollout_log_probs, None
    weights = None
    if correction.rollout_is is not None:
        weights = rollout_is_weights(current, rollout_log_probs, response_mask, correction.rollout_is,
                                     correction.rollout_is_threshold)
    # -A · log π · w is the GPG loss with IS weights; its ppo_kl, mean(π_rollout - π_θ), is verl's too.
    return "gpg", rollout_log_probs, weights
