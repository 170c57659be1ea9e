"""Rollout correction's rejection sampling (rollout_rs) and batch-normalized IS weights, as verl 0.9.1 runs them.

Masks and weights are worked out by hand from log r = log π_old - log π_rollout; k1 = -log r, k2 = (log r)²/2,
k3 = r - 1 - log r (engine.algos.rollout_correction, rlconf.schema.sections.rejection_checks).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from engine.algos.rollout_correction import bypass_corrections, normalize_is_weights, rejection_mask
from rlconf.schema.sections import RejectionCheck, RolloutRsError, rejection_checks

PRESETS = Path(__file__).resolve().parents[2] / "presets"
L2 = math.log(2.0)
# row 0: log r = 0, log 2, -0.1 (+ padding holding a value that must not count); row 1: 0.2, 0; row 2: 0.55, 0, 0
LOG_RATIO = torch.tensor([[0.0, L2, -0.1, 5.0], [0.2, 0.0, 7.0, 7.0], [0.55, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]])


def keep(option: str, threshold: str | float) -> list[list[int]]:
    mask, _ = rejection_mask(LOG_RATIO, MASK, rejection_checks(option, threshold))
    return mask.tolist()


def test_threshold_specs_read_as_verl_reads_them():
    assert rejection_checks("token_k1,seq_max_k2", "0.6_1.6,2.5") == [RejectionCheck("token_k1", 0.6, 1.6),
                                                                      RejectionCheck("seq_max_k2", None, 2.5)]
    assert rejection_checks("seq_mean_k1", 2.0) == [RejectionCheck("seq_mean_k1", 0.5, 2.0)]  # a lone u: 1/u to u
    assert rejection_checks(" token_k3 , token_k3,seq_sum_k2", "0.1") == [RejectionCheck("token_k3", None, 0.1),
                                                                         RejectionCheck("seq_sum_k2", None, 0.1)]


@pytest.mark.parametrize(("rs", "threshold", "key", "says"), [
    ("token_k4", 1.0, "rollout_rs", "not one of verl's"),
    ("token_k1", None, "rollout_rs", "needs rollout_rs_threshold"),
    ("token_k2", "0.5_2", "rollout_rs_threshold", "one upper bound"),
    ("token_k1,token_k2", "1.5,2,3", "rollout_rs_threshold", "3 thresholds for 2 options"),
    ("token_k1", "2_1", "rollout_rs_threshold", "lower ≤ upper"),
    ("seq_max_k3", "-1", "rollout_rs_threshold", "positive"),
])
def test_specs_verl_refuses_are_refused_naming_the_key(rs, threshold, key, says):
    with pytest.raises(RolloutRsError, match=says) as caught:
        rejection_checks(rs, threshold)
    assert caught.value.key == key


def test_token_k1_rejects_tokens_whose_ratio_leaves_its_bounds():
    # k1 = -log r must lie in [log 0.6, log 1.6] = [-0.511, 0.470]: row 0's log 2 (k1 -0.693) and row 2's 0.55 fail.
    assert keep("token_k1", "0.6_1.6") == [[1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0]]


def test_token_k2_and_k3_reject_tokens_above_their_bound():
    # k2: row 0 [0, 0.240, 0.005], row 1 [0.02, 0], row 2 [0.151, 0, 0]
    assert keep("token_k2", 0.1) == [[1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0]]
    assert keep("token_k2", 0.2) == [[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    # k3: row 0 [0, 0.307, 0.0048], row 1 [0.0214, 0], row 2 [0.183, 0, 0]
    assert keep("token_k3", 0.25) == [[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert keep("token_k3", 0.02) == [[1, 0, 1, 0], [0, 1, 0, 0], [0, 1, 1, 0]]


def test_sequence_options_keep_or_drop_whole_responses():
    # sums of k1: row 0 -0.593, row 1 -0.2, row 2 -0.55; bounds [log 0.6, log 1.6] = [-0.511, 0.470]
    assert keep("seq_sum_k1", "0.6_1.6") == [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
    # geometric (seq_mean_k1): means -0.198, -0.1, -0.183 against [log 0.9, log 1.1] = [-0.105, 0.095]
    assert keep("seq_mean_k1", "0.9_1.1") == [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
    assert keep("seq_mean_k1", "0.8_1.1") == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]]  # log 0.8 = -0.223
    # sums of k2: 0.245, 0.02, 0.151
    assert keep("seq_sum_k2", 0.2) == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert keep("seq_sum_k2", 0.25) == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    # means of k2: 0.0817, 0.01, 0.0504
    assert keep("seq_mean_k2", 0.06) == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    # max of k2: 0.240, 0.02, 0.151; of k3: 0.307, 0.0214, 0.183 (padding's 5.0 and 7.0 never count)
    assert keep("seq_max_k2", 0.2) == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert keep("seq_max_k3", 0.2) == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    # sum of k3: 0.312, 0.0214, 0.183; mean of k3: 0.104, 0.0107, 0.061
    assert keep("seq_sum_k3", 0.2) == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert keep("seq_mean_k3", 0.05) == [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]


def test_several_options_must_all_pass_and_the_metrics_count_what_each_rejects():
    mask, metrics = rejection_mask(LOG_RATIO, MASK, rejection_checks("token_k1,seq_max_k2", "0.6_1.6,0.2"))
    # seq_max_k2 drops row 0 (max 0.240); token_k1 drops row 2's first token; row 1 passes both
    assert mask.tolist() == [[0, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0]]
    prefix = "rollout_corr/rollout_rs"
    assert metrics[f"{prefix}_masked_fraction"] == pytest.approx(4 / 8)  # 4 of 8 valid tokens
    assert metrics[f"{prefix}_seq_masked_fraction"] == pytest.approx(2 / 3)
    assert metrics[f"{prefix}_token_k1_masked_fraction"] == pytest.approx(2 / 8)
    assert metrics[f"{prefix}_token_k1_seq_masked_fraction"] == pytest.approx(2 / 3)
    assert metrics[f"{prefix}_seq_max_k2_masked_fraction"] == pytest.approx(3 / 8)
    assert metrics[f"{prefix}_seq_max_k2_seq_masked_fraction"] == pytest.approx(1 / 3)
    # token_k1's statistic over the 8 valid tokens: -(0 + log 2 - 0.1 + 0.2 + 0 + 0.55 + 0 + 0) / 8
    assert metrics[f"{prefix}_token_k1_mean"] == pytest.approx(-(L2 - 0.1 + 0.2 + 0.55) / 8)
    assert metrics[f"{prefix}_token_k1_min"] == pytest.approx(-L2)
    assert metrics[f"{prefix}_token_k1_fraction_low"] == pytest.approx(2 / 8)
    assert metrics[f"{prefix}_token_k1_fraction_high"] == 0.0
    # seq_max_k2 per response: max 0.240 (row 0), min 0.02 (row 1); one response of three above 0.2
    assert metrics[f"{prefix}_seq_max_k2_max"] == pytest.approx(0.5 * L2 ** 2)
    assert metrics[f"{prefix}_seq_max_k2_min"] == pytest.approx(0.5 * 0.2 ** 2)
    assert metrics[f"{prefix}_seq_max_k2_fraction_high"] == pytest.approx(1 / 3)


def test_batch_normalization_divides_by_the_mean_over_tokens_or_over_responses():
    weights = torch.tensor([[1.0, 2.0, 0.5, 0.0], [1.5, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    normalized, factor = normalize_is_weights(weights, mask, "token")
    assert float(factor) == pytest.approx(6.0 / 5)  # (1 + 2 + 0.5 + 1.5 + 1) / 5 tokens
    assert torch.allclose(normalized, weights / 1.2)
    per_sequence = torch.tensor([[2.0, 2.0, 2.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    three = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])  # an empty response does not count
    normalized, factor = normalize_is_weights(per_sequence, three, "sequence")
    assert float(factor) == pytest.approx(1.25)  # (2 + 0.5) / 2 responses, not weighted by length
    assert torch.allclose(normalized, per_sequence / 1.25)
    # the sum over ranks enters as [total, count]: a second rank with the same rows doubles both
    doubled, factor = normalize_is_weights(per_sequence, three, "sequence", sum_over_ranks=lambda t: 2 * t)
    assert float(factor) == pytest.approx(1.25)
    _, factor = normalize_is_weights(weights, mask, "token", sum_over_ranks=lambda t: t + torch.tensor([4.0, 1.0]))
    assert float(factor) == pytest.approx((6.0 + 4.0) / 6)


def test_bypass_mode_masks_the_policy_loss_and_normalizes_the_micro_batchs_weights():
    class Correction:
        rollout_is, rollout_is_batch_normalize = "token", True

    rollout = torch.zeros(3, 4)
    weights = torch.tensor([[1.0, 2.0, 0.5, 0.0], [1.5, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    policy_mask, normalized, metrics = bypass_corrections(Correction(), rejection_checks("token_k1", "0.6_1.6"),
                                                          LOG_RATIO, rollout, MASK, weights)
    assert policy_mask.tolist() == [[1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0]]
    # the weights' mean is over the micro batch's valid tokens before rejection (8 tokens, sum 9)
    assert float(metrics["rollout_corr/rollout_is_batch_norm_factor"]) == pytest.approx(9 / 8)
    assert torch.allclose(normalized, weights / (9 / 8))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 8)


# --- the controller's stage: after the reward and its KL penalty, before advantages ---------------------------

def test_the_advantage_stage_rejects_after_the_reward_is_placed_at_the_true_last_token():
    from engine.controller.samples import StepInputs
    from engine.controller.stages import StepStages
    from rlconf.compile import compile_plan

    result = compile_plan(PRESETS / "ppo_reward_model.yaml", [
        "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=0.6_1.6",
        "algorithm.gamma=1.0", "algorithm.lam=1.0", "algorithm.use_kl_in_reward=false"])
    assert not result.errors, result.errors
    assert result.resolved.roles.rollout.old_log_probs == "recompute"  # rejection reads π_old before the update
    stages = StepStages(result.resolved, actor=None, critic=object(), rewards=None, decode=None)
    # row 0's last token (log r = log 2) is rejected, row 1 keeps both of its tokens
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    batch = {"response_mask": mask, "old_log_probs": torch.tensor([[0.0, 0.0, L2], [0.0, 0.0, 0.0]]) - 1.0,
             "rollout_log_probs": torch.full((2, 3), -1.0), "values": torch.zeros(2, 3)}
    samples = StepInputs({}, [0, 1], ["x", "x"], ["", ""], [{}, {}])
    fields, metrics = stages.advantages(samples, batch, torch.tensor([1.0, 1.0]), None)
    assert fields["response_mask"].tolist() == [[1, 1, 0], [1, 1, 0]]
    # GAE skips the rejected token, as verl's does: row 0's reward sat on it (the true last token) and is not
    # moved to the last kept one, so row 0 returns nothing; row 1's reward reaches both its tokens.
    assert fields["returns"].tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 5)
    assert batch["response_mask"] is mask  # the caller merges the new mask; the stage leaves its input alone
