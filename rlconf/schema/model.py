"""`actor_rollout_ref.model`, `critic.model`, `reward_model.model` and FSDP settings."""

from typing import Literal

from pydantic import Field

from rlconf.schema.common import MinusOneOrPositive, NonNegativeInt, PositiveFloat, Section


class WrapPolicy(Section):
    # FSDP wraps each decoder layer; a module with at least this many parameters is also wrapped.
    min_num_params: NonNegativeInt = 0


class FSDPConfig(Section):
    # Keep the parameter shard on CPU while the model is idle (rollout, other models); on GPU for its forward passes and update.
    param_offload: bool = False
    optimizer_offload: bool = False  # Keep Adam's moments on CPU except during each optimizer step.
    # FSDP2 CPUOffloadPolicy: parameters, gradients and the optimizer step on CPU in every phase; supersedes param_offload and optimizer_offload. Slowest, smallest GPU footprint.
    offload_policy: bool = False
    # Free gathered weights after each layer's forward (ZeRO-3 style); false keeps them until the optimizer step, through all the micro batches of a step.
    reshard_after_forward: bool = True
    # Accumulate gradients unsharded over a step's micro batches and reduce-scatter them once: fewer collectives, the whole model's fp32 gradient on every GPU.
    use_no_sync_for_gradient_accumulation: bool = False
    # Prefetch the next layer's all-gather before the current forward finishes (seed: FSDP forward prefetch).
    forward_prefetch: bool = False
    # -1: shard across the whole data-parallel group.
    fsdp_size: MinusOneOrPositive = -1
    wrap_policy: WrapPolicy = Field(default_factory=WrapPolicy)


class RefFSDPConfig(Section):
    """The reference policy is frozen: no optimizer to offload."""

    param_offload: bool = False  # Keep the frozen weights on CPU except during the model's own forward pass.
    reshard_after_forward: bool = True  # Free gathered weights after each layer's forward.
    forward_prefetch: bool = False  # Prefetch the next layer's all-gather.
    wrap_policy: WrapPolicy = Field(default_factory=WrapPolicy)


class FusedKernelOptions(Section):
    # Kernels of the loss head's log-prob and entropy math: "torch" (eager; the Triton kernels anyway with actor.use_torch_compile on CUDA) or "triton" (CUDA: rlconf's kernels, one pass over the logits each way and no fp32 [tokens, vocab] tensor), with or without use_fused_kernels.
    impl_backend: Literal["torch", "triton"] = "torch"


class ActorModel(Section):
    path: str = "~/models/Qwen2.5-0.5B-Instruct"  # HF model directory or hub id; `tiny://qwen2` or `tiny://llama` builds a tiny random model (`tiny://qwen2-untied`: with an LM head of its own); `random://Qwen2.5-0.5B` (and other names in rlconf/modelinfo.py) a random-weight model of that real shape.
    tokenizer_path: str | None = None  # null: path.
    custom_chat_template: str | None = None  # Jinja chat template overriding the tokenizer's.
    trust_remote_code: bool = False  # Allow custom model code from the model directory.
    override_config: dict = Field(default_factory=dict)  # Entries merged into the model config (e.g. attention dropout).
    enable_gradient_checkpointing: bool = True  # Recompute activations in backward; allows larger micro batches.
    # Keep what the training forward saves for backward (with checkpointing: each layer's input) on CPU until backward.
    enable_activation_offload: bool = False
    # Sequence packing: drop pad tokens and run varlen attention (llama, mistral, gemma, qwen families).
    use_remove_padding: bool = True
    use_liger: bool = False  # Liger fused kernels (CUDA).
    use_fused_kernels: bool = False  # Log-probs/entropy from hidden states in chunks, no full logits.
    fused_kernel_options: FusedKernelOptions = Field(default_factory=FusedKernelOptions)
    # rlconf extension: torch.compile each decoder layer (actor and reference; one graph all layers share),
    # fusing the elementwise work between matmuls. Costs a compile at the first step (about a minute
    # on CPU), on any device. verl's actor.use_torch_compile compiles only the loss head.
    compile_layers: bool = False
    # bf16 compute with fp32 master weights is the engine's mixed-precision policy.
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # LoRA (peft, `pip install 'rlconf[lora]'`): rank of the adapters, 0 for full fine-tuning. The base
    # weights are frozen in `dtype`; the reference policy is the same model with its adapters switched off.
    lora_rank: NonNegativeInt = 0
    lora_alpha: PositiveFloat = 16  # The adapters' output is scaled by lora_alpha / lora_rank.
    # Modules given adapters: "all-linear" (every linear layer but the LM head), a list of module names, or a regex.
    target_modules: str | list[str] = "all-linear"
    exclude_modules: str | list[str] | None = None  # Module names (or a regex) left without adapters.
    # A saved peft adapter (a directory with adapter_config.json) to start LoRA from: it turns LoRA on, and its
    # own rank, alpha and target modules replace lora_rank, lora_alpha and target_modules (rlconf/lora_adapter.py).
    lora_adapter_path: str | None = None


class CriticModel(Section):
    path: str | None = None  # None: the actor's model path
    tokenizer_path: str | None = None  # null: the critic model path.
    trust_remote_code: bool = False  # As the actor's.
    override_config: dict = Field(default_factory=dict)  # As the actor's.
    enable_gradient_checkpointing: bool = True  # As the actor's.
    enable_activation_offload: bool = False  # As the actor's.
    use_remove_padding: bool = True  # Sequence packing for the critic.
    compile_layers: bool = False  # As the actor's (rlconf extension).
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)


class RewardModelModel(Section):
    path: str | None = None  # Reward model directory (sequence classification head).
    input_tokenizer: str | None = None  # Tokenizer of the policy, to re-tokenize responses.
    trust_remote_code: bool | None = False  # Allow custom model code (null: no).
    use_remove_padding: bool = False  # Sequence packing.
    fsdp_config: RefFSDPConfig = Field(default_factory=RefFSDPConfig)
