"""Policy loss modes other than vanilla (engine/algos/policy_losses.py) against values worked out by hand.

Each test writes its arithmetic out; tensors are float64 and tiny so the numbers can be followed.
"""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch
from torch.testing import assert_close

from engine.algos.losses import BatchCounts
from engine.algos.policy_losses import POLICY_LOSSES, LossSettings, compute_policy_loss
from rlconf.schema.actor import LossMode
from rlconf.schema.verl_compat import NOT_RUN_VALUES

TOL = {"rtol": 1e-6, "atol": 1e-8}
CLIP = LossSettings(clip_ratio_low=0.2, clip_ratio_high=0.2)


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def leaf(x: object) -> torch.Tensor:
    return t(x).requires_grad_(True)


def test_every_mode_the_schema_takes_and_does_not_refuse_is_in_the_registry():
    # The compiler refuses (RL108) exactly the modes the engine has no function for.
    refused = set(NOT_RUN_VALUES["actor_rollout_ref.actor.policy_loss.loss_mode"])
    assert set(get_args(LossMode)) - refused == set(POLICY_LOSSES)


def test_unknown_mode_is_a_clear_error():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="dro.*runs"):
        compute_policy_loss("dro", z, z, z, torch.ones(1, 1), CLIP)


def test_gspo_clips_whole_sequences_and_averages_per_sequence():
    old = t([[0.0, 0.0], [0.0, 0.0]])
    new = leaf([[0.2, 0.0], [0.6, 5.0]])  # row 1's second token is padding
    adv = t([[1.0, 1.0], [1.0, 1.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    out = compute_policy_loss("gspo", old, new, adv, mask, CLIP, "token-mean")
    # row 0: s = exp((0.2 + 0.0) / 2) = e^0.1 inside [0.8, 1.2]: each token's loss -e^0.1
    # row 1: s = exp(0.6 / 1) = 1.822 > 1.2: clipped, each token's loss -1.2
    # per-sequence token mean, then mean over sequences (token-mean asked for is not used):
    s0 = math.exp(0.1)
    assert_close(out.loss, t((-s0 + -1.2) / 2), **TOL)
    assert_close(out.clip_fraction, t(1 / 3), **TOL)  # 1 of 3 valid tokens clipped
    out.loss.backward()
    # d/d log π_t of -A · sg(s) · π_t / sg(π_t) = -A · s: both of row 0's tokens get the *sequence*
    # ratio e^0.1 (not their own e^0.2 and e^0), times 1/2 tokens · 1/2 sequences; row 1 is clipped.
    assert_close(new.grad, t([[-s0 / 4, -s0 / 4], [0.0, 0.0]]), **TOL)


def test_gpg_is_the_plain_policy_gradient():
    new = leaf([[-0.5, -2.0]])
    adv = t([[2.0, -1.0]])
    mask = t([[1.0, 1.0]])
    out = compute_policy_loss("gpg", t([[-9.0, 3.0]]), new, adv, mask, CLIP, "token-mean")
    # -A · log π = [-2 · -0.5, 1 · -2] = [1, -2]; token mean -0.5; old log-probs play no part
    assert_close(out.loss, t(-0.5), **TOL)
    out.loss.backward()
    assert_close(new.grad, t([[-2.0 / 2, 1.0 / 2]]), **TOL)  # -A / 2 tokens


def test_cispo_weights_by_the_clipped_ratio_and_keeps_every_gradient():
    new = leaf([[-1.0, -2.0]])
    old = t([[-1.0 - math.log(1.5), -2.0]])  # token 0: ratio 1.5, token 1: ratio 1
    adv = t([[1.0, -1.0]])
    out = compute_policy_loss("cispo", old, new, adv, t([[1.0, 1.0]]), CLIP, "token-mean")
    # token 0: -clip(1.5, 0.8, 1.2) · 1 · (-1) = 1.2; token 1: -1 · (-1) · (-2) = -2; mean -0.4
    assert_close(out.loss, t(-0.4), **TOL)
    assert_close(out.clip_fraction, t(0.5), **TOL)
    out.loss.backward()
    # the weight is a constant: d/d log π = -w · A / 2, nonzero even for the clipped token (PPO gives 0)
    assert_close(new.grad, t([[-1.2 / 2, 1.0 / 2]]), **TOL)


def test_geo_mean_clips_the_log_ratio_on_the_advantages_side_and_averages_per_sequence():
    old = t([[0.0, 0.0], [0.0, 0.0]])
    new = leaf([[0.3, -0.1], [-0.5, 7.0]])  # row 1's second token is padding
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    out = compute_policy_loss("geo_mean", old, new, adv, mask, CLIP, "token-sum-is-not-read")
    # row 0 (A > 0): min(x, clamp(x, -0.2, 0.2)) = [min(0.3, 0.2), min(-0.1, -0.1)] = [0.2, -0.1]
    #   ratio = exp((0.2 - 0.1) / 2) = e^0.05, Ā = 1, loss = -e^0.05
    # row 1 (A < 0): -min(-x, -clamp(x)) = -min(0.5, 0.2) = -0.2, ratio e^-0.2, Ā = -1, loss = +e^-0.2
    # mean over the 2 sequences
    assert_close(out.loss, t((-math.exp(0.05) + math.exp(-0.2)) / 2), **TOL)
    # clamped tokens with A > 0: row 0 token 0 only (row 1's is clamped with A < 0); 1 of 3 valid
    assert_close(out.clip_fraction, t(1 / 3), **TOL)
    out.loss.backward()
    # row 0: d/dx_t of -e^{mean} = -e^0.05 · (1/2 if x_t not clipped else 0) · 1/2 rows
    assert_close(new.grad, t([[0.0, -math.exp(0.05) / 4], [0.0, 0.0]]), **TOL)


def test_geo_mean_shares_sum_to_the_whole_batch_loss():
    old, new = t([[0.0], [0.0]]), t([[0.1], [-0.1]])
    adv, mask = t([[1.0], [2.0]]), t([[1.0], [1.0]])
    whole = compute_policy_loss("geo_mean", old, new, adv, mask, CLIP).loss
    totals = BatchCounts(tokens=2, sequences=2, nonempty_sequences=2)
    halves = [compute_policy_loss("geo_mean", old[i:i + 1], new[i:i + 1], adv[i:i + 1], mask[i:i + 1], CLIP,
                                  totals=totals).loss for i in range(2)]
    # (-1 · e^0.1 - 2 · e^-0.1) / 2, whether computed at once or as two micro batches' shares
    assert_close(whole, t((-math.exp(0.1) - 2 * math.exp(-0.1)) / 2), **TOL)
    assert_close(halves[0] + halves[1], whole, **TOL)


# clip_cov and kl_cov: log π = [-1, -3, -1, -3] (mean -2, deviations [1, -1, 1, -1]),
# A = [3, -3, 1, 1] (mean 0.5, deviations [2.5, -3.5, 0.5, 0.5]), so cov = [2.5, 3.5, 0.5, -0.5].
LOGP = [[-1.0, -3.0, -1.0, -3.0]]
ADV = [[3.0, -3.0, 1.0, 1.0]]
MASK = [[1.0, 1.0, 1.0, 1.0]]


def test_clip_cov_cuts_the_gradient_of_tokens_with_covariance_inside_the_bounds():
    new = leaf(LOGP)
    settings = LossSettings(clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0)
    out = compute_policy_loss("clip_cov", t(LOGP), new, t(ADV), t(MASK), settings, "token-mean")
    # ratio 1 everywhere (no PPO clip); candidates: cov in (1, 5) = tokens 0 and 1;
    # max(1, int(0.5 · 4)) = 2 tokens cut, so both. losses -A·1 = [-3, 3, -1, -1] · [0, 0, 1, 1]
    assert_close(out.loss, t(-2 / 4), **TOL)
    assert_close(out.clip_fraction, t(0.5), **TOL)
    out.loss.backward()
    assert_close(new.grad, t([[0.0, 0.0, -1 / 4, -1 / 4]]), **TOL)


def test_clip_cov_upper_bound_and_ratio_limit_the_cut():
    # ub 3 leaves token 0 (cov 2.5) the only candidate: losses [0, 3, -1, -1], mean 0.25
    out = compute_policy_loss("clip_cov", t(LOGP), t(LOGP), t(ADV), t(MASK),
                              LossSettings(clip_cov_ratio=0.5, clip_cov_ub=3.0), "token-mean")
    assert_close(out.loss, t(0.25), **TOL)
    # ratio 0.25: max(1, int(0.25 · 4)) = 1 of the 2 candidates is cut, drawn at random
    out = compute_policy_loss("clip_cov", t(LOGP), t(LOGP), t(ADV), t(MASK), LossSettings(clip_cov_ratio=0.25),
                              "token-mean", generator=torch.Generator().manual_seed(0))
    assert_close(out.clip_fraction, t(0.25), **TOL)
    # token 0 cut: [0, 3, -1, -1]; token 1 cut: [-3, 0, -1, -1]
    assert any(math.isclose(out.loss.item(), v) for v in ((3 - 1 - 1) / 4, (-3 - 1 - 1) / 4))


def test_kl_cov_penalises_the_top_covariance_tokens_and_clips_nothing():
    log_ratio = [0.1, -0.2, 0.0, 0.3]
    old = t([[lp - lr for lp, lr in zip(LOGP[0], log_ratio, strict=True)]])
    settings = LossSettings(kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    out = compute_policy_loss("kl_cov", old, leaf(LOGP), t(ADV), t(MASK), settings, "token-mean")
    # -A · r per token; max(1, int(4 · 0.25)) = 1 token with the largest cov (token 1, 3.5) also
    # gets 0.1 · |log r| = 0.1 · 0.2. Token 3's ratio e^0.3 > 1.2 is not clipped.
    expected = [-3 * math.exp(0.1), 3 * math.exp(-0.2) + 0.1 * 0.2, -1.0, -1 * math.exp(0.3)]
    assert_close(out.loss, t(sum(expected) / 4), **TOL)


def test_vanilla_through_the_registry_is_ppos_clipped_surrogate():
    # ratio 1.5 with A = 1: max(-1.5, -1.2) = -1.2 (same as engine.algos.losses.policy_loss)
    out = compute_policy_loss("vanilla", t([[0.0]]), t([[math.log(1.5)]]), t([[1.0]]), t([[1.0]]), CLIP)
    assert_close(out.loss, t(-1.2), **TOL)


def test_sapo_gates_the_ratio_smoothly_with_a_temperature_per_advantage_sign():
    settings = LossSettings(tau_pos=1.0, tau_neg=2.0)
    old = t([[0.0, 0.0], [0.0, 0.0]])
    new = leaf([[0.0, math.log(1.5)], [math.log(0.5), 9.0]])  # row 1's second token is padding
    adv = t([[1.0, 1.0], [-2.0, -2.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    out = compute_policy_loss("sapo", old, new, adv, mask, settings, "token-mean")
    # gate(r, τ) = σ(τ (r - 1)) · 4 / τ
    # row 0 (A = 1, τ = 1): r = 1 -> σ(0) · 4 = 2; r = 1.5 -> σ(0.5) · 4; loss -A · gate
    # row 1 (A = -2, τ = 2): r = 0.5 -> σ(-1) · 2; loss 2 · σ(-1) · 2
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    row0 = (-2.0 - 4 * sig(0.5)) / 2
    row1 = 2 * 2 * sig(-1.0)
    assert_close(out.loss, t((row0 + row1) / 2), **TOL)  # per-sequence token mean, then over sequences
    out.loss.backward()
    # d/dlogπ of -A·gate = -A · σ'(τ(r-1)) · 4 · r (the chain through r = e^logπ); at r = 1, τ = 1: -1 · 1/4 · 4 = -1
    # then · 1/2 tokens · 1/2 sequences
    assert_close(new.grad[0, 0], t(-1.0 / 4), **TOL)
