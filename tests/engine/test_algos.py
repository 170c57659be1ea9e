"""Hand-computed checks for engine.algos (advantages, losses, KL).

Every expected number is derived in the comments next to it; tensors are float32 and
compared with ``assert_close(rtol=1e-5, atol=1e-6)`` unless a test states otherwise.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from engine.algos import (
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_in_reward,
    compute_gae,
    compute_grpo_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_rloo_advantages,
    entropy_from_logits,
    entropy_from_logits_chunked,
    kl_penalty,
    log_probs_from_logits,
    masked_var,
    masked_whiten,
    policy_loss,
    value_loss,
)
from engine.algos.losses import LOSS_AGG_MODES, BatchCounts

TOL = {"rtol": 1e-5, "atol": 1e-6}
LN2 = math.log(2.0)


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


# ---------------------------------------------------------------- advantages


def test_gae_gamma1_lam1_is_reward_to_go_minus_value() -> None:
    rewards = t([[0.0, 0.0, 1.0], [1.0, 2.0, 3.0]])
    values = t([[0.5, 0.2, 0.1], [1.0, 1.0, 1.0]])
    mask = torch.ones(2, 3)
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # row 0: reward-to-go [1, 1, 1] - V [0.5, 0.2, 0.1] = [0.5, 0.8, 0.9]
    # row 1: reward-to-go [6, 5, 3] - V [1, 1, 1]       = [5, 4, 2]
    assert_close(adv, t([[0.5, 0.8, 0.9], [5.0, 4.0, 2.0]]), **TOL)
    assert_close(ret, t([[1.0, 1.0, 1.0], [6.0, 5.0, 3.0]]), **TOL)


def test_gae_gamma_half_lam_half_by_hand() -> None:
    rewards, values = t([[1.0, 0.0, 2.0]]), t([[1.0, 2.0, 3.0]])
    adv, ret = compute_gae(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.5)
    # t=2: delta = 2 + 0.5*0 - 3 = -1                 A2 = -1
    # t=1: delta = 0 + 0.5*3 - 2 = -0.5               A1 = -0.5 + 0.25*(-1)    = -0.75
    # t=0: delta = 1 + 0.5*2 - 1 = 1                  A0 = 1 + 0.25*(-0.75)    = 0.8125
    assert_close(adv, t([[0.8125, -0.75, -1.0]]), **TOL)
    # returns = A + V = [1.8125, 1.25, 2]
    assert_close(ret, t([[1.8125, 1.25, 2.0]]), **TOL)


def test_gae_right_padding_ignores_pad_reward_and_value() -> None:
    # Same sequence as the hand test, plus a pad token with junk reward 5 and value 100.
    rewards, values = t([[1.0, 0.0, 2.0, 5.0]]), t([[1.0, 2.0, 3.0, 100.0]])
    mask = t([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = compute_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    # Valid part identical to the unpadded hand values; pad position zeroed.
    assert_close(adv, t([[0.8125, -0.75, -1.0, 0.0]]), **TOL)
    assert_close(ret, t([[1.8125, 1.25, 2.0, 0.0]]), **TOL)


def test_gae_interior_masked_token_is_skipped() -> None:
    # An observation token (mask 0) between valid tokens: its reward 7 and value 50 must not
    # be used, so the valid tokens see the hand sequence r=[1,0,2], V=[1,2,3].
    rewards, values = t([[1.0, 7.0, 0.0, 2.0]]), t([[1.0, 50.0, 2.0, 3.0]])
    mask = t([[1.0, 0.0, 1.0, 1.0]])
    adv, _ = compute_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    assert_close(adv, t([[0.8125, 0.0, -0.75, -1.0]]), **TOL)


def test_masked_whiten_uses_only_masked_entries_with_unbiased_var() -> None:
    x, mask = t([[1.0, 2.0, 3.0, 99.0]]), t([[1.0, 1.0, 1.0, 0.0]])
    # mean = 2, unbiased var = (1 + 0 + 1) / (3 - 1) = 1  ->  [-1, 0, 1] on valid entries
    out = masked_whiten(x, mask)
    assert_close(out[:, :3], t([[-1.0, 0.0, 1.0]]), **TOL)


def test_masked_var_single_element_raises() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(t([1.0, 2.0]), t([1.0, 0.0]))


def test_grpo_group_of_three_normalised_by_std() -> None:
    scores = t([1.0, 2.0, 6.0])
    mask = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = compute_grpo_advantages(scores, ["p", "p", "p"], mask, norm_by_std=True)
    # mean = 3; deviations [-2, -1, 3]; unbiased var = (4+1+9)/2 = 7; std = sqrt(7)
    expected = t([-2.0, -1.0, 3.0]) / (math.sqrt(7.0) + 1e-6)
    assert_close(adv, expected.unsqueeze(-1) * mask, **TOL)
    assert_close(ret, adv, **TOL)


def test_grpo_group_of_three_without_std() -> None:
    scores = t([1.0, 2.0, 6.0])
    adv, _ = compute_grpo_advantages(scores, [0, 0, 0], torch.ones(3, 2), norm_by_std=False)
    # score - mean 3
    assert_close(adv, t([[-2.0, -2.0], [-1.0, -1.0], [3.0, 3.0]]), **TOL)


def test_grpo_interleaved_groups_and_singleton() -> None:
    scores = t([1.0, 10.0, 2.0, 6.0])
    groups = torch.tensor([0, 1, 0, 0])
    adv, _ = compute_grpo_advantages(scores, groups, torch.ones(4, 1), norm_by_std=True)
    # group 0 = {1, 2, 6} as above; group 1 = {10} is a singleton: mean 0, std 1 -> 10/(1+eps)
    s7 = math.sqrt(7.0) + 1e-6
    assert_close(adv[:, 0], t([-2.0 / s7, 10.0 / (1.0 + 1e-6), -1.0 / s7, 3.0 / s7]), **TOL)


def test_grpo_singleton_group_without_std_keeps_raw_score() -> None:
    adv, _ = compute_grpo_advantages(t([5.0]), ["only"], torch.ones(1, 2), norm_by_std=False)
    assert_close(adv, t([[5.0, 5.0]]), **TOL)


def test_grpo_with_one_sample_per_prompt_gives_the_raw_reward_exactly() -> None:
    # rollout.n 1: every group is a singleton, mean 0 and std 1 as in verl's compute_grpo_outcome_advantage,
    # so the advantage is the reward itself on each valid token (REINFORCE without a baseline).
    scores = t([0.0, 1.0, -2.5, 7.0])
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    raw = scores.unsqueeze(-1) * mask
    with_std, returns = compute_grpo_advantages(scores, [0, 1, 2, 3], mask, norm_by_std=True, eps=0.0)
    assert torch.equal(with_std, raw) and torch.equal(returns, raw)
    without_std, _ = compute_grpo_advantages(scores, ["a", "b", "c", "d"], mask, norm_by_std=False)
    assert torch.equal(without_std, raw)
    # verl's default epsilon divides by 1 + 1e-6
    default, _ = compute_grpo_advantages(scores, [0, 1, 2, 3], mask)
    assert torch.equal(default, scores.unsqueeze(-1) / (1.0 + 1e-6) * mask)


def test_grpo_identical_scores_give_zero_not_nan() -> None:
    # std = 0, so (s - mean)/(0 + eps) = 0/eps = 0
    adv, _ = compute_grpo_advantages(t([1.0, 1.0]), [3, 3], torch.ones(2, 2), norm_by_std=True)
    assert_close(adv, torch.zeros(2, 2), **TOL)


def test_rloo_leave_one_out_baseline_by_hand() -> None:
    adv, _ = compute_rloo_advantages(t([1.0, 2.0, 6.0, 4.0]), [0, 0, 0, 1], torch.ones(4, 1))
    # 1 - (2+6)/2 = -3;  2 - (1+6)/2 = -1.5;  6 - (1+2)/2 = 4.5;  singleton keeps 4
    assert_close(adv[:, 0], t([-3.0, -1.5, 4.5, 4.0]), **TOL)


def test_reinforce_plus_plus_discounted_returns_then_whitened() -> None:
    rewards = t([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    adv, ret = compute_reinforce_plus_plus_advantages(rewards, torch.ones(2, 3), gamma=0.5)
    # row 0: [0.25, 0.5, 1]; row 1: [0.5, 1, 0]
    assert_close(ret, t([[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]]), **TOL)
    # mean = 3.25/6 = 13/24; sum x^2 = 41/16; SS = 41/16 - 6*(13/24)^2 = 77/96;
    # unbiased var = (77/96)/5 = 77/480
    expected = (ret - 13.0 / 24.0) / math.sqrt(77.0 / 480.0)
    assert_close(adv, expected, **TOL)


# ---------------------------------------------------------------- agg_loss

RAGGED_LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
RAGGED_MASK = t([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_agg_token_mean_ragged() -> None:
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert_close(agg_loss(RAGGED_LOSS, RAGGED_MASK, "token-mean"), t(2.5), **TOL)


def test_agg_seq_mean_token_sum_ragged() -> None:
    # row sums 6 and 4 -> mean 5
    assert_close(agg_loss(RAGGED_LOSS, RAGGED_MASK, "seq-mean-token-sum"), t(5.0), **TOL)


def test_agg_seq_mean_token_mean_ragged() -> None:
    # row means 2 and 4 -> mean 3
    assert_close(agg_loss(RAGGED_LOSS, RAGGED_MASK, "seq-mean-token-mean"), t(3.0), **TOL)


def test_agg_seq_mean_token_mean_skips_empty_rows() -> None:
    loss = torch.cat([RAGGED_LOSS, t([[9.0, 9.0, 9.0]])])
    mask = torch.cat([RAGGED_MASK, torch.zeros(1, 3)])
    # the all-masked third row is excluded: still (2 + 4) / 2 = 3
    assert_close(agg_loss(loss, mask, "seq-mean-token-mean"), t(3.0), **TOL)


def test_agg_seq_mean_token_sum_norm_ragged() -> None:
    # Dr.GRPO: valid sums 6 and 4 over 2 sequences, mean 5, divided by T = 3; or by norm_length 5 -> 1
    assert_close(agg_loss(RAGGED_LOSS, RAGGED_MASK, "seq-mean-token-sum-norm"), t(5.0 / 3.0), **TOL)
    assert_close(
        agg_loss(RAGGED_LOSS, RAGGED_MASK, "seq-mean-token-sum-norm", norm_length=5), t(1.0), **TOL
    )


def test_agg_unknown_mode_raises() -> None:
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'token-sum'"):
        agg_loss(RAGGED_LOSS, RAGGED_MASK, "token-sum")


# ---------------------------------------------------------------- policy / value loss


def _pl(ratio: float, adv: float, c: float = 3.0):
    log_prob = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out = policy_loss(torch.zeros(1, 1), log_prob, t([[adv]]), torch.ones(1, 1), 0.2, 0.28, c)
    return out, log_prob


def test_policy_loss_unclipped_inside_trust_region() -> None:
    out, _ = _pl(ratio=1.1, adv=1.0)
    # 1.1 is inside [0.8, 1.28]: loss = -A * r = -1.1, nothing clipped
    assert_close(out.loss, t(-1.1), **TOL)
    assert_close(out.clip_fraction, t(0.0), **TOL)


def test_policy_loss_positive_advantage_clipped_at_one_plus_eps_high() -> None:
    out, log_prob = _pl(ratio=1.5, adv=1.0)
    # max(-1*1.5, -1*clip(1.5, 0.8, 1.28)) = max(-1.5, -1.28) = -1.28, clipped branch taken
    assert_close(out.loss, t(-1.28), **TOL)
    assert_close(out.clip_fraction, t(1.0), **TOL)
    out.loss.backward()
    assert_close(log_prob.grad, torch.zeros(1, 1), **TOL)  # clipped: no gradient


def test_policy_loss_negative_advantage_clipped_at_one_minus_eps_low() -> None:
    out, _ = _pl(ratio=0.5, adv=-1.0)
    # max(1*0.5, 1*clip(0.5, 0.8, 1.28)) = max(0.5, 0.8) = 0.8; dual bound 3 not reached
    assert_close(out.loss, t(0.8), **TOL)
    assert_close(out.clip_fraction, t(1.0), **TOL)
    assert_close(out.dual_clip_fraction, t(0.0), **TOL)


def test_policy_loss_dual_clip_bounds_negative_advantage_at_c_times_abs_adv() -> None:
    out, _ = _pl(ratio=5.0, adv=-2.0, c=3.0)
    # ppo = max(2*5, 2*1.28) = 10; dual bound = 3 * |-2| = 6; min(10, 6) = 6
    assert_close(out.loss, t(6.0), **TOL)
    assert_close(out.dual_clip_fraction, t(1.0), **TOL)
    assert_close(out.clip_fraction, t(0.0), **TOL)  # 2.56 > 10 is false


def test_policy_loss_dual_clip_not_applied_to_positive_advantage() -> None:
    out, _ = _pl(ratio=0.1, adv=2.0, c=3.0)
    # max(-2*0.1, -2*0.8) = -0.2; A > 0 so the dual bound -6 is never applied
    assert_close(out.loss, t(-0.2), **TOL)
    assert_close(out.dual_clip_fraction, t(0.0), **TOL)


def test_policy_loss_approx_kl_is_masked_k1() -> None:
    old = t([[math.log(0.5), 0.0]])
    new = t([[math.log(0.25), -50.0]])  # second token masked out; would dominate if counted
    out = policy_loss(old, new, t([[1.0, 1.0]]), t([[1.0, 0.0]]), 0.2, 0.2, 3.0)
    # old - new = log 0.5 - log 0.25 = ln 2
    assert_close(out.approx_kl, t(LN2), **TOL)


def test_policy_loss_rejects_dual_clip_constant_not_above_one() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2, 1.0)


def test_policy_loss_unknown_agg_mode_raises() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode"):
        z = torch.zeros(1, 1)
        policy_loss(z, z, z, torch.ones(1, 1), 0.2, 0.2, 3.0, loss_agg_mode="mean")


def test_value_loss_clipping_by_hand() -> None:
    values, old = t([[1.5, 0.0]]), t([[1.0, 1.0]])
    returns = t([[2.0, 1.0]])
    loss, clip_frac = value_loss(values, old, returns, torch.ones(1, 2), 0.2)
    # tok0: v clipped to 1.2; (1.5-2)^2 = 0.25 vs (1.2-2)^2 = 0.64 -> 0.64 (clipped larger)
    # tok1: v clipped to 0.8; (0-1)^2   = 1    vs (0.8-1)^2 = 0.04 -> 1    (unclipped larger)
    # 0.5 * mean(0.64, 1) = 0.41; clip fraction 1/2
    assert_close(loss, t(0.41), **TOL)
    assert_close(clip_frac, t(0.5), **TOL)


# ---------------------------------------------------------------- entropy / log-probs


def test_entropy_of_uniform_is_log_vocab() -> None:
    logits = torch.full((2, 3, 5), 7.0)
    assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(5.0)), **TOL)
    assert_close(entropy_from_logits_chunked(logits, chunk_size=4), torch.full((2, 3), math.log(5.0)), **TOL)


def test_entropy_two_class_by_hand() -> None:
    # p = [1/4, 3/4]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351
    assert_close(entropy_from_logits(t([0.0, math.log(3.0)])), t(0.5623351), **TOL)


def test_entropy_chunked_equals_unchunked() -> None:
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0)) * 3
    # 6 rows in chunks of 4 -> an uneven last chunk is exercised
    assert_close(entropy_from_logits_chunked(logits, chunk_size=4), entropy_from_logits(logits), **TOL)


def test_log_probs_from_logits_by_hand_and_matches_log_softmax() -> None:
    # p = [1/4, 3/4]; label 1 -> ln 0.75
    assert_close(log_probs_from_logits(t([[[0.0, math.log(3.0)]]]), torch.tensor([[1]])), t([[math.log(0.75)]]), **TOL)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 13, generator=g, requires_grad=True)
    labels = torch.randint(0, 13, (2, 3), generator=g)
    got = log_probs_from_logits(logits, labels, chunk_size=4)
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert_close(got, ref, **TOL)
    (grad_got,) = torch.autograd.grad(got.sum(), logits)
    (grad_ref,) = torch.autograd.grad(ref.sum(), logits)
    assert_close(grad_got, grad_ref, **TOL)


# ---------------------------------------------------------------- KL


LP_HALF, LP_QUARTER = t([[math.log(0.5)]]), t([[math.log(0.25)]])


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("kl", LN2),  # logp - ref = ln 0.5 - ln 0.25 = ln 2
        ("k1", LN2),
        ("abs", LN2),
        ("mse", 0.5 * LN2**2),  # 0.5 * (ln 2)^2 = 0.2402265
        ("k2", 0.5 * LN2**2),
        ("low_var_kl", 0.5 + LN2 - 1.0),  # r = 0.25/0.5: r - ln r - 1 = 0.5 + ln2 - 1 = 0.1931472
        ("k3", 0.5 + LN2 - 1.0),
    ],
)
def test_kl_estimators_by_hand(kind: str, expected: float) -> None:
    assert_close(kl_penalty(LP_HALF, LP_QUARTER, kind), t([[expected]]), **TOL)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", -LN2),  # ln 0.25 - ln 0.5
        ("abs", LN2),
        ("k2", 0.5 * LN2**2),
        ("k3", 2.0 - LN2 - 1.0),  # r = 0.5/0.25 = 2: 2 - ln 2 - 1 = 0.3068528
    ],
)
def test_kl_estimators_by_hand_reversed_order(kind: str, expected: float) -> None:
    assert_close(kl_penalty(LP_QUARTER, LP_HALF, kind), t([[expected]]), **TOL)


def test_low_var_kl_is_clamped_to_ten() -> None:
    # ref - logp = 30 -> clamped to 20 -> e^20 - 20 - 1 >> 10 -> 10
    # ref - logp = -30 -> clamped to -20 -> e^-20 + 20 - 1 ~ 19 -> 10
    out = kl_penalty(t([-30.0, 0.0]), t([0.0, -30.0]), "low_var_kl")
    assert_close(out, t([10.0, 10.0]), **TOL)


def test_kl_unknown_kind_raises() -> None:
    with pytest.raises(ValueError, match="unknown kl penalty kind 'full'"):
        kl_penalty(LP_HALF, LP_QUARTER, "full")


@pytest.mark.parametrize("kind", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_straight_through_kl_has_the_named_value_and_k2s_gradient(kind: str) -> None:
    # ln 0.5 against ln 0.25 and ln 0.25 against ln 0.5: both signs of logp - ref.
    log_prob = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    ref = t([[math.log(0.25), math.log(0.5)]])
    straight = kl_penalty(log_prob, ref, kind + "+")
    assert_close(straight, kl_penalty(log_prob, ref, kind), **TOL)
    (grad,) = torch.autograd.grad(straight.sum(), log_prob)
    # d/dlogp 0.5 (logp - ref)^2 = logp - ref = +ln 2, -ln 2
    assert_close(grad, t([[LN2, -LN2]]), **TOL)


def test_k3_and_k3_plus_differ_only_in_the_gradient() -> None:
    log_prob = torch.tensor([[math.log(0.5)]], requires_grad=True)
    (grad_k3,) = torch.autograd.grad(kl_penalty(log_prob, LP_QUARTER, "k3").sum(), log_prob)
    (grad_k3_plus,) = torch.autograd.grad(kl_penalty(log_prob, LP_QUARTER, "k3+").sum(), log_prob)
    # d/dlogp (r - ln r - 1), r = ref/p = 0.5: -r + 1 = 0.5; k2's gradient is ln 2
    assert_close(grad_k3, t([[0.5]]), **TOL)
    assert_close(grad_k3_plus, t([[LN2]]), **TOL)


def test_kl_unknown_straight_through_kind_raises() -> None:
    with pytest.raises(ValueError, match="unknown kl penalty kind 'full'"):
        kl_penalty(LP_HALF, LP_QUARTER, "full+")


def test_adaptive_kl_controller_update_by_hand() -> None:
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=256)
    # error = 9/6 - 1 = 0.5 -> clipped to 0.2; mult = 1 + 0.2*256/10000 = 1.00512
    assert ctl.value == pytest.approx(0.100512, rel=1e-12)
    ctl.update(current_kl=5.4, n_steps=1000)
    # error = 5.4/6 - 1 = -0.1 (inside the clip); mult = 1 - 0.1*1000/10000 = 0.99
    assert ctl.value == pytest.approx(0.100512 * 0.99, rel=1e-12)


def test_fixed_kl_controller_ignores_updates() -> None:
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=10)
    assert ctl.value == 0.05


def test_apply_kl_in_reward_by_hand() -> None:
    scores = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    log_prob = torch.full((2, 3), math.log(0.5))
    ref = t([[math.log(0.25)] * 3, [math.log(0.125)] * 3])
    rewards, mean_kl = apply_kl_in_reward(scores, log_prob, ref, mask, coef=0.1, kind="k1")
    # k1: row 0 = ln2 per token; row 1 = ln 0.5 - ln 0.125 = 2 ln2; pad token gets no penalty
    l = LN2
    expected = t([[-0.1 * l, -0.1 * l, 1 - 0.1 * l], [-0.2 * l, 2 - 0.2 * l, 0.0]])
    assert_close(rewards, expected, **TOL)
    # per-sequence mean then batch mean: (ln2 + 2 ln2)/2 = 1.5 ln2 (token-weighted would be 1.4 ln2)
    assert_close(mean_kl, t(1.5 * l), **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_shares_of_micro_batches_sum_to_the_whole_mini_batch_loss(mode: str) -> None:
    # Ragged lengths and an empty row: the cases where a mean of per-micro-batch means goes wrong.
    gen = torch.Generator().manual_seed(0)
    loss_mat = torch.randn(6, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0],
                         [0, 0, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    whole = agg_loss(loss_mat, mask, mode)
    totals = BatchCounts.from_tensor(BatchCounts.of(mask))
    for cuts in ([2, 2, 2], [1, 5], [3, 1, 2]):
        shares = [agg_loss(lm, mk, mode, totals=totals)
                  for lm, mk in zip(loss_mat.split(cuts), mask.split(cuts))]
        assert torch.allclose(sum(shares), whole, atol=1e-6), (mode, cuts)


def test_batch_counts_count_tokens_rows_and_nonempty_rows() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert BatchCounts.from_tensor(BatchCounts.of(mask)) == BatchCounts(tokens=3.0, sequences=3.0, nonempty_sequences=2.0)


def test_truncated_is_weights_are_the_clamped_ratio_per_token_or_per_sequence():
    from engine.algos.rollout_correction import rollout_is_weights

    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.1]]))
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.3, 0.6, 0.5]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # token: ρ = old / rollout = [2, 0.5, 3], [1, 0.5, -]; truncated at 2.5; padding 0
    token = rollout_is_weights(old, rollout, mask, "token", threshold=2.5)
    assert torch.allclose(token, torch.tensor([[2.0, 0.5, 2.5], [1.0, 0.5, 0.0]]))
    # sequence: ρ = 2 × 0.5 × 3 = 3 -> 2.5 on every token; 1 × 0.5 = 0.5 (the padded token does not count)
    sequence = rollout_is_weights(old, rollout, mask, "sequence", threshold=2.5)
    assert torch.allclose(sequence, torch.tensor([[2.5, 2.5, 2.5], [0.5, 0.5, 0.0]]))


def test_policy_loss_weights_each_token_by_its_is_weight():
    from engine.algos.losses import policy_loss

    old = torch.zeros(1, 2)
    new = torch.zeros(1, 2, requires_grad=True)  # ratio 1: the loss is -A per token
    advantages = torch.tensor([[1.0, 3.0]])
    mask = torch.ones(1, 2)
    plain = policy_loss(old, new, advantages, mask, 0.2, 0.2)
    weighted = policy_loss(old, new, advantages, mask, 0.2, 0.2, is_weights=torch.tensor([[2.0, 0.5]]))
    assert float(plain.loss) == pytest.approx(-(1.0 + 3.0) / 2)
    assert float(weighted.loss) == pytest.approx(-(2.0 * 1.0 + 0.5 * 3.0) / 2)
