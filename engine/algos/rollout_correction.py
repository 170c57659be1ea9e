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

`rollout_is_batch_normalize` divides the weights by their mean (`normalize_is_weights`). Rejection
sampling (`rollout_rs`, `rejection_mask`) drops tokens or whole responses whose divergence between
π_old and π_rollout passes a bound: outside bypass mode the step's response mask loses them after the
reward (and its KL penalty) is placed and before advantages, critic and actor (engine.controller.
stages); in bypass mode, as verl does, each micro batch's policy loss drops them, measured against
the current π_θ, while its normalizer still counts them (`bypass_policy_mask`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

# (option, lower, upper): rlconf.schema.sections.RejectionCheck, verl's reading of rollout_rs and its threshold.
RejectionChecks = Sequence[tuple[str, float | None, float]]

METRIC_PREFIX = "rollout_corr/"  # verl's prefix of its rollout-correction metrics

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


# --- batch normalization of the IS weights ------------------------------------------------------------

def normalize_is_weights(weights: torch.Tensor, response_mask: torch.Tensor, level: str,
                         sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights / their mean, the mean as a 0-d tensor) — verl's rollout_is_batch_normalize.

    The mean is over valid tokens (`token`) or over responses with a valid token, one weight each
    (`sequence`); `sum_over_ranks` sums [total, count] over the ranks that share the batch. A mean
    of at most 1e-8 leaves the weights as they are (factor 1). No read-back: no device sync.
    """
    mask = response_mask.to(weights.dtype)
    if level == "token":
        total, count = (weights * mask).sum(), mask.sum()
    else:
        tokens = mask.sum(-1)
        per_sequence = (weights * mask).sum(-1) / (tokens + 1e-8)
        has_tokens = (tokens > 0).to(weights.dtype)
        total, count = (per_sequence * has_tokens).sum(), has_tokens.sum()
    sums = torch.stack([total, count])
    if sum_over_ranks is not None:
        sums = sum_over_ranks(sums)
    mean = sums[0] / sums[1].clamp_min(1e-8)
    factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
    return weights / factor, factor


def bypass_corrections(correction: Any, checks: RejectionChecks, log_probs: torch.Tensor,
                       rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, is_weights: torch.Tensor | None,
                       sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float | torch.Tensor]]:
    """Bypass mode, one micro batch: (the policy loss's mask, its IS weights, rollout_corr/* metrics).

    As verl's bypass loss: the weights (π_θ/π_rollout, REINFORCE) are normalized over this micro batch
    of every rank, and rejection judges π_θ's detached log-probs against π_rollout's; the rejected
    tokens leave the policy loss only (its normalizer, the entropy and the KL loss keep them).
    """
    metrics: dict[str, float | torch.Tensor] = {}
    if is_weights is not None and correction.rollout_is_batch_normalize:
        is_weights, factor = normalize_is_weights(is_weights, response_mask, correction.rollout_is, sum_over_ranks)
        metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor
    if not checks:
        return response_mask, is_weights, metrics
    mask, rs_metrics = rejection_mask(log_probs.detach() - rollout_log_probs, response_mask, checks)
    return mask, is_weights, {**metrics, **rs_metrics}


# --- rejection sampling --------------------------------------------------------------------------------

def _divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """verl's per-token statistics of log r = log π_old/π_rollout, r bounded to e^±20."""
    safe = log_ratio.clamp(-SAFETY_LOG_BOUND, SAFETY_LOG_BOUND)
    return {"k1": -safe, "k2": 0.5 * safe.square(), "k3": torch.exp(safe) - 1.0 - safe}


def _sequence_statistic(token_stat: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """[b]: the response's sum, mean or max of a token statistic over its valid tokens (0 without any)."""
    if how == "sum":
        return (token_stat * mask).sum(-1)
    if how == "mean":
        return (token_stat * mask).sum(-1) / (mask.sum(-1) + 1e-8)
    highest = token_stat.masked_fill(~mask.bool(), float("-inf")).max(-1).values
    return torch.where(torch.isinf(highest), torch.zeros_like(highest), highest)


def rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, checks: RejectionChecks
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """(the response mask without the rejected tokens, rollout_corr/* metrics as verl names them).

    `log_ratio`: [b, R] log π_old - log π_rollout (in bypass mode π_θ's detached log-probs for π_old).
    A token stays when every check passes: a token option judges the token itself, a sequence option
    (seq_sum / seq_mean / seq_max) the whole response, keeping or dropping all its tokens. k1 options
    keep log(lower) ≤ stat ≤ log(upper); k2 and k3 keep stat ≤ upper.
    Metrics per option (`rollout_corr/rollout_rs_<option>_*`): the statistic's token-weighted mean, its
    max and min (over responses for sequence options), the fractions above the upper and below the
    lower bound, and the fractions of tokens and of responses it rejects; then the same two fractions
    for all options together.
    """
    mask = response_mask.to(log_ratio.dtype)
    valid = response_mask.bool()
    valid_rows = valid.any(-1)
    divergences = _divergences(log_ratio)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for option, lower, upper in checks:
        level, estimator = option.rsplit("_", 1)  # "token" | "seq_sum" | "seq_mean" | "seq_max", "k1" | "k2" | "k3"
        low = math.log(lower) if lower is not None else None
        high = math.log(upper) if lower is not None else upper
        if level == "token":
            stat = divergences[estimator]
            keep = stat <= high if low is None else (stat >= low) & (stat <= high)
            judged = stat[valid]  # one value per valid token
        else:
            per_row = _sequence_statistic(divergences[estimator], mask, level.removeprefix("seq_"))
            keep_row = per_row <= high if low is None else (per_row >= low) & (per_row <= high)
            keep = keep_row.unsqueeze(-1).expand_as(valid)
            stat = per_row.unsqueeze(-1).expand_as(log_ratio)
            judged = per_row[valid_rows]  # one value per response
        keep_all = keep_all & keep
        name = f"{METRIC_PREFIX}rollout_rs_{option}"
        if judged.numel():
            metrics[f"{name}_mean"] = float(stat[valid].mean())
            metrics[f"{name}_max"] = float(judged.max())
            metrics[f"{name}_min"] = float(judged.min())
            metrics[f"{name}_fraction_high"] = float((judged > high).float().mean())
            metrics[f"{name}_fraction_low"] = 0.0 if low is None else float((judged < low).float().mean())
        metrics.update(_rejected_fractions(name, keep, valid, valid_rows))
    metrics.update(_rejected_fractions(f"{METRIC_PREFIX}rollout_rs", keep_all, valid, None))
    return (response_mask * keep_all.to(response_mask.dtype)), metrics


def _rejected_fractions(name: str, keep: torch.Tensor, valid: torch.Tensor,
                        rows: torch.Tensor | None) -> dict[str, float]:
    """Fractions of valid tokens rejected, and of responses with a rejected token (over `rows`, or all rows
    as verl's overall metric counts them)."""
    rejected = ~keep & valid
    tokens = valid.sum().clamp_min(1)
    per_row = rejected.any(-1).float()
    sequences = per_row.mean() if rows is None else (per_row[rows].mean() if rows.any() else per_row.sum())
    return {f"{name}_masked_fraction": float(rejected.sum() / tokens),
            f"{name}_seq_masked_fraction": float(sequences)}
