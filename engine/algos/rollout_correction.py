"""Truncated importance sampling between the rollout engine's policy and the trainer's (verl's
`algorithm.rollout_correction`, IS weights in its decoupled mode).

vLLM samples with bf16 kernels of its own; the actor recomputes the same tokens' log-probs with
the trainer's kernels. The two policies differ a little, so the PPO ratio is taken against π_old
(the trainer's) while the data came from π_rollout. Weighting each token's policy loss by
ρ = π_old / π_rollout, truncated from above at a threshold, corrects that bias with bounded
variance. `token`: one ρ per token; `sequence`: the product over the response, one per sequence.
"""

from __future__ import annotations

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
