"""Policy-gradient losses keyed by verl's ``actor.policy_loss.loss_mode``.

Every mode is one function with the same signature, pure tensor arithmetic on ``[B, T]``
tensors; :data:`POLICY_LOSSES` maps the mode's name to it and the actor worker calls
:func:`compute_policy_loss`. ``vanilla`` is :func:`engine.algos.losses.policy_loss` (PPO's
clipped surrogate with dual clip). Semantics follow verl 0.9.1's ``core_algos``; where a mode
fixes its own aggregation (gspo, sapo: per-sequence token mean; geo_mean: one term per sequence) the
plan's ``loss_agg_mode`` does not apply to it, as in verl.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.algos.advantages import masked_mean
from engine.algos.losses import BatchCounts, PolicyLossOutput, agg_loss, policy_loss

__all__ = ["POLICY_LOSSES", "LossSettings", "compute_policy_loss"]

# exp() of a log-ratio beyond this overflows; verl clamps cispo's log-ratio to the same range.
_LOG_RATIO_CLAMP = 20.0
# GSPO clamps the log of its sequence ratio from above at 10 (verl's value) before exp().
_GSPO_LOG_RATIO_MAX = 10.0


@dataclass(frozen=True)
class LossSettings:
    """The actor settings a policy loss reads (verl's names; defaults are verl 0.9.1's)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    clip_cov_ratio: float = 0.0002  # clip_cov: fraction of valid tokens whose gradient is cut
    clip_cov_lb: float = 1.0  # clip_cov: only tokens with covariance in (lb, ub) are candidates
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # kl_cov: fraction of valid tokens that get the |log ratio| penalty
    ppo_kl_coef: float = 0.1  # kl_cov: weight of that penalty
    tau_pos: float = 1.0  # sapo: gate temperature where A > 0
    tau_neg: float = 1.05  # sapo: gate temperature where A <= 0


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def _k1(old_log_prob: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The metric ppo_kl: masked mean of old - new log-prob (the k1 estimator), as vanilla reports it."""
    with torch.no_grad():
        return masked_mean(old_log_prob - log_prob, mask)


def _weighted(losses: torch.Tensor, is_weights: torch.Tensor | None) -> torch.Tensor:
    return losses if is_weights is None else losses * is_weights.detach()


def vanilla_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
                 totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
                 generator: torch.Generator | None = None) -> PolicyLossOutput:
    """PPO's clipped surrogate with dual clip: :func:`engine.algos.losses.policy_loss`."""
    return policy_loss(old_log_prob, log_prob, advantages, mask, settings.clip_ratio_low, settings.clip_ratio_high,
                       settings.clip_ratio_c, loss_agg_mode, totals=totals, is_weights=is_weights)


def gspo_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
              totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
              generator: torch.Generator | None = None) -> PolicyLossOutput:
    """GSPO (arXiv 2507.18671): PPO's clip on the *sequence* ratio ``s = exp(mean_t(log π - log π_old))``.

    Each token's ratio has the value ``s`` of its sequence but the gradient of its own log-prob
    (``s_t = sg(s) · π_t / sg(π_t)``), so a sequence is kept or clipped as a whole. Aggregated
    per sequence (token mean, then mean over sequences) whatever ``loss_agg_mode`` says; no dual clip.
    """
    m = mask.to(log_prob.dtype)
    lengths = m.sum(-1).clamp_min(1.0)
    seq_log_ratio = ((log_prob - old_log_prob) * m).sum(-1) / lengths
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=_GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high)
    losses = _weighted(torch.maximum(unclipped, clipped), is_weights)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).to(ratio.dtype), mask)
    return PolicyLossOutput(agg_loss(losses, mask, "seq-mean-token-mean", totals=totals), clip_fraction,
                            _k1(old_log_prob, log_prob, mask), _zero(ratio))


def sapo_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
              totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
              generator: torch.Generator | None = None) -> PolicyLossOutput:
    """SAPO (arXiv 2511.20347): a smooth gate instead of a hard clip, ``-A · σ(τ (r - 1)) · 4 / τ``.

    ``τ`` is ``tau_pos`` where ``A > 0`` and ``tau_neg`` elsewhere. At ``r = 1`` the gate is 2/τ with
    slope 1 (the plain surrogate's gradient); far from 1 it flattens, so the gradient fades without a
    cut-off. Aggregated per sequence (token mean, then mean over sequences) whatever ``loss_agg_mode`` says.
    """
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    tau = torch.where(advantages > 0, settings.tau_pos, settings.tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    losses = _weighted(-gate * advantages, is_weights)
    return PolicyLossOutput(agg_loss(losses, mask, "seq-mean-token-mean", totals=totals), _zero(ratio),
                            _k1(old_log_prob, log_prob, mask), _zero(ratio))


def gpg_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
             totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> PolicyLossOutput:
    """GPG: the plain policy gradient ``-A · log π`` (no ratio, no clip)."""
    losses = _weighted(-advantages * log_prob, is_weights)
    return PolicyLossOutput(agg_loss(losses, mask, loss_agg_mode, totals=totals), _zero(log_prob),
                            _k1(old_log_prob, log_prob, mask), _zero(log_prob))


def clip_cov_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
                  totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> PolicyLossOutput:
    """Clip-Cov (arXiv 2505.22617): PPO's clipped surrogate, minus the gradient of a few high-covariance tokens.

    Per valid token not already clipped by PPO, ``cov = (A - mean A) · (log π - mean log π)`` (means
    over this batch's valid tokens). Of the tokens with ``lb < cov < ub``, ``max(1, ⌊ratio · n_valid⌋)``
    drawn at random (``generator``) have their loss multiplied by 0. No dual clip. ``clip_fraction``
    counts those cut tokens, as verl's ``pg_clipfrac`` does for this mode.
    """
    if settings.clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {settings.clip_cov_ratio}")
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high)
    valid = mask > 0
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))
        candidate = valid & ~(clipped > unclipped) & (cov > settings.clip_cov_lb) & (cov < settings.clip_cov_ub)
        where = torch.nonzero(candidate)
        n_cut = max(int(settings.clip_cov_ratio * int(valid.sum())), 1)
        chosen = where[torch.randperm(len(where), generator=generator)[:n_cut].to(where.device)]
        keep = torch.ones_like(ratio)
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
        clip_fraction = masked_mean((keep == 0).to(ratio.dtype), mask)
    losses = _weighted(torch.maximum(unclipped, clipped) * keep, is_weights)
    return PolicyLossOutput(agg_loss(losses, mask, loss_agg_mode, totals=totals), clip_fraction,
                            _k1(old_log_prob, log_prob, mask), _zero(ratio))


def kl_cov_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
                totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> PolicyLossOutput:
    """KL-Cov (arXiv 2505.22617): the unclipped surrogate ``-A · r``, plus ``ppo_kl_coef · |log r|`` on the
    ``max(1, ⌊kl_cov_ratio · n_valid⌋)`` valid tokens of largest ``(A - mean A) · (log π - mean log π)``.

    No clipping anywhere; the penalty holds the highest-covariance tokens near the rollout policy.
    """
    if settings.kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {settings.kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    valid = mask > 0
    penalised = torch.zeros_like(valid)
    n_valid = int(valid.sum())
    if n_valid:
        with torch.no_grad():
            adv, logp = advantages[valid], log_prob[valid]
            cov = (adv - adv.mean()) * (logp - logp.mean())
            top = torch.topk(cov, max(1, int(n_valid * settings.kl_cov_ratio))).indices
            flat = torch.zeros(n_valid, dtype=torch.bool, device=cov.device)
            flat[top] = True
            penalised[valid] = flat
    losses = -advantages * ratio + torch.where(penalised, settings.ppo_kl_coef * log_ratio.abs(), 0.0)
    losses = _weighted(losses, is_weights)
    return PolicyLossOutput(agg_loss(losses, mask, loss_agg_mode, totals=totals), _zero(ratio),
                            _k1(old_log_prob, log_prob, mask), _zero(ratio))


def geo_mean_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
                  totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> PolicyLossOutput:
    """GMPO (arXiv 2507.20673): one term per sequence, ``-Ā · exp(mean_t clip_A(log r_t))``.

    ``clip_A`` clips the token log-ratio into ``[-low, high]`` only on the side the advantage's
    sign pushes it (``sign(A) · min(sign(A) · x, sign(A) · clamp(x))``); ``Ā`` is the sequence's mean
    token advantage. The loss is the mean over sequences whatever ``loss_agg_mode`` says (an empty
    row counts, with loss 0, as in verl). IS weights enter as their per-sequence geometric mean.
    ``clip_fraction`` counts clamped tokens with ``A > 0``, as verl's ``pg_clipfrac``.
    """
    m = mask.to(log_prob.dtype)
    lengths = m.sum(-1).clamp_min(1.0)
    log_ratio = log_prob - old_log_prob
    clamped = torch.clamp(log_ratio, -settings.clip_ratio_low, settings.clip_ratio_high)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = torch.exp((pessimistic * m).sum(-1) / lengths)
    seq_adv = (advantages * m).sum(-1) / lengths
    losses = -seq_adv * seq_ratio
    if is_weights is not None:
        losses = losses * torch.exp((torch.log(is_weights.detach() + 1e-10) * m).sum(-1) / lengths)
    # Share of the mean over the whole mini batch's rows (BatchCounts), or the mean over these rows.
    rows = totals.sequences if totals is not None else float(losses.shape[0])
    with torch.no_grad():
        clip_fraction = masked_mean(((log_ratio != clamped) & (advantages > 0)).to(m.dtype), mask)
    return PolicyLossOutput(losses.sum() / max(rows, 1.0), clip_fraction, _k1(old_log_prob, log_prob, mask),
                            _zero(m))


def cispo_loss(old_log_prob, log_prob, advantages, mask, settings: LossSettings, loss_agg_mode: str,
               totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> PolicyLossOutput:
    """CISPO (arXiv 2506.13585): ``-sg(clip(r, 1 - low, 1 + high)) · A · log π``.

    The clipped ratio is a constant weight, so every token keeps a gradient (PPO's clip zeroes it).
    """
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    weight = torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high).detach()
    losses = _weighted(-weight * advantages * log_prob, is_weights)
    with torch.no_grad():
        clip_fraction = masked_mean((ratio != weight).to(ratio.dtype), mask)
    return PolicyLossOutput(agg_loss(losses, mask, loss_agg_mode, totals=totals), clip_fraction,
                            _k1(old_log_prob, log_prob, mask), _zero(ratio))


PolicyLossFn = Callable[..., PolicyLossOutput]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "vanilla": vanilla_loss,
    "gspo": gspo_loss,
    "sapo": sapo_loss,
    "gpg": gpg_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
    "geo_mean": geo_mean_loss,
    "cispo": cispo_loss,
}


def compute_policy_loss(loss_mode: str, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, settings: LossSettings, loss_agg_mode: str = "token-mean",
                        totals: BatchCounts | None = None, is_weights: torch.Tensor | None = None,
                        generator: torch.Generator | None = None) -> PolicyLossOutput:
    """The policy loss of ``loss_mode`` (a key of :data:`POLICY_LOSSES`).

    Raises:
        ValueError: a mode this engine does not run.
    """
    fn = POLICY_LOSSES.get(loss_mode)
    if fn is None:
        raise ValueError(f"policy loss_mode {loss_mode!r} is not run by this engine; it runs "
                         f"{', '.join(sorted(POLICY_LOSSES))}")
    return fn(old_log_prob, log_prob, advantages, mask, settings, loss_agg_mode, totals=totals,
              is_weights=is_weights, generator=generator)
