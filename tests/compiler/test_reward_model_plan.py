"""The compiler's side of the reward model: its rules, its per-GPU numbers and its memory in the estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlconf.compile import compile_plan

PRESETS = Path(__file__).resolve().parents[2] / "presets"
RM = ["reward_model.enable=true", "reward_model.model.path=tiny://qwen2-reward"]


def codes(result) -> list[str]:
    return [d.code for d in result.diagnostics]


def test_a_reward_model_without_a_path_is_refused():
    result = compile_plan(PRESETS / "quickstart.yaml", ["reward_model.enable=true"])
    assert "RL531" in codes(result) and result.resolved is None


def test_rule_scorers_beside_a_reward_model_are_said_to_be_replaced():
    result = compile_plan(PRESETS / "quickstart.yaml", [*RM, f"custom_reward_function.path={PRESETS / 'quickstart.yaml'}"])
    (warning,) = [d for d in result.diagnostics if d.code == "RL532"]
    assert "custom_reward_function" in warning.message and "will not be applied" in warning.message
    assert "RL532" not in codes(compile_plan(PRESETS / "quickstart.yaml", RM))


def test_the_reward_models_per_gpu_numbers_follow_the_plan():
    resolved = compile_plan(PRESETS / "quickstart.yaml", [*RM, "reward_model.micro_batch_size_per_gpu=16"]).resolved
    role = resolved.roles.reward_model
    # quickstart: 16 prompts × n 8 = 128 sequences over 2 CPU slots.
    assert (role.dp_size, role.sequences_per_gpu, role.micro_batch_size_per_gpu, role.micro_batches_per_gpu) == (2, 64, 16, 4)
    assert not role.use_dynamic_bsz


def test_without_a_micro_batch_the_reward_model_fills_the_token_budget():
    # verl 0.9's reward loop batches by itself, so its plans set none; the critic's forward budget is inherited.
    resolved = compile_plan(PRESETS / "quickstart.yaml", [*RM, "critic.forward_max_token_len_per_gpu=96"]).resolved
    role = resolved.roles.reward_model
    assert role.use_dynamic_bsz and role.micro_batch_size_per_gpu is None
    assert role.tokens_per_micro_batch == 96


@pytest.mark.parametrize("offload", [False, True])
def test_the_estimate_holds_the_reward_models_shards_in_both_phases(offload):
    from rlconf.modelinfo import model_info

    plan = compile_plan(PRESETS / "quickstart.yaml", [*RM, f"reward_model.model.fsdp_config.param_offload={str(offload).lower()}"])
    base = compile_plan(PRESETS / "quickstart.yaml").resolved
    params = model_info("tiny://qwen2-reward").num_params
    for with_rm, without in zip(plan.resolved.memory, base.memory, strict=True):
        (term,) = [t for t in with_rm.terms if t.what.startswith("reward model")]
        # float32 (the CPU plan's dtype), sharded over the 2 slots; nothing on the device when offloaded.
        assert term.gib == pytest.approx(0.0 if offload else 4 * params / 2 / 2**30, abs=1e-6)  # rounded to 6 places
        assert with_rm.total_gib == pytest.approx(without.total_gib + term.gib, abs=1e-6), with_rm.phase
