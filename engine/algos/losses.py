"""PPO policy/value losses, loss aggregation, and logit utilities (entropy, log-probs).

Shapes: ``B`` = batch, ``T`` = response length, ``V`` = vocabulary. Masks are 0/1 tensors
(bool or float) of shape ``[B, T]``. Semantics follow verl's ``core_algos``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.algos.advantages import masked_mean

__all__ = [
    "LOSS_AGG_MODES",
    "BatchCounts",
    "PolicyLossOutput",
    "agg_loss",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "log_probs_from_logits",
    "policy_loss",
    "value_loss",
]

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# exp() of a log-ratio beyond this overflows / explodes the gradient; verl clamps identically.
_LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class BatchCounts:
    """Sizes of a whole mini batch (all micro batches on all ranks) that a loss is averaged over.

    With these, :func:`agg_loss` returns one micro batch's *share* of the mini batch's loss, so
    the shares summed over micro batches and ranks equal the loss of the whole mini batch: the
    gradient then does not depend on how the batch was cut into micro batches and GPUs (a plain
    mean of per-micro-batch token means would weigh a token in a short micro batch more).
    """

    tokens: float  # valid (mask = 1) tokens
    sequences: float  # rows
    nonempty_sequences: float  # rows with at least one valid token
    width: float | None = None  # the batch's response width T: seq-mean-token-sum-norm's default divisor,
    # which must not shrink when a micro batch is trimmed of padding

    @staticmethod
    def of(mask: torch.Tensor) -> torch.Tensor:
        """This batch's counts as a float tensor ``[tokens, sequences, nonempty]``, ready to all-reduce."""
        m = mask.to(torch.float64)
        return torch.stack([m.sum(), torch.tensor(float(m.shape[0]), dtype=torch.float64), (m.sum(-1) > 0).sum().to(torch.float64)])

    @classmethod
    def from_tensor(cls, counts: torch.Tensor, width: float | None = None) -> BatchCounts:
        tokens, sequences, nonempty = (float(x) for x in counts)
        return cls(tokens, sequences, nonempty, width)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    norm_length: float | None = None,
    totals: BatchCounts | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar.

    Modes:
        - ``token-mean``: sum over valid tokens / number of valid tokens in the batch.
        - ``seq-mean-token-sum``: per-sequence token sum, then mean over all ``B`` rows.
        - ``seq-mean-token-mean``: per-sequence token mean, then mean over sequences that have
          at least one valid token (an empty row would otherwise be 0/0).
        - ``seq-mean-token-sum-norm`` (Dr.GRPO): per-sequence token sum divided by the constant
          ``norm_length`` (default ``T``), then mean over sequences (Dr.GRPO's 1/G). verl sums
          over the sequences of each micro batch and divides by the accumulation steps, which
          makes its scale grow with the micro batch size (a performance knob); the mean over the
          whole mini batch does not. Keep ``norm_length`` constant across steps.

    Args:
        loss_mat: ``[B, T]``.
        mask: ``[B, T]``.
        mode: one of :data:`LOSS_AGG_MODES`.
        norm_length: divisor for ``seq-mean-token-sum-norm`` only.
        totals: counts of the whole mini batch this ``[B, T]`` slice belongs to; the result is
            then this slice's share of the mini batch's loss (see :class:`BatchCounts`).

    Returns:
        Scalar tensor.

    Raises:
        ValueError: unknown ``mode``.
    """
    m = mask.to(loss_mat.dtype)
    if totals is not None:
        return _share_of_total(loss_mat, m, mode, norm_length, totals)
    if mode == "token-mean":
        return masked_mean(loss_mat, m)
    if mode == "seq-mean-token-sum":
        return (loss_mat * m).sum(-1).mean()
    if mode == "seq-mean-token-mean":
        tokens = m.sum(-1)
        seq_means = (loss_mat * m).sum(-1) / tokens.clamp_min(1e-8)
        return masked_mean(seq_means, tokens > 0)
    if mode == "seq-mean-token-sum-norm":
        divisor = float(m.shape[-1]) if norm_length is None else float(norm_length)
        return (loss_mat * m).sum(-1).mean() / divisor
    raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


def _share_of_total(loss_mat: torch.Tensor, m: torch.Tensor, mode: str, norm_length: float | None,
                    totals: BatchCounts) -> torch.Tensor:
    """Numerator of the mode's mean over this slice, divided by the whole batch's denominator."""
    if mode == "token-mean":
        return (loss_mat * m).sum() / max(totals.tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return (loss_mat * m).sum() / max(totals.sequences, 1.0)
    if mode == "seq-mean-token-mean":
        tokens = m.sum(-1)
        seq_means = (loss_mat * m).sum(-1) / tokens.clamp_min(1e-8)
        return seq_means[tokens > 0].sum() / max(totals.nonempty_sequences, 1.0)
    if mode == "seq-mean-token-sum-norm":
        width = totals.width if totals.width is not None else float(m.shape[-1])
        divisor = width if norm_length is None else float(norm_length)
        return (loss_mat * m).sum() / divisor / max(totals.sequences, 1.0)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


@dataclass(frozen=True)
class PolicyLossOutput:
    """Result of :func:`policy_loss`.

    Attributes:
        loss: scalar, differentiable w.r.t. ``log_prob``.
        clip_fraction: scalar, fraction of valid tokens where the PPO-clipped term was taken.
        approx_kl: scalar, masked mean of ``old_log_prob - log_prob`` (k1 estimator).
        dual_clip_fraction: scalar, fraction of valid tokens (negative advantage only) where
            the dual-clip bound ``clip_ratio_c * |A|`` was taken.
    """

    loss: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    dual_clip_fraction: torch.Tensor


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    totals: BatchCounts | None = None,
    is_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate with asymmetric clip range and dual clip (Ye et al., 2020).

    Per token, with ``r = exp(log_prob - old_log_prob)``:
    ``L = max(-A r, -A clip(r, 1 - low, 1 + high))``; for ``A < 0`` additionally
    ``L = min(L, -A c)`` so a huge ratio on a bad action cannot produce an unbounded loss.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``[B, T]``.
        clip_ratio_low, clip_ratio_high: the ratio is clipped to ``[1-low, 1+high]``.
        clip_ratio_c: dual-clip constant, must be > 1.
        loss_agg_mode: see :func:`agg_loss`.
        totals: the whole mini batch's counts; the loss is then this slice's share (:func:`agg_loss`).
        is_weights: ``[B, T]`` per-token weights of the loss (rollout correction's truncated IS), constants.

    Raises:
        ValueError: ``clip_ratio_c <= 1`` or unknown ``loss_agg_mode``.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual clip, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo_losses = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(ppo_losses, dual_bound), ppo_losses)
    if is_weights is not None:
        losses = losses * is_weights.detach()

    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).to(ratio.dtype), response_mask)
        dual_hit = (ppo_losses > dual_bound) & negative
        dual_clip_fraction = masked_mean(dual_hit.to(ratio.dtype), response_mask)
        approx_kl = masked_mean(-log_ratio, response_mask)
    return PolicyLossOutput(
        loss=agg_loss(losses, response_mask, loss_agg_mode, totals=totals),
        clip_fraction=clip_fraction,
        approx_kl=approx_kl,
        dual_clip_fraction=dual_clip_fraction,
    )


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    totals: BatchCounts | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped critic loss ``0.5 * max((v - R)^2, (clip(v, v_old +- eps) - R)^2)``.

    Args:
        values: ``[B, T]`` current critic predictions (differentiable).
        old_values: ``[B, T]`` predictions at rollout time.
        returns: ``[B, T]`` targets.
        response_mask: ``[B, T]``.
        cliprange_value: the prediction may move at most this far from ``old_values``.
        loss_agg_mode: see :func:`agg_loss`.
        totals: the whole mini batch's counts; the loss is then this slice's share (:func:`agg_loss`).

    Returns:
        ``(loss, clip_fraction)``: scalars; the fraction counts valid tokens where the
        clipped error was the larger one.
    """
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    err_unclipped = (values - returns) ** 2
    err_clipped = (clipped_values - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), response_mask, loss_agg_mode, totals=totals)
    with torch.no_grad():
        clip_fraction = masked_mean((err_clipped > err_unclipped).to(values.dtype), response_mask)
    return loss, clip_fraction


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` along the last dim: ``logsumexp(z) - sum(p * z)``.

    Args:
        logits: ``[..., V]``.

    Returns:
        ``[...]``.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Same as :func:`entropy_from_logits`, processing ``chunk_size`` rows at a time.

    The softmax temporary is ``[chunk_size, V]`` instead of the full ``[..., V]``, which is
    what matters for large vocabularies. The saving is for forward-only use (``no_grad``);
    under autograd each chunk's activations are kept for backward anyway.

    Args:
        logits: ``[..., V]``.
        chunk_size: rows (flattened leading positions) per chunk, > 0.

    Returns:
        ``[...]``.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy_from_logits(chunk) for chunk in flat.split(chunk_size, dim=0)]
    out = torch.cat(parts) if parts else flat.new_empty(0)
    return out.reshape(logits.shape[:-1])


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 4096
) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``, without a full log-softmax.

    For fp32/fp64 this is ``logits[label] - logsumexp(logits)`` per chunk of rows, so the
    ``[N, V]`` log-softmax is never materialised. For half precision, logsumexp loses too
    much accuracy on large vocabularies, so (as verl) a per-chunk ``log_softmax`` is used.

    Args:
        logits: ``[B, T, V]`` (any ``[..., V]``).
        labels: ``[B, T]`` integer token ids (``[...]``).
        chunk_size: rows (flattened positions) per chunk, > 0.

    Returns:
        ``[B, T]`` log-probabilities, differentiable w.r.t. ``logits``.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    flat = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, 1).long()
    full_precision = logits.dtype in (torch.float32, torch.float64)
    parts = []
    for chunk, chunk_labels in zip(
        flat.split(chunk_size, dim=0), flat_labels.split(chunk_size, dim=0), strict=True
    ):
        if full_precision:
            picked = chunk.gather(-1, chunk_labels).squeeze(-1)
            parts.append(picked - torch.logsumexp(chunk, dim=-1))
        else:
            parts.append(torch.log_softmax(chunk, dim=-1).gather(-1, chunk_labels).squeeze(-1))
    out = torch.cat(parts) if parts else flat.new_empty(0)
    return out.reshape(labels.shape)
