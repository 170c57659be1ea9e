"""`actor_rollout_ref.rollout`: generation engine and sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlconf.schema.common import Fraction, MinusOneOrPositive, NonNegativeFloat, PositiveInt, Section


class ValidationSampling(Section):
    temperature: NonNegativeFloat = 0.0
    top_k: MinusOneOrPositive = -1
    top_p: Fraction = 1.0
    n: PositiveInt = 1
    do_sample: bool = False


class RolloutConfig(Section):
    # vllm: the GPU fast path; hf: transformers `generate`, runs anywhere (CPU included).
    name: Literal["vllm", "hf"] = "vllm"
    mode: Literal["sync"] = "sync"
    n: PositiveInt = 1
    temperature: NonNegativeFloat = 1.0
    top_k: MinusOneOrPositive = -1
    top_p: Fraction = 1.0
    do_sample: bool = True
    ignore_eos: bool = False
    prompt_length: PositiveInt | None = None  # None: data.max_prompt_length
    response_length: PositiveInt | None = None  # None: data.max_response_length
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # vLLM >= 0.7: the fraction of *total* GPU memory the engine may use (weights + KV cache).
    gpu_memory_utilization: Fraction = 0.5
    tensor_model_parallel_size: PositiveInt = 1
    max_num_batched_tokens: PositiveInt = 8192
    max_num_seqs: PositiveInt = 1024
    max_model_len: PositiveInt | None = None
    enable_chunked_prefill: bool = True
    enforce_eager: bool = True
    free_cache_engine: bool = True
    disable_log_stats: bool = True
    load_format: Literal["dummy", "auto"] = "dummy"
    seed: int = 0
    # Recomputing old log-probs after generation (forward only).
    log_prob_micro_batch_size: PositiveInt | None = None  # deprecated: global
    log_prob_micro_batch_size_per_gpu: PositiveInt | None = None
    log_prob_use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    log_prob_max_token_len_per_gpu: PositiveInt | None = None  # None: actor.ppo_max_token_len_per_gpu
    val_kwargs: ValidationSampling = Field(default_factory=ValidationSampling)
    engine_kwargs: dict = Field(default_factory=dict)
