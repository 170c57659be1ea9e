"""Which worker groups share a pool's GPUs, and the checks a GPU plan meets before Ray starts (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

PRESETS = Path(__file__).resolve().parents[2] / "presets"
SPLIT_POOLS = ["trainer.n_gpus_per_node=3", "data.train_batch_size=48", "actor_rollout_ref.actor.ppo_mini_batch_size=48",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=8",
               "placement.pools.policy.n_gpus_per_node=2", "placement.pools.value.n_gpus_per_node=1",
               "placement.roles.actor=policy", "placement.roles.rollout=policy", "placement.roles.ref=policy",
               "placement.roles.critic=value"]


def _plan(preset: str, *overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PRESETS / preset, list(overrides))
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def test_a_colocated_critic_shares_the_actors_pool_and_a_split_one_has_its_own():
    from engine.workers.cluster.placement import groups_per_pool

    assert groups_per_pool(_plan("quickstart.yaml")) == {"global": 1}
    assert groups_per_pool(_plan("quickstart_ppo.yaml")) == {"global": 2}
    assert groups_per_pool(_plan("quickstart_ppo.yaml", *SPLIT_POOLS)) == {"policy": 1, "value": 1}


def test_a_local_gpu_plan_larger_than_the_machine_is_refused_with_the_counts(monkeypatch):
    import engine.launch
    from engine.launch import local_gpu_shortage

    monkeypatch.setattr(engine.launch, "gpu_count", lambda: 1)
    message = local_gpu_shortage(_plan("quickstart.yaml", "trainer.device=cuda"))
    assert message.startswith("trainer.device=cuda on 2 GPU(s)")
    assert "this machine has 1; set trainer.n_gpus_per_node=1" in message
    assert local_gpu_shortage(_plan("quickstart.yaml", "trainer.device=cuda", "trainer.n_gpus_per_node=1")) is None
    monkeypatch.setattr(engine.launch, "gpu_count", lambda: 0)
    assert "no CUDA device" in local_gpu_shortage(_plan("quickstart.yaml", "trainer.device=cuda"))
    assert local_gpu_shortage(_plan("quickstart.yaml")) is None  # a CPU plan needs no GPU


def test_a_plan_over_several_nodes_is_launched(monkeypatch):
    import engine.capabilities as capabilities
    from engine.capabilities import unsupported_features

    monkeypatch.setattr(capabilities, "triton_importable", lambda: True)  # CUDA builds of torch ship it; CI's CPU one not

    assert unsupported_features(_plan("quickstart.yaml", "trainer.nnodes=2", "trainer.n_gpus_per_node=1")) == []
    assert unsupported_features(_plan("quickstart.yaml", "trainer.device=cuda", "trainer.nnodes=4")) == []


def test_a_pool_slot_is_one_gpu_or_one_cpu_per_worker_process_that_shares_it():
    from engine.workers.cluster.placement import slot_bundle

    assert slot_bundle("cuda", groups=2) == {"GPU": 1, "CPU": 1}  # the groups split the GPU and its CPU
    assert slot_bundle("cpu", groups=1) == {"CPU": 1}
    assert slot_bundle("cpu", groups=2) == {"CPU": 2}  # actor and colocated critic: a process each


def test_keys_the_engine_cannot_honour_are_refused_or_noted_before_launch(monkeypatch):
    import engine.capabilities as capabilities
    from engine.capabilities import ignored_knob_notes, unsupported_features

    # No memory knob is refused today; the mechanism, with a stand-in entry:
    monkeypatch.setattr(capabilities, "NOT_APPLIED_REFUSED", (
        ("actor_rollout_ref.model.use_fused_kernels", "memory: the estimate assumes it"),
        ("critic.model.enable_activation_offload", "memory")))
    problems = unsupported_features(_plan("quickstart.yaml", "actor_rollout_ref.model.use_fused_kernels=true"))
    assert problems == ["actor_rollout_ref.model.use_fused_kernels=true is not applied by this engine yet "
                        "(memory: the estimate assumes it); set it to false"]
    # Critic keys only count when the plan has a critic.
    assert unsupported_features(_plan("quickstart.yaml", "critic.model.enable_activation_offload=true")) == []
    assert unsupported_features(_plan("quickstart_ppo.yaml", "critic.model.enable_activation_offload=true")) != []
    monkeypatch.undo()
    speed_only = _plan("quickstart.yaml", "data.dataloader_num_workers=2")
    assert unsupported_features(speed_only) == []
    assert ignored_knob_notes(speed_only) == [
        "data.dataloader_num_workers=2 is not applied by this engine yet (speed or memory only: the numbers are the same)"]
    # Applied now (tests/engine/test_packing.py, test_fused_head.py, test_fsdp_grad_equivalence.py):
    # neither refused nor noted.
    applied = _plan("quickstart_ppo.yaml", "actor_rollout_ref.model.use_remove_padding=true",
                    "critic.model.use_remove_padding=true", "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
                    "actor_rollout_ref.actor.entropy_checkpointing=true", "actor_rollout_ref.model.use_fused_kernels=true")
    assert unsupported_features(applied) == [] and ignored_knob_notes(applied) == []
    assert ignored_knob_notes(_plan("quickstart.yaml")) == []
    # The reference's entropy knobs have nothing to act on: said so, not "not applied yet".
    (note,) = ignored_knob_notes(_plan("quickstart.yaml", "actor_rollout_ref.ref.entropy_checkpointing=true"))
    assert note.startswith("actor_rollout_ref.ref.entropy_checkpointing=true has no effect: the reference policy "
                           "computes no entropy")


def test_offload_knobs_are_applied_neither_refused_nor_noted():
    """engine/workers/fsdp/offload.py; equivalence on CPU: tests/engine/test_offload_equivalence.py."""
    from engine.capabilities import ignored_knob_notes, unsupported_features

    for prefix in ("actor_rollout_ref.actor.fsdp_config", "critic.model.fsdp_config"):
        for knob in ("param_offload", "optimizer_offload", "offload_policy"):
            plan = _plan("quickstart_ppo.yaml", f"{prefix}.{knob}=true")
            assert unsupported_features(plan) == [] and ignored_knob_notes(plan) == [], knob
    for key in ("actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.model.enable_activation_offload",
                "critic.model.enable_activation_offload"):
        plan = _plan("quickstart_ppo.yaml", "actor_rollout_ref.actor.use_kl_loss=true", f"{key}=true")
        assert unsupported_features(plan) == [] and ignored_knob_notes(plan) == [], key


def test_a_vllm_plan_without_vllm_installed_is_refused_naming_the_extra():
    from engine.capabilities import rollout_problems

    plan = _plan("quickstart.yaml", "trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm")
    (problem,) = rollout_problems(plan, vllm_found=lambda: False)
    assert "pip install 'rlconf[vllm]'" in problem and "rollout.name=hf" in problem
    assert rollout_problems(plan, vllm_found=lambda: True) == []


def test_hf_rollout_refuses_tensor_parallelism_and_vllm_engine_kwargs():
    from engine.capabilities import rollout_problems
    from rlconf.compile import compile_plan

    # verl's default tp 2 is for vLLM: with HF generate the compiler refuses it (RL518), and so would
    # the engine given a resolved plan that says so.
    compiled = compile_plan(PRESETS / "quickstart.yaml", ["trainer.device=cuda", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    assert [d.code for d in compiled.errors] == ["RL518"]
    plan = _plan("quickstart.yaml", "trainer.device=cuda")
    rollout = plan.roles.rollout.model_copy(update={"tensor_parallel_size": 2})
    tp = rollout_problems(plan.model_copy(update={"roles": plan.roles.model_copy(update={"rollout": rollout})}))
    assert any("needs rollout.name=vllm" in p for p in tp)
    kwargs = rollout_problems(_plan("quickstart.yaml", "actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling=true"))
    assert any("engine_kwargs" in p for p in kwargs)


def test_gpu_presets_pass_the_capability_check(monkeypatch):
    """grpo_7b_8gpu, ppo_critic_split, long_context_ulysses and memory_lean name vLLM, offload, chunked
    entropy and Ulysses (long_context_ulysses: sp 4): the engine runs all of them, so none is refused."""
    import engine.capabilities as capabilities

    monkeypatch.setattr(capabilities, "vllm_importable", lambda: True)
    monkeypatch.setattr(capabilities, "triton_importable", lambda: True)  # the loss head's kernels (use_torch_compile)
    for preset in ("grpo_7b_8gpu.yaml", "ppo_critic_split.yaml", "long_context_ulysses.yaml", "memory_lean.yaml"):
        problems = capabilities.unsupported_features(_plan(preset))
        assert problems == [], (preset, problems)
    assert _plan("long_context_ulysses.yaml").roles.actor.sp_size == 4


def test_verl_values_the_compiler_refuses_are_refused_again_at_launch():
    """A resolved plan naming sglang, an estimator verl has and the engine does not run, or a reward manager it does
    not run (which validate reports as RL108) does not start either: the engine names the feature and what to use instead."""
    from engine.capabilities import unsupported_features

    plan = _plan("quickstart.yaml")
    config = plan.config
    arr = config.actor_rollout_ref
    sglang = config.model_copy(update={"actor_rollout_ref": arr.model_copy(update={
        "rollout": arr.rollout.model_copy(update={"name": "sglang"})})})
    otb = config.model_copy(update={"algorithm": config.algorithm.model_copy(update={
        "adv_estimator": "gdpo"})})
    remote = config.model_copy(update={"reward_model": config.reward_model.model_copy(update={"reward_manager": "remote"})})
    for changed, feature in ((sglang, "SGLang rollout"), (otb, "the gdpo advantage estimator"),
                             (remote, "the remote reward manager")):
        problems = unsupported_features(plan.model_copy(update={"config": changed}))
        assert any(feature in p and "this engine does not yet" in p for p in problems), problems


def test_ulysses_sequence_parallelism_is_launched_for_actor_ref_and_critic():
    from engine.capabilities import ignored_knob_notes, unsupported_features

    actor = _plan("quickstart.yaml", "actor_rollout_ref.model.use_remove_padding=true",
                  "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=true",
                  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16")
    assert (actor.roles.actor.sp_size, actor.roles.ref.sp_size) == (2, 2)
    critic = _plan("quickstart_ppo.yaml", "critic.model.use_remove_padding=true", "critic.ulysses_sequence_parallel_size=2")
    assert critic.roles.critic.sp_size == 2
    for plan in (actor, critic):
        assert unsupported_features(plan) == [] and ignored_knob_notes(plan) == []


def test_fused_kernels_with_ulysses_are_refused_naming_both_fixes():
    """The fused head runs on whole rows (engine/workers/sequence/fused_head.py); a Ulysses rank holds a slice."""
    from engine.capabilities import unsupported_features

    plan = _plan("quickstart.yaml", "actor_rollout_ref.model.use_remove_padding=true",
                 "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=true",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16", "actor_rollout_ref.model.use_fused_kernels=true")
    assert unsupported_features(plan) == [
        "actor_rollout_ref.model.use_fused_kernels=true with Ulysses sequence parallelism (actor over 2 ranks, ref over "
        "2 ranks) is not implemented; set use_fused_kernels to false or ulysses_sequence_parallel_size to 1"]


def test_liger_is_refused_before_launch_on_cpu_or_without_the_package_naming_the_fix():
    """engine/models/liger.py: checked by unsupported_features, which launch runs before any model loads."""
    from engine.capabilities import ignored_knob_notes, unsupported_features
    from engine.models.liger import liger_problems

    cpu = _plan("quickstart.yaml", "actor_rollout_ref.model.use_liger=true")
    assert cpu.config.trainer.device == "cpu"
    assert unsupported_features(cpu) == [
        "actor_rollout_ref.model.use_liger=true needs CUDA (liger-kernel's kernels are Triton), and "
        "trainer.device=cpu; set use_liger to false on this device"]
    assert ignored_knob_notes(cpu) == []  # applied where it can run, so not "noted, not applied"
    assert liger_problems(True, "cuda", liger_found=lambda: False) == [
        "actor_rollout_ref.model.use_liger=true, but liger-kernel is not installed in this Python; install it with "
        "`pip install 'rlconf[liger]'` (or `pip install liger-kernel`), or set use_liger to false"]
    assert liger_problems(True, "cuda", liger_found=lambda: True) == []
    assert liger_problems(False, "cpu") == []


def test_fused_kernels_with_a_lora_adapter_on_the_head_are_refused():
    from engine.capabilities import unsupported_features

    fused_lora = ["actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.model.lora_rank=4"]
    on_head = _plan("quickstart.yaml", *fused_lora, "actor_rollout_ref.model.target_modules=[q_proj,lm_head]")
    assert "actor_rollout_ref.model.use_fused_kernels=true with a LoRA adapter on lm_head is not implemented; set " \
           "use_fused_kernels to false or leave lm_head out of target_modules" in unsupported_features(on_head)
    # all-linear leaves the output layer out (peft), so the fused head is the plain head there.
    assert not any("use_fused_kernels" in p for p in unsupported_features(_plan("quickstart.yaml", *fused_lora)))
