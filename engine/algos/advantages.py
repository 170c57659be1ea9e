"""Advantage estimators (GAE, GRPO, RLOO, REINFORCE++ and their group variants) and masked statistics.

Shapes: ``B`` = batch (responses), ``T`` = response length. Masks are 0/1 (bool or float)
tensors of shape ``[B, T]`` marking response tokens that take part in the update.
Semantics follow verl's ``core_algos``; all estimators run under ``torch.no_grad``
because advantages and returns are targets, never differentiated through.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

__all__ = [
    "compute_gae",
    "compute_grpo_advantages",
    "compute_reinforce_plus_plus_advantages",
    "compute_gpg_advantages",
    "compute_grpo_passk_advantages",
    "compute_opo_advantages",
    "compute_optimal_token_baseline_advantages",
    "compute_tir_optimal_token_baseline_advantages",
    "compute_reinforce_plus_plus_baseline_advantages",
    "compute_remax_advantages",
    "compute_rloo_advantages",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "outcome_token_scores",
    "sum_pi_squared_from_logits",
]

GroupIndex = Sequence[Hashable] | torch.Tensor

# Estimators that weigh tokens by the old policy's Σ_v π(v)², which the actor then computes with its log-probs.
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1.

    Args:
        values: any shape.
        mask: same shape as ``values`` (bool or 0/1 float).
        dim: reduce only this dimension; ``None`` reduces everything to a scalar.

    Returns:
        Scalar tensor, or ``values`` with ``dim`` removed. An empty mask yields 0, not NaN,
        so a fully padded row cannot poison a batch statistic.
    """
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp_min(1e-8)
    return (values * mask).sum(dim) / mask.sum(dim).clamp_min(1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of ``values`` (scalar tensor).

    Raises:
        ValueError: with ``unbiased=True`` and fewer than two masked entries, where the
            Bessel correction is undefined (verl raises here too rather than return inf).
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = float(mask.to(values.dtype).sum().item())
        if count < 2:
            raise ValueError(
                f"masked_var(unbiased=True) needs at least 2 masked elements, got {count:g}"
            )
        variance = variance * (count / (count - 1.0))
    return variance


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise ``values`` to zero mean, unit (unbiased) variance over masked entries.

    Args:
        values: ``[B, T]`` (any shape works).
        mask: same shape as ``values``.
        shift_mean: if False the original mean is added back (scale-only whitening).
        eps: added to the variance before the square root.

    Returns:
        Tensor shaped like ``values``. Unmasked entries are transformed too but carry no meaning.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


@torch.no_grad()
def outcome_token_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each response's scalar score on its last valid token, zeros elsewhere.

    The token-level form that GAE, REINFORCE++ and the KL-in-reward penalty work on: the
    outcome arrives when the response ends, every earlier token earns only what the KL term
    adds. An empty row indexes token 0 (instead of wrapping around to the last column).

    Args:
        scores: ``[B]`` outcome score per response.
        response_mask: ``[B, T]``.

    Returns:
        ``[B, T]`` float tensor.
    """
    scores = _as_float(scores)
    # Responses are right-padded: the valid tokens come first, so the last one is at count - 1.
    last = (response_mask.long().sum(-1) - 1).clamp_min(0)
    token_scores = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    token_scores[torch.arange(scores.shape[0], device=scores.device), last] = scores
    return token_scores


@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation over response tokens.

    Masked positions are skipped: their value is never bootstrapped from and their TD error
    never enters the recursion, so the next valid token bootstraps from the following *valid*
    token (this also handles interleaved observation tokens in multi-turn rollouts).

    Args:
        token_rewards: ``[B, T]`` per-token rewards (KL already folded in, if any).
        values: ``[B, T]`` critic values V(s_t).
        response_mask: ``[B, T]``.
        gamma: discount factor.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, each ``[B, T]``, raw (not whitened; call
        :func:`masked_whiten` as verl does), zero at masked positions.
        ``returns = advantages + values`` on valid positions.
    """
    mask = response_mask.to(values.dtype)
    batch, length = values.shape
    next_value = values.new_zeros(batch)
    last_gae = values.new_zeros(batch)
    advantages = torch.zeros_like(values)
    for t in reversed(range(length)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * last_gae
        # On a masked step keep the carried state untouched, i.e. the step does not exist.
        last_gae = m * candidate + (1.0 - m) * last_gae
        next_value = m * values[:, t] + (1.0 - m) * next_value
        advantages[:, t] = last_gae
    advantages = advantages * mask
    returns = (advantages + values) * mask
    return advantages, returns


def _group_ids(group_index: GroupIndex, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group labels to contiguous int ids ``[B]``; return (ids, n_groups)."""
    labels = group_index.tolist() if isinstance(group_index, torch.Tensor) else list(group_index)
    if len(labels) != batch:
        raise ValueError(f"group_index has {len(labels)} entries, expected batch size {batch}")
    lookup: dict[Hashable, int] = {}
    ids = [lookup.setdefault(label, len(lookup)) for label in labels]
    return torch.tensor(ids, dtype=torch.long, device=device), len(lookup)


def _group_stats(
    scores: torch.Tensor, group_index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group mean, unbiased group std, group size), each ``[B]``.

    Singleton groups get mean 0 and std 1 so their advantage is the raw score, as in verl.
    """
    ids, n_groups = _group_ids(group_index, scores.shape[0], scores.device)
    counts = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, ids, torch.ones_like(scores)
    )
    sums = torch.zeros_like(counts).index_add_(0, ids, scores)
    means = sums / counts
    sq_dev = torch.zeros_like(counts).index_add_(0, ids, (scores - means[ids]) ** 2)
    stds = torch.sqrt(sq_dev / (counts - 1.0).clamp_min(1.0))
    singleton = counts == 1
    means = torch.where(singleton, torch.zeros_like(means), means)
    stds = torch.where(singleton, torch.ones_like(stds), stds)
    return means[ids], stds[ids], counts[ids]


def _as_float(scores: torch.Tensor) -> torch.Tensor:
    return scores if scores.is_floating_point() else scores.to(torch.float32)


@torch.no_grad()
def compute_grpo_advantages(
    scores: torch.Tensor,
    group_index: GroupIndex,
    response_mask: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantages: score minus its group mean (optionally over group std).

    Args:
        scores: ``[B]`` scalar outcome score per response.
        group_index: length-``B`` labels (ints, strings, or a tensor); equal labels share
            a prompt and form one group.
        response_mask: ``[B, T]``.
        norm_by_std: divide by ``std + eps`` (unbiased std, like ``torch.std``). False gives
            the Dr.GRPO variant.
        eps: keeps all-equal groups (std 0) finite: their advantages become 0.

    Returns:
        ``(advantages, returns)``, identical ``[B, T]`` tensors: the per-sample advantage
        broadcast over valid tokens, zero elsewhere.
    """
    scores = _as_float(scores)
    mean, std, _ = _group_stats(scores, group_index)
    adv = scores - mean
    if norm_by_std:
        adv = adv / (std + eps)
    token_adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return token_adv, token_adv


@torch.no_grad()
def compute_rloo_advantages(
    scores: torch.Tensor, group_index: GroupIndex, response_mask: torch.Tensor, singleton_keeps_score: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO advantages: score minus the mean score of the *other* members of its group.

    Written as ``n/(n-1) * (score - group_mean)``, which equals the leave-one-out form.
    A singleton group has no baseline: its advantage is its raw score (verl's ``rloo``), or 0 with
    ``singleton_keeps_score=False`` (verl's ``rloo_vectorized``); groups of 2 or more agree.

    Args:
        scores: ``[B]``; group_index: length ``B``; response_mask: ``[B, T]``.

    Returns:
        ``(advantages, returns)``, identical ``[B, T]`` tensors, zero at masked positions.
    """
    scores = _as_float(scores)
    mean, _, counts = _group_stats(scores, group_index)
    factor = counts / (counts - 1.0).clamp_min(1.0)
    adv = torch.where(counts > 1, factor * (scores - mean), scores if singleton_keeps_score else torch.zeros_like(scores))
    token_adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return token_adv, token_adv


@torch.no_grad()
def compute_reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go, whitened over the whole batch.

    Args:
        token_rewards: ``[B, T]`` (KL penalty already folded in, if used).
        response_mask: ``[B, T]``.
        gamma: discount factor.

    Returns:
        ``(advantages, returns)``, each ``[B, T]``; advantages are the batch-whitened returns,
        both zero at masked positions. A masked token ends the running return, as in verl.
    """
    mask = response_mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = token_rewards.new_zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns * mask


def _broadcast(adv: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A per-response advantage on every valid token, zero elsewhere; returned as (advantages, returns)."""
    token_adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return token_adv, token_adv


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantages(
    scores: torch.Tensor, group_index: GroupIndex, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: score minus its group mean, on every token, whitened over the batch.

    A singleton group's baseline is 0 (its raw score goes into the whitening), as in verl.
    Returns ``(advantages, returns)``, identical ``[B, T]``, zero at masked positions.
    """
    scores = _as_float(scores)
    mean, _, _ = _group_stats(scores, group_index)
    mask = response_mask.to(scores.dtype)
    centred = (scores - mean).unsqueeze(-1) * mask
    token_adv = masked_whiten(centred, mask) * mask
    return token_adv, token_adv


@torch.no_grad()
def compute_opo_advantages(
    scores: torch.Tensor, group_index: GroupIndex, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: score minus its group's *length-weighted* mean score ``Σ len_j r_j / Σ len_j``.

    Lengths are valid response tokens. A singleton group's baseline is 0, as in verl.
    Returns ``(advantages, returns)``, identical ``[B, T]``, zero at masked positions.
    """
    scores = _as_float(scores)
    lengths = response_mask.to(scores.dtype).sum(-1)
    ids, n_groups = _group_ids(group_index, scores.shape[0], scores.device)
    weighted = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, lengths * scores)
    total = torch.zeros_like(weighted).index_add_(0, ids, lengths)
    counts = torch.zeros_like(weighted).index_add_(0, ids, torch.ones_like(scores))
    baseline = torch.where(counts > 1, weighted / total.clamp_min(1e-8), torch.zeros_like(weighted))
    return _broadcast(scores - baseline[ids], response_mask)


@torch.no_grad()
def compute_grpo_passk_advantages(
    scores: torch.Tensor, group_index: GroupIndex, response_mask: torch.Tensor, norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (arXiv 2503.19595): only each group's best response gets an advantage, ``r_max - r_second``.

    With ``norm_by_std`` it is divided by the group's unbiased std ``+ eps``. On a tie for the best
    the first response listed gets it (the difference is then 0 anyway).

    Raises:
        ValueError: a group with fewer than 2 responses (there is no second best).
    """
    scores = _as_float(scores)
    ids, n_groups = _group_ids(group_index, scores.shape[0], scores.device)
    adv = torch.zeros_like(scores)
    for group in range(n_groups):
        members = torch.nonzero(ids == group).flatten()
        if len(members) < 2:
            raise ValueError(f"grpo_passk needs at least 2 responses per prompt; a group has {len(members)} "
                             f"(set actor_rollout_ref.rollout.n >= 2)")
        rewards = scores[members]
        top = torch.topk(rewards, 2)
        best = members[int(torch.argmax(rewards))]
        gap = top.values[0] - top.values[1]
        adv[best] = gap / (rewards.std() + eps) if norm_by_std else gap
    return _broadcast(adv, response_mask)


@torch.no_grad()
def compute_gpg_advantages(
    scores: torch.Tensor, group_index: GroupIndex, response_mask: torch.Tensor, f_norm: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (arXiv 2504.02546): ``α · (score - group mean) / f_norm`` with ``α = B / #(nonzero scores)``.

    ``α`` scales up the batch when few responses score anything (``B`` counts all responses; with
    no nonzero score ``α = B``). A singleton group's mean is 0, as in verl.
    """
    scores = _as_float(scores)
    mean, _, _ = _group_stats(scores, group_index)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    return _broadcast(alpha * (scores - mean) / f_norm, response_mask)


@torch.no_grad()
def compute_remax_advantages(
    token_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (arXiv 2310.10505): each token's undiscounted reward-to-go minus the reward of the
    prompt's greedy response (the baseline), not whitened.

    Args:
        token_rewards: ``[B, T]`` (KL penalty already folded in, if used).
        reward_baselines: ``[B]`` the greedy response's total reward for each row's prompt.
        response_mask: ``[B, T]``.

    Returns:
        ``(advantages, returns)``, each ``[B, T]``; ``returns`` is the reward-to-go, both zero at masked positions.
    """
    mask = response_mask.to(token_rewards.dtype)
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    return returns - reward_baselines.to(returns.dtype).unsqueeze(-1) * mask, returns


def _path_energy(old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, response_mask: torch.Tensor,
                 rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """``W_t = Σ_{j<=t} (1 - 2π_j + Σπ²_j) [· ρ_j²]`` over valid tokens, ``[B, T]``.

    ``1 - 2π_j + Σπ²_j`` is the squared norm of the logit gradient of ``log π(token_j)``
    (``||onehot - π||²``): OTB's forward-only proxy for how much noise token j adds to the
    policy gradient. Rollout IS weights scale it by ρ² (the variance of an importance-weighted term).
    """
    mask = response_mask.to(old_log_probs.dtype)
    per_token = 1.0 - 2.0 * old_log_probs.exp() + sum_pi_squared.to(old_log_probs.dtype)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.to(per_token.dtype) ** 2
    return (per_token * mask).cumsum(-1)


def _otb_baselines(returns: torch.Tensor, energy: torch.Tensor, response_mask: torch.Tensor, group_ids: list[int],
                   handle_zero_tail: bool, eps: float) -> torch.Tensor:
    """Per-token baselines ``B_t = Σ_i G_t W_t / (Σ_i W_t + eps)`` over each group's rows, ``[B, T]``.

    ``group_ids[i] < 0`` leaves row i out of every group (baseline 0). A group of one has no
    baseline (0), as in verl. With ``handle_zero_tail``, a group's unique longest response gets
    baseline 0 past the second-longest length, where it alone defines the "group" average.
    """
    mask = response_mask.to(returns.dtype)
    lengths = mask.sum(-1)
    baselines = torch.zeros_like(returns)
    members_of: dict[int, list[int]] = {}
    for row, group in enumerate(group_ids):
        if group >= 0:
            members_of.setdefault(group, []).append(row)
    for members in members_of.values():
        if len(members) < 2:
            continue
        rows = torch.tensor(members, device=returns.device)
        weight = energy[rows] * mask[rows]
        baseline = (returns[rows] * weight).sum(0) / (weight.sum(0) + eps)
        baselines[rows] = baseline.unsqueeze(0).expand(len(members), -1)
        if handle_zero_tail:
            group_lengths = lengths[rows]
            ordered = torch.sort(group_lengths).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            at_longest = torch.nonzero(group_lengths == longest).flatten()
            if at_longest.numel() == 1 and longest > second:
                baselines[members[int(at_longest[0])], second:] = 0.0
    return baselines


@torch.no_grad()
def compute_optimal_token_baseline_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, group_index: GroupIndex, old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None = None, handle_zero_tail: bool = False,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline (verl ``optimal_token_baseline``): a baseline per token position and group.

    ``A_t = G_t - Σ_i G_t^i W_t^i / (Σ_i W_t^i + eps)``, ``G_t`` the undiscounted reward-to-go and
    ``W_t`` the cumulative path energy (:func:`_path_energy`) from the old policy's probability of
    each sampled token (``old_log_probs``) and ``Σ_v π(v)²`` at that position (``sum_pi_squared``).

    Returns:
        ``(advantages, returns)``, each ``[B, T]``; advantages zero at masked positions, not whitened.
    """
    mask = response_mask.to(token_rewards.dtype)
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    energy = _path_energy(old_log_probs, sum_pi_squared, response_mask, rollout_is_weights)
    ids, _ = _group_ids(group_index, token_rewards.shape[0], token_rewards.device)
    baselines = _otb_baselines(returns, energy, response_mask, ids.tolist(), handle_zero_tail, eps)
    return (returns - baselines) * mask, returns


@torch.no_grad()
def compute_tir_optimal_token_baseline_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, group_index: GroupIndex, old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None = None, handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The multi-turn OTB (verl ``tir_optimal_token_baseline``): OTB over each response's own tokens.

    A multi-turn mask has holes (tool / observation tokens); this variant aligns responses by their
    k-th *valid* token rather than by column before averaging, leaves empty responses out of their
    group, and zeroes the unique longest response's tail by default. For right-padded single-turn
    rows it equals OTB with ``handle_zero_tail=True``.

    Returns:
        ``(advantages, returns)``, each ``[B, T]`` in the original layout; ``returns`` is the
        reward-to-go (not masked), advantages zero at masked positions.
    """
    mask = response_mask.to(token_rewards.dtype)
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    energy = _path_energy(old_log_probs, sum_pi_squared, response_mask, rollout_is_weights)
    # Stable sort puts each row's valid columns first, in order: column k of the compact layout is
    # the row's k-th valid token.
    order = torch.sort((~response_mask.bool()).to(torch.int8), dim=-1, stable=True).indices
    lengths = response_mask.bool().sum(-1)
    compact_mask = (torch.arange(mask.shape[1], device=mask.device).unsqueeze(0) < lengths.unsqueeze(-1)).to(mask.dtype)
    compact_returns = returns.gather(-1, order) * compact_mask
    compact_energy = energy.gather(-1, order) * compact_mask
    ids, _ = _group_ids(group_index, token_rewards.shape[0], token_rewards.device)
    members = [group if int(length) > 0 else -1 for group, length in zip(ids.tolist(), lengths.tolist(), strict=True)]
    baselines = _otb_baselines(compact_returns, compact_energy, compact_mask, members, handle_zero_tail, eps)
    compact_advantages = (compact_returns - baselines) * compact_mask
    advantages = torch.zeros_like(returns).scatter_(-1, order, compact_advantages)
    return advantages * mask, returns


@torch.no_grad()
def sum_pi_squared_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``Σ_v π(v)²`` of ``softmax(logits / temperature)`` over the last dim, in fp32, ``[..., V] -> [...]``.

    Computed as ``exp(logsumexp(2z) - 2·logsumexp(z))`` so no probability is squared in low precision.
    """
    z = logits.float() / max(temperature, 1e-6)
    return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))
