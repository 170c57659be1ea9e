"""KL estimators between policy and reference, KL coefficient controllers, KL-in-reward.

Shapes: ``B`` = batch, ``T`` = response length. Semantics follow verl's ``core_algos``.
Estimators follow http://joschu.net/blog/kl-approx.html with ``log r = ref - log_prob``.
"""

from __future__ import annotations

import torch

from engine.algos.advantages import masked_mean

__all__ = [
    "KL_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_in_reward",
    "kl_penalty",
]

_BASE_KINDS: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# A `+` suffix: the named estimator's value with k2's gradient (verl core_algos.py kl_penalty).
KL_KINDS: tuple[str, ...] = _BASE_KINDS + tuple(kind + "+" for kind in _BASE_KINDS)

# exp(ref - logp) can overflow where the two policies disagree strongly; verl clamps the
# log-ratio to +-20 and the k3 value to +-10 so a few outlier tokens cannot dominate.
_K3_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0


def _estimate(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return log_prob - ref_log_prob
    if kind == "abs":
        return (log_prob - ref_log_prob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind in ("low_var_kl", "k3"):
        log_r = torch.clamp(ref_log_prob - log_prob, -_K3_LOG_RATIO_CLAMP, _K3_LOG_RATIO_CLAMP)
        k3 = torch.exp(log_r) - log_r - 1.0
        return torch.clamp(k3, -_K3_VALUE_CLAMP, _K3_VALUE_CLAMP)
    raise ValueError(f"unknown kl penalty kind {kind!r}; expected one of {', '.join(KL_KINDS)}")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate from sampled-token log-probs.

    Kinds:
        - ``kl`` / ``k1``: ``logp - ref`` (unbiased, high variance, can be negative).
        - ``abs``: ``|logp - ref|``.
        - ``mse`` / ``k2``: ``0.5 * (logp - ref)^2``.
        - ``low_var_kl`` / ``k3``: ``exp(ref - logp) - (ref - logp) - 1``, clamped to [-10, 10]
          (non-negative, low variance).
        - any of these with a ``+`` suffix (``k3+``): straight-through, the value of the named
          estimator with the gradient of k2. k1 and k3 estimate KL's value without bias but
          not its gradient; k2's gradient, ``logp - ref`` times the score, is the right one.

    Args:
        log_prob: ``[B, T]`` log-probs of the sampled tokens under the current/rollout policy.
        ref_log_prob: ``[B, T]`` log-probs of the same tokens under the reference policy.
        kind: one of :data:`KL_KINDS`.

    Returns:
        ``[B, T]`` (unmasked; callers apply the response mask).

    Raises:
        ValueError: unknown ``kind``.
    """
    if not kind.endswith("+"):
        return _estimate(log_prob, ref_log_prob, kind)
    value = _estimate(log_prob, ref_log_prob, kind[:-1])
    k2 = 0.5 * (log_prob - ref_log_prob).square()
    # k2 - k2.detach() is zero in the forward pass and carries k2's gradient in the backward one.
    return k2 - k2.detach() + value.detach()


class FixedKLController:
    """Constant KL coefficient; ``update`` is a no-op so both controllers are interchangeable."""

    def __init__(self, coef: float) -> None:
        self.value: float = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Ignore the observation: the coefficient is fixed."""


class AdaptiveKLController:
    """Proportional KL controller from Ziegler et al. 2019 ("Fine-Tuning LMs from Human Preferences").

    ``value <- value * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)``.
    The error is clipped so one noisy KL measurement moves the coefficient by at most
    ``0.2 * n_steps / horizon`` in relative terms.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value: float = float(init_kl_coef)
        self.target: float = float(target_kl)
        self.horizon: float = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards keeping ``current_kl`` at the target.

        Args:
            current_kl: observed mean KL (float or 0-dim tensor).
            n_steps: samples (verl passes the batch size) since the last update.
        """
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def apply_kl_in_reward(
    token_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    kind: str = "kl",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract ``coef * KL`` from per-token scores (the PPO/RLHF KL-shaped reward).

    Args:
        token_scores: ``[B, T]`` task scores (typically the outcome score on the last token).
        log_prob: ``[B, T]`` rollout-policy log-probs (verl uses the recomputed old log-probs).
        ref_log_prob: ``[B, T]`` reference log-probs.
        response_mask: ``[B, T]``; KL at masked positions is zeroed before subtraction.
        coef: KL coefficient (e.g. a controller's ``.value``).
        kind: see :func:`kl_penalty`.

    Returns:
        ``(token_rewards [B, T], mean_kl)``: ``mean_kl`` is a detached 0-dim tensor, the
        per-sequence masked-mean KL averaged over the batch, i.e. what verl feeds to
        ``AdaptiveKLController.update``.
    """
    mask = response_mask.to(token_scores.dtype)
    kld = kl_penalty(log_prob, ref_log_prob, kind) * mask
    token_rewards = token_scores - coef * kld
    mean_kl = masked_mean(kld, mask, dim=-1).mean().detach()
    return token_rewards, mean_kl
