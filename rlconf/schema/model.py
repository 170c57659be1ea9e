"""`actor_rollout_ref.model`, `critic.model`, `reward_model.model` and FSDP settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlconf.schema.common import MinusOneOrPositive, NonNegativeInt, Section


class WrapPolicy(Section):
    # FSDP wraps each decoder layer; a module with at least this many parameters is also wrapped.
    min_num_params: NonNegativeInt = 0


class FSDPConfig(Section):
    param_offload: bool = False
    optimizer_offload: bool = False
    # FSDP2 CPU offload policy (parameters, gradients and optimizer on CPU). Slower, smallest GPU footprint.
    offload_policy: bool = False
    reshard_after_forward: bool = True
    # Prefetch the next layer's all-gather before the current forward finishes (seed: FSDP forward prefetch).
    forward_prefetch: bool = False
    # -1: shard across the whole data-parallel group.
    fsdp_size: MinusOneOrPositive = -1
    wrap_policy: WrapPolicy = Field(default_factory=WrapPolicy)


class RefFSDPConfig(Section):
    """The reference policy is frozen: no optimizer to offload."""

    param_offload: bool = False
    reshard_after_forward: bool = True
    forward_prefetch: bool = False
    wrap_policy: WrapPolicy = Field(default_factory=WrapPolicy)


class ActorModel(Section):
    path: str = "~/models/Qwen2.5-0.5B-Instruct"
    tokenizer_path: str | None = None
    custom_chat_template: str | None = None
    trust_remote_code: bool = False
    override_config: dict = Field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    # Sequence packing: drop pad tokens and run varlen attention (llama, mistral, gemma, qwen families).
    use_remove_padding: bool = False
    use_liger: bool = False
    use_fused_kernels: bool = False
    # bf16 compute with fp32 master weights is the engine's mixed-precision policy.
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"


class CriticModel(Section):
    path: str | None = None  # None: the actor's model path
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    override_config: dict = Field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    use_remove_padding: bool = False
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)


class RewardModelModel(Section):
    path: str | None = None
    input_tokenizer: str | None = None
    trust_remote_code: bool = False
    use_remove_padding: bool = False
    fsdp_config: RefFSDPConfig = Field(default_factory=RefFSDPConfig)
