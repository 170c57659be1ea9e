"""Starting LoRA from a saved peft adapter (actor_rollout_ref.model.lora_adapter_path).

A tiny model gets an adapter of rank 2, alpha 6 on q_proj and v_proj with non-zero B (so it changes the
model), saved with peft's save_pretrained. A worker started from it — with lora_rank left at 0, as verl's
example run_qwen2_5-3b_gsm8k_grpo_lora_from_adapter.sh does — must compute the adapted model's log-probs on
its first step, hold the saved adapter weights, and scale by the adapter's alpha / r (3), not the plan's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"
SEQUENCES, PROMPT_LENGTH, RESPONSE_LENGTH = 4, 8, 6
RANK, ALPHA, TARGETS = 2, 6.0, ["q_proj", "v_proj"]


def _plan(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PRESET, [
        "trainer.n_gpus_per_node=1", f"data.train_batch_size={SEQUENCES // 2}", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}", *overrides])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result


@pytest.fixture(scope="module")
def saved(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The adapter (save_pretrained) and the adapted model with the adapter merged in (a plain checkpoint)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("adapter")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0,
                                                  task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # B starts at zero: give the adapter something to say
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    peft_model.save_pretrained(out / "adapter")
    peft_model.merge_and_unload().save_pretrained(out / "merged")
    for tokenizer_file in Path(tiny_model_dir).glob("*token*"):
        (out / "merged" / tokenizer_file.name).write_bytes(tokenizer_file.read_bytes())
    return {"adapter": out / "adapter", "merged": out / "merged"}


@pytest.fixture(scope="module")
def started(tiny_model_dir: Path, saved: dict[str, Path]) -> dict:
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.workers.cluster.device import join_process_group, set_rendezvous_env
    from engine.workers.cluster.failure import free_port
    from engine.workers.fsdp.sharding import full_state_dict

    g = torch.Generator().manual_seed(1)
    batch = rollout_rows(torch.randint(3, PROMPT_LENGTH + 1, (SEQUENCES,), generator=g),
                         torch.randint(1, RESPONSE_LENGTH + 1, (SEQUENCES,), generator=g), PROMPT_LENGTH,
                         RESPONSE_LENGTH, g)
    set_rendezvous_env(0, 1, "127.0.0.1", free_port(), "127.0.0.1")
    join_process_group(torch.device("cpu"), 0, 1)
    joined = actor_module.join_process_group
    actor_module.join_process_group = lambda *args: None  # one group serves both workers
    out: dict = {"batch": batch}
    try:
        adapted = actor_module.ActorRolloutRefWorker(_plan().resolved, str(saved["merged"]), 0, 1,
                                                     total_training_steps=2, pad_token_id=0, eos_token_id=1)
        adapted.init_model()
        out["adapted_log_probs"] = adapted.compute_log_prob(batch)["old_log_probs"]
        del adapted
        plan = _plan(f"actor_rollout_ref.model.lora_adapter_path={saved['adapter']}")
        out["plan"] = plan
        worker = actor_module.ActorRolloutRefWorker(plan.resolved, str(tiny_model_dir), 0, 1, total_training_steps=2,
                                                    pad_token_id=0, eos_token_id=1)
        worker.init_model()
        out["log_probs"] = worker.compute_log_prob(batch)["old_log_probs"]
        out["ref_log_probs"] = worker.compute_ref_log_prob(batch)["ref_log_probs"]
        out["state"] = {name: value.clone() for name, value in full_state_dict(worker.actor).items()}
        out["scaling"] = worker.lora_scaling
        out["trainable"] = sorted(name for name, p in worker.actor.named_parameters() if p.requires_grad)
        worker.sync_rollout_weights()
        out["rollout_copy"] = {k: v.clone() for k, v in worker.rollout.model.state_dict().items()}
    finally:
        actor_module.join_process_group = joined
        torch.distributed.destroy_process_group()
    return out


def test_the_first_steps_log_probs_are_the_adapted_models(started) -> None:
    mask = started["batch"]["response_mask"].bool()
    assert torch.allclose(started["log_probs"][mask], started["adapted_log_probs"][mask], atol=1e-5)
    # and not the base model's: the reference (adapters off) differs where the adapter acts
    assert (started["ref_log_probs"][mask] - started["log_probs"][mask]).abs().max() > 1e-3


def test_training_starts_from_the_saved_adapter_weights_with_the_adapters_rank_alpha_and_targets(saved,
                                                                                                started) -> None:
    from safetensors.torch import load_file

    stored = load_file(saved["adapter"] / "adapter_model.safetensors")  # peft's names: ...q_proj.lora_A.weight
    assert len(stored) == 2 * 2 * 2  # 2 layers × (q_proj, v_proj) × (A, B)
    state = started["state"]
    for name, tensor in stored.items():
        ours = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        (match,) = [key for key in state if key.endswith(ours.removeprefix("base_model.model."))]
        assert torch.equal(state[match], tensor), name
    assert started["scaling"] == ALPHA / RANK  # the adapter's 6 / 2, not the plan's lora_alpha 16 / lora_rank 0
    assert started["trainable"] and all(".lora_" in name for name in started["trainable"])
    assert {name.split(".")[-4] for name in started["trainable"]} == set(TARGETS)


def test_the_rollout_copy_gets_the_merged_adapted_weights(saved, started) -> None:
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(saved["merged"], torch_dtype=torch.float32).state_dict()
    copy = started["rollout_copy"]
    for name, tensor in merged.items():
        assert torch.allclose(copy[name].float(), tensor, atol=1e-6), name


def test_the_compiler_reads_the_local_adapters_config_for_the_estimate(saved, started) -> None:
    from rlconf.lora_adapter import actor_lora

    plan = started["plan"]
    lora = actor_lora(plan.resolved.config.actor_rollout_ref.model)
    assert (lora.rank, lora.alpha, sorted(lora.target_modules)) == (RANK, ALPHA, TARGETS)
    assert not [d for d in plan.diagnostics if d.code == "RL551"]  # nothing in the plan contradicts it
    terms = [t.formula for m in plan.resolved.memory for t in m.terms if t.what == "actor adapter parameters"]
    assert terms and all(f"rank {RANK} ×" in formula for formula in terms)
    # set against the adapter, the plan's own shape is named as having no effect
    told = _plan(f"actor_rollout_ref.model.lora_adapter_path={saved['adapter']}", "actor_rollout_ref.model.lora_rank=8")
    (warning,) = [d for d in told.diagnostics if d.code == "RL551"]
    assert "lora_rank 8 (the adapter's: 2)" in warning.message
    far = _plan("actor_rollout_ref.model.lora_adapter_path=org/some-adapter-on-the-hub")
    (warning,) = [d for d in far.diagnostics if d.code == "RL551"]
    assert "assumes lora_rank 0" in warning.message


def test_the_plans_target_modules_in_another_order_are_the_adapters_own(saved) -> None:
    """peft matches target modules as a set: the same names in another order contradict nothing (no RL551)."""
    import json as _json

    config = _json.loads((Path(saved["adapter"]) / "adapter_config.json").read_text())
    reversed_targets = "[" + ",".join(reversed(sorted(config["target_modules"]))) + "]"
    plan = _plan(f"actor_rollout_ref.model.lora_adapter_path={saved['adapter']}",
                 f"actor_rollout_ref.model.target_modules={reversed_targets}")
    assert not [d for d in plan.diagnostics if d.code == "RL551"]
