"""Plans verl 0.9.1 runs are not refused (issue #30): where the result is merely unusual, rlconf warns and
says what verl does instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import VALID

from rlconf.compile import compile_plan
from rlconf.rules.algorithm import ONE_SAMPLE_FAILS, ONE_SAMPLE_RUNS
from rlconf.schema.sections import GROUP_ESTIMATORS


def compile_base(tmp_path: Path, overrides: list[str]):
    plan = tmp_path / "plan.yaml"
    plan.write_text(VALID)  # GRPO, n 2, on 4 GPUs
    return compile_plan(plan, overrides, resolve=False)


@pytest.mark.parametrize("estimator", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_straight_through_kl_estimators_are_accepted_for_the_loss_and_the_reward(estimator: str, tmp_path: Path):
    # verl core_algos.py kl_penalty: a name ending in `+` is the named estimator's value with k2's gradient.
    result = compile_base(tmp_path, ["actor_rollout_ref.actor.use_kl_loss=true",
                                     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                                     f"actor_rollout_ref.actor.kl_loss_type={estimator}+",
                                     f"algorithm.kl_penalty={estimator}+"])
    assert [d.code for d in result.errors] == []


def test_an_unknown_straight_through_estimator_is_still_refused(tmp_path: Path):
    result = compile_base(tmp_path, ["actor_rollout_ref.actor.kl_loss_type=full+"])
    assert [(d.code, d.key) for d in result.errors] == [("RL104", "actor_rollout_ref.actor.kl_loss_type")]


def test_grpo_with_one_sample_per_prompt_validates_with_a_warning_that_says_what_verl_does(tmp_path: Path):
    # verl 0.9.1 core_algos.py compute_grpo_outcome_advantage: a group of one has mean 0 and std 1.
    result = compile_base(tmp_path, ["actor_rollout_ref.rollout.n=1"])
    assert result.errors == []
    (warned,) = [d for d in result.diagnostics if d.code == "RL501"]
    assert warned.key == "actor_rollout_ref.rollout.n"
    assert "the advantage is the raw reward" in warned.message and "REINFORCE" in warned.message


def test_strict_validate_still_fails_on_the_one_sample_warning(tmp_path: Path):
    result = compile_base(tmp_path, ["actor_rollout_ref.rollout.n=1"])
    assert result.exit_code(strict=False) == 0
    assert result.exit_code(strict=True) == 1


@pytest.mark.parametrize("estimator", sorted(GROUP_ESTIMATORS))
def test_every_group_estimator_says_what_verl_does_with_one_sample(estimator: str, tmp_path: Path):
    result = compile_base(tmp_path, ["actor_rollout_ref.rollout.n=1", f"algorithm.adv_estimator={estimator}"])
    codes = {d.code for d in result.diagnostics} & {"RL501", "RL530"}
    if estimator in ONE_SAMPLE_FAILS:  # verl raises (grpo_passk) or trains on zero advantages (rloo_vectorized)
        assert codes == {"RL530"} and [d.code for d in result.errors] == ["RL530"]
    else:
        assert estimator in ONE_SAMPLE_RUNS and codes == {"RL501"} and result.errors == []


def test_a_token_budget_below_max_model_len_with_chunked_prefill_is_a_warning(tmp_path: Path):
    # verl 0.9.1 passes both to vLLM, whose chunked prefill runs them (vllm_async_server.py raises the budget
    # itself only when chunked prefill is off).
    result = compile_base(tmp_path, ["actor_rollout_ref.rollout.name=vllm",
                                     "actor_rollout_ref.rollout.max_num_batched_tokens=64"])
    assert result.errors == []
    assert "RL512" in {d.code for d in result.diagnostics}
