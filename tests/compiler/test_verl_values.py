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


# --- the reward loop: a reward model served by a rollout engine ------------------------------------------------

GRPO_8 = PRESETS / "grpo_7b_8gpu.yaml"
SERVED = ["reward_model.enable=true", "reward_model.model.path=Qwen/Qwen2.5-7B", "reward_model.rollout.name=vllm"]


def test_a_served_reward_model_is_colocated_with_the_actor_and_its_replicas_are_gpus_over_tp():
    result = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.tensor_model_parallel_size=2"])
    assert not result.errors, result.errors
    served = result.resolved.roles.served_reward_model
    actor_pool = result.resolved.placement.roles["actor"]
    assert (served.pool, served.colocated, served.world_size, served.replicas) == (actor_pool, True, 8, 4)
    assert served.formulas["replicas"] == "8 GPUs ÷ tp 2 = 4"
    assert "reward_model" in result.resolved.placement.pools[actor_pool].roles
    assert result.resolved.roles.reward_model is None  # no FSDP reward-model worker beside it


def test_verl_091_spellings_of_the_served_reward_model_read_into_the_same_plan():
    legacy = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.gpu_memory_utilization=0.3"]).resolved
    new = compile_plan(GRPO_8, ["reward.reward_model.enable=true", "reward.reward_model.model_path=Qwen/Qwen2.5-7B",
                                "reward.reward_model.rollout.name=vllm",
                                "reward.reward_model.rollout.gpu_memory_utilization=0.3"]).resolved
    assert new.roles.served_reward_model == legacy.roles.served_reward_model
    assert new.memory == legacy.memory


def test_the_colocated_reward_model_wakes_between_rollout_and_training_with_its_share_of_the_gpu():
    result = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.gpu_memory_utilization=0.3"])
    base = compile_plan(GRPO_8).resolved
    phases = {(m.pool, m.phase): m for m in result.resolved.memory}
    before = {(m.pool, m.phase): m for m in base.memory}
    pool = result.resolved.placement.roles["actor"]
    assert list(phases) == [(pool, "rollout"), (pool, "reward"), (pool, "training")]
    # asleep (free_cache_engine) in rollout and training: those phases are the plan's without it
    assert phases[pool, "rollout"] == before[pool, "rollout"] and phases[pool, "training"] == before[pool, "training"]
    (share,) = [t for t in phases[pool, "reward"].terms if t.what.startswith("served reward model")]
    assert share.gib == 0.3 * result.resolved.config.estimate.gpu_memory_gib
    # the actor's own vLLM sleeps while the reward model scores; its FSDP states stay
    reward_terms = {t.what for t in phases[pool, "reward"].terms}
    assert not any(what.startswith("vLLM ") for what in reward_terms)
    assert {t.what for t in before[pool, "rollout"].terms if not t.what.startswith("vLLM ")} <= reward_terms


def test_a_reward_model_awake_throughout_counts_in_every_phase():
    result = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.gpu_memory_utilization=0.3",
                                   "reward_model.rollout.free_cache_engine=false"])
    for phase in result.resolved.memory:
        assert any(t.what.startswith("served reward model") for t in phase.terms), phase.phase


def test_a_reward_model_pool_of_its_own_is_a_pool_and_a_phase_of_its_own():
    result = compile_plan(GRPO_8, [*SERVED, "reward_model.enable_resource_pool=true", "reward_model.nnodes=1",
                                   "reward_model.n_gpus_per_node=4", "reward_model.rollout.tensor_model_parallel_size=1",
                                   "reward_model.rollout.gpu_memory_utilization=0.8"])
    assert not result.errors, result.errors
    served = result.resolved.roles.served_reward_model
    assert (served.pool, served.colocated, served.world_size, served.replicas) == ("reward_pool", False, 4, 4)
    pool = result.resolved.placement.pools["reward_pool"]
    assert (pool.gpus, pool.roles) == (4, ["reward_model"])
    (phase,) = [m for m in result.resolved.memory if m.pool == "reward_pool"]
    assert phase.phase == "reward" and phase.total_gib == 0.8 * result.resolved.config.estimate.gpu_memory_gib


def test_verls_own_checks_of_a_served_reward_model():
    no_nodes = compile_plan(GRPO_8, [*SERVED, "reward_model.enable_resource_pool=true"])
    assert [(d.code, d.key) for d in no_nodes.errors] == [("RL541", "reward_model.nnodes")]
    too_wide = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.tensor_model_parallel_size=16"])
    assert [d.code for d in too_wide.errors] == ["RL542"] and "not one replica" in too_wide.errors[0].message
    uneven = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.tensor_model_parallel_size=3"])
    assert [d.code for d in uneven.errors] == ["RL542"] and "1, 2, 4, 8" in uneven.errors[0].help
    no_name = compile_plan(GRPO_8, ["reward_model.enable=true", "reward_model.model.path=Qwen/Qwen2.5-7B",
                                    "reward_model.use_reward_loop=true"])
    assert [d.code for d in no_name.errors] == ["RL540"]
    no_chat = compile_plan(GRPO_8, [*SERVED, "data.return_raw_chat=false"])
    assert [d.code for d in no_chat.errors] == ["RL546"]


def test_two_engines_awake_at_once_must_fit_the_gpu_together():
    over = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.free_cache_engine=false",
                                 "reward_model.rollout.gpu_memory_utilization=0.5"])  # the preset's actor: 0.6
    assert [d.code for d in over.errors] == ["RL544"] and "0.5 + 0.6 = 1.1" in over.errors[0].message
    asleep = compile_plan(GRPO_8, [*SERVED, "reward_model.rollout.gpu_memory_utilization=0.5"])
    assert "RL544" not in codes(asleep)


def test_the_other_paths_settings_are_said_to_have_no_effect():
    served = compile_plan(GRPO_8, [*SERVED, "reward_model.micro_batch_size_per_gpu=8"])
    (warning,) = [d for d in served.diagnostics if d.code == "RL545"]
    assert warning.key == "reward_model.micro_batch_size_per_gpu" and "has no effect" in warning.message
    fsdp = compile_plan(GRPO_8, [*SERVED, "reward_model.use_reward_loop=false",
                                 "reward_model.micro_batch_size_per_gpu=8"])
    assert fsdp.resolved.roles.served_reward_model is None and fsdp.resolved.roles.reward_model is not None
    assert [d.key for d in fsdp.diagnostics if d.code == "RL545"] == ["reward_model.rollout"]

