"""Plans verl 0.9.1 runs are not refused (issue #30): where the result is merely unusual, rlconf warns and
says what verl does instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlconf.compile import compile_plan

BASE = """\
data:
  train_batch_size: 16
  max_prompt_length: 64
  max_response_length: 64
actor_rollout_ref:
  model:
    path: org/model-1B
  actor:
    ppo_mini_batch_size: 8
    ppo_micro_batch_size_per_gpu: 2
  rollout:
    n: 4
    log_prob_micro_batch_size_per_gpu: 4
  ref:
    log_prob_micro_batch_size_per_gpu: 4
algorithm:
  adv_estimator: grpo
trainer:
  nnodes: 1
  n_gpus_per_node: 4
"""


def compile_base(tmp_path: Path, overrides: list[str]):
    plan = tmp_path / "plan.yaml"
    plan.write_text(BASE)
    return compile_plan(plan, overrides, resolve=False)


@pytest.mark.parametrize("estimator", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_straight_through_kl_estimators_are_accepted_for_the_loss_and_the_reward(estimator: str, tmp_path: Path):
    # verl core_algos.py kl_penalty: a name ending in `+` is the named estimator's value with k2's gradient.
    result = compile_base(tmp_path, ["actor_rollout_ref.actor.use_kl_loss=true",
                                     f"actor_rollout_ref.actor.kl_loss_type={estimator}+",
                                     f"algorithm.kl_penalty={estimator}+"])
    assert [d.code for d in result.errors] == []


def test_an_unknown_straight_through_estimator_is_still_refused(tmp_path: Path):
    result = compile_base(tmp_path, ["actor_rollout_ref.actor.kl_loss_type=full+"])
    assert [(d.code, d.key) for d in result.errors] == [("RL104", "actor_rollout_ref.actor.kl_loss_type")]
