"""`actor_rollout_ref.rollout`: generation engine and sampling."""

from typing import Literal

from pydantic import Field

from rlconf.schema.common import Fraction, MinusOneOrPositive, NonNegativeFloat, NonNegativeInt, PositiveInt, Section


class ValidationSampling(Section):
    temperature: NonNegativeFloat = 0.0  # 0: greedy.
    top_k: MinusOneOrPositive = -1  # -1: off.
    top_p: Fraction = 1.0  # Nucleus sampling mass.
    n: PositiveInt = 1  # Samples per validation prompt.
    do_sample: bool = False  # false: greedy decoding.


class EngineKwargs(Section):
    """Per backend, as in verl (`engine_kwargs.vllm.<arg>`); sglang and trtllm are known, not run."""

    vllm: dict = Field(default_factory=dict)  # Keyword arguments added to vLLM's engine arguments.


class CheckpointEngineConfig(Section):
    """How the trainer's weights reach the rollout engine (verl's checkpoint engine)."""

    # naive: in the actor's own processes (colocated); nccl: over a collective from the trainer's pool to a
    # rollout pool of its own (rlconf runs it on NCCL between GPUs and on gloo between CPU processes).
    # verl's hccl (Ascend) and nixl are known, not run (RL108).
    backend: Literal["naive", "nccl", "hccl", "nixl"] = "naive"
    update_weights_bucket_megabytes: PositiveInt = 2048  # Weights are sent in flat buckets of at most this many MB.


class RolloutConfig(Section):
    # vllm: the GPU fast path; hf: transformers `generate`, runs anywhere (CPU included). verl's sglang and trtllm are known, not run (RL108).
    name: Literal["vllm", "hf", "sglang", "trtllm"] = "vllm"
    # verl 0.9 runs rollout as a server (`async`, its only mode); rlconf generates each step's batch in the actor's processes. Both spellings run the same on-policy loop.
    mode: Literal["async", "sync"] = "async"
    n: PositiveInt = 1  # Responses sampled per prompt (GRPO group size).
    temperature: NonNegativeFloat = 1.0  # Sampling temperature.
    top_k: MinusOneOrPositive = -1  # -1: off.
    top_p: Fraction = 1.0  # Nucleus sampling mass.
    do_sample: bool = True  # false: greedy decoding.
    ignore_eos: bool = False  # Keep generating past EOS up to response_length.
    prompt_length: PositiveInt | None = None  # None: data.max_prompt_length
    response_length: PositiveInt | None = None  # None: data.max_response_length
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"  # Generation precision.
    # vLLM >= 0.7: the fraction of *total* GPU memory the engine may use (weights + KV cache).
    gpu_memory_utilization: Fraction = 0.5
    # A rollout pool of its own (with actor_rollout_ref.hybrid_engine false): nodes and GPUs per node, beside the
    # trainer's (trainer.nnodes × trainer.n_gpus_per_node). 0 nodes: rollout shares the actor's GPUs.
    nnodes: NonNegativeInt = 0
    n_gpus_per_node: PositiveInt | None = None  # None: trainer.n_gpus_per_node
    tensor_model_parallel_size: PositiveInt = 2  # GPUs per rollout replica (verl's default 2; HF generate needs 1).
    max_num_batched_tokens: PositiveInt = 8192  # vLLM: tokens per scheduler step (tuning guide: > 2048).
    max_num_seqs: PositiveInt = 256  # vLLM: concurrent sequences per replica.
    max_model_len: PositiveInt | None = None  # null: prompt_length + response_length.
    enable_chunked_prefill: bool = True  # vLLM chunked prefill.
    enforce_eager: bool = True  # vLLM: no CUDA graphs (saves memory, slower decode).
    free_cache_engine: bool = True  # Release vLLM KV cache while training (a rollout pool of its own keeps it: RL363).
    disable_log_stats: bool = True  # false: log vLLM throughput and cache use (advised while tuning).
    load_format: str = "dummy"  # vLLM load format for the engine's first weights (dummy: random; auto, safetensors, ...: from the model directory); the actor pushes its weights before the first rollout either way.
    seed: int = 42  # Sampling seed.
    # Return each sampled token's log-prob (the rollout/trainer gap metrics read them). false: sample without them,
    # unless rollout correction or its bypass mode reads them (then they are returned anyway).
    calculate_log_probs: bool = True
    # Recomputing old log-probs after generation (forward only).
    log_prob_micro_batch_size: PositiveInt | None = None  # deprecated: global
    log_prob_micro_batch_size_per_gpu: PositiveInt | None = None  # Sequences per old-log-prob forward per GPU.
    log_prob_use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    log_prob_max_token_len_per_gpu: PositiveInt | None = None  # None: actor.ppo_max_token_len_per_gpu
    val_kwargs: ValidationSampling = Field(default_factory=ValidationSampling)
    engine_kwargs: EngineKwargs = Field(default_factory=EngineKwargs)  # Extra keyword arguments per rollout backend.
    checkpoint_engine: CheckpointEngineConfig = Field(default_factory=CheckpointEngineConfig)
