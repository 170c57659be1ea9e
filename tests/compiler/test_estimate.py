"""The memory estimate's terms against hand-computed bytes (rlconf/estimate.py, docs/resolved-plan.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlconf.compile import compile_plan
from rlconf.estimate import _hf_kv_cache, activation_bytes_per_token_layer, decoder_linears
from rlconf.modelinfo import model_info

QUICKSTART = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"
GIB = 1024**3
# Qwen2.5-0.5B's layer shape with a 512-token vocabulary (the shape bench/memory_estimate.py measures).
QWEN_SHAPE = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 512, "tie_word_embeddings": True}


# Per token and layer: the gated MLP's 17 B × hidden + 8 B × intermediate, less what packed rows on CUDA
# do not keep (keys and values at their 2 heads of 64, not repeated to 14): 4 B × (896 − 2 × 64).
KV_KEPT = 4 * (896 - 2 * 64)
LAYER_BYTES = 17 * 896 + 8 * 4864 - KV_KEPT  # the default plan here: use_remove_padding, trainer.device cuda


def _phases(tmp_path: Path, config: dict, *overrides: str) -> dict[str, dict[str, float]]:
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    # The eager loss head's coefficients unless a test turns use_torch_compile on (then the Triton head's).
    result = compile_plan(QUICKSTART, [f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cuda",
                                       "trainer.n_gpus_per_node=1", "data.max_prompt_length=256",
                                       "data.max_response_length=256", "actor_rollout_ref.rollout.dtype=bfloat16",
                                       "actor_rollout_ref.actor.use_torch_compile=false", *overrides])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return {phase.phase: {term.what: term.gib for term in phase.terms} for phase in result.resolved.memory}


def _params(cfg: dict) -> int:
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = h // cfg["num_attention_heads"]
    attn = 2 * h * h + 2 * h * cfg["num_key_value_heads"] * head_dim
    return layers * (attn + 3 * h * inter + 2 * h) + cfg["vocab_size"] * h


def test_gated_mlp_activations_count_17_hidden_plus_8_intermediate_bytes_per_token_and_layer(tmp_path):
    training = _phases(tmp_path, QWEN_SHAPE)["training"]
    tokens = 16 * 512  # ppo_micro_batch_size_per_gpu 16 × (256 + 256)
    assert training["actor activations"] * GIB == pytest.approx(tokens * 24 * LAYER_BYTES)


# The loss head works on the response positions only: 16 rows × 256 response tokens, vocabulary 512.
RESPONSE_TOKENS = 16 * 256


@pytest.mark.parametrize(("entropy_coeff", "per_token"), [(0.0, 20), (0.01, 24)])
def test_plain_logits_count_the_fp32_log_softmax_peak_per_response_token(tmp_path, entropy_coeff, per_token):
    # 4 B saved fp32 logits (+ 4 B softmax with the entropy) and 16 B of backward's gradients and temporaries.
    training = _phases(tmp_path, QWEN_SHAPE, f"actor_rollout_ref.actor.entropy_coeff={entropy_coeff}")["training"]
    assert training["actor logits"] * GIB == pytest.approx(per_token * RESPONSE_TOKENS * 512, rel=1e-4)


@pytest.mark.parametrize("knob", ["entropy_from_logits_with_chunking", "entropy_checkpointing"])
def test_recomputed_fp32_logit_math_leaves_the_logits_and_one_chunks_fp32_math(tmp_path, knob):
    training = _phases(tmp_path, QWEN_SHAPE, f"actor_rollout_ref.actor.{knob}=true")["training"]
    # bf16 logits and their gradient (2 + 2 B) per response token, one chunk of 2048 rows at 18 B (no entropy).
    assert training["actor logits"] * GIB == pytest.approx((4 * RESPONSE_TOKENS + 18 * 2048) * 512, rel=1e-4)


def test_fused_kernels_count_one_chunk_of_fp32_math_and_the_head_gradient_accumulator(tmp_path):
    training = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.model.use_fused_kernels=true")["training"]
    # Nothing per response token: one chunk of 1024 rows at 12 B (three fp32 chunk tensors), plus the
    # fp32 gradient of the 512 × 896 head weight accumulated over chunks (4 B each).
    assert training["actor logits"] * GIB == pytest.approx((12 * 1024 + 4 * 896) * 512, rel=1e-4)


TRITON = "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton"
BF16 = "actor_rollout_ref.model.dtype=bfloat16"


COMPILED = "actor_rollout_ref.actor.use_torch_compile=true"


@pytest.mark.parametrize("head", [TRITON, COMPILED], ids=["impl_backend_triton", "use_torch_compile_on_cuda"])
@pytest.mark.parametrize("extra", [(), ("actor_rollout_ref.actor.entropy_coeff=0.01",),
                                   ("actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",),
                                   ("actor_rollout_ref.model.enable_activation_offload=true",),
                                   (COMPILED,)])
def test_the_triton_head_holds_the_bf16_logits_and_their_gradient_whatever_the_other_head_knobs(tmp_path, head, extra):
    # 2 B saved logits + 2 B gradient per response token: no fp32 math, nothing chunked, entropy or not. On CUDA
    # use_torch_compile runs the same kernels (rlconf.loss_head), and the estimate counts what runs.
    training = _phases(tmp_path, QWEN_SHAPE, head, BF16, *extra)["training"]
    assert training["actor logits"] * GIB == pytest.approx(4 * RESPONSE_TOKENS * 512, rel=1e-4)


def test_the_fused_head_with_triton_holds_one_chunks_bf16_logits_and_gradient(tmp_path):
    training = _phases(tmp_path, QWEN_SHAPE, TRITON, BF16, "actor_rollout_ref.model.use_fused_kernels=true")["training"]
    # One chunk of 1024 rows at 2 + 2 B, plus the fp32 accumulator of the 512 × 896 head weight's gradient.
    assert training["actor logits"] * GIB == pytest.approx((4 * 1024 + 4 * 896) * 512, rel=1e-4)


def test_the_triton_head_of_an_fp32_model_counts_fp32_logits_and_gradients(tmp_path):
    # The logits come out of the head in the compute dtype: 4 B saved + 4 B of gradient, 8 B a chunk row fused.
    training = _phases(tmp_path, QWEN_SHAPE, COMPILED)["training"]  # the quickstart's float32 on CUDA
    assert training["actor logits"] * GIB == pytest.approx(8 * RESPONSE_TOKENS * 512, rel=1e-4)
    fused = _phases(tmp_path, QWEN_SHAPE, TRITON, "actor_rollout_ref.model.use_fused_kernels=true")["training"]
    assert fused["actor logits"] * GIB == pytest.approx((8 * 1024 + 4 * 896) * 512, rel=1e-4)


def test_use_torch_compile_leaves_cpu_plans_and_the_fused_head_with_their_own_bytes(tmp_path):
    # On CPU the engine runs the eager head (rlconf.loss_head), and use_torch_compile leaves the fused head alone.
    cpu = _phases(tmp_path, QWEN_SHAPE, COMPILED, "trainer.device=cpu", "actor_rollout_ref.model.dtype=float32",
                  "actor_rollout_ref.rollout.dtype=float32")["training"]
    assert cpu["actor logits"] * GIB == pytest.approx(20 * RESPONSE_TOKENS * 512, rel=1e-4)
    fused = _phases(tmp_path, QWEN_SHAPE, COMPILED, "actor_rollout_ref.model.use_fused_kernels=true")["training"]
    assert fused["actor logits"] * GIB == pytest.approx((12 * 1024 + 4 * 896) * 512, rel=1e-4)


def test_token_budget_logits_count_the_full_length_rows_response_share(tmp_path):
    training = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                       "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4000")["training"]
    # 4000 tokens of 256 + 256 token rows: 4000 × 256 ÷ 512 = 2000 response tokens.
    assert training["actor logits"] * GIB == pytest.approx(20 * 2000 * 512, rel=1e-4)


def test_a_token_budget_above_the_mini_batch_is_never_filled(tmp_path):
    """verl cuts micro batches out of a mini batch: a budget larger than its tokens counts the mini batch."""
    phases = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100000", "data.train_batch_size=4",
                     "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    # Mini batch per GPU: 2 prompts × n 2 = 4 rows of 256 + 256 tokens = 2048 tokens, 1024 of them response.
    assert phases["training"]["actor logits"] * GIB == pytest.approx(20 * 1024 * 512, rel=1e-4)
    assert phases["training"]["actor activations"] * GIB == pytest.approx(2048 * 24 * LAYER_BYTES, rel=1e-4)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_packing_changes_the_worst_case_estimate_only_by_the_keys_and_values_cuda_keeps_at_their_heads(
        tmp_path, device):
    on = [f"trainer.device={device}"]
    padded = _phases(tmp_path, QWEN_SHAPE, *on, "actor_rollout_ref.model.use_remove_padding=false")["training"]
    packed = _phases(tmp_path, QWEN_SHAPE, *on, "actor_rollout_ref.model.use_remove_padding=true")["training"]
    tokens = 16 * 512
    assert padded["actor activations"] * GIB == pytest.approx(tokens * 24 * (17 * 896 + 8 * 4864))
    kept = KV_KEPT if device == "cuda" else 0  # on CPU packed rows go through SDPA, which repeats them
    assert packed["actor activations"] * GIB == pytest.approx(tokens * 24 * (17 * 896 + 8 * 4864 - kept))
    assert {k: v for k, v in packed.items() if "activations" not in k} == {
        k: v for k, v in padded.items() if "activations" not in k}


def test_ulysses_keeps_the_repeated_keys_and_values_in_the_estimate(tmp_path):
    from rlconf.estimate import attention_keeps_kv_heads

    assert attention_keeps_kv_heads(True, "cuda", 1)
    assert not attention_keeps_kv_heads(True, "cuda", 2)
    assert not attention_keeps_kv_heads(False, "cuda", 1)
    assert not attention_keeps_kv_heads(True, "cpu", 1)


def test_checkpointed_activations_keep_one_hidden_state_per_layer_plus_one_layers_working_set(tmp_path):
    training = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.model.enable_gradient_checkpointing=true")["training"]
    tokens = 16 * 512
    assert training["actor activations"] * GIB == pytest.approx(tokens * (24 * 2 * 896 + LAYER_BYTES))


def test_a_model_family_without_a_gated_mlp_uses_34_bytes_per_hidden_unit(tmp_path):
    training = _phases(tmp_path, {**QWEN_SHAPE, "model_type": "gpt_neox"})["training"]
    assert training["actor activations"] * GIB == pytest.approx(16 * 512 * 24 * (34 * 896 - KV_KEPT))


def test_the_hf_rollout_copy_is_counted_in_both_phases_and_vllms_reservation_only_when_kept(tmp_path):
    params = _params(QWEN_SHAPE)
    hf = _phases(tmp_path, QWEN_SHAPE)
    for phase in ("rollout", "training"):
        assert hf[phase]["HF generate bfloat16 weights"] * GIB == pytest.approx(2 * params)
        assert hf[phase]["actor fp32 params"] * GIB == pytest.approx(4 * params)
        assert hf[phase]["actor Adam moments"] * GIB == pytest.approx(8 * params)
    assert hf["training"]["actor fp32 grads"] * GIB == pytest.approx(4 * params)
    vllm = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.rollout.name=vllm",
                   "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "estimate.gpu_memory_gib=80")
    # vLLM's share of the GPU is its bf16 weights plus the KV cache made of the rest.
    assert vllm["rollout"]["vLLM bfloat16 weights"] * GIB == pytest.approx(2 * params)
    assert vllm["rollout"]["vLLM bfloat16 weights"] + vllm["rollout"]["vLLM KV cache + activations"] == pytest.approx(40.0)
    tp2 = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=2",
                  "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "estimate.gpu_memory_gib=80")
    assert tp2["rollout"]["vLLM bfloat16 weights"] * GIB == pytest.approx(params)  # one of two shards per GPU
    assert not any("HF generate" in what or "vLLM" in what for what in vllm["training"])
    # Weights beyond the share count whole (not cut to it), with no KV cache: RL611 says the engine cannot start.
    small = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.rollout.name=vllm",
                    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", f"estimate.gpu_memory_gib={2 * params / GIB * 1.5:.4f}")
    assert small["rollout"]["vLLM bfloat16 weights"] * GIB == pytest.approx(2 * params)
    assert small["rollout"]["vLLM KV cache + activations"] == 0.0
    kept = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.rollout.name=vllm",
                   "actor_rollout_ref.rollout.free_cache_engine=false", "estimate.gpu_memory_gib=80")
    assert kept["training"]["vLLM reservation kept"] == pytest.approx(0.5 * 80)


def test_hf_generate_keeps_a_kv_cache_for_the_whole_shard_of_rows(tmp_path):
    rollout = _phases(tmp_path, QWEN_SHAPE)["rollout"]
    rows = 16 * 8  # train_batch_size × n on one GPU (one rollout replica)
    # K and V × layers × kv heads × head_dim (896 / 14) × bf16 × rows × (256 + 256) tokens
    assert rollout["HF generate KV cache"] * GIB == pytest.approx(2 * 24 * 2 * 64 * 2 * rows * 512)


def test_attention_widths_follow_configs_head_dim_where_it_is_not_hidden_over_heads():
    # Qwen3-4B: hidden 2560 and 32 heads, but each head is 128 wide (head_dim), its 8 kv heads too.
    model = model_info("Qwen/Qwen3-4B", env={"HF_HUB_CACHE": "/nonexistent/hf-hub-cache"})
    linears = decoder_linears(model)
    assert (linears["self_attn.q_proj"], linears["self_attn.k_proj"], linears["self_attn.o_proj"]) == (
        (2560, 32 * 128), (2560, 8 * 128), (32 * 128, 2560))
    [kv_cache] = _hf_kv_cache(model, rows=1, seq_len=1, width=2)
    assert kv_cache.gib * GIB == pytest.approx(2 * 36 * 8 * 128 * 2)
    repeated, _ = activation_bytes_per_token_layer(model)
    kept, _ = activation_bytes_per_token_layer(model, kv_heads_kept=True)
    assert repeated - kept == 4 * (2560 - 8 * 128)


def test_a_colocated_critic_keeps_params_and_adam_in_both_phases_but_not_its_freed_gradients(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(QWEN_SHAPE))
    ppo = Path(__file__).resolve().parents[2] / "presets" / "quickstart_ppo.yaml"
    result = compile_plan(ppo, [f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cuda"])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    phases = {phase.phase: {term.what for term in phase.terms} for phase in result.resolved.memory}
    for phase in ("rollout", "training"):
        assert {"critic fp32 params", "critic Adam moments"} <= phases[phase]
        assert "critic fp32 grads" not in phases[phase]


# --- offload (engine/workers/fsdp/offload.py): what leaves the GPU in which phase --------------------------

def test_param_offload_empties_the_rollout_phase_but_the_update_brings_the_parameters_back(tmp_path):
    params = _params(QWEN_SHAPE)
    phases = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.actor.fsdp_config.param_offload=true")
    assert phases["rollout"]["actor fp32 params"] == 0.0
    assert phases["training"]["actor fp32 params"] * GIB == pytest.approx(4 * params)
    assert phases["rollout"]["actor Adam moments"] * GIB == pytest.approx(8 * params)


# On CUDA the engine's AdamW is the fused kernel (no temporary); elsewhere foreach's fp32 temporary counts.
@pytest.mark.parametrize(("device", "step_bytes"), [("cuda", 8), ("cpu", 12)])
def test_optimizer_offload_counts_the_moments_and_adams_temporary_only_above_the_freed_activations(
        tmp_path, device, step_bytes):
    params = _params(QWEN_SHAPE)
    off = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", f"trainer.device={device}",
           "actor_rollout_ref.rollout.name=hf")
    # 8192 tokens without checkpointing: activations and logits far above 12 B × params.
    big = _phases(tmp_path, QWEN_SHAPE, *off)
    assert big["rollout"]["actor Adam moments"] == 0.0
    assert big["training"]["actor Adam moments"] == 0.0
    # One row of 512 tokens, checkpointed: the optimizer step (moments + temporary) is the peak.
    small = _phases(tmp_path, QWEN_SHAPE, *off, "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    training = small["training"]
    activations = training["actor activations"] + training["actor logits"]
    assert training["actor Adam moments"] * GIB == pytest.approx(step_bytes * params - activations * GIB)
    # So the phase's total is the larger of the forward/backward peak and the optimizer step's.
    rest = sum(gib for what, gib in training.items() if what not in ("actor Adam moments", "actor activations",
                                                                     "actor logits"))
    assert sum(training.values()) == pytest.approx(rest + max(activations, step_bytes * params / GIB))


def test_offload_policy_keeps_parameters_gradients_and_moments_off_the_gpu_in_every_phase(tmp_path):
    phases = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.actor.fsdp_config.offload_policy=true")
    for phase in ("rollout", "training"):
        assert phases[phase]["actor fp32 params"] == phases[phase]["actor Adam moments"] == 0.0
    assert phases["training"]["actor fp32 grads"] == 0.0


@pytest.mark.parametrize("checkpointing", [True, False])
def test_activation_offload_leaves_one_layers_working_set_and_the_logits(tmp_path, checkpointing):
    gc = f"actor_rollout_ref.model.enable_gradient_checkpointing={str(checkpointing).lower()}"
    plain = _phases(tmp_path, QWEN_SHAPE, gc)["training"]
    training = _phases(tmp_path, QWEN_SHAPE, gc, "actor_rollout_ref.model.enable_activation_offload=true")["training"]
    tokens = 16 * 512
    # rel: terms are rounded to 1e-6 GiB
    assert training["actor activations"] * GIB == pytest.approx(tokens * LAYER_BYTES, rel=1e-5)
    # Without the entropy the backward's peak reads back all the head saved (its fp32 logits).
    assert training["actor logits"] == plain["actor logits"]


@pytest.mark.parametrize(("chunking", "saved_not_read"), [(False, 4), (True, 2)])
def test_activation_offload_lowers_the_loss_head_by_what_its_peak_does_not_read_back(tmp_path, chunking, saved_not_read):
    # With the entropy: plain, 4 of the 8 B of saved fp32 tensors stay on the CPU through the peak;
    # chunked, the bf16 logits (2 B).
    knobs = ("actor_rollout_ref.actor.entropy_coeff=0.01",
             f"actor_rollout_ref.actor.entropy_from_logits_with_chunking={str(chunking).lower()}")
    plain = _phases(tmp_path, QWEN_SHAPE, *knobs)["training"]
    offloaded = _phases(tmp_path, QWEN_SHAPE, *knobs, "actor_rollout_ref.model.enable_activation_offload=true")["training"]
    assert (plain["actor logits"] - offloaded["actor logits"]) * GIB == pytest.approx(
        saved_not_read * RESPONSE_TOKENS * 512, rel=1e-4)


def test_the_reference_is_counted_in_the_compute_dtype_and_not_at_all_when_offloaded(tmp_path):
    params = _params(QWEN_SHAPE)
    kl = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16")
    kept = _phases(tmp_path, QWEN_SHAPE, *kl, "actor_rollout_ref.model.dtype=bfloat16")
    assert kept["rollout"]["ref bf16 params"] * GIB == pytest.approx(2 * params)
    assert kept["training"]["ref bf16 params"] * GIB == pytest.approx(2 * params)
    fp32 = _phases(tmp_path, QWEN_SHAPE, *kl, "actor_rollout_ref.model.dtype=float32")
    assert fp32["rollout"]["ref fp32 params"] * GIB == pytest.approx(4 * params)
    offloaded = _phases(tmp_path, QWEN_SHAPE, *kl, "actor_rollout_ref.model.dtype=bfloat16",
                        "actor_rollout_ref.ref.fsdp_config.param_offload=true")
    assert offloaded["rollout"]["ref bf16 params"] == offloaded["training"]["ref bf16 params"] == 0.0


def test_an_offloaded_colocated_critic_leaves_the_actors_phases(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(QWEN_SHAPE))
    ppo = Path(__file__).resolve().parents[2] / "presets" / "quickstart_ppo.yaml"
    result = compile_plan(ppo, [f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cuda",
                                "critic.model.fsdp_config.param_offload=true",
                                "critic.model.fsdp_config.optimizer_offload=true"])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    for phase in result.resolved.memory:
        terms = {term.what: term.gib for term in phase.terms}
        assert terms["critic fp32 params"] == terms["critic Adam moments"] == 0.0


def test_long_prompts_do_not_reach_the_head_which_runs_on_the_response_positions_only(tmp_path):
    # 16 rows × (3840 + 256) tokens: the head sees the 4096 response positions alone (logits_to_keep),
    # so the chunked backward's 4 B × 4096 + 18 B × 2048 is the peak, as with short prompts.
    training = _phases(tmp_path, QWEN_SHAPE, "data.max_prompt_length=3840",
                       "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true")["training"]
    assert training["actor logits"] * GIB == pytest.approx((4 * RESPONSE_TOKENS + 18 * 2048) * 512, rel=1e-4)


def test_with_ulysses_the_forwards_bf16_logits_of_every_position_of_the_slice_count(tmp_path):
    # sp 2: each rank's half of 16 × 4096 tokens goes through the head whole: 2 B × 32,768 + 2 B × 2048
    # response positions = 69,632 B per vocab entry, above the chunked backward's (4 + 18) B × 2048.
    training = _phases(tmp_path, QWEN_SHAPE, "data.max_prompt_length=3840", "trainer.n_gpus_per_node=2",
                       "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                       "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true")["training"]
    assert training["actor logits"] * GIB == pytest.approx((2 * 16 * 4096 // 2 + 2 * 2048) * 512, rel=1e-4)


ROUNDING = 1e-6 * GIB  # the plan rounds each term to 6 decimals of a GiB
# Qwen2.5-0.5B's shape: q and o are 896 × 896, k and v 896 × 128 (2 kv heads × head_dim 64), gate, up
# and down 896 × 4864. Rank-8 adapters on a layer, rank × (in + out) each:
LORA_PER_LAYER = {"q_proj": 8 * (896 + 896), "k_proj": 8 * (896 + 128), "v_proj": 8 * (896 + 128),
                  "o_proj": 8 * (896 + 896), "gate_proj": 8 * (896 + 4864), "up_proj": 8 * (896 + 4864),
                  "down_proj": 8 * (4864 + 896)}
LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.dtype=bfloat16")


def test_lora_counts_a_bf16_frozen_base_fp32_states_for_the_adapters_only_and_no_reference(tmp_path):
    params = _params(QWEN_SHAPE)
    adapters = 24 * sum(LORA_PER_LAYER.values())
    assert adapters == 24 * 183296  # 14336 + 8192 + 8192 + 14336 + 3 × 46080
    kl = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16")
    phases = _phases(tmp_path, QWEN_SHAPE, *LORA, *kl)
    for phase in ("rollout", "training"):
        terms = phases[phase]
        assert terms["actor frozen base bf16 params"] * GIB == pytest.approx(2 * params, abs=ROUNDING)
        assert terms["actor adapter fp32 params"] * GIB == pytest.approx(4 * adapters, abs=ROUNDING)
        assert terms["actor adapter Adam moments"] * GIB == pytest.approx(8 * adapters, abs=ROUNDING)
        assert not any(name.startswith("ref ") or name.startswith("actor fp32") for name in terms), terms
    assert phases["training"]["actor adapter fp32 grads"] * GIB == pytest.approx(4 * adapters, abs=ROUNDING)
    assert "actor adapter fp32 grads" not in phases["rollout"]


def test_lora_target_and_exclude_modules_choose_the_adapted_layers_as_peft_does(tmp_path):
    listed = _phases(tmp_path, QWEN_SHAPE, *LORA, "actor_rollout_ref.model.target_modules=[q_proj,v_proj]")
    assert listed["training"]["actor adapter fp32 params"] * GIB == pytest.approx(
        4 * 24 * (LORA_PER_LAYER["q_proj"] + LORA_PER_LAYER["v_proj"]), abs=ROUNDING)
    # The LM head only when named: rank × (hidden 896 + vocab 512).
    head = _phases(tmp_path, QWEN_SHAPE, *LORA, "actor_rollout_ref.model.target_modules=[q_proj,lm_head]")
    assert head["training"]["actor adapter fp32 params"] * GIB == pytest.approx(
        4 * (24 * LORA_PER_LAYER["q_proj"] + 8 * (896 + 512)), abs=ROUNDING)
    # A string is a regex over the whole module name: here every layer but layer 0.
    excluded = _phases(tmp_path, QWEN_SHAPE, *LORA, r"actor_rollout_ref.model.exclude_modules=.*\.layers\.0\..*")
    assert excluded["training"]["actor adapter fp32 params"] * GIB == pytest.approx(
        4 * 23 * sum(LORA_PER_LAYER.values()), abs=ROUNDING)


def test_lora_param_offload_takes_the_frozen_base_off_the_gpu_while_the_actor_is_idle(tmp_path):
    phases = _phases(tmp_path, QWEN_SHAPE, *LORA, "actor_rollout_ref.actor.fsdp_config.param_offload=true")
    assert phases["rollout"]["actor frozen base bf16 params"] == 0.0
    assert phases["training"]["actor frozen base bf16 params"] * GIB == pytest.approx(2 * _params(QWEN_SHAPE), abs=ROUNDING)


# One micro batch an optimizer step: the quickstart's train_batch_size 16 × n 8 = 128 rows a mini batch.
ONE_MICRO = [("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=128",), (
    "actor_rollout_ref.actor.use_dynamic_bsz=true", f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={128 * 512}")]
ACCUMULATING = [("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",), (
    "actor_rollout_ref.actor.use_dynamic_bsz=true", f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={128 * 512 - 1}")]


@pytest.mark.parametrize("overrides", ONE_MICRO, ids=["micro_batch", "token_budget"])
def test_gradients_of_a_one_micro_batch_step_add_only_what_exceeds_the_activations(tmp_path, overrides):
    """Gradients are None after each optimizer step and FSDP2 allocates a layer's as its backward ends: with
    nothing accumulated they appear while the activations and logits are freed, so at most the excess counts."""
    params = _params(QWEN_SHAPE)
    training = _phases(tmp_path, QWEN_SHAPE, *overrides)["training"]
    freed = training["actor activations"] + training["actor logits"]
    assert freed * GIB > 4 * params  # 128 rows × 512 tokens of activations outweigh 4 B × 358M
    assert training["actor fp32 grads"] == 0.0
    # A model whose gradients outweigh its activations: one micro batch of one 512-token row, no checkpointing.
    small = _phases(tmp_path, QWEN_SHAPE, "data.train_batch_size=1", "actor_rollout_ref.rollout.n=2",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")["training"]
    excess = 4 * params / GIB - small["actor activations"] - small["actor logits"]
    assert excess > 0
    assert small["actor fp32 grads"] == pytest.approx(excess)


@pytest.mark.parametrize("overrides", ACCUMULATING, ids=["micro_batch", "token_budget"])
def test_accumulated_gradients_sit_beside_the_next_micro_batchs_activations(tmp_path, overrides):
    training = _phases(tmp_path, QWEN_SHAPE, *overrides)["training"]
    assert training["actor fp32 grads"] * GIB == pytest.approx(4 * _params(QWEN_SHAPE))


def test_with_optimizer_offload_the_gradients_of_a_one_micro_batch_step_count_in_full(tmp_path):
    """The offloaded moments come back for the step into the freed activations, beside the live gradients:
    the moments' term already counts on that space, so the gradients may not count on it again."""
    training = _phases(tmp_path, QWEN_SHAPE, *ONE_MICRO[0],
                       "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")["training"]
    assert training["actor fp32 grads"] * GIB == pytest.approx(4 * _params(QWEN_SHAPE))


FSDP = "actor_rollout_ref.actor.fsdp_config"


def test_no_sync_accumulates_the_whole_fp32_gradient_on_every_gpu_when_a_step_has_several_micro_batches(tmp_path):
    params = _params(QWEN_SHAPE)
    two_gpus = ("trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16")
    sharded = _phases(tmp_path, QWEN_SHAPE, *two_gpus)["training"]
    no_sync = _phases(tmp_path, QWEN_SHAPE, *two_gpus, f"{FSDP}.use_no_sync_for_gradient_accumulation=true")["training"]
    assert sharded["actor fp32 grads"] * GIB == pytest.approx(4 * params / 2)
    assert no_sync["actor fp32 grads"] * GIB == pytest.approx(4 * params)
    # One micro batch a step: the only backward syncs, so nothing changes.
    one = _phases(tmp_path, QWEN_SHAPE, *ONE_MICRO[0], f"{FSDP}.use_no_sync_for_gradient_accumulation=true")
    assert one["training"]["actor fp32 grads"] == _phases(tmp_path, QWEN_SHAPE, *ONE_MICRO[0])["training"]["actor fp32 grads"]


@pytest.mark.parametrize("dtype, width", [("bfloat16", 2), ("float32", 4)])
def test_keeping_the_gathered_weights_counts_the_whole_model_in_the_compute_dtype(tmp_path, dtype, width):
    overrides = ("trainer.n_gpus_per_node=2", f"actor_rollout_ref.model.dtype={dtype}")
    kept = _phases(tmp_path, QWEN_SHAPE, *overrides, f"{FSDP}.reshard_after_forward=false")["training"]
    assert kept["actor gathered weights kept"] * GIB == pytest.approx(width * _params(QWEN_SHAPE))
    assert "actor gathered weights kept" not in _phases(tmp_path, QWEN_SHAPE, *overrides)["training"]


def test_ulysses_splits_the_critics_micro_batch_with_or_without_a_token_budget(tmp_path):
    """Each of the sp ranks holds 1/sp of every row: the critic's activations count micro batch × length ÷ sp."""
    gae = ["algorithm.adv_estimator=gae", f"critic.model.path={tmp_path / 'model'}", "critic.ppo_micro_batch_size_per_gpu=4",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "critic.model.enable_gradient_checkpointing=false",
           "critic.forward_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=4",
           # A pool of its own: a colocated critic's update is not a phase of the estimate.
           "placement.pools.policy.nnodes=1", "placement.pools.policy.n_gpus_per_node=2",
           "placement.pools.value.nnodes=1", "placement.pools.value.n_gpus_per_node=2",
           "placement.roles.actor=policy", "placement.roles.rollout=policy", "placement.roles.critic=value"]
    def critic_tokens(*extra: str) -> str:
        result = compile_plan(QUICKSTART, [f"actor_rollout_ref.model.path={tmp_path / 'model'}", "trainer.device=cuda",
                                           "data.max_prompt_length=256", "data.max_response_length=256", *gae, *extra])
        assert result.resolved is not None, [d.message for d in result.diagnostics]
        (term,) = [t for phase in result.resolved.memory for t in phase.terms if t.what == "critic activations"]
        return term.formula.split(" tokens")[0]

    _phases(tmp_path, QWEN_SHAPE)  # writes the model's config.json
    # 4 rows of 256 + 256 tokens a micro batch: 2048 tokens, 1024 on each of 2 sp ranks.
    assert critic_tokens() == "2048"
    assert critic_tokens("critic.ulysses_sequence_parallel_size=2") == "1024"
    assert critic_tokens("critic.ulysses_sequence_parallel_size=2", "critic.use_dynamic_bsz=true",
                         "critic.ppo_max_token_len_per_gpu=1024") == "1024"  # the budget × sp 2, ÷ sp 2


ROLLOUT_POOL = ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.free_cache_engine=false",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                "algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.name=vllm",
                "estimate.gpu_memory_gib=80"]


def test_a_rollout_pool_of_its_own_holds_the_largest_bucket_the_weights_arrive_in(tmp_path):
    params = _params(QWEN_SHAPE)
    whole = _phases(tmp_path, QWEN_SHAPE, *ROLLOUT_POOL)  # 2 B × params is under the 2048 MB bucket limit
    assert whole["rollout"]["weight receive buffer"] * GIB == pytest.approx(2 * params)
    small = _phases(tmp_path, QWEN_SHAPE, *ROLLOUT_POOL,
                    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64")
    assert small["rollout"]["weight receive buffer"] * GIB == pytest.approx(64 * 2**20)
    colocated = _phases(tmp_path, QWEN_SHAPE, "actor_rollout_ref.rollout.name=vllm", "estimate.gpu_memory_gib=80")
    assert "weight receive buffer" not in colocated["rollout"]  # the weights go in-process, tensor by tensor
