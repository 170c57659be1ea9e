"""`actor_rollout_ref.actor`, `.ref` and `critic`: training and forward-only FSDP roles.

Algorithmic sizes (`ppo_mini_batch_size`) are global, counted in prompts; performance sizes
(`*_micro_batch_size_per_gpu`, `*_max_token_len_per_gpu`) are per GPU, counted in sequences or
tokens. rlconf/normalize.py turns the former into the latter's units.
"""

from typing import Literal

from pydantic import Field

from rlconf.schema.common import KLEstimator, NonNegativeFloat, PositiveFloat, PositiveInt, Section
from rlconf.schema.model import CriticModel, FSDPConfig, RefFSDPConfig
from rlconf.schema.optim import OptimConfig

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


# verl's policy loss modes (core_algos.py register_policy_loss); engine/algos/policy_losses.py runs vanilla, gspo,
# sapo, gpg, clip_cov, kl_cov, geo_mean and cispo (RL108 for the rest).
LossMode = Literal["vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo",
                   "bypass_mode"]


class PolicyLossConfig(Section):
    loss_mode: LossMode = "vanilla"  # Policy-gradient loss: vanilla is PPO's clipped surrogate; gspo, sapo and geo_mean aggregate per sequence whatever loss_agg_mode says.
    clip_cov_ratio: PositiveFloat = 0.0002  # clip_cov: fraction of valid tokens whose gradient is cut.
    clip_cov_lb: float = 1.0  # clip_cov: lower bound of the covariance of a token that may be cut.
    clip_cov_ub: float = 5.0  # clip_cov: upper bound of the covariance of a token that may be cut.
    kl_cov_ratio: PositiveFloat = 0.0002  # kl_cov: fraction of valid tokens that get the |log ratio| penalty.
    ppo_kl_coef: NonNegativeFloat = 0.1  # kl_cov: weight of the |log ratio| penalty.


class CheckpointContents(Section):
    save_contents: list[Literal["model", "optimizer", "extra", "hf_model"]] = ["model", "optimizer", "extra"]  # What a checkpoint holds; hf_model adds an HF export.
    load_contents: list[Literal["model", "optimizer", "extra", "hf_model"]] = ["model", "optimizer", "extra"]  # What a resume restores; unset: save_contents.


class ActorConfig(Section):
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"  # FSDP2 (fully_shard) training; fsdp is accepted as an alias.
    ppo_mini_batch_size: PositiveInt = 256  # Prompts per optimizer step (global; × rollout.n sequences).
    ppo_micro_batch_size: PositiveInt | None = None  # deprecated: global; use ppo_micro_batch_size_per_gpu
    ppo_micro_batch_size_per_gpu: PositiveInt | None = None  # Sequences per forward/backward pass per GPU.
    use_dynamic_bsz: bool = False  # Pack micro batches by token budget instead of a fixed count.
    ppo_max_token_len_per_gpu: PositiveInt = 16384  # Token budget per micro batch per GPU with use_dynamic_bsz.
    grad_clip: PositiveFloat = 1.0  # Clip the global gradient norm to this.
    clip_ratio: NonNegativeFloat = 0.2  # PPO clip epsilon (fallback for clip_ratio_low/high).
    clip_ratio_low: NonNegativeFloat | None = 0.2  # Lower PPO clip epsilon; null: clip_ratio (verl's default 0.2 makes clip_ratio a fallback only).
    clip_ratio_high: NonNegativeFloat | None = 0.2  # Upper PPO clip epsilon; null: clip_ratio.
    clip_ratio_c: float = Field(default=3.0, gt=1.0)  # dual-clip bound for negative advantages
    policy_loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    tau_pos: PositiveFloat = 1.0  # sapo: gate temperature of tokens with a positive advantage.
    tau_neg: PositiveFloat = 1.05  # sapo: gate temperature of tokens with a zero or negative advantage.
    loss_agg_mode: LossAggMode = "token-mean"  # How token losses are averaged into one number.
    entropy_coeff: NonNegativeFloat = 0.0  # Entropy bonus weight (0: off).
    use_kl_loss: bool = False  # Add a KL(actor || ref) loss term (GRPO style; needs the reference policy).
    kl_loss_coef: NonNegativeFloat = 0.001  # Weight of the KL loss term.
    kl_loss_type: KLEstimator = "low_var_kl"  # KL estimator for the loss term; a `+` suffix (k3+) keeps its value and takes k2's gradient.
    ppo_epochs: PositiveInt = 1  # Passes over each step's data.
    shuffle: bool = False  # Shuffle sequences between PPO epochs.
    ulysses_sequence_parallel_size: PositiveInt = 1  # Split each sequence over this many GPUs (Ulysses); needs use_remove_padding.
    entropy_from_logits_with_chunking: bool = False  # Compute entropy in chunks to cut peak memory.
    entropy_checkpointing: bool = False  # Recompute entropy in backward instead of storing it.
    use_torch_compile: bool = True  # Fast kernels for the loss head's logit math. verl compiles it with torch.compile; on CUDA rlconf runs its own Triton kernels instead (rlconf.loss_head: faster, less memory, nothing to compile); on CPU the eager head.
    optim: OptimConfig = Field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)
    checkpoint: CheckpointContents = Field(default_factory=CheckpointContents)


class RefConfig(Section):
    """Frozen reference policy. `None` values inherit the actor's setting."""

    log_prob_micro_batch_size: PositiveInt | None = None  # deprecated: global
    log_prob_micro_batch_size_per_gpu: PositiveInt | None = None  # Sequences per reference forward pass per GPU.
    log_prob_use_dynamic_bsz: bool | None = None  # null: actor.use_dynamic_bsz.
    log_prob_max_token_len_per_gpu: PositiveInt | None = None  # null: actor.ppo_max_token_len_per_gpu.
    ulysses_sequence_parallel_size: PositiveInt | None = None  # null: the actor's.
    entropy_from_logits_with_chunking: bool = False  # As the actor's.
    entropy_checkpointing: bool = False  # As the actor's.
    fsdp_config: RefFSDPConfig = Field(default_factory=RefFSDPConfig)


def _critic_default_optim() -> OptimConfig:
    """OptimConfig(lr=1e-5), made without validation: the constant needs no checking, and validating it
    would build a validator for OptimConfig alone besides the plan's (1.4 ms of a cold `rlconf validate`;
    tests/compiler/test_cold_start.py)."""
    return OptimConfig.model_construct(lr=1e-5)


class CriticConfig(Section):
    """Value model for GAE. `None` values inherit from the actor (as verl's interpolations do)."""

    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"  # FSDP2 training.
    model: CriticModel = Field(default_factory=CriticModel)
    optim: OptimConfig = Field(default_factory=_critic_default_optim)
    ppo_mini_batch_size: PositiveInt | None = None  # null: actor.ppo_mini_batch_size.
    ppo_micro_batch_size: PositiveInt | None = None  # deprecated: global
    ppo_micro_batch_size_per_gpu: PositiveInt | None = None  # Sequences per forward/backward pass per GPU.
    forward_micro_batch_size: PositiveInt | None = None  # deprecated: global
    forward_micro_batch_size_per_gpu: PositiveInt | None = None  # Sequences per value forward pass; null: ppo_micro_batch_size_per_gpu.
    use_dynamic_bsz: bool | None = None  # null: actor.use_dynamic_bsz.
    ppo_max_token_len_per_gpu: PositiveInt = 32768  # Token budget per training micro batch (tuning guide: ≥ 2× the actor's).
    forward_max_token_len_per_gpu: PositiveInt | None = None  # null: ppo_max_token_len_per_gpu.
    ulysses_sequence_parallel_size: PositiveInt = 1  # Ulysses size for the critic; needs critic.model.use_remove_padding.
    ppo_epochs: PositiveInt | None = None  # null: actor.ppo_epochs.
    shuffle: bool = False  # Shuffle between epochs; unset: actor.shuffle.
    grad_clip: PositiveFloat = 1.0  # Clip the global gradient norm.
    cliprange_value: NonNegativeFloat = 0.5  # Value clipping range around the old values.
    loss_agg_mode: LossAggMode | None = None  # null: actor.loss_agg_mode.
    checkpoint: CheckpointContents = Field(default_factory=CheckpointContents)
