"""Hand-computed checks for the Optimal Token Baseline estimators (engine.algos.advantages).

Per-token path energy w = 1 - 2π + Σπ²; the inputs pick π and Σπ² so w is a round number:
π = 0.5, Σπ² = 0.5 -> w = 0.5;  π = 0.25, Σπ² = 0.25 -> w = 0.75.
"""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from engine.algos.advantages import (
    compute_optimal_token_baseline_advantages,
    compute_tir_optimal_token_baseline_advantages,
    sum_pi_squared_from_logits,
)

TOL = {"rtol": 1e-5, "atol": 1e-6}


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _two_responses(mask_a: list[int], mask_b: list[int]) -> dict[str, torch.Tensor]:
    # Row A (reward 1 on its last valid token) has w = 0.5 per token; row B (reward 0) has w = 0.75.
    mask = t([mask_a, mask_b])
    rewards = torch.zeros_like(mask)
    rewards[0, max(i for i, m in enumerate(mask_a) if m)] = 1.0
    pi = t([[0.5] * len(mask_a), [0.25] * len(mask_b)])
    return {"token_rewards": rewards, "response_mask": mask, "old_log_probs": pi.log(), "sum_pi_squared": pi.clone()}


def test_otb_baseline_weights_each_response_by_its_cumulative_path_energy() -> None:
    inputs = _two_responses([1, 1, 1], [1, 1, 0])
    # Returns: A = [1, 1, 1], B = [0, 0, 0]. Energy W: A = [0.5, 1.0, 1.5], B = [0.75, 1.5, (masked)].
    # Baselines: t0 = 0.5 / 1.25 = 0.4; t1 = 1.0 / 2.5 = 0.4; t2 = 1.5 / 1.5 = 1 (only A is valid).
    adv, returns = compute_optimal_token_baseline_advantages(group_index=[7, 7], **inputs)
    assert_close(adv, t([[0.6, 0.6, 0.0], [-0.4, -0.4, 0.0]]), **TOL)
    assert_close(returns, t([[1, 1, 1], [0, 0, 0]]), **TOL)


def test_otb_zero_tail_drops_the_baseline_where_only_the_longest_response_remains() -> None:
    inputs = _two_responses([1, 1, 1], [1, 1, 0])
    # A is the unique longest (3 > 2): its baseline from column 2 on is 0, so A_2 = G_2 = 1.
    adv, _ = compute_optimal_token_baseline_advantages(group_index=[7, 7], handle_zero_tail=True, **inputs)
    assert_close(adv, t([[0.6, 0.6, 1.0], [-0.4, -0.4, 0.0]]), **TOL)


def test_otb_rollout_is_weights_scale_the_energy_by_their_square() -> None:
    inputs = _two_responses([1, 1, 1], [1, 1, 0])
    weights = t([[1, 1, 1], [2, 2, 2]])
    # B's w becomes 0.75 * 4 = 3, W_B = [3, 6]. t0: 0.5 / 3.5 = 1/7; t1: 1.0 / 7 = 1/7; t2 as before 1.
    adv, _ = compute_optimal_token_baseline_advantages(group_index=[7, 7], rollout_is_weights=weights, **inputs)
    assert_close(adv, t([[6 / 7, 6 / 7, 0.0], [-1 / 7, -1 / 7, 0.0]]), **TOL)


def test_otb_singleton_group_keeps_its_returns() -> None:
    inputs = _two_responses([1, 1, 1], [1, 1, 0])
    # Different labels: two groups of one, no baseline, advantage = reward-to-go.
    adv, _ = compute_optimal_token_baseline_advantages(group_index=[1, 2], **inputs)
    assert_close(adv, t([[1, 1, 1], [0, 0, 0]]), **TOL)


def test_tir_otb_aligns_responses_by_their_valid_tokens_not_by_column() -> None:
    # A multi-turn row with a hole: A's tokens sit at columns 0 and 2, B's at 0 and 1.
    inputs = _two_responses([1, 0, 1], [1, 1, 0])
    # Compact: A: G = [1, 1], W = [0.5, 1.0]; B: G = [0, 0], W = [0.75, 1.5]; equal lengths, no zero tail.
    # Baselines k0 = 0.5 / 1.25 = 0.4, k1 = 1.0 / 2.5 = 0.4; A's k1 goes back to column 2.
    adv, _ = compute_tir_optimal_token_baseline_advantages(group_index=[7, 7], **inputs)
    assert_close(adv, t([[0.6, 0.0, 0.6], [-0.4, -0.4, 0.0]]), **TOL)
    # Column-aligned OTB instead compares A's 2nd token with nothing (column 2: only A, baseline 1)
    # and B's 2nd token with nothing (column 1: only B, G = 0, baseline 0).
    otb, _ = compute_optimal_token_baseline_advantages(group_index=[7, 7], **inputs)
    assert_close(otb, t([[0.6, 0.0, 0.0], [-0.4, 0.0, 0.0]]), **TOL)


def test_tir_otb_leaves_empty_responses_out_of_the_group() -> None:
    one = _two_responses([1, 1, 1], [1, 1, 0])
    inputs = {key: torch.cat([value, value[1:]]) for key, value in one.items()}
    inputs["response_mask"][2] = 0.0
    # The empty row C joins nothing: A and B get the zero-tail result of the 2-row group, C all zeros.
    adv, _ = compute_tir_optimal_token_baseline_advantages(group_index=[7, 7, 7], **inputs)
    assert_close(adv, t([[0.6, 0.6, 1.0], [-0.4, -0.4, 0.0], [0, 0, 0]]), **TOL)


def test_sum_pi_squared_of_uniform_and_tempered_logits() -> None:
    # Uniform over 4 tokens: 4 * (1/4)^2 = 1/4. Logits [ln 3, 0] at temperature 1: π = [3/4, 1/4] -> 10/16;
    # at temperature 2 the logits halve: π ∝ [√3, 1] -> (3 + 1) / (√3 + 1)^2.
    assert_close(sum_pi_squared_from_logits(torch.zeros(4)), t(0.25), **TOL)
    logits = t([math.log(3.0), 0.0])
    assert_close(sum_pi_squared_from_logits(logits), t(10 / 16), **TOL)
    assert_close(sum_pi_squared_from_logits(logits, temperature=2.0), t(4 / (math.sqrt(3) + 1) ** 2), **TOL)
