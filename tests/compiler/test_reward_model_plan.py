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


SERVED = [*RM, "reward_model.rollout.name=vllm", "reward_model.rollout.tensor_model_parallel_size=1",
          "data.return_raw_chat=true", "trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
AWAKE_SHARES = ["reward_model.rollout.free_cache_engine=false", "reward_model.rollout.gpu_memory_utilization=0.5",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"]


def test_two_engines_awake_on_one_gpu_beyond_its_memory_are_refused_only_where_they_share_it():
    """RL544: colocated with the actor, the served model shares the GPUs of the actor's vLLM in the synchronous step;
    with the rollout on a pool of its own (one-step off-policy) they never meet."""
    shared = compile_plan(PRESETS / "quickstart.yaml", [*SERVED, *AWAKE_SHARES])
    assert "RL544" in codes(shared)
    apart = compile_plan(PRESETS / "quickstart_offpolicy.yaml", [*SERVED, *AWAKE_SHARES])
    assert apart.resolved is not None and apart.resolved.schedule.mode == "one_step_off_policy"
    assert "RL544" not in codes(apart)


def test_explain_says_a_served_reward_model_reads_text_rendered_by_the_policys_tokenizer():
    from rlconf.rewards import reward_text

    resolved = compile_plan(PRESETS / "quickstart.yaml", [*SERVED, "reward_model.model.input_tokenizer=tiny://qwen2"]).resolved
    text = reward_text(resolved.config)
    assert "served by vLLM" in text and "the policy's tokenizer" in text and "input_tokenizer" not in text


# RL534: the FSDP reward-model worker reads the policy's token ids as they are unless input_tokenizer is set.
RANDOM_POLICY = ["actor_rollout_ref.model.path=random://Qwen2.5-0.5B", "critic.model.path=random://Qwen2.5-0.5B"]


def local_reward_model(tmp_path: Path, vocab_size: int) -> Path:
    """A reward model directory as build_tiny_reward_model writes it: only its config.json is read here."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "vocab_size": vocab_size, "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "num_labels": 1}))
    return tmp_path


def test_a_reward_model_with_fewer_token_ids_than_the_policy_samples_is_refused(tmp_path):
    rm_dir = local_reward_model(tmp_path, 300)
    result = compile_plan(PRESETS / "ppo_reward_model.yaml",
                          [*RANDOM_POLICY, f"reward_model.model.path={rm_dir}", "reward_model.use_reward_loop=false"])
    (found,) = [d for d in result.diagnostics if d.code == "RL534"]
    assert found.is_error and found.key == "reward_model.model.path" and result.resolved is None
    assert "300 token embeddings" in found.message and "151,936" in found.message
    assert str(rm_dir / "config.json") in found.note  # where the size was read
    assert "reward_model.model.input_tokenizer: random://Qwen2.5-0.5B" in found.help


def test_input_tokenizer_or_a_served_reward_model_reads_the_responses_as_text_and_is_accepted(tmp_path):
    rm = [*RANDOM_POLICY, f"reward_model.model.path={local_reward_model(tmp_path, 300)}"]
    retokenized = compile_plan(PRESETS / "ppo_reward_model.yaml", [*rm, "reward_model.model.input_tokenizer=random://Qwen2.5-0.5B"])
    assert "RL534" not in codes(retokenized) and retokenized.resolved is not None
    served = compile_plan(PRESETS / "quickstart.yaml", [*SERVED, *rm])
    assert served.resolved is not None and served.resolved.roles.served_reward_model is not None
    assert "RL534" not in codes(served)


def test_a_reward_model_with_more_token_ids_than_the_policy_is_warned_of():
    result = compile_plan(PRESETS / "ppo_reward_model.yaml", ["reward_model.model.path=random://Qwen2.5-0.5B"])
    (found,) = [d for d in result.diagnostics if d.code == "RL534"]
    assert not found.is_error and result.resolved is not None
    assert "151,936 token embeddings" in found.message and "`tiny://qwen2` 512" in found.message
    assert "reward_model.model.input_tokenizer: tiny://qwen2" in found.help


@pytest.mark.parametrize("reward_vocab", [151_936, 152_064])
def test_one_tokenizers_padded_vocabularies_are_warned_of_not_refused(tmp_path, reward_vocab):
    """Qwen2.5 7B's 152,064 rows against 1.5B's 151,936 (one tokenizer, padded apart), either way round."""
    policy = "random://Qwen2.5-7B" if reward_vocab == 151_936 else "random://Qwen2.5-0.5B"
    result = compile_plan(PRESETS / "ppo_reward_model.yaml",
                          [f"actor_rollout_ref.model.path={policy}", f"critic.model.path={policy}",
                           f"reward_model.model.path={local_reward_model(tmp_path, reward_vocab)}"])
    (found,) = [d for d in result.diagnostics if d.code == "RL534"]
    assert not found.is_error and "padding" in found.message
    assert ("stops the run" in found.message) == (reward_vocab == 151_936)  # only a smaller one can be out of range


@pytest.mark.parametrize("overrides", [
    [],  # the preset: tiny://qwen2 and tiny://qwen2-reward share the tiny tokenizer
    [*RANDOM_POLICY, "reward_model.model.path=org/reward-1B"],  # the reward model's config is not known here
    ["actor_rollout_ref.model.path=org/model-1B", "critic.model.path=org/model-1B"],  # nor the policy's
], ids=["same_vocabulary", "reward_model_unknown", "policy_unknown"])
def test_the_vocabulary_check_is_silent_where_the_sizes_agree_or_one_is_unknown(overrides):
    result = compile_plan(PRESETS / "ppo_reward_model.yaml", overrides)
    assert "RL534" not in codes(result)
