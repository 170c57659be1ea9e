"""Group advantage estimators beyond grpo/rloo (engine/algos/advantages.py) against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from engine.algos.advantages import (
    compute_gpg_advantages,
    compute_grpo_advantages,
    compute_grpo_passk_advantages,
    compute_opo_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_rloo_advantages,
)
from engine.capabilities import ADVANTAGE_ESTIMATORS
from rlconf.schema import PlanConfig

TOL = {"rtol": 1e-6, "atol": 1e-8}


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def test_the_engine_computes_every_estimator_capabilities_lets_through():
    from engine.controller.advantages import GROUP_ADVANTAGES

    # gae, reinforce_plus_plus and remax work on token rewards, the optimal token baselines on the old
    # log-probs and Σπ² as well (engine.algos.advantages); every other runnable estimator is a group one
    assert ADVANTAGE_ESTIMATORS == set(GROUP_ADVANTAGES) | {"gae", "reinforce_plus_plus", "remax",
                                                            "optimal_token_baseline", "tir_optimal_token_baseline"}


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_then_whitens_the_batch():
    adv, _ = compute_reinforce_plus_plus_baseline_advantages(t([1.0, 0.0, 2.0]), ["a", "a", "b"], t([[1.0]] * 3))
    # group a mean 0.5 -> [0.5, -0.5]; b is a singleton, baseline 0 -> 2
    # whiten [0.5, -0.5, 2]: mean 2/3, deviations [-1/6, -7/6, 4/3],
    # unbiased var = (1/36 + 49/36 + 64/36) / 2 = 114/72
    std = math.sqrt(114 / 72)
    assert_close(adv, t([[-1 / 6 / std], [-7 / 6 / std], [4 / 3 / std]]), **TOL)


def test_opo_baseline_is_the_length_weighted_group_mean():
    mask = t([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    adv, _ = compute_opo_advantages(t([1.0, 0.0, 1.0, 3.0]), [0, 0, 0, 1], mask)
    # group 0: lengths [1, 3, 2], baseline (1·1 + 3·0 + 2·1) / 6 = 0.5 -> [0.5, -0.5, 0.5]
    # (the plain mean 2/3 would differ); group 1 is a singleton, baseline 0 -> 3
    assert_close(adv, t([[0.5, 0, 0], [-0.5, -0.5, -0.5], [0.5, 0.5, 0], [3.0, 0, 0]]), **TOL)


def test_grpo_passk_gives_only_the_best_response_the_gap_to_the_second():
    scores, groups, mask = t([0.2, 1.0, 0.5]), [7, 7, 7], t([[1.0]] * 3)
    raw, _ = compute_grpo_passk_advantages(scores, groups, mask, norm_by_std=False)
    assert_close(raw, t([[0.0], [0.5], [0.0]]), **TOL)  # 1.0 - 0.5 on the best only
    normed, _ = compute_grpo_passk_advantages(scores, groups, mask)
    # unbiased std of [0.2, 1.0, 0.5]: mean 17/30, squared deviations sum 0.32667, / 2
    std = math.sqrt(((0.2 - 17 / 30) ** 2 + (1.0 - 17 / 30) ** 2 + (0.5 - 17 / 30) ** 2) / 2)
    assert_close(normed, t([[0.0], [0.5 / (std + 1e-6)], [0.0]]), **TOL)


def test_grpo_passk_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2 responses"):
        compute_grpo_passk_advantages(t([1.0, 0.0, 1.0]), [0, 0, 1], t([[1.0]] * 3))


def test_gpg_scales_the_group_centred_score_by_batch_over_nonzero_scores():
    adv, _ = compute_gpg_advantages(t([1.0, 0.0, 0.0, 0.0]), [0, 0, 1, 1], t([[1.0]] * 4))
    # α = 4 responses / 1 nonzero score = 4; group 0 mean 0.5 -> 4 · [0.5, -0.5]; group 1 all 0
    assert_close(adv, t([[2.0], [-2.0], [0.0], [0.0]]), **TOL)


def test_rloo_vectorized_equals_rloo_except_a_singleton_gets_zero():
    scores, groups, mask = t([1.0, 0.0, 0.5, 4.0]), [0, 0, 0, 1], t([[1.0, 1.0]] * 4)
    rloo, _ = compute_rloo_advantages(scores, groups, mask)
    vectorized, _ = compute_rloo_advantages(scores, groups, mask, singleton_keeps_score=False)
    # group 0: score minus the mean of the other two: [1 - 0.25, 0 - 0.75, 0.5 - 0.5]
    assert_close(vectorized[:3], t([[0.75] * 2, [-0.75] * 2, [0.0] * 2]), **TOL)
    assert_close(rloo[:3], vectorized[:3], **TOL)
    assert_close(rloo[3], t([4.0, 4.0]), **TOL)  # rloo keeps a singleton's raw score
    assert_close(vectorized[3], t([0.0, 0.0]), **TOL)  # rloo_vectorized gives it 0, as verl's


def test_grpo_vectorized_runs_grpo():
    from engine.controller.advantages import GROUP_ADVANTAGES

    algorithm = PlanConfig().algorithm
    scores, groups, mask = t([1.0, 0.0, 0.5, 2.0, 2.5]), [0, 0, 0, 1, 1], t([[1.0]] * 5)
    expected, _ = compute_grpo_advantages(scores, groups, mask)
    assert_close(GROUP_ADVANTAGES["grpo_vectorized"](scores, groups, mask, algorithm), expected, **TOL)
    # and grpo itself by hand for group 1: [2, 2.5], mean 2.25, unbiased std sqrt(0.125)
    assert_close(expected[3:], t([[-0.25 / (math.sqrt(0.125) + 1e-6)], [0.25 / (math.sqrt(0.125) + 1e-6)]]), **TOL)


def test_remax_is_reward_to_go_minus_the_greedy_baseline_unwhitened():
    from engine.algos.advantages import compute_remax_advantages

    token_rewards = t([[0.0, 0.5, 1.0], [2.0, 0.0, 9.0]])  # row 1's last token is padding
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, returns = compute_remax_advantages(token_rewards, t([0.5, 3.0]), mask)
    # reward-to-go: row 0 [1.5, 1.5, 1.0]; row 1 [2.0, 0.0] (the padded 9 is not counted)
    assert_close(returns, t([[1.5, 1.5, 1.0], [2.0, 0.0, 0.0]]), **TOL)
    # minus the baseline on valid tokens: row 0 - 0.5, row 1 - 3
    assert_close(adv, t([[1.0, 1.0, 0.5], [-1.0, -3.0, 0.0]]), **TOL)
