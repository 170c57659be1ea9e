"""`data`, `reward_model`, `custom_reward_function`, `algorithm`, `trainer`, and rlconf's own
`placement` and `estimate` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlconf.schema.common import (
    MinusOneOrPositive,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
    UnitInterval,
)
from rlconf.schema.model import RewardModelModel


class DataConfig(Section):
    tokenizer: str | None = None
    train_files: str | list[str] = "~/data/gsm8k/train.parquet"
    val_files: str | list[str] | None = None
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: PositiveInt = 512
    max_response_length: PositiveInt = 512
    train_batch_size: PositiveInt = 1024
    val_batch_size: PositiveInt | None = None  # deprecated in verl: validation runs as one batch
    shuffle: bool = True
    seed: int = 1
    filter_overlong_prompts: bool = False
    # What to do with a prompt longer than max_prompt_length (after the chat template).
    truncation: Literal["error", "left", "right", "middle"] = "error"
    dataloader_num_workers: NonNegativeInt = 0
    return_raw_chat: bool = False


class RewardModelConfig(Section):
    enable: bool = False
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    model: RewardModelModel = Field(default_factory=RewardModelModel)
    micro_batch_size: PositiveInt | None = None  # deprecated: global
    micro_batch_size_per_gpu: PositiveInt | None = None
    max_length: PositiveInt | None = None
    ulysses_sequence_parallel_size: PositiveInt = 1
    use_dynamic_bsz: bool | None = None  # None: critic.use_dynamic_bsz
    forward_max_token_len_per_gpu: PositiveInt | None = None  # None: critic.forward_max_token_len_per_gpu
    reward_manager: Literal["naive"] = "naive"


class CustomRewardFunction(Section):
    path: str | None = None
    name: str = "compute_score"


class KLControl(Section):
    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: NonNegativeFloat = 0.001
    horizon: PositiveInt = 10000
    target_kl: PositiveFloat = 0.1


AdvEstimator = Literal["gae", "grpo", "rloo", "reinforce_plus_plus"]
# Estimators that compare samples of the same prompt: they need rollout.n > 1.
GROUP_ESTIMATORS: frozenset[str] = frozenset({"grpo", "rloo"})


class AlgorithmConfig(Section):
    gamma: UnitInterval = 1.0
    lam: UnitInterval = 1.0
    adv_estimator: AdvEstimator = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "kl"
    kl_ctrl: KLControl = Field(default_factory=KLControl)


class TrainerConfig(Section):
    project_name: str = "rlconf"
    experiment_name: str = "run"
    logger: list[Literal["console", "tensorboard", "wandb"]] = ["console"]
    nnodes: PositiveInt = 1
    n_gpus_per_node: PositiveInt = 8
    device: Literal["cuda", "cpu"] = "cuda"
    total_epochs: PositiveInt = 1
    total_training_steps: PositiveInt | None = None
    critic_warmup: NonNegativeInt = 0
    balance_batch: bool = True
    save_freq: MinusOneOrPositive = -1
    test_freq: MinusOneOrPositive = -1
    val_before_train: bool = False
    resume_mode: str = "auto"  # auto | disable | resume_path, see TrainerConfig docs
    resume_from_path: str | None = None
    default_local_dir: str | None = None  # None: checkpoints/{project_name}/{experiment_name}
    max_actor_ckpt_to_keep: PositiveInt | None = None
    max_critic_ckpt_to_keep: PositiveInt | None = None
    seed: int = 1
    # Steps (1-based) for which to write a torch.profiler trace into the run directory.
    profile_steps: list[PositiveInt] = []


class PoolSpec(Section):
    nnodes: PositiveInt = 1
    n_gpus_per_node: PositiveInt


Role = Literal["actor", "rollout", "ref", "critic", "reward_model"]


class PlacementConfig(Section):
    """rlconf extension (verl: resource pools): which GPU group each role runs on.

    Omitted: one pool spanning the cluster with every role colocated (verl's hybrid engine).
    """

    pools: dict[str, PoolSpec]
    roles: dict[Role, str]


class EstimateConfig(Section):
    """rlconf extension: hints for the memory estimate in `rlconf explain`."""

    gpu_memory_gib: PositiveFloat = 80.0
    # Billions of parameters; None: read model.path/config.json if local, else parse "7B" from the name.
    num_params_b: PositiveFloat | None = None
