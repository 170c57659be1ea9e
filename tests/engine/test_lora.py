"""LoRA on the actor (actor_rollout_ref.model.lora_rank > 0): the merge, the reference, what trains, checkpoints.

The worker tests build real `ActorRolloutRefWorker`s (one rank on gloo, in this process) from the
tiny checkpoint with bf16 compute, as on a GPU: the frozen base is then stored in bf16 next to fp32
adapters inside the same FSDP2 layer groups, the mix a GPU run has. Two more LoRA workers run with
the offload knobs on and must agree bit for bit (the same operations in the same order on the CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"
SEQUENCES, PROMPT_LENGTH, RESPONSE_LENGTH = 8, 8, 6
RANK, ALPHA = 4, 8.0
LORA = [f"actor_rollout_ref.model.lora_rank={RANK}", f"actor_rollout_ref.model.lora_alpha={ALPHA}"]
Q_PROJ = "model.layers.0.self_attn.q_proj"
FSDP = "actor_rollout_ref.actor.fsdp_config"
OFFLOAD_VARIANTS = ((f"{FSDP}.param_offload=true", f"{FSDP}.optimizer_offload=true"),
                    (f"{FSDP}.offload_policy=true", "actor_rollout_ref.model.enable_activation_offload=true"))


# --- the merge, by hand ----------------------------------------------------------------------

def test_merged_weight_is_the_base_plus_alpha_over_r_times_b_at_a_under_the_base_names() -> None:
    from engine.models.lora import lora_scaling, merge_lora_weights

    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = torch.tensor([[1.0, -1.0]])  # r = 1: [r, in]
    b = torch.tensor([[2.0], [0.5]])  # [out, r]
    scaling = lora_scaling(rank=1, alpha=2.0)
    assert scaling == 2.0
    # B @ A = [[2, -2], [0.5, -0.5]]; × 2 = [[4, -4], [1, -1]]; + W:
    expected = torch.tensor([[5.0, -2.0], [4.0, 3.0]])
    bias, norm = torch.tensor([0.5, 0.25]), torch.tensor([1.0, 1.0])
    merged = dict(merge_lora_weights([
        (f"{Q_PROJ}.base_layer.weight", w), (f"{Q_PROJ}.base_layer.bias", bias),
        (f"{Q_PROJ}.lora_A.default.weight", a), (f"{Q_PROJ}.lora_B.default.weight", b),
        ("model.norm.weight", norm)], scaling))
    assert list(merged) == [f"{Q_PROJ}.bias", f"{Q_PROJ}.weight", "model.norm.weight"]
    assert torch.equal(merged[f"{Q_PROJ}.weight"], expected)
    assert torch.equal(merged[f"{Q_PROJ}.bias"], bias) and torch.equal(merged["model.norm.weight"], norm)


def test_the_merge_runs_in_fp32_before_the_cast_to_the_rollout_dtype() -> None:
    from engine.models.lora import merge_lora_weights

    # 256 in bf16 has a spacing of 2: adding 0.75 and then 0.75 again in bf16 would stay at 256,
    # the fp32 sum 257.5 rounds to 258.
    w = torch.tensor([[256.0]], dtype=torch.bfloat16)
    a, b = torch.tensor([[1.0]]), torch.tensor([[1.5]])
    merged = dict(merge_lora_weights([("m.base_layer.weight", w), ("m.lora_A.default.weight", a),
                                      ("m.lora_B.default.weight", b)], scaling=1.0, dtype=torch.bfloat16))
    assert merged["m.weight"].dtype == torch.bfloat16 and float(merged["m.weight"]) == 258.0


def test_a_lora_module_with_a_missing_matrix_is_an_error_not_a_silent_drop() -> None:
    from engine.models.lora import merge_lora_weights

    with pytest.raises(ValueError, match="needs W, A and B"):
        list(merge_lora_weights([("m.base_layer.weight", torch.ones(2, 2)), ("m.lora_A.default.weight", torch.ones(1, 2))],
                                1.0))


def test_the_merged_linear_computes_what_peft_computes_with_the_adapter_on() -> None:
    """Ties the hand formula to peft's own forward (same scaling, same orientation of A and B)."""
    from peft import LoraConfig, get_peft_model

    from engine.models.lora import lora_scaling, merge_lora_weights

    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("proj", torch.nn.Linear(5, 3))
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=6, target_modules=["proj"]))
    torch.nn.init.normal_(model.proj.lora_B["default"].weight)  # B starts at zero: make the adapter count
    x = torch.randn(4, 5)
    merged = dict(merge_lora_weights(model.state_dict().items(), lora_scaling(2, 6)))
    plain = torch.nn.Linear(5, 3)
    plain.load_state_dict({"weight": merged["proj.weight"], "bias": merged["proj.bias"]})
    torch.testing.assert_close(plain(x), peft_model(x), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(plain(x), model.proj.base_layer(x))  # the adapter changed the output


def test_an_adapter_on_an_lm_head_tied_to_the_embeddings_is_refused(tiny_model_dir: Path) -> None:
    """No plain model holds a merged head that differs from the embeddings it shares a weight with."""
    from types import SimpleNamespace

    from engine.models.loading import load_causal_lm
    from engine.models.lora import add_lora

    model = load_causal_lm(tiny_model_dir)
    assert model.config.tie_word_embeddings
    cfg = SimpleNamespace(lora_rank=2, lora_alpha=4.0, target_modules=["q_proj", "lm_head"], exclude_modules=None,
                          enable_gradient_checkpointing=False, lora_adapter_path=None)
    with pytest.raises(ValueError, match="ties to its input embeddings"):
        add_lora(model, cfg, torch.float32)


# --- the worker ------------------------------------------------------------------------------

def _plan(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PRESET, [
        "trainer.n_gpus_per_node=1", f"data.train_batch_size={SEQUENCES // 2}", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.optim.lr=0.01",
        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}", *overrides])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    batch = rollout_rows(torch.randint(3, PROMPT_LENGTH + 1, (SEQUENCES,), generator=g),
                         torch.randint(1, RESPONSE_LENGTH + 1, (SEQUENCES,), generator=g), PROMPT_LENGTH, RESPONSE_LENGTH, g)
    batch["advantages"] = torch.randn(SEQUENCES, 1, generator=g).expand(-1, RESPONSE_LENGTH) * batch["response_mask"]
    return batch


def _capture_gradients(model, optimizer) -> list[dict[str, torch.Tensor]]:
    captured: list[dict[str, torch.Tensor]] = []
    optimizer.register_step_pre_hook(lambda *_: captured.append(
        {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}))
    return captured


def _sleeping_vllm_rollout():
    """A VLLMRollout asleep at level 2 whose vLLM engine is a recorder: (backend, the calls it saw).

    Built without __init__ (no vLLM, no GPU); `load_weights` and `_wake` are the real methods, and
    the stand-in model records what vLLM's `model.load_weights(weights=...)` would be handed. How
    vLLM then maps those HF names onto its fused layers is vLLM's part, not run here.
    """
    from types import SimpleNamespace

    from engine.rollout.vllm import VLLMRollout

    calls: list[tuple[str, object]] = []

    def load_weights(weights):
        calls.append(("load_weights", {name: tensor.clone() for name, tensor in weights}))

    model = SimpleNamespace(load_weights=load_weights)
    runner = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=runner)))
    backend = object.__new__(VLLMRollout)
    backend.llm = SimpleNamespace(llm_engine=engine, wake_up=lambda tags: calls.append(("wake_up", list(tags))))
    backend._asleep, backend._seconds, backend.has_weights = {"weights", "kv_cache"}, {}, False
    return backend, calls


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A LoRA worker and a full fine-tuning worker (its separate reference = the base model) on the same rows."""
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.workers.cluster.device import join_process_group, set_rendezvous_env
    from engine.workers.cluster.failure import free_port
    from engine.workers.fsdp.sharding import full_state_dict as gathered

    def full_state_dict(model) -> dict[str, torch.Tensor]:
        # Copies: on one rank a gathered tensor may be the parameter's own storage, which later updates change.
        return {name: value.clone() for name, value in gathered(model).items()}

    out_dir = tmp_path_factory.mktemp("lora")
    set_rendezvous_env(0, 1, "127.0.0.1", free_port(), "127.0.0.1")
    join_process_group(torch.device("cpu"), 0, 1)
    joined = actor_module.join_process_group
    actor_module.join_process_group = lambda *args: None  # one group serves both workers
    results: dict = {}
    try:
        batch = _batch()
        plain = actor_module.ActorRolloutRefWorker(_plan(), str(tiny_model_dir), 0, 1, total_training_steps=10,
                                                   pad_token_id=0, eos_token_id=1)
        plain.init_model()
        results["plain_ref"] = plain.compute_ref_log_prob(batch)["ref_log_probs"]
        del plain

        worker = actor_module.ActorRolloutRefWorker(_plan(*LORA), str(tiny_model_dir), 0, 1, total_training_steps=10,
                                                    pad_token_id=0, eos_token_id=1)
        worker.init_model()
        results["has_ref_model"] = worker.ref is not None
        results["ref_before"] = worker.compute_ref_log_prob(batch)["ref_log_probs"]
        old = worker.compute_log_prob(batch)["old_log_probs"]
        results["before"] = full_state_dict(worker.actor)
        results["optimizer_params"] = {id(p) for group in worker.optimizer.param_groups for p in group["params"]}
        results["param_ids"] = {name: id(p) for name, p in worker.actor.named_parameters()}
        results["requires_grad"] = {name: p.requires_grad for name, p in worker.actor.named_parameters()}
        results["dtypes"] = {name: p.dtype for name, p in worker.actor.named_parameters()}
        grads = _capture_gradients(worker.actor, worker.optimizer)
        trained = {**batch, "old_log_probs": old, "ref_log_probs": results["ref_before"]}
        worker.update_actor(trained)
        results["grads"] = list(grads)
        results["after"] = full_state_dict(worker.actor)
        results["ref_after"] = worker.compute_ref_log_prob(batch)["ref_log_probs"]
        results["actor_after"] = worker.compute_log_prob(batch)["old_log_probs"]
        worker.sync_rollout_weights()
        results["rollout_copy"] = {k: v.clone() for k, v in worker.rollout.model.state_dict().items()}
        # The vLLM backend gets the same push: its load_weights, with vLLM's model object stood in for.
        hf_rollout, (worker.rollout, results["vllm_calls"]) = worker.rollout, _sleeping_vllm_rollout()
        worker.sync_rollout_weights()
        worker.rollout = hf_rollout
        worker.export_hf("actor", str(out_dir / "hf"))
        results["hf_dir"] = out_dir / "hf"
        # Checkpoint round trip: save, a second update, load, the second update again.
        worker.save_checkpoint(str(out_dir / "step"))
        worker.update_actor(trained)
        results["second"] = full_state_dict(worker.actor)
        worker.load_checkpoint(str(out_dir / "step"))
        results["reloaded"] = full_state_dict(worker.actor)
        results["reloaded_rollout_copy"] = {k: v.clone() for k, v in worker.rollout.model.state_dict().items()}
        worker.update_actor(trained)
        results["second_again"] = full_state_dict(worker.actor)
        # The offload knobs move the LoRA model's mixed states (bf16 base, fp32 adapters) and change no number.
        del worker
        results["offloaded"] = {}
        for knobs in OFFLOAD_VARIANTS:
            worker = actor_module.ActorRolloutRefWorker(_plan(*LORA, *knobs), str(tiny_model_dir), 0, 1,
                                                        total_training_steps=10, pad_token_id=0, eos_token_id=1)
            worker.init_model()
            ref = worker.compute_ref_log_prob(batch)["ref_log_probs"]
            worker.update_actor({**batch, "old_log_probs": worker.compute_log_prob(batch)["old_log_probs"],
                                 "ref_log_probs": ref})
            results["offloaded"][knobs] = (ref, full_state_dict(worker.actor))
            del worker
    finally:
        actor_module.join_process_group = joined
        torch.distributed.destroy_process_group()
    return results


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def test_only_the_adapters_train_and_the_optimizer_holds_only_them(runs) -> None:
    adapters = {name for name in runs["param_ids"] if _is_adapter(name)}
    # all-linear: q, k, v, o, gate, up, down of each of the tiny model's layers, A and B each.
    layers = 1 + max(int(name.split(".")[2]) for name in adapters)
    assert len(adapters) == 7 * 2 * layers
    assert {name for name, trains in runs["requires_grad"].items() if trains} == adapters
    assert runs["optimizer_params"] == {runs["param_ids"][name] for name in adapters}
    # The update's two optimizer steps (8 rows, mini batches of 2 prompts × n 2) saw adapter gradients only.
    assert len(runs["grads"]) == 2 and all(set(step) == adapters for step in runs["grads"])
    # Gradient checkpointing is on: the adapters of the checkpointed layers still get gradients.
    # (A's gradient is B^T-weighted and B starts at 0, so B's gradients are the ones that must be non-zero first.)
    assert all(float(step[name].abs().max()) > 0 for step in runs["grads"][:1] for name in adapters if ".lora_B." in name)
    # The frozen base stays in the compute dtype, the adapters are fp32 master weights.
    assert {runs["dtypes"][n] for n in adapters} == {torch.float32}
    assert {d for n, d in runs["dtypes"].items() if n not in adapters} == {torch.bfloat16}


def test_the_update_moves_the_adapters_and_leaves_every_base_weight_bit_for_bit(runs) -> None:
    before, after = runs["before"], runs["after"]
    assert before.keys() == after.keys()
    for name in before:
        if _is_adapter(name):
            continue
        assert torch.equal(before[name], after[name]), name
    assert any(not torch.equal(before[n], after[n]) for n in before if ".lora_B." in n)


def test_reference_log_probs_with_the_adapters_off_equal_the_base_models_exactly(runs) -> None:
    """The plain worker's reference is a separate model loaded from the checkpoint; the LoRA worker's is
    its actor with the adapters switched off. Same bf16 base weights, same kernels: bit for bit."""
    torch.testing.assert_close(runs["ref_before"], runs["plain_ref"], rtol=0, atol=0)
    torch.testing.assert_close(runs["ref_after"], runs["plain_ref"], rtol=0, atol=0)  # after the adapters moved
    assert not torch.equal(runs["actor_after"], runs["plain_ref"])  # while the actor itself has moved


def test_the_rollout_copy_receives_the_merged_weights_under_the_base_names(runs) -> None:
    after, copy = runs["after"], runs["rollout_copy"]
    assert not any(".lora_" in name or ".base_layer." in name for name in copy)
    w = after[f"{Q_PROJ}.base_layer.weight"].float()
    a, b = after[f"{Q_PROJ}.lora_A.default.weight"], after[f"{Q_PROJ}.lora_B.default.weight"]
    torch.testing.assert_close(copy[f"{Q_PROJ}.weight"], w + ALPHA / RANK * b @ a, rtol=0, atol=0)
    assert not torch.equal(copy[f"{Q_PROJ}.weight"], w)  # the adapter is not zero any more
    torch.testing.assert_close(copy["model.norm.weight"], after["model.norm.weight"].float(), rtol=0, atol=0)


def test_the_vllm_backend_receives_the_same_merged_weights_under_the_base_names(runs) -> None:
    """The worker hands vLLM's load_weights the iterator it hands the HF copy: the merged weights, and
    nothing named after peft's layers (vLLM knows the base model's names only)."""
    calls = runs["vllm_calls"]
    # The weights' pool wakes first (the KV cache stays asleep until generation), then one load.
    assert [kind for kind, _ in calls] == ["wake_up", "load_weights"] and calls[0][1] == ["weights"]
    received, copy = calls[1][1], runs["rollout_copy"]
    assert not any(".lora_" in name or ".base_layer." in name for name in received)
    # The tiny model ties its LM head to the embeddings: that tensor is sent once, under the first name.
    assert set(copy) - set(received) == {"lm_head.weight"} and set(received) <= set(copy)
    for name, value in received.items():
        torch.testing.assert_close(value, copy[name], rtol=0, atol=0, msg=name)
    after = runs["after"]
    a, b = after[f"{Q_PROJ}.lora_A.default.weight"], after[f"{Q_PROJ}.lora_B.default.weight"]
    expected = after[f"{Q_PROJ}.base_layer.weight"].float() + ALPHA / RANK * b @ a
    torch.testing.assert_close(received[f"{Q_PROJ}.weight"], expected, rtol=0, atol=0)


def test_the_hf_export_is_the_merged_model_and_loads_as_a_plain_causal_lm(runs) -> None:
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(runs["hf_dir"], dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    exported = model.state_dict()
    for name, value in runs["rollout_copy"].items():  # fp32 merges of the same weights
        torch.testing.assert_close(exported[name], value, rtol=0, atol=0, msg=name)


def test_a_checkpoint_round_trip_restores_base_and_adapters_and_the_optimizer(runs) -> None:
    after, second, reloaded = runs["after"], runs["second"], runs["reloaded"]
    assert any(not torch.equal(after[n], second[n]) for n in after)  # the second update moved something
    for name in after:
        assert torch.equal(reloaded[name], after[name]), name
    # Adam's moments came back too: the second update repeats exactly.
    for name in second:
        assert torch.equal(runs["second_again"][name], second[name]), name
    # The load refreshed the rollout copy with the loaded (merged) weights.
    for name, value in runs["rollout_copy"].items():
        assert torch.equal(runs["reloaded_rollout_copy"][name], value), name


def test_a_lora_plan_keeps_no_separate_reference_model(runs) -> None:
    assert runs["has_ref_model"] is False


@pytest.mark.parametrize("knobs", OFFLOAD_VARIANTS, ids=["param+optimizer offload", "offload_policy+activation offload"])
def test_offload_knobs_give_the_lora_actor_the_same_reference_and_update_bit_for_bit(runs, knobs) -> None:
    ref, weights = runs["offloaded"][knobs]
    torch.testing.assert_close(ref, runs["ref_before"], rtol=0, atol=0)
    assert weights.keys() == runs["after"].keys()
    for name, value in runs["after"].items():
        assert torch.equal(weights[name], value), name
