"""What rlconf does with each key of verl's trainer config (verl 0.9.1, `verl_keys.json`).

verl's side (key names, defaults, which key a default follows) is a generated fact file,
`verl_keys.json` (tools/verl_keys.py). rlconf's side is written here:

- ALIASES: verl 0.9 spellings of keys rlconf's schema holds under another (older verl) name;
- VERL_ONLY: keys rlconf knows and does not run, by group: what the key means in verl, the
  feature it belongs to, why rlconf does not run it and what to use instead. Set off verl's
  default, such a key is an error (RL108) when running without it would train something else,
  and a warning (RL109) when the run computes the same numbers without it;
- NOT_RUN_VALUES: values of schema keys that verl runs and this engine does not (RL108);
- DIFFERENCES: schema defaults that differ from verl's, each with its reason;
- FOLLOWS: schema keys whose unset value is another key's, as verl's `${...}` defaults are;
- RLCONF_ONLY: schema keys verl 0.9.1 does not have.

docs/verl-compat.md is generated from these tables (python -m rlconf.docgen) and
tests/compiler/test_verl_keys.py keeps them complete against the fact file.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

FACTS = Path(__file__).resolve().parent / "verl_keys.json"


@cache
def verl_facts() -> dict[str, Any]:
    """verl's keys and defaults (read on first use: plans with only rlconf's keys never need it)."""
    import json  # with the file: not imported on the way of a plan of rlconf keys

    return json.loads(FACTS.read_text())


def verl_default(key: str) -> tuple[bool, Any]:
    """(known, default) of a verl key, current or removed since the older config recorded."""
    facts = verl_facts()
    entry = facts["keys"].get(key) or facts["removed"].get(key) or UNDECLARED.get(key)
    return (entry is not None, entry["default"] if entry else None)


class NotRun(NamedTuple):
    feature: str  # the feature a person would name: "LoRA", "SGLang rollout"
    why: str  # why this engine does not run it
    instead: str = ""  # what to use instead, if anything
    refused: bool = True  # True: RL108 error (results would differ); False: RL109 warning (same numbers without it)


# --- features rlconf does not run -------------------------------------------------------------

CRITIC_LORA = NotRun("LoRA for the critic", "the critic trains full weights; LoRA runs for the actor only",
                     "full fine-tuning of the critic (leave critic.model.lora_rank 0)")
MEGATRON_LORA = NotRun("LoRA", "this engine's LoRA is the FSDP one (actor_rollout_ref.model.lora_rank, lora_alpha, "
                       "target_modules); verl's Megatron-style `model.lora` section is not run",
                       "actor_rollout_ref.model.lora_rank")
MULTI_MODAL = NotRun("multi-modal data", "the engine trains text-only models on token ids; images, video and audio are not loaded",
                     "a text-only dataset and model")
MULTI_TURN = NotRun("multi-turn rollout and tools", "rollout generates one response per prompt; agent loops with tools or "
                    "several turns are not implemented yet", "single-turn prompts")
AGENT_LOOP = NotRun("custom agent loops", "rollout is the single-turn loop (verl's single_turn_agent); other agent loops and "
                    "async servers are not run", "the default single_turn_agent")
RM_OVERRIDE = NotRun("overriding the reward model's config", "the reward model loads with the config.json of its path",
                     "a reward model directory whose config.json says what is wanted")
RM_TOKENIZER_OFF = NotRun("a served reward model without its tokenizer", "the reward loop sends text and the engine "
                          "tokenizes it (verl asserts skip_tokenizer_init is false)", "skip_tokenizer_init false")
CUSTOM_REWARD_MANAGER = NotRun("custom reward managers", "rewards are assembled by verl's naive, dapo, batch or prime "
                               "manager (reward_model.reward_manager)", "custom_reward_function")
SANDBOX = NotRun("sandboxed code rewards", "code execution sandboxes are not called", "custom_reward_function")
DISTILLATION = NotRun("on-policy distillation", "no teacher model is run", "")
DAPO_SAMPLING = NotRun("this setting of dynamic sampling (DAPO group filtering)", "algorithm.filter_groups runs "
                       "one generation batch (data.gen_batch_size prompts) at a time", "algorithm.filter_groups")
PF_PPO = NotRun("PF-PPO", "samples are not reweighted by reward", "")
ASYNC_TRAINING = NotRun("verl's v1 asynchronous trainers (colocated or separated async, partial rollouts)",
                        "rlconf runs the synchronous step, verl's one-step off-policy schedule and its fully async one "
                        "(experimental/fully_async_policy, partial rollouts included); the v1 trainers are not "
                        "implemented yet",
                        "actor_rollout_ref.hybrid_engine=false with actor_rollout_ref.rollout.nnodes (one-step off-policy), "
                        "plus an async_training section (fully async, async_training.partial_rollout)")
LOSS_MODES = NotRun("the settings of policy loss modes this engine does not run (dro, dppo)", "the engine runs "
                    "vanilla, gspo, sapo, gpg, clip_cov, kl_cov, geo_mean and cispo; these settings have no effect", "",
                    refused=False)
LOSS_SCALE = NotRun("a fixed loss normalizer (loss_scale_factor)", "losses are normalized by loss_agg_mode", "actor.loss_agg_mode")
OPTIMIZERS = NotRun("optimizers other than AdamW", "the engine builds torch.optim.AdamW", "optim.lr, betas and weight_decay")
SCHEDULE_INDEX = NotRun("a one-indexed LR schedule", "the warmup counts steps from 0, as verl's default", "")
PRECISION = NotRun("other FSDP precision policies", "master weights and reductions are fp32 and compute runs in "
                   "actor_rollout_ref.model.dtype", "actor_rollout_ref.model.dtype")
# verl 0.9.1 reads no `model.torch_dtype` (its example run_cispo_qwen2_5_0_5b_gsm8k.sh sets it): the FSDP engine loads
# with fsdp_config.model_dtype (fp32 for a trained model) and computes in fsdp_config.dtype, as rlconf does.
MODEL_TORCH_DTYPE = NotRun("a dtype in the model section", "verl 0.9.1 reads no actor_rollout_ref.model.torch_dtype: its FSDP "
                           "engine loads the trained weights in fp32 (fsdp_config.model_dtype) and computes in "
                           "fsdp_config.dtype, as rlconf does (fp32 master weights, compute in "
                           "actor_rollout_ref.model.dtype)", "actor_rollout_ref.model.dtype for the compute dtype",
                           refused=False)
QAT = NotRun("quantization-aware training", "weights train and sync in full precision", "")
QUANTIZED_ROLLOUT = NotRun("quantized rollout", "vLLM runs the actor's weights unquantized", "")
MTP = NotRun("multi-token prediction and speculative decoding", "models train and decode one token at a time", "")
ROUTER_REPLAY = NotRun("MoE router replay", "expert routing is recomputed in training", "")
ROLLOUT_PARALLEL = NotRun("data, expert or pipeline parallelism inside a rollout replica",
                          "a replica is tensor_model_parallel_size GPUs", "actor_rollout_ref.rollout.tensor_model_parallel_size")
DISAGGREGATION = NotRun("prefill/decode disaggregation", "each replica prefills and decodes", "")
OVER_SAMPLING = NotRun("rollout over-sampling", "every request of a step runs to completion", "")
LOGPROB_MODE = NotRun("other rollout log-prob modes", "vLLM returns the log-probs of the sampled (processed) distribution", "")
CRITIC_SWITCH = NotRun("switching the critic on or off by hand", "the critic runs exactly when adv_estimator is gae",
                       "algorithm.adv_estimator")
ROLLOUT_N_COPY = NotRun("a role's own copy of rollout.n", "every role reads actor_rollout_ref.rollout.n",
                        "actor_rollout_ref.rollout.n")
SUBSAMPLING = NotRun("dataset subsampling", "every row of the parquet files is used", "a parquet file with the rows wanted")
CHAT_TEMPLATE_ARGS = NotRun("chat template arguments", "prompts are rendered with the tokenizer's template and no extra "
                            "arguments", "actor_rollout_ref.model.custom_chat_template")
CUSTOM_DATA = NotRun("custom dataset, sampler and generator classes", "data comes from parquet files or synthetic:// sources", "")
VAL_ONLY = NotRun("validation-only runs", "a launch trains", "")
ROLLOUT_SKIP = NotRun("replaying dumped rollouts", "every step generates", "")
HF_CONFIG = NotRun("a model config apart from the weights", "the model config is read from model.path",
                   "actor_rollout_ref.model.override_config")
EXTERNAL_LIB = NotRun("external model libraries", "models load through transformers' auto classes", "trust_remote_code")
ROLLOUT_BACKEND = NotRun("other rollout backends' engine arguments", "only engine_kwargs.vllm reaches an engine",
                         "actor_rollout_ref.rollout.engine_kwargs.vllm", refused=False)


def ignored(feature: str, why: str, instead: str = "") -> NotRun:
    """A verl setting the run does not apply and computes the same numbers without (RL109)."""
    return NotRun(feature, why, instead, refused=False)


RM_ENGINE = ignored("the served reward model's engine settings", "rlconf's plan for the served reward model holds its "
                    "engine, dtype, memory share, parallel size, batching and lengths; the scores do not depend on the rest")
PLUMBING = ignored("verl's config plumbing", "rlconf's schema is typed; there is nothing to instantiate")
PROFILER = ignored("verl's profilers", "rlconf profiles with a torch.profiler trace per listed step", "trainer.profile_steps")
SPEED = ignored("a speed knob this engine does not have", "the engine does not use it; the numbers are the same")
MEMORY = ignored("a memory knob this engine does not have", "the engine does not use it; the numbers are the same")
SEEDS = ignored("verl's per-component seeds", "rlconf seeds everything from trainer.seed (and data.seed for the data order)",
                "trainer.seed")
DETERMINISM = ignored("fully deterministic kernels", "torch is not switched to deterministic algorithms")
OBSERVABILITY = ignored("verl's logging and dumps", "rlconf writes metrics.jsonl and the loggers in trainer.logger",
                        "trainer.logger")
SUM_PI_SQUARED = ignored("verl's switch for computing Σπ²", "the engine computes Σπ² with the old log-probs whenever "
                         "adv_estimator is (tir_)optimal_token_baseline, its only consumer", "algorithm.adv_estimator")
INFRASTRUCTURE = ignored("verl's cluster and storage settings", "`rlconf launch` starts or joins Ray (--address) and writes "
                         "the run directory", "rlconf launch options")
MIRROR = ignored("a copy of a role-level key", "rlconf reads the role's key")


# --- VERL_ONLY: (glob, what the key means in verl, what rlconf does) ---------------------------
# `*` matches one segment and `**` any number; the first matching glob decides.

VERL_ONLY: list[tuple[str, str, NotRun]] = [
    ("**._target_", "the dataclass verl builds this section into", PLUMBING),
    # profilers
    ("global_profiler.**", "verl's profiler: tool, steps and output", PROFILER),
    ("actor_rollout_ref.*.profiler.**", "a role's profiler settings", PROFILER),
    ("critic.profiler.**", "the critic's profiler settings", PROFILER),
    ("reward_model.profiler.**", "the reward model's profiler settings", PROFILER),
    # optimizer
    ("*.optim.optimizer", "the optimizer class", OPTIMIZERS),
    ("*.*.optim.optimizer", "the optimizer class", OPTIMIZERS),
    ("**.optim.optimizer_impl", "the module the optimizer class comes from", OPTIMIZERS),
    ("**.optim.override_optimizer_config", "extra optimizer arguments", OPTIMIZERS),
    ("**.optim.zero_indexed_step", "whether the LR schedule counts steps from 0", SCHEDULE_INDEX),
    # FSDP engine settings (actor, ref: fsdp_config; critic: fsdp in 0.9, model.fsdp_config before)
    ("**.qat.**", "quantization-aware training settings", QAT),
    ("actor_rollout_ref.rollout.qat", "the actor's quantization-aware training settings, for rollout", QAT),
    ("**.turbo_config.**", "settings of verl's alternative FSDP implementation", SPEED),
    ("**.model_dtype", "the dtype FSDP keeps parameters in", PRECISION),
    ("**.mixed_precision.**", "the param, reduce and buffer dtypes of FSDP mixed precision", PRECISION),
    ("**.mixed_precision", "the param, reduce and buffer dtypes of FSDP mixed precision", PRECISION),
    ("actor_rollout_ref.ref.fsdp_config.dtype", "the reference model's compute dtype", PRECISION),
    ("critic.fsdp.dtype", "the critic's compute dtype", PRECISION),
    ("critic.model.fsdp_config.dtype", "the critic's compute dtype", PRECISION),
    ("**.use_orig_params", "an FSDP1 flag keeping original parameters in the flat parameter", SPEED),
    ("**.fsdp_config.seed", "the seed of a role's engine", SEEDS),
    ("critic.fsdp.seed", "the seed of the critic's engine", SEEDS),
    ("**.full_determinism", "deterministic kernels", DETERMINISM),
    ("**.fsdp_config.ulysses_sequence_parallel_size", "the engine's copy of the role's Ulysses size", MIRROR),
    ("critic.fsdp.ulysses_sequence_parallel_size", "the engine's copy of the critic's Ulysses size", MIRROR),
    ("**.fsdp_config.entropy_from_logits_with_chunking", "the engine's copy of the role's chunked entropy", MIRROR),
    ("critic.fsdp.entropy_from_logits_with_chunking", "chunked entropy, which the critic does not compute", MIRROR),
    ("**.fsdp_config.entropy_checkpointing", "the engine's copy of the role's entropy recompute", MIRROR),
    ("critic.fsdp.entropy_checkpointing", "entropy recompute, which the critic does not compute", MIRROR),
    ("**.entropy_from_logits_chunk_size", "tokens per entropy chunk", MEMORY),
    ("**.use_torch_compile", "torch.compile in a role's engine", SPEED),
    ("actor_rollout_ref.ref.fsdp_config.use_no_sync_for_gradient_accumulation", "gradient sync of a model that "
     "does not train", ignored("the reference policy's gradient settings", "the reference policy computes no gradients")),
    ("**.pad_to_length", "pad packed batches to a bucketed length", SPEED),
    ("**.pad_to_length_bucket", "the bucket size of pad_to_length", SPEED),
    ("**.forward_only", "whether a role's engine only runs forward passes, set by verl per role", PLUMBING),
    ("**.fsdp_config.strategy", "the engine's copy of the role's strategy", PLUMBING),
    ("critic.fsdp.strategy", "the engine's copy of the critic's strategy", PLUMBING),
    ("actor_rollout_ref.ref.fsdp_config.optimizer_offload", "optimizer offload, and the reference has no optimizer", MEMORY),
    ("actor_rollout_ref.ref.fsdp_config.offload_policy", "FSDP2 CPU offload of the reference model", MEMORY),
    ("actor_rollout_ref.ref.fsdp_config.fsdp_size", "the reference model's sharding group size", MEMORY),
    ("critic.fsdp.**", "the critic's FSDP engine settings", SPEED),
    # actor
    ("*.*.rollout_n", "a role's copy of rollout.n", ROLLOUT_N_COPY),
    ("critic.rollout_n", "the critic's copy of rollout.n", ROLLOUT_N_COPY),
    ("actor_rollout_ref.actor.policy_loss.**", "a setting of one of verl's policy loss modes", LOSS_MODES),
    ("actor_rollout_ref.actor.freeze_vision_tower", "keep a vision-language model's vision tower frozen", MULTI_MODAL),
    ("*.*.loss_scale_factor", "a constant the summed loss is divided by", LOSS_SCALE),
    ("critic.loss_scale_factor", "a constant the summed value loss is divided by", LOSS_SCALE),
    ("actor_rollout_ref.actor.calculate_entropy", "compute the entropy even when entropy_coeff is 0", OBSERVABILITY),
        ("actor_rollout_ref.actor.calculate_sum_pi_squared", "compute Σπ² for the optimal-token-baseline estimators", SUM_PI_SQUARED),
    ("actor_rollout_ref.actor.sum_pi_squared_checkpointing", "recompute Σπ² in backward", MEMORY),
    ("actor_rollout_ref.actor.use_prefix_grouper", "run a group's shared prompt once in the forward pass", SPEED),
    ("**.data_loader_seed", "the seed of the mini-batch shuffle", SEEDS),
    ("**.checkpoint.async_save", "write checkpoints in the background", SPEED),
    ("**.checkpoint.strict", "load checkpoints with strict key matching", PLUMBING),
    ("actor_rollout_ref.actor.use_fused_kernels", "the actor's copy of model.use_fused_kernels", MIRROR),
    ("actor_rollout_ref.actor.use_remove_padding", "the actor's copy of model.use_remove_padding", MIRROR),
    ("actor_rollout_ref.*.router_replay.**", "replay MoE routing decisions", ROUTER_REPLAY),
    ("actor_rollout_ref.ref.strategy", "the reference's backend, following the actor's", MIRROR),
    # rollout
    ("actor_rollout_ref.rollout.cudagraph_capture_sizes", "batch sizes vLLM captures CUDA graphs for", SPEED),
    ("actor_rollout_ref.rollout.data_parallel_size", "data-parallel ranks inside a rollout replica", ROLLOUT_PARALLEL),
    ("actor_rollout_ref.rollout.expert_parallel_size", "expert-parallel ranks inside a rollout replica", ROLLOUT_PARALLEL),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size", "pipeline stages inside a rollout replica", ROLLOUT_PARALLEL),
    ("actor_rollout_ref.rollout.enable_prefix_caching", "vLLM's prefix cache",
     ignored("vLLM's prefix cache switch", "vLLM runs with its own default", "actor_rollout_ref.rollout.engine_kwargs.vllm")),
    ("actor_rollout_ref.rollout.logprobs_mode", "which distribution rollout log-probs describe", LOGPROB_MODE),
    ("actor_rollout_ref.rollout.scheduling_policy", "vLLM's request scheduling policy", SPEED),
    ("actor_rollout_ref.rollout.layered_summon", "gather FSDP weights layer by layer for the weight sync",
     ignored("layered summon", "the weight sync does not need it")),
    ("actor_rollout_ref.rollout.over_sample_rate", "abort the slowest requests of a step", OVER_SAMPLING),
    ("actor_rollout_ref.rollout.multi_stage_wake_up", "wake the rollout engine's weights and KV cache in stages", MEMORY),
    ("actor_rollout_ref.rollout.engine_kwargs.sglang", "arguments for SGLang", ROLLOUT_BACKEND),
    ("actor_rollout_ref.rollout.engine_kwargs.trtllm", "arguments for TensorRT-LLM", ROLLOUT_BACKEND),
    ("actor_rollout_ref.rollout.router_config_path", "a router config for the rollout servers", SPEED),
    ("actor_rollout_ref.rollout.multi_turn.**", "multi-turn rollout with tools", MULTI_TURN),
    ("actor_rollout_ref.rollout.agent.num_workers", "agent-loop worker processes", SPEED),
    ("actor_rollout_ref.rollout.agent.**", "which agent loop generates responses", AGENT_LOOP),
    ("actor_rollout_ref.rollout.checkpoint_engine.**", "arguments of a weight-sync backend",
     ignored("verl's weight-sync backend arguments", "rlconf pushes the FSDP actor's weights in its own processes, or "
             "over NCCL / gloo to a rollout pool of its own, in buckets of update_weights_bucket_megabytes")),
    ("actor_rollout_ref.rollout.trace.**", "tracing of rollout requests", OBSERVABILITY),
    ("actor_rollout_ref.rollout.skip_tokenizer_init", "start the rollout engine without a tokenizer", SPEED),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay", "record MoE routing in rollout for replay", ROUTER_REPLAY),
    ("actor_rollout_ref.rollout.moe_load_balance_metrics_interval", "how often MoE load-balance metrics are logged", OBSERVABILITY),
    ("actor_rollout_ref.rollout.prometheus.**", "Prometheus metrics of the rollout servers", OBSERVABILITY),
    ("actor_rollout_ref.rollout.quantization", "quantize the rollout engine's weights", QUANTIZED_ROLLOUT),
    ("actor_rollout_ref.rollout.quantization_config_file", "the quantization config of the rollout engine", QUANTIZED_ROLLOUT),
    ("actor_rollout_ref.rollout.mtp", "the model's multi-token prediction settings, for rollout", MTP),
    ("actor_rollout_ref.rollout.mtp.**", "the model's multi-token prediction settings, for rollout", MTP),
    ("actor_rollout_ref.rollout.disaggregation.**", "prefill/decode disaggregation", DISAGGREGATION),
    ("actor_rollout_ref.rollout.skip_rollout", "replay dumped rollouts instead of generating", ROLLOUT_SKIP),
    ("actor_rollout_ref.rollout.skip_dump_dir", "where dumped rollouts are read", ROLLOUT_SKIP),
    # models
    ("*.model.hf_config_path", "a model config read apart from the weights", HF_CONFIG),
    ("**.use_shm", "copy models or data through shared memory", SPEED),
    ("**.model.external_lib", "a library imported to register custom models", EXTERNAL_LIB),
    ("critic.model.lora_rank", "LoRA rank of the critic, 0 for full fine-tuning", CRITIC_LORA),
    ("critic.model.lora_alpha", "LoRA scaling alpha of the critic", CRITIC_LORA),
    ("critic.model.target_modules", "the critic modules LoRA adapts", CRITIC_LORA),
    ("critic.model.exclude_modules", "critic modules LoRA leaves out", CRITIC_LORA),
    ("critic.model.lora_adapter_path", "a LoRA adapter for the critic to start from", CRITIC_LORA),
    ("**.model.lora.**", "LoRA settings of verl's Megatron-style LoRA", MEGATRON_LORA),
    ("critic.model.fused_kernel_options.**", "the backend of the critic's fused log-prob kernels", SPEED),
    ("**.tiled_mlp.**", "compute the MLP in tiles to cut activation memory", MEMORY),
    ("**.model.mtp.**", "multi-token prediction", MTP),
    ("critic.model.custom_chat_template", "the critic's chat template, though it reads the actor's token ids", MIRROR),
    ("critic.model.use_liger", "Liger kernels for the critic", SPEED),
    ("critic.model.use_fused_kernels", "fused kernels for the critic", SPEED),
    ("actor_rollout_ref.model.torch_dtype", "a dtype in the model section, which verl passes nowhere", MODEL_TORCH_DTYPE),
    ("actor_rollout_ref.nccl_timeout", "timeout of collective operations", INFRASTRUCTURE),
    # data
    ("data.train_max_samples", "use at most this many training rows", SUBSAMPLING),
    ("data.val_max_samples", "use at most this many validation rows", SUBSAMPLING),
    ("data.tool_config_path", "tools offered in multi-turn rollout", MULTI_TURN),
    ("data.function_tool_path", "function tools offered in multi-turn rollout", MULTI_TURN),
    ("data.return_raw_input_ids", "also return the prompt ids before the chat template", OBSERVABILITY),
    ("data.return_full_prompt", "also return the rendered prompt text", OBSERVABILITY),
    ("data.image_patch_size", "the image patch size of a vision-language processor", MULTI_MODAL),
    ("data.image_key", "the column holding images", MULTI_MODAL),
    ("data.video_key", "the column holding videos", MULTI_MODAL),
    ("data.audio_key", "the column holding audio", MULTI_MODAL),
    ("data.return_multi_modal_inputs", "return processed multi-modal inputs with each row", MULTI_MODAL),
    ("data.mm_processor_kwargs", "arguments of the multi-modal processor", MULTI_MODAL),
    ("data.validation_shuffle", "shuffle the validation set", OBSERVABILITY),
    ("data.filter_overlong_prompts_workers", "processes that filter overlong prompts", SPEED),
    ("data.trust_remote_code", "allow custom tokenizer or processor code",
     ignored("trusting remote code for the tokenizer alone", "the tokenizer follows the model's trust_remote_code",
             "actor_rollout_ref.model.trust_remote_code")),
    ("data.custom_cls.**", "a custom dataset class", CUSTOM_DATA),
    ("data.datagen.**", "a generator of new training rows", CUSTOM_DATA),
    ("data.sampler.**", "a custom sampler, as for curricula", CUSTOM_DATA),
    ("data.apply_chat_template_kwargs", "extra arguments of the chat template, such as enable_thinking", CHAT_TEMPLATE_ARGS),
    # critic
    ("critic.enable", "force the critic on or off; null decides by estimator", CRITIC_SWITCH),
    # rewards (verl 0.9 `reward`, and the legacy `reward_model` keys of its reward loop)
    ("reward.num_workers", "reward worker processes", SPEED),
    ("reward.reward_manager.**", "a custom reward manager", CUSTOM_REWARD_MANAGER),
    ("reward_manager.**", "a custom reward manager", CUSTOM_REWARD_MANAGER),
    ("reward.reward_model.rollout.pipeline_model_parallel_size", "pipeline stages of a served replica", ROLLOUT_PARALLEL),
    ("reward.reward_model.rollout.data_parallel_size", "data-parallel ranks inside a served replica", ROLLOUT_PARALLEL),
    ("reward.reward_model.rollout.expert_parallel_size", "expert-parallel ranks inside a served replica", ROLLOUT_PARALLEL),
    ("reward.reward_model.rollout.quantization", "quantized serving of the reward model", QUANTIZED_ROLLOUT),
    ("reward.reward_model.rollout.quantization_config_file", "quantized serving of the reward model", QUANTIZED_ROLLOUT),
    ("reward.reward_model.rollout.mtp", "multi-token prediction in the reward model's engine", MTP),
    ("reward.reward_model.rollout.disaggregation.**", "prefill/decode disaggregation of the reward model", DISAGGREGATION),
    ("reward.reward_model.rollout.skip_tokenizer_init", "an engine without its tokenizer", RM_TOKENIZER_OFF),
    ("reward.reward_model.rollout.limit_images", "images per prompt of a multi-modal reward model", MULTI_MODAL),
    ("reward.reward_model.rollout.**", "a setting of the engine serving the reward model", RM_ENGINE),
    ("reward.sandbox_fusion.**", "a code-execution sandbox for rewards", SANDBOX),
    ("reward_model.num_workers", "reward-loop worker processes", SPEED),
    ("reward_model.launch_reward_fn_async", "compute rewards in the background", SPEED),
    ("reward_model.reward_loop_source", "where the reward loop class comes from", CUSTOM_REWARD_MANAGER),
    ("reward_model.reward_loop_module_path", "the module of a custom reward loop", CUSTOM_REWARD_MANAGER),
    ("reward_model.reward_loop_class_name", "the class of a custom reward loop", CUSTOM_REWARD_MANAGER),
    ("reward_model.rollout.data_parallel_size", "data-parallel ranks inside a served replica", ROLLOUT_PARALLEL),
    ("reward_model.rollout.expert_parallel_size", "expert-parallel ranks inside a served replica", ROLLOUT_PARALLEL),
    ("reward_model.rollout.skip_tokenizer_init", "an engine without its tokenizer", RM_TOKENIZER_OFF),
    ("reward_model.rollout.limit_images", "images per prompt of a multi-modal reward model", MULTI_MODAL),
    ("reward_model.rollout.**", "a setting of the engine serving the reward model", RM_ENGINE),
    ("reward_model.reward_kwargs.**", "arguments of the reward manager, such as DAPO's overlong buffer", CUSTOM_REWARD_MANAGER),
    ("reward_model.sandbox_fusion.**", "a code-execution sandbox for rewards", SANDBOX),
    ("reward_model.model.override_config", "entries merged into the reward model's config", RM_OVERRIDE),
    ("reward_model.model.use_fused_kernels", "fused kernels for the reward model", SPEED),
    ("reward_model.model.fsdp_config.fsdp_size", "the reward model's sharding group size", MEMORY),
    ("sandbox_fusion.**", "a code-execution sandbox for rewards", SANDBOX),
    # algorithm
    ("algorithm.filter_groups.max_inflight_gen_batches", "generation batches in flight at once while DAPO filters "
     "groups", DAPO_SAMPLING),
    ("algorithm.use_pf_ppo", "PF-PPO sample reweighting", PF_PPO),
    ("algorithm.pf_ppo.**", "PF-PPO's reweighting method", PF_PPO),
    # whole sections
    ("distillation.**", "on-policy distillation from teacher models", DISTILLATION),
    ("transfer_queue.**", "verl's TransferQueue data plane", INFRASTRUCTURE),
    ("skip.**", "replay dumped rollouts instead of generating", ROLLOUT_SKIP),
    ("ray_kwargs.**", "arguments of ray.init", INFRASTRUCTURE),
    # trainer
    ("trainer.rollout_data_dir", "dump training generations here", OBSERVABILITY),
    ("trainer.validation_data_dir", "dump validation generations here", OBSERVABILITY),
    ("trainer.esi_redundant_time", "time reserved to save before an elastic instance expires", INFRASTRUCTURE),
    ("trainer.checkpoint_callback_class", "a hook called after each checkpoint", INFRASTRUCTURE),
    ("trainer.val_only", "validate and stop", VAL_ONLY),
    ("trainer.default_hdfs_dir", "copy checkpoints to HDFS", INFRASTRUCTURE),
    ("trainer.del_local_ckpt_after_load", "delete a local checkpoint once resumed from", INFRASTRUCTURE),
    ("trainer.ray_wait_register_center_timeout", "how long workers wait for Ray's register center", INFRASTRUCTURE),
    ("trainer.use_legacy_worker_impl", "choose verl's legacy or engine-based workers", PLUMBING),
    ("trainer.use_v1", "use verl's v1 trainer", PLUMBING),
    ("trainer.v1.trainer_mode", "sync, colocated async or separated async training", ASYNC_TRAINING),
    ("trainer.v1.**", "settings of verl's asynchronous trainer modes", ignored(
        "asynchronous trainer settings", "they act only in the async trainer modes rlconf does not run")),
]

# Keys verl reads with `.get` without declaring them in its config (a script adds them with `+`).
UNDECLARED: dict[str, dict[str, Any]] = {
    "actor_rollout_ref.actor.fsdp_config.mixed_precision": {"default": None, "seen_in": "verl workers/config/engine.py"},
    "actor_rollout_ref.ref.fsdp_config.mixed_precision": {"default": None, "seen_in": "verl workers/config/engine.py"},
    "reward_model.reward_kwargs": {"default": {}, "seen_in": "verl trainer/ppo/reward.py (load_reward_manager)"},
    "actor_rollout_ref.model.torch_dtype": {"default": None, "seen_in": "verl's example run_cispo_qwen2_5_0_5b_gsm8k.sh (no code reads it)"},
}

# The served reward model's engine keys the schema holds (reward_model.rollout.*, verl 0.9.1: reward.reward_model.rollout.*).
SERVED_RM_KEYS = ("name", "dtype", "gpu_memory_utilization", "free_cache_engine", "tensor_model_parallel_size",
                  "max_num_batched_tokens", "max_model_len", "max_num_seqs", "prompt_length", "response_length")

# verl 0.9 spelling -> the schema key rlconf reads it into (both set: RL107).
ALIASES: dict[str, str] = {
    **{f"critic.fsdp.{leaf}": f"critic.model.fsdp_config.{leaf}" for leaf in (
        "param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward", "forward_prefetch", "fsdp_size",
        "wrap_policy.min_num_params", "use_no_sync_for_gradient_accumulation")},
    "actor_rollout_ref.actor.optim.clip_grad": "actor_rollout_ref.actor.grad_clip",
    "critic.optim.clip_grad": "critic.grad_clip",
    "actor_rollout_ref.actor.fsdp_config.dtype": "actor_rollout_ref.model.dtype",
    # verl 0.9.1's one-step off-policy recipe sizes the rollout pool at the top level (its main_ppo copies them in).
    "rollout.nnodes": "actor_rollout_ref.rollout.nnodes",
    "rollout.n_gpus_per_node": "actor_rollout_ref.rollout.n_gpus_per_node",
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.model_path": "reward_model.model.path",
    **{f"reward.reward_model.{key}": f"reward_model.{key}" for key in ("enable_resource_pool", "nnodes", "n_gpus_per_node")},
    **{f"reward.reward_model.rollout.{key}": f"reward_model.rollout.{key}" for key in SERVED_RM_KEYS},
}


# --- values of schema keys that verl runs and this engine does not ------------------------------

NOT_RUN_VALUES: dict[str, dict[str, NotRun]] = {
    "actor_rollout_ref.rollout.name": {
        "sglang": NotRun("SGLang rollout", "rollout runs on vLLM (GPU) or HF generate (anywhere)", "vllm"),
        "trtllm": NotRun("TensorRT-LLM rollout", "rollout runs on vLLM (GPU) or HF generate (anywhere)", "vllm"),
    },
    "algorithm.adv_estimator": {name: NotRun(
        f"the {name} advantage estimator", "the engine runs gae, grpo(_vectorized), rloo(_vectorized), grpo_passk, "
        "opo, gpg, remax, reinforce_plus_plus(_baseline), (tir_)optimal_token_baseline so far",
        "gae, grpo, rloo or reinforce_plus_plus") for name in ("gdpo",)},
    "actor_rollout_ref.actor.policy_loss.loss_mode": {mode: NotRun(
        f"the {mode} policy loss", "the engine runs vanilla, gspo, sapo, gpg, clip_cov, kl_cov, geo_mean and cispo so far",
        "vanilla") for mode in ("dppo_tv", "dppo_kl", "dro")} | {
        # verl's trainer sets this mode itself in bypass mode; set by hand, verl stops for want of its settings.
        "bypass_mode": NotRun("the bypass_mode policy loss set by hand", "it is the loss of bypass mode, which "
                              "algorithm.rollout_correction.bypass_mode switches on (with its loss_type)",
                              "algorithm.rollout_correction.bypass_mode=true")},
    "actor_rollout_ref.rollout.checkpoint_engine.backend": {name: NotRun(
        f"the {name} weight-sync backend", "weights reach a rollout pool of its own over NCCL (GPU) or gloo (CPU)",
        "nccl") for name in ("hccl", "nixl")},
    "reward_model.reward_manager": {name: NotRun(
        f"the {name} reward manager", "rewards are assembled by the naive, dapo, batch or prime manager",
        "naive, batch or prime with custom_reward_function") for name in ("gdpo", "remote")},
    "trainer.logger": {name: ignored(f"the {name} logger", "metrics go to metrics.jsonl, the console, tensorboard and wandb",
                                     "console, tensorboard or wandb") for name in (
        "tracking", "trackio", "mlflow", "swanlab", "vemlp_wandb", "clearml", "file", "rl_insight")},
}


# --- schema keys whose default differs from verl's, and why --------------------------------------

DIFFERENCES: dict[str, str] = {
    "data.train_files": "the directory verl's and rlconf's gsm8k preprocessing write to (~/data/gsm8k)",
    "data.val_files": "no validation unless the plan names validation data",
    "trainer.val_before_train": "validation runs only when the plan asks for it (and names data.val_files)",
    "data.seed": "a seeded data order, so a rerun sees the same batches (verl's null leaves the shuffle unseeded)",
    "actor_rollout_ref.model.path": "a small model that runs on one GPU",
    "critic.model.path": "null: the actor's model, the usual critic initialisation (verl names a fixed model)",
    "actor_rollout_ref.actor.strategy": "rlconf trains with FSDP2 (fully_shard); `fsdp` is accepted and runs the same",
    "critic.strategy": "as actor.strategy",
    "actor_rollout_ref.rollout.name": "verl requires a backend; rlconf's default is vLLM, the GPU fast path",
    "actor_rollout_ref.rollout.enforce_eager": "vLLM runs eager (no CUDA graphs): the rollout memory that RL609 checks and the "
                                               "GPU tests use; set false for faster decoding",
    "reward_model.enable": "false and verl's null (not set) both leave the reward model off",
    "reward_model.reward_manager": "verl's null (not set) falls back to reward.reward_manager.name, naive",
    "reward_model.model.trust_remote_code": "false and verl's null (not set) both leave remote code off",
    "custom_reward_function.name": "verl's null (not set) falls back to reward.custom_reward_function.name, compute_score",
    "trainer.project_name": "names rlconf's run directory, runs/{project_name}/{experiment_name}",
    "trainer.experiment_name": "as project_name",
    "trainer.default_local_dir": "null: runs/{project_name}/{experiment_name}, which holds metrics and checkpoints",
    "trainer.logger": "the console (and metrics.jsonl) needs no account; wandb is one entry away",
    # verl 0.9.1 keeps the legacy reward_model.* keys at null and copies the set ones into reward.reward_model.*
    # (migrate_legacy_reward_impl): null there means reward.reward_model's default, which is rlconf's.
    **{f"reward_model.{key}": "verl 0.9.1's legacy key is null (not set): reward.reward_model's default applies, which "
                              "is this one" for key in ("enable_resource_pool", "nnodes", "n_gpus_per_node")},
    **{f"reward_model.rollout.{key}": "verl 0.9.1's legacy key is null (not set): reward.reward_model.rollout's "
                                      "default applies, which is this one"
       for key in SERVED_RM_KEYS if key not in ("name", "max_model_len")},
}

# Schema keys left null that resolve to another key, as verl's `${...}` defaults do (rlconf/normalize.py,
# or rlconf/schema/plan.py COPIED_DEFAULTS for the keys the engine reads directly).
FOLLOWS: dict[str, str] = {
    "actor_rollout_ref.rollout.prompt_length": "data.max_prompt_length",
    "actor_rollout_ref.rollout.response_length": "data.max_response_length",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "critic.ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "critic.use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "critic.forward_max_token_len_per_gpu": "critic.ppo_max_token_len_per_gpu",
    "critic.ppo_epochs": "actor_rollout_ref.actor.ppo_epochs",
    "critic.loss_agg_mode": "actor_rollout_ref.actor.loss_agg_mode",
    "critic.shuffle": "actor_rollout_ref.actor.shuffle",
    "actor_rollout_ref.actor.checkpoint.load_contents": "actor_rollout_ref.actor.checkpoint.save_contents",
    "critic.checkpoint.load_contents": "critic.checkpoint.save_contents",
    "critic.forward_micro_batch_size_per_gpu": "critic.ppo_micro_batch_size_per_gpu",
    "data.gen_batch_size": "data.train_batch_size",
    "actor_rollout_ref.rollout.n_gpus_per_node": "trainer.n_gpus_per_node",
}

# verl follows rlconf does not copy, and why.
FOLLOWS_DIFFER: dict[str, str] = {
    "critic.ppo_micro_batch_size_per_gpu": "verl copies the deprecated global critic.ppo_micro_batch_size into the per-GPU key; "
                                           "rlconf divides the deprecated value by the data-parallel size (RL106), as verl's "
                                           "workers did",
    "critic.forward_micro_batch_size": "a deprecated global size; rlconf derives the forward size from the per-GPU one",
    "trainer.default_local_dir": "see its default",
}

# Schema keys verl 0.9.1's config does not have: rlconf extensions, and verl keys it has since renamed.
RLCONF_ONLY: dict[str, str] = {
    "reward_model.reward_kwargs.overlong_buffer_cfg": "verl reads it from reward_kwargs, which its config does not declare "
                                                      "(the DAPO reward manager's argument)",
    "reward_model.reward_kwargs.max_resp_len": "verl reads it from reward_kwargs, which its config does not declare "
                                               "(the DAPO reward manager's argument)",
    "async_training": "verl 0.9.1's fully async mode (experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml), "
                      "not in its main trainer config",
    "placement": "rlconf extension: which GPU pool each role runs on (verl's resource pools)",
    "estimate": "rlconf extension: hints for the memory estimate of `rlconf explain`",
    "trainer.seed": "rlconf extension: the seed of model init, sampling and dropout",
    "trainer.profile_steps": "rlconf extension: steps to trace with torch.profiler",
    "actor_rollout_ref.model.compile_layers": "rlconf extension: torch.compile each decoder layer (verl's "
                                              "use_torch_compile compiles only the loss head)",
    "critic.model.compile_layers": "rlconf extension: as actor_rollout_ref.model.compile_layers",
    "actor_rollout_ref.model.dtype": "rlconf's compute dtype; verl 0.9 spells it actor.fsdp_config.dtype (read into this key)",
    "critic.model.fsdp_config": "verl up to 0.8 (verl 0.9: critic.fsdp, read into this section)",
    "reward_model.strategy": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.use_reward_loop": "verl up to 0.8 (true at b178a3cd): false keeps the legacy reward model worker; "
                                    "verl 0.9.1 always serves a reward model",
    "reward_model.model.input_tokenizer": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.model.use_remove_padding": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.model.fsdp_config": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.micro_batch_size": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.micro_batch_size_per_gpu": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.max_length": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.ulysses_sequence_parallel_size": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.use_dynamic_bsz": "verl up to 0.8 (legacy reward model worker)",
    "reward_model.forward_max_token_len_per_gpu": "verl up to 0.8 (legacy reward model worker)",
}


# --- lookups -------------------------------------------------------------------------------------


def _glob(pattern: str) -> re.Pattern[str]:
    """A regex over `key + "."`: each segment ends in a dot, `**` is any number of segments."""
    segments = {"**": r"(?:[^.]+\.)*", "*": r"[^.]+\."}
    return re.compile("".join(segments.get(part, re.escape(part) + r"\.") for part in pattern.split(".")) + r"\Z")


@cache
def _compiled() -> list[tuple[re.Pattern[str], str, NotRun]]:
    return [(_glob(pattern), meaning, not_run) for pattern, meaning, not_run in VERL_ONLY]


def verl_only(key: str) -> tuple[str, NotRun] | None:
    """(meaning, what rlconf does) of a verl key the schema does not hold; None: not listed."""
    for pattern, meaning, not_run in _compiled():
        if pattern.match(key + "."):
            return meaning, not_run
    return None
