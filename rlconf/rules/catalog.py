"""Every diagnostic code: what it means, where the check comes from, and an example plan that
triggers it. docs/rules.md is generated from this table (python -m rlconf.docgen), with each
example's real output, and a test keeps both in sync with the code.

verl references are to volcengine/verl at b178a3cd (2026-01-29) unless marked v0.4.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A small valid plan the examples build on (`base: example-base.yaml`).
EXAMPLE_BASE = """\
data:
  train_batch_size: 64
  max_prompt_length: 256
  max_response_length: 256
actor_rollout_ref:
  model:
    path: org/model-1B
  actor:
    ppo_mini_batch_size: 32
    ppo_micro_batch_size_per_gpu: 4
  rollout:
    n: 4
    log_prob_micro_batch_size_per_gpu: 8
algorithm:
  adv_estimator: grpo
trainer:
  nnodes: 1
  n_gpus_per_node: 8
"""


@dataclass(frozen=True)
class RuleDoc:
    code: str
    severity: str
    title: str
    source: str
    example: str  # plan text; `base: example-base.yaml` gives it the valid base above
    overrides: list[str] = field(default_factory=list)
    raw_bytes: bytes | None = None  # for examples that are not text


B = "base: example-base.yaml\n"
RULES: list[RuleDoc] = [
    RuleDoc("RL001", "error", "plan file missing or unreadable", "rlconf", "", raw_bytes=None),
    RuleDoc("RL002", "error", "YAML syntax error, or not UTF-8 text", "rlconf", "data:\n  train_batch_size: [64\n"),
    RuleDoc("RL003", "error", "empty file, or not a mapping of sections", "rlconf", "- data\n- trainer\n"),
    RuleDoc("RL004", "error", "`base:` names no preset and no file", "rlconf", "base: grpo_70b\n"),
    RuleDoc("RL005", "error", "`base:` chain is a cycle", "rlconf", "base: plan.yaml\n"),
    RuleDoc("RL006", "error", "malformed `key=value` override", "rlconf", B, overrides=["actor_rollout_ref.rollout.n"]),
    RuleDoc("RL007", "error", "YAML tag in a plan (`!!python/...`, `!include`, any `!tag`): refused, never constructed", "rlconf",
            B + "trainer:\n  project_name: !!python/object/apply:os.getcwd []\n"),
    RuleDoc("RL008", "error", "plan past a loader limit: values copied through YAML aliases, nesting depth, file size, "
                              "integer length", "rlconf",
            "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"),
    RuleDoc("RL009", "error", "a path in the plan cannot be looked at here (name too long, a file used as a directory, "
            "no permission); a path that does not exist is fine", "rlconf",
            B + "data:\n  train_files: example-base.yaml/train.parquet\n"),
    RuleDoc("RL101", "error", "unknown key (with did-you-mean)", "rlconf", B + "data:\n  max_prompt_lenght: 512\n"),
    RuleDoc("RL102", "error", "value of the wrong type", "rlconf", B + "data:\n  train_batch_size: sixty-four\n"),
    RuleDoc("RL103", "error", "value out of range (sizes > 0, 0 < gpu_memory_utilization <= 1, finite numbers)", "rlconf",
            B + "actor_rollout_ref:\n  rollout:\n    gpu_memory_utilization: 1.5\n"),
    RuleDoc("RL104", "error", "value not one of the allowed choices", "rlconf", B + "algorithm:\n  adv_estimator: grpoo\n"),
    RuleDoc("RL105", "error", "required key missing", "rlconf",
            B + "placement:\n  pools:\n    main: {nnodes: 1}\n  roles: {actor: main, rollout: main}\n"),
    RuleDoc("RL106", "warning", "deprecated key (mapped to its replacement)", "verl utils/config.py L117-143",
            B + "actor_rollout_ref:\n  rollout:\n    log_prob_micro_batch_size_per_gpu: null\n    log_prob_micro_batch_size: 64\n"),
    RuleDoc("RL107", "error", "deprecated key and its replacement both set", "verl utils/config.py L117-143 (check_mutually_exclusive)",
            B + "actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size: 32\n"),
    RuleDoc("RL108", "error", "a verl setting rlconf does not run yet (key or value; docs/verl-compat.md)", "verl 0.9.1 config",
            B + "actor_rollout_ref:\n  rollout:\n    name: sglang\n"),
    RuleDoc("RL109", "warning", "a verl setting rlconf accepts and does not apply (the numbers are the same)", "verl 0.9.1 config",
            B + "actor_rollout_ref:\n  actor:\n    calculate_entropy: true\n"),
    RuleDoc("RL201", "error", "train_batch_size × rollout.n does not split over the GPUs", "verl utils/config.py L109-113; protocol.py L884-887 (DataProto.chunk)",
            B + "data:\n  train_batch_size: 63\n"),
    RuleDoc("RL202", "error", "ppo_mini_batch_size larger than train_batch_size", "verl workers/config/actor.py L200-221",
            B + "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 128\n"),
    RuleDoc("RL203", "error", "mini batch × n does not split over the data-parallel ranks", "verl fsdp_workers.py L240-262 (floors silently there)",
            B + "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 31\n"),
    RuleDoc("RL204", "error", "normalized mini batch not divisible by the micro batch per GPU", "verl fsdp_workers.py L240-262",
            B + "actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size_per_gpu: 6\n"),
    RuleDoc("RL205", "error", "no micro batch size and no dynamic batch size", "verl utils/config.py L117-143; workers/config/actor.py L174-198",
            B + "actor_rollout_ref:\n  rollout:\n    log_prob_micro_batch_size_per_gpu: null\n"),
    RuleDoc("RL206", "error", "deprecated global micro batch does not split over the data-parallel ranks", "verl fsdp_workers.py L240-273 (floors silently there)",
            B + "actor_rollout_ref:\n  rollout:\n    log_prob_micro_batch_size_per_gpu: null\n    log_prob_micro_batch_size: 12\n"),
    RuleDoc("RL207", "warning", "train_batch_size not a multiple of ppo_mini_batch_size (short last mini batch)", "verl protocol.py L916-925 (DataProto.split)",
            B + "data:\n  train_batch_size: 96\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 64\n"),
    RuleDoc("RL208", "error", "gen_batch_size × rollout.n does not split over the rollout replicas", "rlconf (a generation round is split evenly over the replicas)",
            B + "data:\n  gen_batch_size: 129\nactor_rollout_ref:\n  rollout:\n    tensor_model_parallel_size: 1\n"
            "algorithm:\n  adv_estimator: grpo\n  filter_groups:\n    enable: true\n    metric: score\n"),
    RuleDoc("RL301", "error", "Ulysses sequence-parallel size does not divide the GPUs", "verl fsdp_workers.py L169-175 (device mesh)",
            B + "actor_rollout_ref:\n  model:\n    use_remove_padding: true\n  actor:\n    ulysses_sequence_parallel_size: 3\n"),
    RuleDoc("RL302", "error", "rollout tensor parallel size does not divide the rollout GPUs", "verl fsdp_workers.py L622-628",
            B + "trainer:\n  n_gpus_per_node: 6\ndata:\n  train_batch_size: 48\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 24\n  rollout:\n    tensor_model_parallel_size: 4\n"),
    RuleDoc("RL303", "warning", "rollout tensor parallel spans nodes (runs; the interconnect carries its all-reduces)", "verl workers/rollout/replica.py L96-105",
            B + "trainer:\n  nnodes: 2\n  n_gpus_per_node: 4\nactor_rollout_ref:\n  rollout:\n    tensor_model_parallel_size: 8\n"),
    RuleDoc("RL305", "error", "attention heads do not split over sequence/tensor parallel ranks (needs a local model config)",
            "verl models/transformers/monkey_patch.py L333-340", ""),
    RuleDoc("RL306", "error", "Ulysses sp > 1 without sequence packing", "verl workers/config/actor.py L291-308; critic.py L202-211",
            B + "actor_rollout_ref:\n  model:\n    use_remove_padding: false\n  actor:\n    ulysses_sequence_parallel_size: 2\n"),
    RuleDoc("RL307", "error", "fsdp_size does not divide the GPUs", "verl fsdp_workers.py L98-105 (HSDP mesh)",
            B + "actor_rollout_ref:\n  actor:\n    fsdp_config:\n      fsdp_size: 3\n"),
    RuleDoc("RL351", "error", "placement pools exceed the cluster", "verl resource pools (ray_trainer ResourcePoolManager)",
            B + "placement:\n  pools:\n    main: {n_gpus_per_node: 8}\n    extra: {n_gpus_per_node: 4}\n  roles: {actor: main, rollout: main}\n"),
    RuleDoc("RL352", "error", "a role is placed on an undefined pool", "rlconf",
            B + "placement:\n  pools:\n    main: {n_gpus_per_node: 8}\n  roles: {actor: main, rollout: mian}\n"),
    RuleDoc("RL353", "error", "a role the plan runs has no pool", "rlconf",
            B + "placement:\n  pools:\n    main: {n_gpus_per_node: 8}\n  roles: {actor: main}\n"),
    RuleDoc("RL354", "error", "rollout placed apart from the actor while hybrid_engine is true", "verl ray_trainer.py L276 (hybrid engine required)",
            B + "placement:\n  pools:\n    a: {n_gpus_per_node: 4}\n    b: {n_gpus_per_node: 4}\n  roles: {actor: a, rollout: b}\n"),
    RuleDoc("RL355", "warning", "a role is placed but the plan does not run it", "rlconf",
            B + "placement:\n  pools:\n    main: {n_gpus_per_node: 8}\n  roles: {actor: main, rollout: main, critic: main}\n"),
    RuleDoc("RL356", "warning", "a pool has no role", "rlconf",
            B + "data:\n  train_batch_size: 32\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 16\nplacement:\n  pools:\n    main: {n_gpus_per_node: 4}\n    spare: {n_gpus_per_node: 4}\n  roles: {actor: main, rollout: main}\n"),
    RuleDoc("RL361", "error", "hybrid_engine false without a rollout pool of its own",
            "verl experimental/separation/utils.py (create_resource_pool_manager)",
            B + "actor_rollout_ref:\n  hybrid_engine: false\n"),
    RuleDoc("RL362", "error", "a rollout pool of its own (rollout.nnodes > 0) while hybrid_engine is true",
            "verl trainer/ppo/ray_trainer.py (assert hybrid_engine); experimental/one_step_off_policy/ray_trainer.py",
            B + "actor_rollout_ref:\n  rollout:\n    nnodes: 1\n    n_gpus_per_node: 2\n"),
    RuleDoc("RL363", "warning", "free_cache_engine on a rollout pool of its own", "verl one_step_off_ppo_trainer.yaml (free_cache_engine: False)",
            B + "actor_rollout_ref:\n  hybrid_engine: false\n  rollout:\n    nnodes: 1\n    n_gpus_per_node: 2\n"
                "    checkpoint_engine: {backend: nccl}\nalgorithm:\n  rollout_correction: {bypass_mode: true}\n"),
    RuleDoc("RL364", "warning", "checkpoint_engine.backend naive with a rollout pool of its own",
            "verl one_step_off_ppo_trainer.yaml (checkpoint_engine.backend: nccl)",
            B + "actor_rollout_ref:\n  hybrid_engine: false\n  rollout:\n    nnodes: 1\n    n_gpus_per_node: 2\n"
                "    free_cache_engine: false\nalgorithm:\n  rollout_correction: {bypass_mode: true}\n"),
    RuleDoc("RL365", "warning", "one-step off-policy without rollout correction (bypass mode, truncated IS or rejection "
            "sampling)",
            "verl one_step_off_ppo_trainer.yaml (rollout_correction.bypass_mode: True)",
            B + "actor_rollout_ref:\n  hybrid_engine: false\n  rollout:\n    nnodes: 1\n    n_gpus_per_node: 2\n"
                "    free_cache_engine: false\n    checkpoint_engine: {backend: nccl}\n"),
    RuleDoc("RL366", "error", "a role other than rollout on the rollout pool of the off-policy schedule", "rlconf",
            B + "actor_rollout_ref:\n  hybrid_engine: false\n  actor:\n    use_kl_loss: true\n"
                "algorithm:\n  rollout_correction: {bypass_mode: true}\n"
                "placement:\n  pools:\n    train: {n_gpus_per_node: 4}\n    gen: {n_gpus_per_node: 4}\n"
                "  roles: {actor: train, rollout: gen, ref: gen}\n"),
    RuleDoc("RL367", "error", "rollout.nnodes and a placement section both size the pools", "rlconf",
            B + "actor_rollout_ref:\n  hybrid_engine: false\n  rollout:\n    nnodes: 1\n"
                "placement:\n  pools:\n    main: {n_gpus_per_node: 8}\n  roles: {actor: main, rollout: main}\n"),
    RuleDoc("RL368", "error", "an async_training section without a rollout pool of its own (hybrid_engine true)",
            "verl experimental/fully_async_policy/fully_async_trainer.py (assert not self.hybrid_engine)",
            B + "async_training:\n  partial_rollout: false\n"),
    RuleDoc("RL369", "error", "fully async: train_batch_size is not ppo_mini_batch_size × require_batches",
            "verl experimental/fully_async_policy/fully_async_rollouter.py (assert train_batch_size == 0; "
            "required_samples)",
            B + "data:\n  train_batch_size: 16\nactor_rollout_ref:\n  hybrid_engine: false\n  actor:\n    ppo_mini_batch_size: 16\n"
                "  rollout:\n    nnodes: 1\n    n_gpus_per_node: 2\n    free_cache_engine: false\n    checkpoint_engine: {backend: nccl}\n"
                "algorithm:\n  rollout_correction: {bypass_mode: true}\n" + "async_training:\n  partial_rollout: false\n  require_batches: 2\n"),
    RuleDoc("RL372", "error", "rollout.engine_kwargs.vllm.distributed_executor_backend other than external_launcher or "
            "mp, or mp with rollout tensor parallel size > 1 or without vLLM",
            "rlconf (vLLM's executors: its config/parallel.py; verl 0.9.1 runs its server with mp)",
            B + "actor_rollout_ref:\n  rollout:\n    name: vllm\n    tensor_model_parallel_size: 2\n"
                "    engine_kwargs:\n      vllm: {distributed_executor_backend: mp}\n"),
    RuleDoc("RL371", "warning", "fully async with vLLM: fewer groups in a replica's engine at once than its share of a step",
            "rlconf (measured: docs/benchmarks.md, the fully async schedule's first GPU runs)",
            B + "actor_rollout_ref:\n  hybrid_engine: false\n  actor:\n    ppo_mini_batch_size: 16\n"
                "  rollout:\n    name: vllm\n    tensor_model_parallel_size: 1\n    nnodes: 1\n    n_gpus_per_node: 1\n"
                "    free_cache_engine: false\n    checkpoint_engine: {backend: nccl}\n"
                "algorithm:\n  rollout_correction: {bypass_mode: true}\n"
                "async_training:\n  partial_rollout: false\n  concurrent_samples_per_replica: 4\n"),
    RuleDoc("RL401", "error", "token budget below one full sequence (dynamic batch size)", "verl utils/seqlen_balancing.py L382-384",
            B + "actor_rollout_ref:\n  actor:\n    use_dynamic_bsz: true\n    ppo_max_token_len_per_gpu: 400\n"),
    RuleDoc("RL402", "warning", "actor token budget under 2 × (prompt + response)", "verl performance tuning guide (dynamic batch size)",
            B + "actor_rollout_ref:\n  actor:\n    use_dynamic_bsz: true\n    ppo_micro_batch_size_per_gpu: null\n    ppo_max_token_len_per_gpu: 768\n"),
    RuleDoc("RL403", "warning", "micro batch size set but ignored under dynamic batch size", "verl dp_actor.py L541-560",
            B + "actor_rollout_ref:\n  actor:\n    use_dynamic_bsz: true\n"),
    RuleDoc("RL501", "warning", "group-relative estimator (grpo, rloo, opo, gpg, ...) with rollout.n 1: each group is one "
            "sample, so the advantage is the raw reward (REINFORCE-like), as verl runs it",
            "verl 0.9.1 trainer/ppo/core_algos.py L315-317 (grpo: a group of one has mean 0, std 1), L572, L622, L678, "
            "L817, L950, L1085", B + "actor_rollout_ref:\n  rollout:\n    n: 1\n"),
    RuleDoc("RL502", "warning", "KL applied both as a loss and in the reward", "verl utils/config.py L180-181",
            B + "actor_rollout_ref:\n  actor:\n    use_kl_loss: true\n  ref:\n    log_prob_micro_batch_size_per_gpu: 8\nalgorithm:\n  use_kl_in_reward: true\n"),
    RuleDoc("RL503", "warning", "critic_warmup without a critic", "rlconf", B + "trainer:\n  critic_warmup: 5\n"),
    RuleDoc("RL505", "warning", "several samples per prompt with greedy decoding", "rlconf", B + "actor_rollout_ref:\n  rollout:\n    do_sample: false\n"),
    RuleDoc("RL508", "warning", "adaptive KL controller without KL in the reward", "verl core_algos.py L200-211",
            B + "algorithm:\n  kl_ctrl:\n    type: adaptive\n"),
    RuleDoc("RL509", "error", "vLLM rollout on CPU", "rlconf", B + "trainer:\n  device: cpu\n"),
    RuleDoc("RL510", "error", "prompt + response longer than max_model_len or the model's positions", "verl vllm_rollout_spmd.py ~L90-133 (v0.4.1)",
            B + "actor_rollout_ref:\n  rollout:\n    max_model_len: 400\n"),
    RuleDoc("RL511", "warning", "Liger kernels requested on CPU", "rlconf",
            B + "trainer:\n  device: cpu\nactor_rollout_ref:\n  model:\n    use_liger: true\n  rollout:\n    name: hf\n"),
    RuleDoc("RL512", "warning", "max_num_batched_tokens below max_model_len with chunked prefill (a long prefill takes "
            "several engine steps)", "verl 0.9.1 workers/rollout/vllm_rollout/vllm_async_server.py L1113-1119 (raises it "
            "only without chunked prefill; verl 0.4.1 refused it)",
            B + "actor_rollout_ref:\n  rollout:\n    max_num_batched_tokens: 256\n"),
    RuleDoc("RL513", "warning", "validation sampling with temperature 0", "verl utils/config.py L196-199",
            B + "actor_rollout_ref:\n  rollout:\n    val_kwargs:\n      do_sample: true\n"),
    RuleDoc("RL514", "error", "resume_mode not auto/disable/resume_path/a path, or resume_path without resume_from_path", "verl ray_trainer (_load_checkpoint)",
            B + "trainer:\n  resume_mode: latest\n"),
    RuleDoc("RL515", "warning", "built-in scorers keyed by a column other than data_source", "rlconf", B + "data:\n  reward_fn_key: task\n"),
    RuleDoc("RL516", "error", "validation asked for (test_freq, val_before_train) without data.val_files", "rlconf",
            B + "trainer:\n  test_freq: 5\n"),
    RuleDoc("RL517", "error", "random:// model path with a name not in the shape table", "rlconf",
            B + "actor_rollout_ref:\n  model:\n    path: random://Qwen9-1T\n"),
    RuleDoc("RL518", "error", "HF rollout with tensor_model_parallel_size > 1", "rlconf (HF generate runs a full copy per rank)",
            B + "trainer:\n  device: cpu\nactor_rollout_ref:\n  rollout:\n    name: hf\n    tensor_model_parallel_size: 2\n"),
    RuleDoc("RL519", "error", "validation sampling with rollout.temperature 0", "verl utils/config.py validate_config (v0.9.1)",
            B + "actor_rollout_ref:\n  rollout:\n    temperature: 0\n    val_kwargs:\n      do_sample: true\n      temperature: 0.7\n"),
    RuleDoc("RL520", "warning", "clip_ratio set while clip_ratio_low/high (verl default 0.2) decide the clip", "verl core_algos.py (compute_policy_loss_vanilla)",
            B + "actor_rollout_ref:\n  actor:\n    clip_ratio: 0.3\n"),
    RuleDoc("RL521", "error", "DAPO overlong buffer without the dapo reward manager or max_resp_len, or longer than it",
            "verl workers/reward_manager/dapo.py (DAPORewardManager)",
            B + "reward_model:\n  reward_manager: dapo\n  reward_kwargs:\n    overlong_buffer_cfg:\n      enable: true\n      len: 4\n"),
    RuleDoc("RL522", "error", "DAPO group filtering on a metric the engine does not compute (acc), or on seq_final_reward "
            "with KL in the reward", "verl 0.9.1 trainer/ppo/v1/replay_buffer.py L299-308 (a metric missing from the "
            "reward's extra info raises)",
            B + "algorithm:\n  adv_estimator: grpo\n  filter_groups:\n    enable: true\n    metric: acc\n"),
    RuleDoc("RL523", "warning", "DAPO group filtering that has nothing to filter: an estimator that does not compare a "
            "prompt's responses, or one response per prompt (verl keeps groups of one)",
            "verl 0.9.1 trainer/ppo/v1/replay_buffer.py L310-312",
            B + "algorithm:\n  adv_estimator: gae\n  filter_groups:\n    enable: true\n    metric: score\n"),
    RuleDoc("RL524", "error", "data.gen_batch_size that cannot fill or does not make the training batch: set without "
            "filter_groups, or too small for max_num_gen_batches (warning: smaller than train_batch_size)",
            "verl trainer/ppo/ray_trainer.py (_create_dataloader), recipe/dapo/dapo_ray_trainer.py (v0.7.0, fit)",
            B + "data:\n  gen_batch_size: 192\n"),
    RuleDoc("RL525", "warning", "a policy loss_mode that bypass mode replaces by its loss_type", "verl trainer/ppo/rollout_corr_helper.py (apply_bypass_mode)",
            B + "algorithm:\n  rollout_correction:\n    bypass_mode: true\nactor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: gspo\n"),
    RuleDoc("RL550", "error", "rollout_correction.rollout_rs with an option verl does not have, no rollout_rs_threshold, "
            "or thresholds that do not fit the options", "verl trainer/ppo/rollout_corr_helper.py (compute_rollout_rejection_mask)",
            B + "algorithm:\n  rollout_correction:\n    rollout_rs: token_k1,seq_max_k2\n    rollout_rs_threshold: 0.6_1.6\n"),
    RuleDoc("RL551", "warning", "lora_adapter_path: lora_rank, lora_alpha or target_modules that the saved adapter's config "
            "overrides, or an adapter whose config the compiler cannot read (not a local directory)",
            "verl workers/engine/fsdp/transformer_impl.py (_build_lora_module: PeftModel.from_pretrained)",
            B + "actor_rollout_ref:\n  model:\n    lora_rank: 16\n    lora_adapter_path: /nonexistent/adapter\n"),
    RuleDoc("RL552", "error", "rollout_correction.rollout_is with rollout_is_threshold null (verl then computes no IS "
            "weights)", "verl trainer/ppo/rollout_corr_helper.py (compute_rollout_correction_and_rejection_mask)",
            B + "algorithm:\n  rollout_correction:\n    rollout_is: token\n    rollout_is_threshold: null\n"),
    RuleDoc("RL553", "warning", "rollout.calculate_log_probs false where rollout correction or bypass mode reads the "
            "rollout's log-probs (rlconf returns them anyway; verl skips rollout_is / rollout_rs, or raises), or in a "
            "fully async run (verl asserts it)",
            "verl trainer/ppo/v1/trainer_base.py (rollout_log_probs in the batch), rollout_corr_helper.py",
            B + "algorithm:\n  rollout_correction:\n    rollout_is: token\nactor_rollout_ref:\n  rollout:\n"
            "    calculate_log_probs: false\n"),
    RuleDoc("RL526", "error", "model.compile_layers (actor or critic) with model.use_liger", "rlconf",
            B + "actor_rollout_ref:\n  model:\n    use_liger: true\n    compile_layers: true\n"),
    RuleDoc("RL527", "error", "model.compile_layers (actor or critic) with Ulysses sequence parallelism", "rlconf",
            B + "actor_rollout_ref:\n  model:\n    compile_layers: true\n  actor:\n    ulysses_sequence_parallel_size: 2\n"),
    RuleDoc("RL528", "warning", "the Triton loss head (fused_kernel_options.impl_backend triton) requested on CPU", "rlconf",
            B + "trainer:\n  device: cpu\nactor_rollout_ref:\n  model:\n    fused_kernel_options:\n      impl_backend: triton\n  rollout:\n    name: hf\n"),
    RuleDoc("RL529", "warning", "entropy chunking or checkpointing with the Triton loss head (impl_backend triton, or "
            "use_torch_compile on CUDA), which has nothing to chunk", "rlconf",
            B + "actor_rollout_ref:\n  model:\n    fused_kernel_options:\n      impl_backend: triton\n  actor:\n    entropy_from_logits_with_chunking: true\n"),
    RuleDoc("RL530", "error", "rollout.n 1 with a group estimator verl fails on (grpo_passk) or gives no signal "
            "(rloo_vectorized: every advantage 0)",
            "verl 0.9.1 trainer/ppo/core_algos.py L516-519 (grpo_passk raises), L864 (rloo_vectorized: 0 for a group of one)",
            B + "algorithm:\n  adv_estimator: grpo_passk\nactor_rollout_ref:\n  rollout:\n    n: 1\n"),
    RuleDoc("RL531", "error", "reward_model.enable without reward_model.model.path", "verl reward_model.yaml (model.path: the "
            "model the reward model worker loads)", B + "reward_model:\n  enable: true\n"),
    RuleDoc("RL532", "warning", "a rule scorer or DAPO's overlong penalty beside a reward model, whose scores replace them",
            "verl workers/reward_manager (rm_scores returned as they are)",
            B + "reward_model:\n  enable: true\n  model:\n    path: tiny://qwen2-reward\n"
            "custom_reward_function:\n  path: example-base.yaml\n"),
    RuleDoc("RL533", "error", "reward_manager batch without custom_reward_function (the built-in scorers take one "
            "response at a time)", "verl workers/reward_manager/batch.py (BatchRewardManager.verify), trainer/ppo/reward.py "
            "(load_reward_manager)", B + "reward_model:\n  reward_manager: batch\n"),
    RuleDoc("RL534", "error", "the FSDP reward model reads the policy's token ids (no input_tokenizer) and its vocabulary "
            "is smaller than the policy's (warning: larger, so the tokenizers likely differ)",
            "verl workers/fsdp_workers.py RewardModelWorker (input_tokenizer null: the ids as they are; verl's default "
            "is the policy's path)",
            B + "actor_rollout_ref:\n  model:\n    path: random://Qwen2.5-0.5B\n"
            "reward_model:\n  enable: true\n  model:\n    path: tiny://qwen2-reward\n"),
    RuleDoc("RL540", "error", "reward_model.use_reward_loop without reward_model.rollout.name, the engine to serve it with",
            "verl 0.9.1 reward_model config (rollout.name: ???, required)",
            B + "reward_model:\n  enable: true\n  model:\n    path: org/reward-1B\n  use_reward_loop: true\n"),
    RuleDoc("RL541", "error", "a reward model pool of its own (enable_resource_pool) with no nodes or no GPUs",
            "verl 0.9.1 trainer/main_ppo_v0.py init_resource_pool_mgr (n_gpus_per_node and nnodes must be > 0)",
            B + "reward_model:\n  enable: true\n  model:\n    path: org/reward-1B\n  enable_resource_pool: true\n  rollout:\n    name: vllm\n"),
    RuleDoc("RL542", "error", "the served reward model's tensor parallel size: no replica fits its pool, or it does not "
            "divide the actor's pool it is colocated on",
            "verl 0.9.1 experimental/reward_loop/reward_model.py (num_replicas > 0), single_controller/ray/base.py "
            "split_resource_pool (split_size divides world_size)",
            B + "reward_model:\n  enable: true\n  model:\n    path: org/reward-1B\n  rollout:\n    name: vllm\n    tensor_model_parallel_size: 3\n"),
    RuleDoc("RL543", "warning", "the reward model's own pool is not a multiple of its tensor parallel size: GPUs idle",
            "verl 0.9.1 experimental/reward_loop/reward_model.py (num_replicas = world_size // tp)",
            B + "reward_model:\n  enable: true\n  model:\n    path: org/reward-1B\n  enable_resource_pool: true\n  nnodes: 1\n  n_gpus_per_node: 3\n  rollout:\n    name: vllm\n"
            "    tensor_model_parallel_size: 2\n"),
    RuleDoc("RL544", "error", "a colocated served reward model and the actor's vLLM awake at once, their shares of the GPU "
            "over 1", "vLLM (each engine reserves gpu_memory_utilization × the GPU at start)",
            B + "reward_model:\n  enable: true\n  model:\n    path: org/reward-1B\n  rollout:\n    name: vllm\n    gpu_memory_utilization: 0.5\n    free_cache_engine: false\n"
            "actor_rollout_ref:\n  rollout:\n    gpu_memory_utilization: 0.6\n"),
    RuleDoc("RL545", "warning", "settings of the other reward-model path, which have no effect: the FSDP worker's micro "
            "batches and token budget with a served reward model, or reward_model.rollout with use_reward_loop false",
            "verl 0.9.1 (no FSDP reward-model worker; b178a3cd: use_reward_loop picks one path)",
            B + "reward_model:\n  enable: true\n  model:\n    path: org/reward-1B\n  micro_batch_size_per_gpu: 8\n  rollout:\n    name: vllm\n    tensor_model_parallel_size: 1\n"),
    RuleDoc("RL546", "error", "a served reward model without the raw chat (data.return_raw_chat false)",
            "verl 0.9.1 experimental/reward_loop/reward_loop.py (_preprocess_reward_inputs asserts raw_prompt)",
            B + "reward_model:\n  enable: true\n  model:\n    path: org/reward-1B\n  rollout:\n    name: vllm\n    tensor_model_parallel_size: 1\ndata:\n  return_raw_chat: false\n"),
    RuleDoc("RL601", "warning", "max_num_batched_tokens <= 2048 (tuning guide: > 2048)", "verl performance tuning guide (rollout)",
            B + "data:\n  max_prompt_length: 128\n  max_response_length: 128\nactor_rollout_ref:\n  rollout:\n    max_num_batched_tokens: 2048\n"),
    RuleDoc("RL602", "warning", "gpu_memory_utilization > 0.7 with nothing offloaded", "verl performance tuning guide (rollout)",
            B + "actor_rollout_ref:\n  rollout:\n    gpu_memory_utilization: 0.85\n"),
    RuleDoc("RL603", "warning", "forward-only micro batch smaller than the training one", "verl performance tuning guide (batch size tuning)",
            B + "actor_rollout_ref:\n  rollout:\n    log_prob_micro_batch_size_per_gpu: 2\n"),
    RuleDoc("RL604", "warning", "sequence packing off for a model family that supports it", "verl performance tuning guide (remove padding)",
            B + "actor_rollout_ref:\n  model:\n    path: Qwen/Qwen2.5-1.5B-Instruct\n    use_remove_padding: false\n"),
    RuleDoc("RL605", "warning", "critic budgets smaller than the actor's", "verl performance tuning guide (dynamic batch size)",
            B + "algorithm:\n  adv_estimator: gae\nactor_rollout_ref:\n  rollout:\n    n: 1\ncritic:\n  ppo_micro_batch_size_per_gpu: 2\n"),
    RuleDoc("RL606", "warning", "gradient checkpointing off", "verl performance tuning guide (batch size tuning)",
            B + "actor_rollout_ref:\n  model:\n    enable_gradient_checkpointing: false\n"),
    RuleDoc("RL609", "warning", "estimated memory per GPU above the GPU's", "rlconf estimate",
            B + "actor_rollout_ref:\n  model:\n    path: org/model-70B\n"),
    RuleDoc("RL610", "warning", "memory estimate without activations: the model's shape is unknown", "rlconf estimate",
            B + "actor_rollout_ref:\n  model:\n    path: org/model-7B\n"),
    RuleDoc("RL611", "warning", "vLLM's weights fill its gpu_memory_utilization share: no room for a KV cache",
            "vLLM (its share holds the weights first, the KV cache in what is left)",
            B + "actor_rollout_ref:\n  model:\n    path: Qwen/Qwen2.5-7B-Instruct\n  rollout:\n"
                "    tensor_model_parallel_size: 1\n    gpu_memory_utilization: 0.15\n"),
]

BY_CODE: dict[str, RuleDoc] = {r.code: r for r in RULES}
