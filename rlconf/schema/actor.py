"""`actor_rollout_ref.actor`, `.ref` and `critic`: training and forward-only FSDP roles.

Algorithmic sizes (`ppo_mini_batch_size`) are global, counted in prompts; performance sizes
(`*_micro_batch_size_per_gpu`, `*_max_token_len_per_gpu`) are per GPU, counted in sequences or
tokens. rlconf/normalize.py turns the former into the latter's units.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlconf.schema.common import NonNegativeFloat, PositiveFloat, PositiveInt, Section
from rlconf.schema.model import CriticModel, FSDPConfig, RefFSDPConfig
from rlconf.schema.optim import OptimConfig

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLLossType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]


class CheckpointContents(Section):
    save_contents: list[Literal["model", "optimizer", "extra", "hf_model"]] = ["model", "optimizer", "extra"]
    load_contents: list[Literal["model", "optimizer", "extra", "hf_model"]] = ["model", "optimizer", "extra"]


class ActorConfig(Section):
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    ppo_mini_batch_size: PositiveInt = 256
    ppo_micro_batch_size: PositiveInt | None = None  # deprecated: global; use ppo_micro_batch_size_per_gpu
    ppo_micro_batch_size_per_gpu: PositiveInt | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: PositiveInt = 16384
    grad_clip: PositiveFloat = 1.0
    clip_ratio: NonNegativeFloat = 0.2
    clip_ratio_low: NonNegativeFloat | None = None  # None: clip_ratio
    clip_ratio_high: NonNegativeFloat | None = None  # None: clip_ratio
    clip_ratio_c: float = Field(default=3.0, gt=1.0)  # dual-clip bound for negative advantages
    loss_agg_mode: LossAggMode = "token-mean"
    entropy_coeff: NonNegativeFloat = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: NonNegativeFloat = 0.001
    kl_loss_type: KLLossType = "low_var_kl"
    ppo_epochs: PositiveInt = 1
    shuffle: bool = False
    ulysses_sequence_parallel_size: PositiveInt = 1
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    use_torch_compile: bool = False
    optim: OptimConfig = Field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)
    checkpoint: CheckpointContents = Field(default_factory=CheckpointContents)


class RefConfig(Section):
    """Frozen reference policy. `None` values inherit the actor's setting."""

    log_prob_micro_batch_size: PositiveInt | None = None  # deprecated: global
    log_prob_micro_batch_size_per_gpu: PositiveInt | None = None
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: PositiveInt | None = None
    ulysses_sequence_parallel_size: PositiveInt | None = None
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    fsdp_config: RefFSDPConfig = Field(default_factory=RefFSDPConfig)


class CriticConfig(Section):
    """Value model for GAE. `None` values inherit from the actor (as verl's interpolations do)."""

    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    model: CriticModel = Field(default_factory=CriticModel)
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: PositiveInt | None = None
    ppo_micro_batch_size: PositiveInt | None = None  # deprecated: global
    ppo_micro_batch_size_per_gpu: PositiveInt | None = None
    forward_micro_batch_size: PositiveInt | None = None  # deprecated: global
    forward_micro_batch_size_per_gpu: PositiveInt | None = None
    use_dynamic_bsz: bool | None = None
    ppo_max_token_len_per_gpu: PositiveInt = 32768
    forward_max_token_len_per_gpu: PositiveInt | None = None
    ulysses_sequence_parallel_size: PositiveInt = 1
    ppo_epochs: PositiveInt | None = None
    shuffle: bool = False
    grad_clip: PositiveFloat = 1.0
    cliprange_value: NonNegativeFloat = 0.5
    loss_agg_mode: LossAggMode | None = None
    checkpoint: CheckpointContents = Field(default_factory=CheckpointContents)
