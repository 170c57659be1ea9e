"""verl values that once kept plans out: what `validate` and `explain` make of them.

actor_rollout_ref.model.torch_dtype (read by no code of verl 0.9.1), lora_adapter_path,
rollout_correction's rejection sampling and batch normalization, and the reward loop's served
reward model (reward_model.use_reward_loop, reward_model.rollout.*, enable_resource_pool).
"""

from __future__ import annotations

from pathlib import Path

from rlconf.compile import compile_plan

PRESETS = Path(__file__).resolve().parents[2] / "presets"
QUICKSTART = PRESETS / "quickstart.yaml"


def codes(result) -> list[str]:
    return [d.code for d in result.diagnostics]


def test_model_torch_dtype_is_accepted_with_a_warning_and_changes_nothing():
    # verl 0.9.1 passes actor_rollout_ref.model.torch_dtype nowhere (its FSDP engine loads in fp32 model_dtype and
    # computes in fsdp_config.dtype): the plan is the one without it, and the warning names the key that does act.
    with_it = compile_plan(QUICKSTART, ["actor_rollout_ref.model.torch_dtype=bfloat16"])
    without = compile_plan(QUICKSTART)
    (warning,) = [d for d in with_it.diagnostics if d.code == "RL109"]
    assert warning.key == "actor_rollout_ref.model.torch_dtype" and "actor_rollout_ref.model.dtype" in warning.help
    assert not with_it.errors
    assert with_it.resolved.roles == without.resolved.roles and with_it.resolved.memory == without.resolved.memory
    assert with_it.resolved.config.actor_rollout_ref.model.dtype == without.resolved.config.actor_rollout_ref.model.dtype
